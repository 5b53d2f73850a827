"""Sliding-window accounting: two ledgers in lockstep, the full->SWA map, out-of-window release,
and the per-request ring."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.sglang.req_to_token import ReqToTokenPool
from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator
from memlab_tests.tools.alloc import decode, extend

T = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731


def books(a):
    """Both sides' free lists and the map, to show a refusal changed nothing."""
    s = a.swa_attn_allocator
    return [
        t.clone()
        for t in (
            a.full_attn_allocator.free_pages,
            a.full_attn_allocator.get_all_free_pages(),
            s.free_pages,
            s.get_all_free_pages(),
            a.full_to_swa_index_mapping,
        )
    ]


def unchanged(a, before):
    return all(torch.equal(x, y) for x, y in zip(books(a), before))


def row(slots):
    return torch.tensor([slots], dtype=torch.int64)  # a one-row request table


# ---- the map ------------------------------------------------------------------------------
def test_map_has_a_trailing_minus_one():
    a = SWATokenToKVPoolAllocator(16, 8, 4)
    m = a.full_to_swa_index_mapping
    assert len(m) == 16 + 4 + 1 and m[-1].item() == -1 and not m[:-1].any()
    assert a.translate_loc_from_full_to_swa(T(-1)).tolist() == [-1]


@pytest.mark.parametrize("ps", [1, 4])
def test_a_fresh_request_maps_last_loc_minus_one_and_both_sides_fill(ps):
    a = SWATokenToKVPoolAllocator(32, 16, ps, debug_mode=True)
    a.swa_attn_allocator.alloc(ps)  # shift the SWA id space so the two sides differ
    held = {}
    full = extend(a, held, "r", 6)
    swa = a.translate_loc_from_full_to_swa(full)
    assert (swa > 0).all() and not torch.equal(full, swa)
    assert torch.equal(full % ps, swa % ps)  # lockstep: same offsets inside pages
    full2 = extend(a, held, "r", 3)  # continue: last_loc goes through the map
    swa2 = a.translate_loc_from_full_to_swa(full2)
    # the rest of the partial page continues from the mapped last slot on both sides
    if ps > 1:
        assert full2[:2].tolist() == [full[-1].item() + 1, full[-1].item() + 2]
        assert swa2[:2].tolist() == [swa[-1].item() + 1, swa[-1].item() + 2]
    a.check_books()


def test_available_size_is_the_smaller_side():
    a = SWATokenToKVPoolAllocator(32, 12, 4)
    assert (
        a.available_size() == 12
        and a.full_available_size() == 32
        and a.swa_available_size() == 12
    )
    extend(a, {}, "r", 5)
    assert a.available_size() == min(32 - 8, 12 - 8) == 4


# ---- lockstep refusals --------------------------------------------------------------------
@pytest.mark.parametrize("size, size_swa", [(64, 8), (8, 64)])
def test_a_refusal_on_either_side_takes_nothing_from_both(size, size_swa):
    a = SWATokenToKVPoolAllocator(size, size_swa, 4, debug_mode=True)
    before = books(a)
    assert extend(a, {}, "r", 12) is None  # 3 pages: one side has only 2
    assert unchanged(a, before)
    assert a.alloc(12) is None and unchanged(a, before)
    held = {}
    extend(a, held, "r", 8)  # both sides now full on the small side
    before = books(a)
    # token 9 would open a page
    assert decode(a, held, ["r"]) is None and unchanged(a, before)


def test_decode_opens_pages_on_both_sides_together():
    a = SWATokenToKVPoolAllocator(32, 32, 4)
    a.swa_attn_allocator.alloc(8)
    held = {}
    extend(a, held, "r", 4)
    full_free, swa_free = a.full_available_size(), a.swa_available_size()
    new = decode(a, held, ["r"])  # position 4 opens a page on each side
    assert (
        a.full_available_size() == full_free - 4
        and a.swa_available_size() == swa_free - 4
    )
    assert new.item() % 4 == 0 and a.translate_loc_from_full_to_swa(new).item() % 4 == 0


