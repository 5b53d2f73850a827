"""memlab.sglang.unified (chapter 12): one byte buffer, two ends, virtual pages bound to physical
ones.

The step-by-step agreement with SGLang 0.5.23 is tests/engines/sglang/test_unified.py; here are
the arithmetic by hand, the bytes themselves (written through the views, moved by compaction,
read back through the translation), the write door, the refusals, and the debug books.
"""

import pytest
import torch

from memlab.sglang.kv_pool import MHATokenToKVPool
from memlab.sglang.swa import SWAKVPool
from memlab.sglang.unified import (
    MambaSubPoolSpec,
    MHASubPoolSpec,
    MLASubPoolSpec,
    MultiEndedAllocator,
    UnifiedKVPool,
    UnifiedMHATokenToKVPool,
    UnifiedSWAKVPool,
    UnifiedSWATokenToKVPoolAllocator,
    reserved_floor_bytes,
    translate_token_ids,
)
from memlab.sglang.write_loc import KVWriteLoc


def T(*xs):
    return torch.tensor(xs, dtype=torch.int64)


def mha(name, grow, layers=1, heads=1, d=16, dtype=torch.bfloat16):
    return MHASubPoolSpec(
        name=name,
        layer_num=layers,
        head_num=heads,
        head_dim=d,
        store_dtype=dtype,
        grow_direction=grow,
    )


def swa_setup(total=4096, ps=2, full_d=16, swa_d=8, debug=True, backend="torch"):
    """full: 1 layer of K+V bf16, 64 B an entry (16 dims); swa: 2 layers, 64 B (8 dims)."""
    pool = UnifiedKVPool(
        total_bytes=total,
        sub_pool_specs=[
            mha("full", "down", 1, 1, full_d),
            mha("swa", "up", 2, 1, swa_d),
        ],
        page_size=ps,
    )
    kv = UnifiedSWAKVPool(
        unified_buffer=pool,
        full_attention_layer_ids=[1],
        swa_attention_layer_ids=[0, 2],
        page_size=ps,
    )
    return (
        pool,
        kv,
        UnifiedSWATokenToKVPoolAllocator(
            unified_buffer=pool,
            kvcache=kv,
            page_size=ps,
            debug_mode=debug,
            backend=backend,
        ),
    )


# -- the buffer ------------------------------------------------------------------------------


def test_entry_bytes_and_the_floor_by_hand():
    full = mha("full", "down", layers=3, heads=2, d=8)  # 3 x 2 x (8 + 8) x 2 B = 192
    assert full.entry_bytes() == 192
    # 32 B; 1 x 1 x 12 x 2 = 48 would round to 64
    odd = mha("swa", "up", layers=1, heads=1, d=8)
    assert odd.entry_bytes() == 32 and mha("x", "up", d=12).entry_bytes() == 64
    mla = MLASubPoolSpec(
        name="mla",
        layer_num=2,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        store_dtype=torch.bfloat16,
        grow_direction="down",
    )
    assert mla.entry_bytes() == 2 * 576 * 2
    mamba = MambaSubPoolSpec(
        name="m",
        layer_num=2,
        conv_state_shapes=((3, 5),),
        conv_dtype=torch.bfloat16,
        temporal_state_shape=(2, 3),
        temporal_dtype=torch.float32,
        grow_direction="up",
    )
    assert mamba.entry_bytes() == 2 * (15 * 2 + 6 * 4) == 108  # not aligned
    # The sink: page 0 of every paged sub-pool, a Mamba entry once.
    assert reserved_floor_bytes([full, odd], 4) == 4 * 192
    assert reserved_floor_bytes([full, mamba], 4) == 4 * 192
    assert reserved_floor_bytes([odd, mamba], 1) == 108
    pool = UnifiedKVPool(total_bytes=4096, sub_pool_specs=[odd, full], page_size=4)
    # low byte to high: up, then down
    assert [s.name for s in pool.sub_pool_specs] == ["swa", "full"]
    assert pool.max_slots("full") == 4096 // 192 and pool.min_slot_index("full") == 4
    assert pool.max_slots("swa") == 128 and pool.min_slot_index("swa") == 4 * 192 // 32


