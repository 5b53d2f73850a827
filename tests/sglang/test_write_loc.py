"""KVWriteLoc; the SWA pool takes a plain location, only a pool with virtual ids demands the
mark."""

import pytest
import torch

from memlab.sglang.kv_pool import MHATokenToKVPool
from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator
from memlab.sglang.write_loc import (
    KVWriteLoc,
    check_physical_write_loc,
    plain_loc,
    unwrap_write_loc,
    write_loc_is_physical,
)

T = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731


def test_side_ids_are_cut_to_the_tokens_of_loc():
    w = KVWriteLoc(T(5, 6), swa_loc=T(1, 2, 0, 0), full_loc=T(5, 6, 0), physical=True)
    assert w.swa_loc.tolist() == [1, 2] and w.full_loc.tolist() == [5, 6]
    assert (
        w.narrow(1).loc.tolist() == [5]
        and w.narrow(1).swa_loc.tolist() == [1]
        and w.narrow(1).physical
    )


def test_full_ids_fall_back_to_loc():
    assert KVWriteLoc(T(5, 6)).full_ids().tolist() == [5, 6]
    assert KVWriteLoc(T(5, 6), full_loc=T(9, 8)).full_ids().tolist() == [9, 8]


def test_for_batch_carries_the_batch_mark_to_every_id():
    w = KVWriteLoc.for_batch(T(3), physical=True, swa_loc=T(1))
    assert write_loc_is_physical(w) and w.swa_loc.tolist() == [1]
    assert not write_loc_is_physical(KVWriteLoc.for_batch(T(3), physical=False))
    assert not write_loc_is_physical(T(3))


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: KVWriteLoc([1, 2]), TypeError, "loc must be a torch.Tensor"),
        (
            lambda: KVWriteLoc(T(1, 2).view(1, 2)),
            ValueError,
            "loc must have 1 dimension",
        ),
        (lambda: KVWriteLoc(torch.tensor([1.0])), TypeError, "int32/int64"),
        (
            lambda: KVWriteLoc(T(1, 2), swa_loc=T(1)),
            ValueError,
            "swa_loc: 1 ids for 2 tokens",
        ),
        (
            lambda: KVWriteLoc(T(1, 2), full_loc=T(1)),
            ValueError,
            "full_loc: 1 ids for 2 tokens",
        ),
        (lambda: KVWriteLoc(T(1), physical=1), TypeError, "physical must be a bool"),
    ],
)
def test_bad_write_locs(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_the_check_names_what_to_pass():
    with pytest.raises(
        ValueError, match=r"not marked physical \(got a bare tensor\).*physical=True"
    ):
        check_physical_write_loc(T(1), "X.set_kv_buffer")
    with pytest.raises(ValueError, match="got a KVWriteLoc not marked physical"):
        check_physical_write_loc(KVWriteLoc(T(1)), "X.set_kv_buffer")
    w = KVWriteLoc(T(1), physical=True)
    assert check_physical_write_loc(w, "X") is w


def test_plain_pools_write_loc_and_leave_the_side_ids_to_hybrid_pools():
    # as SGLang's MHATokenToKVPool: loc, _, _ = unwrap_write_loc(loc_info)
    assert plain_loc(T(4), "P").tolist() == [4]
    assert plain_loc(KVWriteLoc(T(4), full_loc=T(7)), "P").tolist() == [4]
    assert [
        x.tolist() if x is not None else x
        for x in unwrap_write_loc(KVWriteLoc(T(4), swa_loc=T(2)))
    ] == [[4], [2], None]
    with pytest.raises(TypeError, match="P: loc must be"):
        plain_loc([4], "P")


class VirtualIdPool(MHATokenToKVPool):
    """What a unified pool does at its write door (memlab has none): virtual ids need the mark."""

    requires_physical_write_loc = True


def test_only_a_pool_with_virtual_ids_demands_the_mark():
    k = torch.ones(1, 1, 2)
    pool = VirtualIdPool(8, 1, torch.float32, 1, 2, 1)
    for bad in (T(3), KVWriteLoc(T(3))):
        with pytest.raises(
            ValueError,
            match="VirtualIdPool.set_kv_buffer: write loc is not marked physical",
        ):
            pool.set_kv_buffer(0, bad, k, k)
    assert not pool.k_buffer[0].any()
    pool.set_kv_buffer(0, KVWriteLoc(T(3), physical=True), k, k)
    plain = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 1)
    plain.set_kv_buffer(0, T(3), k, k)  # a plain pool takes a bare location
    assert torch.equal(pool.k_buffer[0], plain.k_buffer[0])


def _swa_setup():
    pool = SWAKVPool(
        16,
        8,
        1,
        torch.float32,
        2,
        4,
        full_attention_layer_ids=[1],
        swa_attention_layer_ids=[0, 2],
    )
    alloc = SWATokenToKVPoolAllocator(16, 8, 1, kvcache=pool)
    alloc.alloc(3)  # make the two id spaces differ
    alloc.swa_attn_allocator.alloc(2)
    loc = alloc.alloc(2)
    return pool, alloc, loc


def test_swa_pool_takes_a_plain_location_and_needs_the_swa_ids_for_swa_layers():
    pool, alloc, loc = _swa_setup()
    k = torch.ones(2, 2, 4)
    pool.set_kv_buffer(1, loc, k, k)  # a full layer: a bare location, no mark
    assert torch.equal(pool.get_key_buffer(1)[loc], k)
    # an SWA layer without the SWA-side ids
    for bad in (loc, KVWriteLoc(loc, physical=True)):
        with pytest.raises(
            ValueError, match="layer 0 is a sliding-window layer.*no swa_loc"
        ):
            pool.set_kv_buffer(0, bad, k, k)
    assert not any(b.any() for b in pool.swa_kv_pool.k_buffer)
    swa = alloc.translate_loc_from_full_to_swa(loc)
    pool.set_kv_buffer(0, KVWriteLoc(loc, swa_loc=swa), 2 * k, 2 * k)  # unmarked: fine
    assert torch.equal(pool.get_key_buffer(0)[swa], 2 * k)


def test_swa_pool_writes_each_layer_in_its_own_id_space():
    pool, alloc, loc = _swa_setup()
    w = alloc.write_loc(loc)
    # the id spaces really differ here
    assert not w.physical and not torch.equal(w.swa_loc, loc)
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    pool.set_kv_buffer(1, w, k, v)  # full layer
    pool.set_kv_buffer(2, w, 2 * k, 2 * v)  # SWA layer
    assert torch.equal(pool.get_key_buffer(1)[loc], k) and torch.equal(
        pool.get_value_buffer(1)[loc], v
    )
    assert torch.equal(pool.get_key_buffer(2)[w.swa_loc], 2 * k)
    assert not pool.get_key_buffer(0).any()  # the other SWA layer is untouched