# ---- freeing ------------------------------------------------------------------------------
class BuggyFullFirst(SWATokenToKVPoolAllocator):
    # the full side first, forgetting the map before the SWA side reads it
    def free(self, free_index):
        self.full_attn_allocator.free(free_index)
        self._clear_mapping(free_index)
        self.free_swa(free_index)


@pytest.mark.parametrize(
    "cls, leaks", [(SWATokenToKVPoolAllocator, False), (BuggyFullFirst, True)]
)
def test_free_reads_the_map_before_it_is_cleared(cls, leaks):
    a = cls(32, 16, 4)
    held = {}
    extend(a, held, "r", 7)
    a.free(T(*held["r"]))
    assert a.full_available_size() == 32
    assert (a.swa_available_size() < 16) == leaks  # the buggy order leaks the SWA pages


def test_the_map_is_cleared_at_page_granularity():
    a = SWATokenToKVPoolAllocator(32, 16, 4)
    held = {}
    extend(a, held, "r", 8)
    a.free(T(held["r"][5]))  # one slot: its whole page goes back on both sides
    m = a.full_to_swa_index_mapping
    assert not m[T(*held["r"][4:8])].any() and (m[T(*held["r"][:4])] > 0).all()
    assert a.full_available_size() == 32 - 4 and a.swa_available_size() == 16 - 4


class BuggyFreesPadding(SWATokenToKVPoolAllocator):
    def free_swa(self, free_index):  # forgets that 0 means "no SWA slot"
        self.swa_attn_allocator.free(self.full_to_swa_index_mapping[free_index])
        self._clear_mapping(free_index)


@pytest.mark.parametrize("ps", [1, 4])
def test_padding_never_reaches_a_free_list_and_the_buggy_variant_is_caught(ps):
    for cls in (SWATokenToKVPoolAllocator, BuggyFreesPadding):
        a = cls(64, 32, ps, debug_mode=True)
        held = {}
        extend(a, held, "r", 20)
        # some SWA slots map to 0 now
        a.release_out_of_window(row(held["r"]), 0, 20, 0, sliding_window=6)
        if cls is BuggyFreesPadding:
            with pytest.raises(ValueError, match="padding"):
                a.free(T(*held["r"]))
            continue
        a.free(T(*held["r"]))
        a.check_books()
        assert a.swa_available_size() == 32 and a.full_available_size() == 64
        assert 0 not in a.swa_attn_allocator.free_pages.tolist()


@pytest.mark.parametrize("bad", [T(0), T(2), T(68)])
def test_freeing_padding_or_out_of_range_full_slots_is_refused(bad):
    a = SWATokenToKVPoolAllocator(64, 32, 4)
    held = {}
    extend(a, held, "r", 5)
    before = books(a)
    with pytest.raises(ValueError, match="free_index: cannot free page"):
        a.free(bad)
    assert unchanged(a, before)


def test_freeing_slots_from_another_device_is_refused():
    a = SWATokenToKVPoolAllocator(64, 32, 4)
    with pytest.raises(ValueError, match="free_index is on meta, the allocator on cpu"):
        a.free(torch.tensor([4], device="meta"))


def test_free_groups_release_both_sides_at_the_end():
    a = SWATokenToKVPoolAllocator(32, 16, 4)
    held = {}
    extend(a, held, "a", 4)
    extend(a, held, "b", 4)
    a.free_group_begin()
    a.free(T(*held["a"]))
    a.free(T(*held["b"]))
    assert a.full_available_size() == 24 and a.swa_available_size() == 8
    a.free_group_end()
    assert a.full_available_size() == 32 and a.swa_available_size() == 16