def test_views_put_slot_t_at_t_times_entry_bytes():
    pool = UnifiedKVPool(
        total_bytes=2048,
        sub_pool_specs=[mha("full", "down", layers=2, heads=1, d=8), mha("swa", "up")],
        page_size=1,
    )
    k, v = pool.mha_views_for("full")
    e = pool.spec("full").entry_bytes()  # 2 layers x (16 + 16) = 64
    k[1][5] = torch.full((1, 8), 1.5, dtype=torch.bfloat16)  # slot 5, layer 1, K
    v[0][5] = torch.full((1, 8), -2.0, dtype=torch.bfloat16)  # slot 5, layer 0, V
    raw = pool._raw
    # layer 1 starts 32 B in
    assert raw[5 * e + 32 : 5 * e + 48].view(torch.bfloat16).tolist() == [1.5] * 8
    # V after layer 0's K
    assert raw[5 * e + 16 : 5 * e + 32].view(torch.bfloat16).tolist() == [-2.0] * 8
    # nothing else was touched
    assert int(raw.view(torch.bfloat16).count_nonzero()) == 16
    # The other sub-pool's slot 10 starts at byte 10 x 32: the same bytes, another stride.
    ks, _ = pool.mha_views_for("swa")
    assert (
        ks[0].data_ptr() == raw.data_ptr()
        and ks[0].stride(0) * 2 == pool.spec("swa").entry_bytes()
    )


def test_bad_pools_are_refused_by_name():
    with pytest.raises(ValueError, match="grow_direction 'float': 'up' or 'down'"):
        mha("x", "float")
    with pytest.raises(ValueError, match="one 'up' and one 'down'"):
        UnifiedKVPool(total_bytes=1024, sub_pool_specs=[mha("a", "up"), mha("b", "up")])
    with pytest.raises(ValueError, match="unique"):
        UnifiedKVPool(
            total_bytes=1024, sub_pool_specs=[mha("a", "up"), mha("a", "down")]
        )
    with pytest.raises(RuntimeError, match="Increase total_bytes"):
        UnifiedKVPool(
            total_bytes=256,
            sub_pool_specs=[mha("a", "up"), mha("b", "down", d=64)],
            page_size=2,
        )
    with pytest.raises(ValueError, match="stored as torch.uint8"):
        MHASubPoolSpec(
            name="f",
            layer_num=1,
            head_num=1,
            head_dim=8,
            store_dtype=torch.float8_e4m3fn,
            kv_cache_dtype=torch.float8_e4m3fn,
            grow_direction="up",
        )
    pool = UnifiedKVPool(
        total_bytes=4096, sub_pool_specs=[mha("a", "up", d=4), mha("b", "down")]
    )
    with pytest.raises(ValueError, match="without --enable-unified-memory"):
        pool.mha_views_for("a")  # an 8-byte row
    with pytest.raises(ValueError, match="only a non-owner"):
        MultiEndedAllocator(
            kvcache=None,
            unified_buffer=pool,
            sub_pool_name="b",
            is_id_owner=True,
            virtual_num_pages=9,
        )


# -- two ends, capacity in bytes -------------------------------------------------------------


def end_pair(total=2048, ps=1, e_down=16, e_up=8, debug=True):
    pool = UnifiedKVPool(
        total_bytes=total,
        sub_pool_specs=[mha("full", "down", d=e_down), mha("swa", "up", d=e_up)],
        page_size=ps,
    )

    def mk(name):
        return MultiEndedAllocator(
            kvcache=None,
            unified_buffer=pool,
            sub_pool_name=name,
            is_id_owner=True,
            page_size=ps,
            debug_mode=debug,
        )

    down, up = mk("full"), mk("swa")
    down.bind_peer(up), up.bind_peer(down)
    return pool, down, up


