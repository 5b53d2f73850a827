"""The allocators, token -> slot (sglang/srt/mem_cache/allocator/: base, token, paged)."""

from memlab.common import _checks
from memlab.sglang.allocator.base import BaseTokenToKVPoolAllocator
from memlab.sglang.allocator.paged import PagedTokenToKVPoolAllocator
from memlab.sglang.allocator.token import TokenToKVPoolAllocator

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "make_allocator",
]


def make_allocator(
    size: int, page_size: int = 1, *, backend: str = "torch", **kw
) -> BaseTokenToKVPoolAllocator:
    """The allocator SGLang's scheduler builds for a page size: the token allocator at page size 1,
    the paged one above it (``backend`` applies to the paged one only). ``kw``: dtype, device,
    kvcache, need_sort, debug_mode."""
    # a bool is no page size (True == 1)
    if _checks.integer("page_size", page_size, 1) == 1:
        return TokenToKVPoolAllocator(size, **kw)
    return PagedTokenToKVPoolAllocator(size, page_size, backend=backend, **kw)