@pytest.mark.parametrize("ps", [1, 4])
def test_a_free_the_full_side_refuses_changes_neither_side(ps):
    a = SWATokenToKVPoolAllocator(32, 16, ps, debug_mode=True)
    held = {}
    extend(a, held, "a", 4)
    extend(a, held, "b", 4)
    gone = held.pop("b")
    a.free(T(*gone))
    before = books(a)
    with pytest.raises(ValueError, match="double free"):
        a.free(T(held["a"][0], gone[0]))  # a's page is held, b's is free already
    # a's SWA page was not given back, its map entries stand
    assert unchanged(a, before)
    a.check_books()


@pytest.mark.parametrize(
    "start, cut, message",
    [
        (0, slice(1, 5), "not page-aligned in memory"),
        (2, slice(0, 4), "page-aligned start"),
    ],
)
def test_a_free_segment_the_full_side_refuses_changes_neither_side(start, cut, message):
    a = SWATokenToKVPoolAllocator(32, 16, 4, debug_mode=True)
    held = {}
    extend(a, held, "a", 8)
    before = books(a)
    with pytest.raises(ValueError, match=message):
        a.free_segment(T(*held["a"][cut]), start)
    assert unchanged(a, before)  # the SWA side gave nothing back, its map entries stand
    a.check_books()


def test_freeing_slots_of_one_page_twice_in_a_call_clears_the_page_once():
    a = SWATokenToKVPoolAllocator(32, 16, 4, debug_mode=True)
    held = {}
    extend(a, held, "r", 8)
    # repeats: writing 0 twice is harmless
    a.free(T(held["r"][5], held["r"][6], held["r"][5]))
    m = a.full_to_swa_index_mapping
    assert not m[T(*held["r"][4:8])].any() and (m[T(*held["r"][:4])] > 0).all()
    assert a.full_available_size() == 28 and a.swa_available_size() == 12
    a.check_books()


# ---- out-of-window release ----------------------------------------------------------------
def test_release_frees_exactly_the_pages_wholly_outside_the_window():
    a = SWATokenToKVPoolAllocator(64, 32, 4, debug_mode=True)
    held = {}
    extend(a, held, "r", 23)  # SWA pages 1..6 (slots 4..27)
    swa = a.translate_loc_from_full_to_swa(T(*held["r"]))
    # the next query (position 23) reads positions >= 17: pages holding positions 0..15 are dead
    ev = a.release_out_of_window(row(held["r"]), 0, 23, 0, sliding_window=6)
    assert ev == 16
    # pages of positions 0..15
    assert a.swa_attn_allocator.free_pages[:4].tolist() == [1, 2, 3, 4]
    # full side keeps all
    assert a.swa_available_size() == 32 - 24 + 16 and a.full_available_size() == 64 - 24
    m = a.full_to_swa_index_mapping[T(*held["r"])]
    assert not m[:16].any() and torch.equal(m[16:], swa[16:])
    # 19 is mid-page: nothing new
    assert a.release_out_of_window(row(held["r"]), 0, 25, ev, 6) == 16
    # repeat: nothing twice
    assert a.release_out_of_window(row(held["r"]), 0, 23, 16, 6) == 16
    for _ in range(3):
        decode(a, held, ["r"])
    assert len(held["r"]) == 26
    # positions 16..19 now dead
    assert a.release_out_of_window(row(held["r"]), 0, 26, 16, 6) == 20
    a.check_books()


def test_release_keeps_what_the_prefix_cache_owns():
    a = SWATokenToKVPoolAllocator(64, 32, 4)
    held = {}
    extend(a, held, "r", 23)
    before = a.swa_available_size()
    # the first 8 tokens (page-aligned, as SGLang asserts) belong to the prefix cache
    assert (
        a.release_out_of_window(row(held["r"]), 0, 23, 0, 6, cache_protected_len=8)
        == 16
    )
    assert a.swa_available_size() == before + 8
    m = a.full_to_swa_index_mapping[T(*held["r"])]
    assert (m[:8] > 0).all() and not m[8:16].any()


