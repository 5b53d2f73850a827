"""Random streams of extend, decode and free on both allocators keep the books exact."""

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab_tests.tools.alloc import check_books, decode, extend

# (op, request id, n): "split" frees a request in two pieces (cut after n % len tokens) inside one
# free group, so both frees touch the page the cut falls in, the way a scheduler frees a finished
# request and its over-allocated tail.
ops = st.lists(
    st.tuples(
        st.sampled_from(["extend", "decode", "free", "group", "split"]),
        st.integers(0, 7),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=40,
)


def make(kind, need_sort, cls=None):
    if kind == 1:
        return TokenToKVPoolAllocator(48, need_sort=need_sort, debug_mode=True)
    return (cls or PagedTokenToKVPoolAllocator)(
        48, kind, need_sort=need_sort, debug_mode=True
    )


def free_set(alloc):
    return sorted(alloc.get_all_free_pages().tolist())


def run(alloc, steps):
    held = {}
    for op, rid, n in steps:
        before = free_set(alloc)
        if op == "extend":
            if extend(alloc, held, rid, n) is None:
                # need_sort may merge before refusing (as SGLang does): the order may
                # change, no page
                assert free_set(alloc) == before, "a refused extend took or lost pages"
        elif op == "decode":
            rids = [r for r in held if held[r]][: max(1, n % 4)]
            if rids and decode(alloc, held, rids) is None:
                assert free_set(alloc) == before, "a refused decode took or lost pages"
        elif op == "free" and rid in held:
            alloc.free(torch.tensor(held.pop(rid), dtype=torch.int64))
        elif op == "group":  # free several requests as one group
            alloc.free_group_begin()
            for r in [r for r in held if r <= rid]:
                alloc.free(torch.tensor(held.pop(r), dtype=torch.int64))
            alloc.free_group_end()
        elif op == "split" and held.get(rid):
            slots = held.pop(rid)
            cut = n % len(slots)
            alloc.free_group_begin()
            # the tail first, then the rest
            alloc.free(torch.tensor(slots[cut:], dtype=torch.int64))
            alloc.free(torch.tensor(slots[:cut], dtype=torch.int64))
            alloc.free_group_end()
        check_books(alloc, held)
        if alloc.debug_mode:
            alloc.check_books()
        assert alloc.available_size() == alloc.page_size * len(
            alloc.get_all_free_pages()
        )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([1, 2, 4, 16]), need_sort=st.booleans(), steps=ops)
def test_random_streams_keep_the_books(kind, need_sort, steps):
    run(make(kind, need_sort), steps)


class DedupPerFree(PagedTokenToKVPoolAllocator):
    """The classic bug: each free() of a group deduplicated on its own and queued as pages, so a
    page shared by two frees of one group is released twice."""

    def free(self, free_index):
        if self.free_group is None:
            return super().free(free_index)
        self.free_page_ids_group.append(torch.unique(free_index // self.page_size))


def test_a_group_freeing_one_page_twice_is_caught():
    # Request 0 holds 5 slots on pages 1-2; freed in two pieces cut inside page 2.
    stream = [("extend", 0, 5), ("split", 0, 3)]
    run(make(4, False), stream)  # the real allocator: page 2 released once
    with pytest.raises(AssertionError, match="a page is on the free list twice"):
        # no debug mode: the test's own books check must see it
        run(DedupPerFree(48, 4), stream)


def test_the_random_streams_find_the_bug_on_their_own():
    def breaks(steps):
        try:
            run(DedupPerFree(48, 4), steps)
        except AssertionError:
            return True
        return False

    # no shrinking: found is enough
    steps = find(
        ops,
        breaks,
        settings=settings(
            max_examples=2000, deadline=None, database=None, phases=[Phase.generate]
        ),
    )
    assert any(op == "split" for op, _, _ in steps)


def test_the_books_check_catches_a_lost_page():
    class LosesPages(PagedTokenToKVPoolAllocator):
        def _release_page_ids(self, page_ids):
            super()._release_page_ids(page_ids[1:])  # forgets one page per release

    alloc = LosesPages(48, 4)
    held = {}
    extend(alloc, held, 0, 9)
    alloc.free(torch.tensor(held.pop(0)))
    with pytest.raises(AssertionError, match="!= 12 pages"):
        check_books(alloc, held)
