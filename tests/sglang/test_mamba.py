"""Mamba state: the slot allocator, the state pool, and the hybrid request table."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.common.models import LINEAR, QWEN3_NEXT_80B_A3B
from memlab.sglang.mamba import (
    HybridReqToTokenPool,
    MambaPool,
    MambaSlotAllocator,
    mamba_tracking_slots,
)
from memlab.sglang.req_to_token import Req

# two conv-state components, shared by every mamba layer (as SGLang's)
CONV = [(6, 3), (4, 2)]
TEMPORAL = (2, 3, 3)
LAYERS = 3


def make_pool(size=4, mamba_size=12, **kw):
    return HybridReqToTokenPool(
        size, 16, mamba_size, CONV, TEMPORAL, [1, 2, 5], debug_mode=True, **kw
    )


# ---- tracking slots -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, overlap, lazy", list(itertools.product([False, True], repeat=3))
)
def test_tracking_slot_counts_for_every_combination(extra, overlap, lazy):
    want = 0 if not extra else 1 if lazy else 2 if overlap else 1
    assert mamba_tracking_slots(extra, overlap, lazy) == want
    pool = make_pool(
        enable_mamba_extra_buffer=extra,
        enable_overlap_schedule=overlap,
        mamba_extra_buffer_lazy=lazy,
    )
    assert pool.mamba_initial_tracking_slots == want
    # the ping-pong buffer is sized for the full count even when lazy mode fills it late
    assert pool.mamba_ping_pong_track_buffer_size == (
        0 if not extra else 2 if overlap else 1
    )
    rows = pool.alloc([Req("a"), Req("b")])
    assert pool.mamba_allocator.available_size() == 12 - 2 * (1 + want)
    held = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[rows]
    assert int((held > 0).sum()) == 2 * want


# ---- the slot allocator -------------------------------------------------------------------
def test_slot_allocator_takes_the_head_and_frees_to_the_tail():
    a = MambaSlotAllocator(5)
    assert a.alloc(2).tolist() == [1, 2]  # slot 0 is padding
    a.free(torch.tensor([1]))
    # FIFO: the oldest free slots go out first
    assert a.free_slots.tolist() == [3, 4, 5, 1]
    assert a.alloc(0).numel() == 0 and a.available_size() == 4


@pytest.mark.parametrize("bad", [[0], [6], [-1]])
def test_freeing_padding_or_out_of_range_slots_is_refused(bad):
    a = MambaSlotAllocator(5)
    a.alloc(5)
    with pytest.raises(ValueError, match="slot 0 is padding"):
        a.free(torch.tensor(bad))
    assert a.available_size() == 0  # nothing changed


def test_double_free_is_caught_in_debug_mode():
    a = MambaSlotAllocator(4, debug_mode=True)
    s = a.alloc(2)
    a.free(s[:1])
    with pytest.raises(ValueError, match="freed twice"):
        a.free(s[:1])
    with pytest.raises(ValueError, match="freed twice"):
        a.free(torch.tensor([2, 2]))


def test_a_double_free_names_the_slot():
    a = MambaSlotAllocator(4, debug_mode=True)
    a.alloc(3)
    a.free(torch.tensor([2]))
    with pytest.raises(ValueError, match="mamba slot 2 freed twice"):
        a.free(torch.tensor([1, 2]))  # 2 is free already
    with pytest.raises(ValueError, match="mamba slot 3 freed twice"):
        a.free(torch.tensor([3, 3]))
    assert a.free_slots.tolist() == [4, 2]  # both refusals changed nothing


def test_bad_arguments():
    with pytest.raises(ValueError, match="size"):
        MambaSlotAllocator(0)
    with pytest.raises(ValueError, match="need_size"):
        MambaSlotAllocator(3).alloc(-1)
    with pytest.raises(TypeError, match="slots must hold int32/int64 ids"):
        MambaSlotAllocator(3).free(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="slots must be a torch.Tensor"):
        MambaSlotAllocator(3).free([1])


# ---- the state pool -----------------------------------------------------------------------
def test_conv_state_is_a_list_over_components_each_stacked_over_layers():
    p = MambaPool(4, LAYERS, CONV, TEMPORAL)
    # SGLang 0.5.23: (num_mamba_layers, size + 1, *shape) per conv component; slot 0 included
    assert [tuple(c.shape) for c in p.conv] == [(3, 5, 6, 3), (3, 5, 4, 2)]
    assert tuple(p.temporal.shape) == (3, 5, 2, 3, 3)
    conv, temporal = p.get_state(1)
    # views
    assert [c.data_ptr() for c in conv] == [
        p.conv[0][1].data_ptr(),
        p.conv[1][1].data_ptr(),
    ]
    assert temporal.shape == (5, 2, 3, 3)


class BuggyNoDeferredClear(HybridReqToTokenPool):
    # forgets the flag: the slot keeps its old state
    def execute_deferred_mamba_cow_and_clear(self, reqs):
        for r in reqs:
            r.kv.mamba_needs_clear = False


def _reuse_sees_stale_state(pool_cls):
    pool = pool_cls(2, 8, 1, CONV, TEMPORAL, [1, 2, 5])
    a = Req("a")
    pool.alloc([a])
    s = a.kv.mamba_pool_idx.reshape(1)
    pool.mamba_pool.conv[1][:, s] = 7  # a's recurrent state
    pool.mamba_pool.temporal[:, s] = 3
    pool.free_mamba_cache(a)
    pool.free(a)
    b = Req("b")
    pool.alloc([b])
    # the only slot comes back, marked
    assert int(b.kv.mamba_pool_idx) == int(s) and b.kv.mamba_needs_clear
    pool.execute_deferred_mamba_cow_and_clear([b])  # before b's first extend
    assert not b.kv.mamba_needs_clear
    return bool(
        pool.mamba_pool.conv[1][:, s].any() or pool.mamba_pool.temporal[:, s].any()
    )


def test_a_new_slot_is_zeroed_before_its_first_extend_and_the_buggy_pool_is_caught():
    assert not _reuse_sees_stale_state(HybridReqToTokenPool)
    assert _reuse_sees_stale_state(BuggyNoDeferredClear)


def test_a_cached_state_copied_in_wins_over_the_clear():
    pool = make_pool(mamba_size=4)
    a, b = Req("a"), Req("b")
    pool.alloc([a, b])
    pool.mamba_pool.temporal[:, a.kv.mamba_pool_idx] = (
        5.0  # a cached state, say a tree's
    )
    pool.mamba_pool.temporal[:, b.kv.mamba_pool_idx] = (
        9.0  # the slot's previous owner's
    )
    b.kv.mamba_cow_src_index = a.kv.mamba_pool_idx.reshape(1)
    pool.execute_deferred_mamba_cow_and_clear([a, b])
    # a's new slot: zeroed
    assert not pool.mamba_pool.temporal[:, a.kv.mamba_pool_idx].any()
    # copied from a, after a's clear
    assert (pool.mamba_pool.temporal[:, b.kv.mamba_pool_idx] == 0).all()
    assert b.kv.mamba_cow_src_index is None and not b.kv.mamba_needs_clear


def test_copy_slots_copies_every_layer():
    p = MambaPool(3, LAYERS, CONV, TEMPORAL)
    a, b = torch.tensor([1]), torch.tensor([2])
    for i, c in enumerate(p.conv):
        c[:, a] = torch.arange(3.0).view(3, 1, 1, 1).to(c.dtype) + i
    p.temporal[:, a] = torch.arange(3.0).view(3, 1, 1, 1, 1)
    p.copy_slots(a, b)
    assert all(torch.equal(c[:, a], c[:, b]) for c in p.conv) and torch.equal(
        p.temporal[:, a], p.temporal[:, b]
    )
    with pytest.raises(ValueError, match="copy of 1 slots into 2"):
        p.copy_slots(a, torch.tensor([1, 2]))


def test_move_slots_copies_then_clears_the_source_with_every_attached_state():
    p = MambaPool(4, LAYERS, CONV, TEMPORAL)
    extra = torch.zeros(5, 2)
    p.register_slot_state(extra)
    src = torch.tensor([1, 2])
    for i, c in enumerate(p.conv):
        c[:, src] = (
            torch.tensor([10.0 + i, 20.0 + i])
            .view(1, 2, *([1] * (c.dim() - 2)))
            .to(c.dtype)
        )
    p.temporal[:, src] = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1, 1)
    extra[src] = torch.tensor([[5.0, 5.0], [6.0, 6.0]])
    # overlapping: slot 2 is a destination and a source; it must end up holding slot 1's state
    dst = torch.tensor([2, 3])
    old = ([c.clone() for c in p.conv], p.temporal.clone(), extra.clone())
    p.move_slots(src, dst)
    for c, o in zip(p.conv, old[0]):
        assert torch.equal(c[:, dst], o[:, src]) and not c[:, 1].any()
    assert (
        torch.equal(p.temporal[:, dst], old[1][:, src]) and not p.temporal[:, 1].any()
    )
    assert torch.equal(extra[dst], old[2][src]) and not extra[1].any()
    with pytest.raises(ValueError, match="move of 2 slots into 1"):
        p.move_slots(dst, torch.tensor([1]))


class Recorder:
    def __init__(self):
        self.calls = []

    def clear_slots(self, s):
        self.calls.append(("clear", s.tolist()))

    def copy_slots(self, src, dst):
        self.calls.append(("copy", src.tolist(), dst.tolist()))


def test_registered_states_ride_along_with_the_slot():
    p = MambaPool(3, LAYERS, CONV, TEMPORAL)
    extra = torch.zeros(4, 5)
    rec = Recorder()
    p.register_slot_state(extra)
    p.register_slot_state(rec)
    a, b = torch.tensor([1]), torch.tensor([2])
    extra[a] = 9
    p.copy_slots(a, b)
    assert torch.equal(extra[b], extra[a])
    p.clear_slots(a)
    assert not extra[a].any() and extra[b].all()  # cleared with its slot
    assert rec.calls == [("copy", [1], [2]), ("clear", [1])]
    with pytest.raises(ValueError, match="4 rows"):
        p.register_slot_state(torch.zeros(3))
    with pytest.raises(TypeError):
        p.register_slot_state(object())


def test_bytes_per_slot_match_the_model_table():
    m, tp = QWEN3_NEXT_80B_A3B, 16
    n = len(m.layer_ids(LINEAR))
    p = MambaPool(
        1,
        n,
        [m.conv_state_shape(tp)],
        m.temporal_state_shape(tp),
        torch.bfloat16,
        torch.float32,
    )
    assert p.bytes_per_slot() == m.state_bytes_per_request(2, 4, tp)


# ---- the hybrid request table -------------------------------------------------------------
def test_dense_map_from_model_layers_to_mamba_layers():
    m = QWEN3_NEXT_80B_A3B
    ids = m.layer_ids(LINEAR)
    pool = HybridReqToTokenPool(2, 8, 2, [(4, 3)], (1, 2, 2), ids)
    assert [pool.mamba_layer_index(i) for i in (0, 1, 2, 4, 46)] == [0, 1, 2, 3, 35]
    conv, temporal = pool.mamba2_layer_cache(46)
    assert conv[0].data_ptr() == pool.mamba_pool.conv[0][
        35
    ].data_ptr() and temporal.shape == (3, 1, 2, 2)
    with pytest.raises(ValueError, match="layer 3 is not a mamba layer"):
        pool.mamba_layer_index(3)  # a full-attention layer


def test_rows_come_with_state_slots_all_or_nothing():
    pool = make_pool(
        size=4,
        mamba_size=3,
        enable_mamba_extra_buffer=True,
        enable_overlap_schedule=True,
    )
    reqs = [Req("a")]
    # 1 state + 2 ping-pong slots: the whole mamba pool
    assert pool.alloc(reqs) is not None
    assert reqs[0].kv.mamba_needs_clear and reqs[
        0
    ].kv.mamba_ping_pong_track_buffer.tolist() == [2, 3]
    gen = pool.req_generation.clone()
    assert pool.alloc([Req("b")]) is None  # rows are free, state slots are not
    assert pool.available_size() == 3 and torch.equal(pool.req_generation, gen)


def test_a_continuing_chunked_prefill_keeps_row_and_slots():
    pool = make_pool()
    r = Req("a")
    pool.alloc([r])
    slot = pool.get_mamba_indices([r.kv.req_pool_idx]).item()
    r.kv.kv_allocated_len = 5
    pool.execute_deferred_mamba_cow_and_clear([r])
    free_before = pool.mamba_allocator.available_size()
    pool.alloc([r, Req("b")])
    assert (
        pool.get_mamba_indices([r.kv.req_pool_idx]).item() == slot
        and not r.kv.mamba_needs_clear
    )
    assert pool.mamba_allocator.available_size() == free_before - 1


def test_free_gives_back_the_row_only_and_alloc_reuses_the_state_still_held():
    pool = make_pool(enable_mamba_extra_buffer=True)
    r = Req("a")
    pool.alloc([r])
    state, tracking = (
        int(r.kv.mamba_pool_idx),
        r.kv.mamba_ping_pong_track_buffer.tolist(),
    )
    pool.execute_deferred_mamba_cow_and_clear([r])
    slots_free = pool.mamba_allocator.available_size()
    # e.g. a tree adopts the state: the row goes, the state stays with the request
    pool.free(r)
    assert (
        not r.kv.holds_kv
        and r.kv.holds_mamba
        and pool.mamba_allocator.available_size() == slots_free
    )
    # back again: a new row, the same state and tracking slots, no clear
    rows = pool.alloc([r])
    assert pool.get_mamba_indices(rows).item() == state and not r.kv.mamba_needs_clear
    assert (
        pool.req_index_to_mamba_ping_pong_track_buffer_mapping[rows[0]].tolist()
        == tracking
    )
    assert pool.mamba_allocator.available_size() == slots_free
    pool.free_mamba_cache(r)
    pool.free(r)
    # the state first, at the tail
    assert pool.mamba_allocator.free_slots.tolist()[-3:] == [state] + tracking
    with pytest.raises(ValueError, match="holds no mamba state"):
        pool.free_mamba_cache(r)


def test_free_mamba_cache_keeps_the_tracking_slot_a_tree_adopted():
    pool = make_pool(enable_mamba_extra_buffer=True)
    r = Req("a")
    pool.alloc([r])
    a, b = r.kv.mamba_ping_pong_track_buffer.tolist()
    pool.free_mamba_cache(r, mamba_ping_pong_track_buffer_to_keep=1)
    assert (
        a in pool.mamba_allocator.free_slots.tolist()
        and b not in pool.mamba_allocator.free_slots.tolist()
    )
    assert (
        r.kv.mamba_ping_pong_track_buffer is None
        and pool.held_mamba_slots().numel() == 0
    )
    with pytest.raises(ValueError, match="cannot keep ping-pong entry 1 of 1"):
        q = Req("q")
        single = make_pool(
            enable_mamba_extra_buffer=True, enable_overlap_schedule=False
        )
        single.alloc([q])
        single.free_mamba_cache(q, 1)


def test_ping_pong_alternates_under_overlap_and_not_without():
    pool = make_pool(enable_mamba_extra_buffer=True, enable_overlap_schedule=True)
    (row,) = pool.alloc([Req("a")])
    a, b = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist()
    assert [pool.next_track_slots([row]).item() for _ in range(4)] == [a, b, a, b]
    single = make_pool(enable_mamba_extra_buffer=True, enable_overlap_schedule=False)
    (row,) = single.alloc([Req("a")])
    (c,) = single.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist()
    assert [single.next_track_slots([row]).item() for _ in range(3)] == [c, c, c]
    with pytest.raises(ValueError, match="enable_mamba_extra_buffer"):
        make_pool().next_track_slots([1])


def test_lazy_mode_adds_the_second_slot_when_needed():
    pool = make_pool(
        mamba_size=5, enable_mamba_extra_buffer=True, mamba_extra_buffer_lazy=True
    )
    q1, q2 = Req("a"), Req("b")
    r1, r2 = pool.alloc([q1, q2])  # 2 x (state + 1 tracking) = 4 of 5 slots
    pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping
    assert pp[r1, 1].item() == -1  # not taken yet (SGLang marks it -1 too)
    pool.next_track_slots([r1])
    with pytest.raises(ValueError, match="ensure_tracking_slots"):
        pool.next_track_slots([r1])  # the second buffer does not exist yet
    assert pool.ensure_tracking_slots([q1]) and pp[r1, 1].item() > 0
    assert q1.kv.mamba_ping_pong_track_buffer[1].item() == pp[r1, 1].item()
    before = pp.clone()
    assert not pool.ensure_tracking_slots([q2])  # pool empty: refused, nothing changed
    assert torch.equal(pp, before)


def test_ensure_tracking_slots_takes_one_slot_per_row_even_for_a_repeated_row():
    pool = make_pool(
        mamba_size=6, enable_mamba_extra_buffer=True, mamba_extra_buffer_lazy=True
    )
    q = Req("a")
    pool.alloc([q])  # state + 1 tracking slot
    free = pool.mamba_allocator.available_size()
    assert pool.ensure_tracking_slots([q, q])
    # one missing slot, one taken: no leak
    assert pool.mamba_allocator.available_size() == free - 1
    held = pool.held_mamba_slots().tolist()
    assert len(held) + pool.mamba_allocator.available_size() == 6


def test_track_state_snapshots_into_the_tracking_slot():
    pool = make_pool(enable_mamba_extra_buffer=True)
    (row,) = pool.alloc([Req("a")])
    main = pool.get_mamba_indices([row])
    pool.mamba_pool.temporal[:, main] = 5.0
    dst = pool.track_state([row], [37])
    assert torch.equal(
        pool.mamba_pool.temporal[:, dst], pool.mamba_pool.temporal[:, main]
    )
    assert (
        pool.mamba_last_track_seqlen[row].item() == 37
        and pool.mamba_next_track_idx[row].item() == 1
    )


def fresh_row(pool, row) -> bool:
    return (
        pool.req_index_to_mamba_index_mapping[row].item() == 0
        and not pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].any()
        and pool.mamba_next_track_idx[row].item() == 0
        and pool.mamba_last_track_seqlen[row].item() == -1
    )


class BuggyPartialReset(HybridReqToTokenPool):
    def _reset_rows(self, rows):  # forgets the ping-pong index and the tracked length
        self.req_index_to_mamba_index_mapping[rows] = 0
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[rows] = 0


def _reused_row_is_clean(cls) -> bool:
    pool = cls(1, 16, 6, CONV, TEMPORAL, [1, 2, 5], enable_mamba_extra_buffer=True)
    r = Req("a")
    (row,) = pool.alloc([r])
    pool.track_state([row], [12])  # ping-pong index now 1
    pool.free_mamba_cache(r)
    pool.free(r)
    clean_after_free = fresh_row(pool, row)
    (row2,) = pool.alloc([Req("b")])
    first = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row2, 0].item()
    return (
        clean_after_free
        and pool.next_track_slots([row2]).item() == first
        and pool.mamba_last_track_seqlen[row2].item() == -1
    )


def test_a_freed_row_carries_no_stale_slot_and_the_partial_reset_is_caught():
    assert _reused_row_is_clean(HybridReqToTokenPool)
    assert not _reused_row_is_clean(BuggyPartialReset)


def test_free_returns_every_slot_and_refuses_bad_rows():
    pool = make_pool(enable_mamba_extra_buffer=True)
    r = Req("a")
    pool.alloc([r])
    row = r.kv.req_pool_idx
    pool.free_mamba_cache(r)
    pool.free(r)
    assert (
        r.kv.req_pool_idx is None
        and fresh_row(pool, row)
        and pool.mamba_allocator.available_size() == 12
    )
    with pytest.raises(ValueError, match="row 0 is padding"):
        pool.free(0)
    pool.clear()
    assert pool.available_size() == 4 and pool.mamba_allocator.available_size() == 12


def test_a_refused_state_free_changes_nothing():
    pool = make_pool(enable_mamba_extra_buffer=True)
    r = Req("a")
    (row,) = pool.alloc([r])
    slot = pool.get_mamba_indices([row])
    # a bookkeeping bug elsewhere: the request's state slot is free already
    pool.mamba_allocator.free(slot)
    rows_free, mapping = (
        list(pool.free_slots),
        pool.req_index_to_mamba_index_mapping.clone(),
    )
    pp, slots_free = (
        pool.req_index_to_mamba_ping_pong_track_buffer_mapping.clone(),
        pool.mamba_allocator.available_size(),
    )
    with pytest.raises(ValueError, match=f"mamba slot {slot.item()} freed twice"):
        pool.free_mamba_cache(r)
    # the row is still held
    assert pool.free_slots == rows_free and row not in pool.free_slots
    assert (
        torch.equal(pool.req_index_to_mamba_index_mapping, mapping) and r.kv.holds_mamba
    )
    assert torch.equal(pool.req_index_to_mamba_ping_pong_track_buffer_mapping, pp)
    assert pool.mamba_allocator.available_size() == slots_free


def test_bad_construction():
    with pytest.raises(ValueError, match="repeated"):
        HybridReqToTokenPool(2, 8, 4, CONV, TEMPORAL, [0, 1, 1])
    with pytest.raises(ValueError, match="at least one mamba layer"):
        HybridReqToTokenPool(2, 8, 4, CONV, TEMPORAL, [])
    with pytest.raises(ValueError, match="conv-state components"):
        MambaPool(2, 3, [], TEMPORAL)


# ---- property test: both ledgers balance after every step ---------------------------------
ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "track", "lazy"]), st.integers(0, 3)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, extra=st.booleans(), overlap=st.booleans(), lazy=st.booleans())
def test_random_streams_keep_both_ledgers_balanced(ops, extra, overlap, lazy):
    pool = HybridReqToTokenPool(
        5,
        8,
        9,
        CONV,
        TEMPORAL,
        [1, 2, 5],
        enable_mamba_extra_buffer=extra,
        enable_overlap_schedule=overlap,
        mamba_extra_buffer_lazy=lazy,
        debug_mode=True,
    )
    live = []
    for op, k in ops:
        if op == "alloc":
            reqs = [Req(f"r{len(live)}-{i}") for i in range(k)]
            if pool.alloc(reqs) is not None:
                live += reqs
        elif op == "free" and live:
            r = live.pop(k % len(live))
            pool.free_mamba_cache(r)
            pool.free(r)
        elif op == "track" and live and extra:
            row = live[k % len(live)].kv.req_pool_idx
            if bool(
                pool.req_index_to_mamba_ping_pong_track_buffer_mapping[
                    row, pool.mamba_next_track_idx[row]
                ]
                > 0
            ):
                pool.track_state([row], [k])
        elif op == "lazy" and live and extra:
            pool.ensure_tracking_slots([live[k % len(live)]])
        # rows: free + held == capacity; mamba slots likewise, none held twice, none both
        assert pool.available_size() + len(live) == 5
        held = pool.held_mamba_slots().tolist()
        free = pool.mamba_allocator.free_slots.tolist()
        assert (
            len(set(held)) == len(held) and not set(held) & set(free) and 0 not in free
        )
        assert len(held) + len(free) == 9
        for row in pool.free_slots:
            assert fresh_row(pool, row)
        for r in live:
            assert (
                pool.req_index_to_mamba_index_mapping[r.kv.req_pool_idx].item()
                == int(r.kv.mamba_pool_idx)
                > 0
            )