def test_release_with_a_prefix_sharing_cache_keeps_a_whole_window_of_pages():
    # SGLang keeps ceil_align(max(window, page_size), page_size) tokens behind pre_len when the
    # cache shares prefixes: a key ending at the last page boundary still has a live window.
    for sharing, want in ((False, 16), (True, 12)):
        a = SWATokenToKVPoolAllocator(64, 32, 4)
        held = {}
        extend(a, held, "r", 23)
        # window 6: without sharing 23 - 6 = 17 -> 16; with it 23 - ceil_align(6, 4) = 15 -> 12
        assert (
            a.release_out_of_window(
                row(held["r"]), 0, 23, 0, 6, supports_prefix_sharing=sharing
            )
            == want
        )
    a = SWATokenToKVPoolAllocator(64, 32, 8)
    held = {}
    # window 3 < page 8: sharing keeps a whole page, 30 - 8 = 22 -> 16
    extend(a, held, "r", 30)
    assert (
        a.release_out_of_window(
            row(held["r"]), 0, 30, 0, 3, supports_prefix_sharing=True
        )
        == 16
    )
    # without sharing: 27 -> 24
    assert a.release_out_of_window(row(held["r"]), 0, 30, 16, 3) == 24


def test_release_needs_page_aligned_lengths():
    a = SWATokenToKVPoolAllocator(64, 32, 4)
    held = {}
    extend(a, held, "r", 23)
    with pytest.raises(ValueError, match="cache_protected_len 6 is not page-aligned"):
        a.release_out_of_window(row(held["r"]), 0, 23, 0, 6, cache_protected_len=6)


def test_release_needs_a_page_aligned_evicted_length():
    a = SWATokenToKVPoolAllocator(64, 32, 4)
    held = {}
    extend(a, held, "r", 23)
    with pytest.raises(ValueError, match="not page-aligned"):
        a.release_out_of_window(row(held["r"]), 0, 23, 3, 6)


def test_sglang_window_convention_keeps_position_seq_len_minus_window():
    # SGLang's sliding_window_size leaves the query out (config.sliding_window - 1): the query at
    # position seq_len reads seq_len - window .. seq_len - 1, so position seq_len - window stays.
    a = SWATokenToKVPoolAllocator(32, 16, 1, debug_mode=True)
    held = {}
    extend(a, held, "r", 10)
    assert a.release_out_of_window(row(held["r"]), 0, 10, 0, sliding_window=4) == 6
    assert (a.full_to_swa_index_mapping[T(*held["r"])] > 0).tolist() == [False] * 6 + [
        True
    ] * 4


# ---- per-request ring ---------------------------------------------------------------------
def test_ring_mode_counts_swa_capacity_in_request_rows():
    rt = ReqToTokenPool(5, 64)
    a = SWATokenToKVPoolAllocator(
        64, None, 4, req_to_token_pool=rt, swa_req_ring_size=10
    )
    assert a.swa_ring_cost == 12  # 10 rounded up to pages of 4
    assert (
        a.size_swa == 5 * 12
        and a.swa_available_size() == 60
        and a.swa_attn_allocator is None
    )
    rt.alloc_rows(2)
    assert a.swa_available_size() == 3 * 12
    # tokens are gated by the full side; rings by the rows
    assert a.available_size() == 64
    out = extend(a, {}, "r", 9)
    assert (
        a.full_available_size() == 64 - 12
        and not a.full_to_swa_index_mapping[:-1].any()
    )
    a.free(out)
    assert a.full_available_size() == 64


