"""Layer 3, the allocators: logical token -> physical slot (SGLang's token and paged allocators)."""

from memlab.allocator.base import BaseTokenToKVPoolAllocator
from memlab.allocator.paged import PagedTokenToKVPoolAllocator
from memlab.allocator.token import TokenToKVPoolAllocator

__all__ = ["BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"]
