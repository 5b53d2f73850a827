"""memlab's token and paged allocators against SGLang 0.5.23's, stream by stream.

Each stream drives SGLang's allocator with both of its backends (its torch fallback and its
Triton kernels, in the interpreter on a CPU) and memlab's with all three (torch, triton,
python) in lockstep; after every step each slot id handed out, each refusal, the free list
(content and order), the staged pages and ``available_size()`` must be the same.
"""

import pytest
import torch

from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab_tests.tools.engines.sglang_loader import load
from memlab_tests.tools.engines.sglang_streams import Stream, run

STEPS = 60
NUM_PAGES = 24  # few enough that streams run short, refuse, and (need_sort) merge


def sglang_paged(sg, size, ps, need_sort, triton):
    a = sg.PagedTokenToKVPoolAllocator(size, ps, torch.float16, "cpu", None, need_sort)
    a.use_triton_kernels = (
        triton  # what current_platform.capabilities.supports_triton decides
    )
    # SGLANG_DEBUG_MEMORY_POOL: no page on its free list twice, after every free.
    a.debug_mode = True
    return a


def paged_ext(a, *args):
    return a.alloc_extend(*args)


def paged_dec(a, *args):
    return a.alloc_decode(*args)


# SGLang's Triton kernels are slow in the interpreter (a 4096-wide block per request), so they
# run in the first stream of each case; the torch and python backends run in every stream.
KERNEL_STREAMS, TORCH_STREAMS = 1, 3


@pytest.mark.parametrize("need_sort", [False, True], ids=["fifo", "need_sort"])
@pytest.mark.parametrize("ps", [2, 4, 16, 64])
def test_paged_allocator_streams_match_sglang(ps, need_sort, tally):
    sg = load()
    size = NUM_PAGES * ps
    for seed in range(KERNEL_STREAMS + TORCH_STREAMS):
        kernels = seed < KERNEL_STREAMS
        sglang = [
            sglang_paged(sg, size, ps, need_sort, triton)
            for triton in ((False, True) if kernels else (False,))
        ]
        memlab = [
            PagedTokenToKVPoolAllocator(
                size, ps, need_sort=need_sort, debug_mode=True, backend=b
            )
            for b in (("torch", "triton", "python") if kernels else ("torch", "python"))
        ]
        run(
            Stream(1000 * ps + 100 * need_sort + seed, ps, NUM_PAGES),
            sglang,
            memlab,
            STEPS,
            paged_ext,
            paged_dec,
        )
    tally(
        f"PagedTokenToKVPoolAllocator page {ps:>2}, torch/python backends",
        KERNEL_STREAMS + TORCH_STREAMS,
        (KERNEL_STREAMS + TORCH_STREAMS) * STEPS,
    )
    tally(
        f"PagedTokenToKVPoolAllocator page {ps:>2}, Triton kernels (both)",
        KERNEL_STREAMS,
        KERNEL_STREAMS * STEPS,
    )


def token_ext(a, prefix, prefix_cpu, seq, seq_cpu, last, n):
    if isinstance(a, TokenToKVPoolAllocator):
        return a.alloc_extend(prefix, prefix_cpu, seq, seq_cpu, last, n)
    # SGLang's scheduler at page size 1: alloc_token_slots -> alloc(extend_num_tokens)
    return a.alloc(n)


def token_dec(a, seq, seq_cpu, last):
    if isinstance(a, TokenToKVPoolAllocator):
        return a.alloc_decode(seq, seq_cpu, last)
    return a.alloc(len(seq))


@pytest.mark.parametrize("need_sort", [False, True], ids=["fifo", "need_sort"])
def test_token_allocator_streams_match_sglang(need_sort, tally):
    sg = load()
    streams, size = 6, 40
    for seed in range(streams):
        sglang = [
            sg.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, need_sort)
        ]
        memlab = [TokenToKVPoolAllocator(size, need_sort=need_sort, debug_mode=True)]
        run(Stream(seed, 1, size), sglang, memlab, STEPS, token_ext, token_dec)
    tally("TokenToKVPoolAllocator", streams, streams * STEPS)


def test_sglang_never_runs_the_paged_allocator_at_page_size_1():
    """Nothing to compare: SGLang builds TokenToKVPoolAllocator at page size 1, and its paged class
    would count no new page in decode there (``seq_len % 1 == 1`` never holds)."""
    sg = load()
    a = sglang_paged(sg, 8, 1, False, False)
    a.debug_mode = False
    assert (
        sg.get_num_new_pages(seq_lens=torch.tensor([1, 2, 3]), page_size=1, decode=True)
        == 0
    )
    out = a.alloc_decode(torch.tensor([1]), torch.tensor([1]), torch.tensor([-1]))
    # last_loc + 1: the padding slot, no page taken. So memlab's paged class is compared with
    # SGLang's at page sizes 2, 4, 16 and 64 only.
    assert out.tolist() == [0] and a.available_size() == 8