def test_ring_slots_cycle_inside_each_rows_ring():
    rt = ReqToTokenPool(5, 64)
    pool = SWAKVPool(
        64, None, 4, torch.float32, 1, 2, [1], [0], swa_req_ring_size=10, num_req_rows=5
    )
    a = SWATokenToKVPoolAllocator(64, None, 4, kvcache=pool, req_to_token_pool=rt)
    # + the padding page
    assert pool.size_swa == 60 and pool.swa_kv_pool.k_buffer[0].shape[0] == 64
    ids = a.ring_loc(T(1, 1, 1, 5), T(0, 11, 12, 11))
    # position 12 wraps to the ring's start
    assert ids.tolist() == [4, 4 + 11, 4, 4 + 4 * 12 + 11]
    w = a.write_loc(T(5, 6), req_pool_indices=T(2, 2), positions=T(0, 1))
    assert not w.physical and w.swa_loc.tolist() == [16, 17]
    pool.set_kv_buffer(0, w, torch.ones(2, 1, 2), torch.ones(2, 1, 2))
    assert pool.get_key_buffer(0)[16:18].all() and not pool.get_key_buffer(0)[:4].any()
    with pytest.raises(ValueError, match="ring"):
        a.write_loc(T(5))
    with pytest.raises(ValueError, match="ring_loc"):
        a.translate_loc_from_full_to_swa(T(5))


def test_ring_row_0_writes_only_the_padding_page():
    rt = ReqToTokenPool(3, 64)
    pool = SWAKVPool(
        64, None, 4, torch.float32, 1, 2, [1], [0], swa_req_ring_size=10, num_req_rows=3
    )
    a = SWATokenToKVPoolAllocator(64, None, 4, kvcache=pool, req_to_token_pool=rt)
    pos = torch.arange(30)
    assert (
        a.ring_loc(torch.zeros(30, dtype=torch.int64), pos).tolist()
        == (pos % 4).tolist()
    )
    # a padded entry (row 0) beside a real one: only the padding page and row 1's ring are written
    w = a.write_loc(T(5, 6), req_pool_indices=T(0, 1), positions=T(3, 3))
    pool.set_kv_buffer(0, w, torch.ones(2, 1, 2), torch.ones(2, 1, 2))
    written = (
        pool.get_key_buffer(0).reshape(pool.get_key_buffer(0).shape[0], -1).any(-1)
    )
    assert written.nonzero().reshape(-1).tolist() == [3, 4 + 3]


def test_the_pool_and_the_allocator_must_agree_on_the_swa_side():
    rt = ReqToTokenPool(5, 64)
    pool = SWAKVPool(
        64, None, 4, torch.float32, 1, 2, [1], [0], swa_req_ring_size=10, num_req_rows=4
    )
    with pytest.raises(
        ValueError, match="SWA pool holds 48 slots, the allocator's SWA side 60"
    ):
        # 4 rows vs 5
        SWATokenToKVPoolAllocator(64, None, 4, kvcache=pool, req_to_token_pool=rt)
    with pytest.raises(ValueError, match="ring size 8.*ring size 10"):
        SWATokenToKVPoolAllocator(
            64,
            None,
            4,
            kvcache=pool,
            req_to_token_pool=ReqToTokenPool(4, 64),
            swa_req_ring_size=8,
        )
    pool = SWAKVPool(64, 16, 4, torch.float32, 1, 2, [1], [0])
    with pytest.raises(
        ValueError, match="SWA pool holds 16 slots.*allocator's SWA side 32"
    ):
        SWATokenToKVPoolAllocator(64, 32, 4, kvcache=pool)
    with pytest.raises(
        ValueError, match="full pool holds 64 slots.*allocator's full side 32"
    ):
        SWATokenToKVPoolAllocator(32, 16, 4, kvcache=pool)
    with pytest.raises(ValueError, match="page_size 4.*page_size 2"):
        SWATokenToKVPoolAllocator(64, 16, 2, kvcache=pool)


def test_bad_construction():
    with pytest.raises(ValueError, match="req_to_token_pool is required"):
        SWATokenToKVPoolAllocator(64, None, 4, swa_req_ring_size=10)
    with pytest.raises(ValueError, match="size_swa is required"):
        SWATokenToKVPoolAllocator(64, None, 4)
    with pytest.raises(TypeError, match="SWAKVPool"):
        SWATokenToKVPoolAllocator(64, 32, 4, kvcache=object())
    with pytest.raises(ValueError, match="both full and SWA"):
        SWAKVPool(8, 8, 1, torch.float32, 1, 2, [0, 1], [1])
    with pytest.raises(ValueError, match="num_req_rows"):
        SWAKVPool(8, None, 1, torch.float32, 1, 2, [0], [1], swa_req_ring_size=4)