def test_two_ends_grow_toward_each_other_and_share_the_gap():
    # 2048 B; full entries 64 B (32 slots), swa 32 B (64 slots); floor 64 B
    pool, down, up = end_pair()
    assert (down.min_page_index, up.min_page_index) == (1, 2)
    gap = 2048 - 64
    assert down._current_gap_bytes() == up._current_gap_bytes() == gap
    assert (
        down.available_size() == gap // 64 == 31
        and up.available_size() == gap // 32 == 62
    )
    v = down.alloc(3)
    # from the top
    assert v.tolist() == [1, 2, 3] and down.translate_kv_loc(v).tolist() == [29, 30, 31]
    w = up.alloc(4)
    # from byte 64
    assert w.tolist() == [2, 3, 4, 5] and up.translate_kv_loc(w).tolist() == [
        2,
        3,
        4,
        5,
    ]
    gap -= 3 * 64 + 4 * 32
    assert down._current_gap_bytes() == up._current_gap_bytes() == gap
    assert (down.available_size(), up.available_size()) == (gap // 64, gap // 32)
    # One side takes the whole gap: the other is refused, and the refusal changes nothing.
    assert up.alloc(up.available_size()) is not None and down.available_size() == 0
    before = (
        down.free_virtual_ids.clone(),
        down.virtual_to_physical.clone(),
        down.watermark_physical,
    )
    assert down.alloc(1) is None
    assert torch.equal(before[0], down.free_virtual_ids) and torch.equal(
        before[1], down.virtual_to_physical
    )
    assert before[2] == down.watermark_physical


def test_a_free_compacts_at_once_and_rewrites_only_the_tables():
    _, down, up = end_pair(ps=2)
    # full pages 15,14 | 13 | 12,11 (from the top)
    a, b, c = (down.alloc(4), down.alloc(2), down.alloc(4))
    assert down.translate_kv_loc(c).tolist() == [22, 23, 24, 25]
    # pages 14, 15 become holes; the two live pages at the bottom (11, 12) move up into them
    down.free(a)
    assert down.translate_kv_loc(c).tolist() == [
        28,
        29,
        30,
        31,
    ] and down.translate_kv_loc(b).tolist() == [26, 27]
    # the virtual ids never change: the request table stays valid
    assert c.tolist() == [8, 9, 10, 11]
    assert down.used_page_range() == (13, 16) and down.watermark_physical == 12
    assert down.translate_kv_loc(a).tolist() == [0, 0, 0, 0]  # unbound: the sink
    # a's pages, at the back of the list (FIFO)
    assert down.free_virtual_ids.tolist()[-2:] == [1, 2]
    down.check_books()


def test_compaction_moves_the_bytes_with_the_pages():
    pool, kv, al = swa_setup(ps=2)
    full = kv.full_kv_pool
    a, b = al.alloc(4), al.alloc(2)
    k = torch.arange(2 * 16, dtype=torch.bfloat16).reshape(2, 1, 16)
    kv.set_kv_buffer(1, al.write_loc(b), k, -k)
    al.free(a)  # b's pages move on both sides
    kb = full.get_key_buffer(0)[al.translate_kv_loc(b)]
    assert torch.equal(kb, k) and torch.equal(
        full.get_value_buffer(0)[al.translate_kv_loc(b)], -k
    )


def test_translation_sends_the_unbound_and_the_out_of_range_to_the_sink():
    # page 0 sink, virtual page 1 -> 5, 2 unbound, 3 -> 2; last: the -1 sentinel
    v2p = T(0, 5, -1, 2, -1)
    got = translate_token_ids(T(0, 1, 2, 3, 4, 5, 6, 7, 9, -1, -3, 99), v2p, 2)
    assert got.tolist() == [0, 1, 10, 11, 0, 0, 4, 5, 0, 0, 0, 0]
    assert translate_token_ids(T(1, 3), v2p, 1).tolist() == [5, 2]
    assert translate_token_ids(T(1, 3)[:0], v2p, 4).tolist() == []


def test_a_double_free_is_caught_as_sglang_does():
    _, down, _ = end_pair()
    v = down.alloc(2)
    down.free(v)
    with pytest.raises(AssertionError, match="double free"):
        down.free(v)


def test_the_debug_books_catch_a_corrupt_table():
    _, down, up = end_pair(ps=2)
    v = down.alloc(4)
    down.check_books()
    down.physical_to_virtual[down.virtual_to_physical[v[0] // 2]] = 9
    with pytest.raises(AssertionError, match="disagree"):
        down.check_books()
    up.alloc(2)
    up.watermark_physical += 1  # claims a page nobody bound
    with pytest.raises(AssertionError, match="not the run"):
        up.check_books()


def test_virtual_ids_come_from_the_chapter_04_kernel_path():
    """alloc_extend / alloc_decode run the paged allocator's backends on the virtual free list;
    the Triton kernel (interpreter here) and the torch reference hand out the same ids and pages."""
    outs = []
    for backend in ("triton", "torch"):
        _, _, al = swa_setup(ps=4, backend=backend)
        fa = al.full_attn_allocator
        first = al.alloc_extend(T(0, 0), T(0, 0), T(6, 3), T(6, 3), T(-1, -1), 9)
        # continues the partly filled page
        nxt = al.alloc_extend(T(6), T(6), T(9), T(9), first[5:6], 3)
        dec = al.alloc_decode(T(10, 4), T(10, 4), torch.cat((nxt[-1:], first[-1:])))
        outs.append(
            (
                first.tolist(),
                nxt.tolist(),
                dec.tolist(),
                fa.virtual_to_physical.tolist(),
                al.swa_attn_allocator.virtual_to_physical.tolist(),
            )
        )
        al.check_books()
    assert outs[0] == outs[1]
    first, nxt, dec, _, _ = outs[0]
    assert (
        first == [4, 5, 6, 7, 8, 9, 12, 13, 14]
        and nxt == [10, 11, 16]
        and dec == [17, 15]
    )


def test_zeroed_pages_on_hand_out():
    pool, kv, al = swa_setup(ps=2)
    pool._raw.fill_(0x7F)  # as if another sub-pool left bytes here
    v = al.alloc(2)
    full, swa = kv.full_kv_pool, kv.swa_kv_pool
    assert not full.get_key_buffer(0)[al.translate_kv_loc(v)].any()
    assert not swa.get_key_buffer(0)[al.translate_loc_from_full_to_swa(v)].any()


# -- the SWA composite -----------------------------------------------------------------------


def test_one_virtual_id_two_physical_slots_and_no_mapping_table():
    _, _, al = swa_setup(ps=2)
    assert not hasattr(al, "full_to_swa_index_mapping")
    fa, sa = al.full_attn_allocator, al.swa_attn_allocator
    assert (
        sa.num_virtual_ids == fa.num_virtual_ids
        and not sa.is_id_owner
        and len(sa.free_virtual_ids) == 0
    )
    v = al.alloc(4)
    assert al.translate_kv_loc(v).tolist() == [60, 61, 62, 63]  # full: from the top
    # swa: from the bottom, same ids
    assert al.translate_loc_from_full_to_swa(v).tolist() == [2, 3, 4, 5]
    pages = (v[::2] // 2).tolist()
    # the SWA v2p IS the full -> SWA map
    assert sa.virtual_to_physical[pages].tolist() == [1, 2]


def test_joint_capacity_costs_both_entries():
    # full 64 B, swa 2 x 64 = 128 B an entry
    _, _, al = swa_setup(total=4096, ps=1, full_d=16, swa_d=16)
    fa, sa = al.full_attn_allocator, al.swa_attn_allocator
    gap = fa._current_gap_bytes()
    assert al.available_size() == gap // (64 + 128)
    assert (
        al.full_available_size() == gap // 64 and al.swa_available_size() == gap // 128
    )
    v = al.alloc(al.available_size())
    assert al.alloc(1) is None and al.available_size() == 0
    al.free_swa(v[:4])  # out of the window: only the SWA bytes come back
    assert al.available_size() == (fa._current_gap_bytes()) // (64 + 128)
    assert al.ensure_capacity(1, 0) is (fa._current_gap_bytes() >= 64)
    # tombstoned: the sink
    assert al.translate_loc_from_full_to_swa(v[:4]).tolist() == [0, 0, 0, 0]
    assert (
        al.translate_kv_loc(v[:4]).tolist() == fa.translate_kv_loc(v[:4]).tolist()
        and (fa.translate_kv_loc(v[:4]) > 0).all()
    )
    al.free(v)  # the SWA side frees only what is still bound; the full side everything
    assert fa.allocated_count() == sa.allocated_count() == 0
    al.check_books()


def test_free_groups_and_segments_release_the_same_pages():
    _, _, al = swa_setup(ps=2)
    a, b = al.alloc(4), al.alloc(4)
    al.free_group_begin()
    al.free(a[:2])
    al.free(a[2:])
    assert al.full_attn_allocator.allocated_count() == 8  # queued
    al.free_group_end()
    assert al.full_attn_allocator.allocated_count() == 4
    al.free_swa_segment(b[:2], 0)
    al.free_full_segment(b[:2], 0)
    al.free_segment(b[2:], 2)
    assert (
        al.full_attn_allocator.allocated_count()
        == al.swa_attn_allocator.allocated_count()
        == 0
    )
    with pytest.raises(ValueError, match="page-aligned"):
        al.free_segment(b[1:], 1)


# -- the write door --------------------------------------------------------------------------


def test_the_unified_pool_refuses_a_write_not_marked_physical():
    _, kv, al = swa_setup(ps=1)
    v = al.alloc(3)
    k = torch.ones(3, 1, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not marked physical"):
        kv.set_kv_buffer(1, v, k, k)  # bare virtual ids
    with pytest.raises(ValueError, match="not marked physical"):
        # translated, unmarked
        kv.full_kv_pool.set_kv_buffer(0, KVWriteLoc(al.translate_kv_loc(v)), k, k)
    kv.full_kv_pool.set_kv_buffer(
        0, KVWriteLoc(al.translate_kv_loc(v), physical=True), k, k
    )
    ks = torch.full((3, 1, 8), 2.0, dtype=torch.bfloat16)
    # an SWA layer: swa_loc, under the batch's mark
    kv.set_kv_buffer(2, al.write_loc(v), ks, ks)
    assert torch.equal(kv.get_key_buffer(2)[al.translate_loc_from_full_to_swa(v)], ks)
    # Chapter 07's two-pool layout holds physical ids by allocation: a plain location is fine.
    plain = SWAKVPool(8, 8, 1, torch.bfloat16, 1, 16, [1], [0])
    plain.set_kv_buffer(1, T(1, 2, 3), k, k)
    assert (
        not SWAKVPool.requires_physical_write_loc
        and UnifiedSWAKVPool.requires_physical_write_loc
    )
    assert (
        UnifiedMHATokenToKVPool.requires_physical_write_loc
        and not MHATokenToKVPool.requires_physical_write_loc
    )


def test_the_unified_sub_pool_reports_its_true_cost():
    pool, kv, _ = swa_setup()
    assert kv.full_kv_pool.bytes_per_token == pool.spec("full").entry_bytes()
    # SGLang's pools report (0, 0): the buffer's bytes are counted once, by the UnifiedKVPool
    assert kv.get_kv_size_bytes() == (0, 0) == kv.full_kv_pool.get_kv_size_bytes()
    envelope = kv.full_kv_pool.get_page_envelope_buffer()
    assert envelope.shape[1] == pool.spec("full").entry_bytes() * kv.page_size
    assert envelope.untyped_storage().data_ptr() == pool._raw.data_ptr()
