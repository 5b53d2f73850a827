"""Random streams of extend, decode and free on both allocators keep the books exact."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alloc_helpers import check_books, decode, extend, same, snapshot
from memlab.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

ops = st.lists(st.tuples(st.sampled_from(["extend", "decode", "free", "group"]), st.integers(0, 7),
                         st.integers(0, 40)), min_size=1, max_size=40)


def make(kind, need_sort):
    if kind == 1:
        return TokenToKVPoolAllocator(48, need_sort=need_sort, debug_mode=True)
    return PagedTokenToKVPoolAllocator(48, kind, need_sort=need_sort, debug_mode=True)


def run(alloc, steps):
    held = {}
    for op, rid, n in steps:
        before = snapshot(alloc)
        if op == "extend":
            if extend(alloc, held, rid, n) is None:
                assert same(before, snapshot(alloc)), "a refused extend changed the free list"
        elif op == "decode":
            rids = [r for r in held if held[r]][: max(1, n % 4)]
            if rids and decode(alloc, held, rids) is None:
                assert same(before, snapshot(alloc)), "a refused decode changed the free list"
        elif op == "free" and rid in held:
            alloc.free(torch.tensor(held.pop(rid), dtype=torch.int64))
        elif op == "group":  # free several requests as one group
            alloc.free_group_begin()
            for r in [r for r in held if r <= rid]:
                alloc.free(torch.tensor(held.pop(r), dtype=torch.int64))
            alloc.free_group_end()
        check_books(alloc, held)
        alloc.check_books()
        assert alloc.available_size() == alloc.page_size * (len(alloc.free_pages) + len(alloc.release_pages))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([1, 2, 4, 16]), need_sort=st.booleans(), steps=ops)
def test_random_streams_keep_the_books(kind, need_sort, steps):
    run(make(kind, need_sort), steps)


def test_the_books_check_catches_a_lost_page():
    class LosesPages(PagedTokenToKVPoolAllocator):
        def free_page_ids(self, page_ids):
            super().free_page_ids(page_ids[1:])  # forgets one page per free

    alloc = LosesPages(48, 4)
    held = {}
    extend(alloc, held, 0, 9)
    alloc.free(torch.tensor(held.pop(0)))
    try:
        check_books(alloc, held)
    except AssertionError as e:
        assert "!= 12 pages" in str(e)
    else:
        raise AssertionError("a lost page went unnoticed")