# ---- property test: both ledgers balance after every step ---------------------------------
def check_ledgers(a, held, evicted):
    ps = a.page_size
    m = a.full_to_swa_index_mapping
    live = [s for slots in held.values() for s in slots]
    full_held = {s // ps for s in live}
    swa_ids = [int(m[s]) for s in live if int(m[s]) > 0]
    assert len(set(swa_ids)) == len(swa_ids), (
        "an SWA slot is mapped from two full slots"
    )
    swa_held = {s // ps for s in swa_ids}
    for side, held_pages, n in (
        (a.full_attn_allocator, full_held, a.size_full // ps),
        (a.swa_attn_allocator, swa_held, a.size_swa // ps),
    ):
        free = side.get_all_free_pages().tolist()
        assert (
            0 not in free and len(set(free)) == len(free) and not set(free) & held_pages
        )
        assert len(free) + len(held_pages) == n, "free + held != capacity"
    # released positions map to nothing, the rest to an SWA slot
    for rid, slots in held.items():
        mapped = (m[T(*slots)] > 0).tolist()
        assert mapped == [p >= evicted[rid] for p in range(len(slots))]
    others = torch.ones(len(m) - 1, dtype=torch.bool)
    if live:
        others[T(*live)] = False
    assert not m[:-1][others].any(), "a slot no request holds still maps to an SWA slot"
    assert a.available_size() == min(a.full_available_size(), a.swa_available_size())
    a.check_books()


ops = st.lists(
    st.tuples(
        st.sampled_from(["new", "decode", "release", "finish"]), st.integers(0, 15)
    ),
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(
    ps=st.sampled_from([1, 4]),
    need_sort=st.booleans(),
    window=st.integers(1, 12),
    ops=ops,
)
def test_random_streams_keep_both_ledgers_balanced(ps, need_sort, window, ops):
    a = SWATokenToKVPoolAllocator(48, 24, ps, need_sort=need_sort, debug_mode=True)
    held, evicted, n = {}, {}, 0
    for op, k in ops:
        rids = sorted(held)
        before = books(a)
        if op == "new":
            n += 1
            if extend(a, held, n, k + 1) is None:
                assert unchanged(a, before)
            else:
                evicted[n] = 0
        elif op == "decode" and rids:
            batch = rids[: k % len(rids) + 1]
            if decode(a, held, batch) is None:
                assert unchanged(a, before)
        elif op == "release" and rids:
            r = rids[k % len(rids)]
            evicted[r] = a.release_out_of_window(
                row(held[r]), 0, len(held[r]), evicted[r], window
            )
            # whole pages only, and never a position the next query may read
            assert evicted[r] % ps == 0 and evicted[r] <= max(0, len(held[r]) - window)
        elif op == "finish" and rids:
            r = rids[k % len(rids)]
            a.free(T(*held.pop(r)))
            evicted.pop(r)
        check_ledgers(a, held, evicted)


def test_the_two_pool_sizes_add_up_side_by_side():
    """SGLang's ``SWAKVPool.get_kv_size_bytes``: K of both sub-pools, V of both sub-pools."""
    pool = SWAKVPool(16, 8, 4, torch.float32, 2, 4, [0], [1, 2])
    k_full, v_full = pool.full_kv_pool.get_kv_size_bytes()
    k_swa, v_swa = pool.swa_kv_pool.get_kv_size_bytes()
    assert pool.get_kv_size_bytes() == (k_full + k_swa, v_full + v_swa)
    assert k_full == (16 + 4) * 2 * 4 * 4 and k_swa == 2 * (8 + 4) * 2 * 4 * 4
