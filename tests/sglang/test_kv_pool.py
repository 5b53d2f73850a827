import pytest
import torch

from memlab.sglang.kv_pool import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    mha_bytes_per_token,
    mla_bytes_per_token,
)

FP8 = torch.float8_e4m3fn


def test_mha_shapes_rows_and_layer_range():
    pool = MHATokenToKVPool(
        size=32,
        page_size=16,
        dtype=torch.float16,
        head_num=4,
        head_dim=8,
        layer_num=3,
        v_head_dim=6,
        start_layer=5,
    )
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    # size + page_size rows
    assert pool.k_buffer[0].shape == (48, 4, 8) and pool.v_buffer[0].shape == (48, 4, 6)
    assert (
        pool.get_key_buffer(5) is pool.k_buffer[0]
        and pool.get_value_buffer(7) is pool.v_buffer[2]
    )
    for bad in (4, 8):
        with pytest.raises(IndexError, match=f"layer {bad}"):
            pool.get_key_buffer(bad)


def test_set_kv_buffer_writes_only_the_given_slots():
    pool = MHATokenToKVPool(8, 1, torch.float32, 2, 4, 1)
    loc = torch.tensor([3, 6])
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    pool.set_kv_buffer(0, loc, k, v)
    assert torch.equal(pool.get_key_buffer(0)[loc], k) and torch.equal(
        pool.get_value_buffer(0)[loc], v
    )
    others = torch.ones(9, dtype=torch.bool)
    others[loc] = False
    assert not pool.k_buffer[0][others].any() and not pool.v_buffer[0][others].any()


def test_fp8_is_stored_as_uint8_and_viewed_back():
    pool = MHATokenToKVPool(8, 1, FP8, 2, 4, 1)
    assert pool.store_dtype == torch.uint8 and pool.k_buffer[0].dtype == torch.uint8
    assert pool.get_key_buffer(0).dtype == FP8
    k = torch.tensor([0.5, -1.0, 2.0, 0.25]).repeat(1, 2, 1)
    pool.set_kv_buffer(0, torch.tensor([2]), k * 4, k, k_scale=4.0)
    # written through the scale, exact in fp8
    assert torch.equal(pool.get_key_buffer(0)[2].float(), k[0])
    assert torch.equal(pool.get_value_buffer(0)[2].float(), k[0])


def test_mla_has_one_latent_buffer_and_v_is_a_view():
    pool = MLATokenToKVPool(
        16, 4, torch.float16, kv_lora_rank=8, qk_rope_head_dim=2, layer_num=2
    )
    assert pool.kv_buffer[0].shape == (20, 1, 10) and not hasattr(pool, "v_buffer")
    latent = torch.randn(3, 1, 10).half()
    loc = torch.tensor([1, 2, 9])
    pool.set_kv_buffer(1, loc, latent)
    v = pool.get_value_buffer(1)
    assert v.shape == (20, 1, 8) and v.data_ptr() == pool.kv_buffer[1].data_ptr()
    assert torch.equal(v[loc], latent[..., :8])


@pytest.mark.parametrize(
    "dtype,b", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4), (FP8, 1)]
)
def test_byte_formulas_match_the_tensors(dtype, b):
    L, T, H, d, ps = 3, 64, 4, 16, 16
    mha = MHATokenToKVPool(T, ps, dtype, H, d, L)
    assert (
        mha.bytes_per_token
        == 2 * L * H * d * b
        == mha_bytes_per_token(L, H, d, dtype_bytes=b)
    )
    # the padding page is real memory; K and V apart, as SGLang reports them
    assert mha.get_kv_size_bytes() == (mha.bytes_per_token * (T + ps) // 2,) * 2
    r, dr = 32, 8
    mla = MLATokenToKVPool(T, ps, dtype, r, dr, L)
    assert mla.bytes_per_token == L * (r + dr) * b == mla_bytes_per_token(L, r, dr, b)
    assert mla.get_kv_size_bytes() == mla.bytes_per_token * (T + ps)
    # memlab's old name stays for a while, warns, and gives the total
    with pytest.warns(DeprecationWarning, match="get_kv_size_bytes"):
        assert mha.kv_size_bytes() == mha.bytes_per_token * (T + ps)


def test_v_head_dim_counts_in_mha_bytes():
    assert (
        mha_bytes_per_token(2, 3, 8, v_head_dim=4, dtype_bytes=2) == 2 * 3 * (8 + 4) * 2
    )


@pytest.mark.parametrize(
    "kw,name,err",
    [
        (dict(size=0), "size", ValueError),
        (dict(head_num=-2), "head_num", ValueError),
        (dict(layer_num=1.5), "layer_num", TypeError),
        (dict(page_size=0), "page_size", ValueError),
    ],
)
def test_bad_dimensions_are_named(kw, name, err):
    args = (
        dict(
            size=8,
            page_size=1,
            dtype=torch.float16,
            head_num=2,
            head_dim=4,
            layer_num=1,
        )
        | kw
    )
    with pytest.raises(err, match=name):
        MHATokenToKVPool(**args)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool])
def test_a_pool_refuses_a_dtype_that_is_not_floating_point(dtype):
    with pytest.raises(TypeError, match=f"dtype {dtype} is not one"):
        MHATokenToKVPool(8, 1, dtype, 2, 4, 1)
    with pytest.raises(TypeError, match=f"dtype {dtype} is not one"):
        MLATokenToKVPool(8, 1, dtype, 4, 2, 1)


def test_a_wrong_head_dim_is_named_before_torch_sees_it():
    pool = MHATokenToKVPool(
        8, 1, torch.float32, head_num=2, head_dim=4, layer_num=1, v_head_dim=3
    )
    loc = torch.tensor([1, 2])
    with pytest.raises(
        ValueError,
        match=r"cache_k has shape \(2, 2, 8\); this pool stores rows of "
        r"\(tokens, head_num, head_dim\) = \(tokens, 2, 4\)",
    ):
        pool.set_kv_buffer(0, loc, torch.ones(2, 2, 8), torch.ones(2, 2, 3))
    with pytest.raises(
        ValueError,
        match=r"cache_v has shape \(2, 2, 4\).*v_head_dim\) = \(tokens, 2, 3\)",
    ):
        pool.set_kv_buffer(0, loc, torch.ones(2, 2, 4), torch.ones(2, 2, 4))
    with pytest.raises(ValueError, match=r"head_num, head_dim\) = \(tokens, 2, 4\)"):
        # heads flattened
        pool.set_kv_buffer(0, loc, torch.ones(2, 8), torch.ones(2, 2, 3))
    # refused before writing
    assert not pool.k_buffer[0].any() and not pool.v_buffer[0].any()
    mla = MLATokenToKVPool(
        8, 1, torch.float32, kv_lora_rank=4, qk_rope_head_dim=2, layer_num=1
    )
    with pytest.raises(
        ValueError,
        match=r"\(tokens, 1, kv_lora_rank \+ qk_rope_head_dim\) = \(tokens, 1, 6\)",
    ):
        mla.set_kv_buffer(0, loc, torch.ones(2, 1, 4))


def test_bad_dtype_and_locations():
    with pytest.raises(TypeError, match="float16"):
        MHATokenToKVPool(8, 1, "float16", 2, 4, 1)
    pool = MHATokenToKVPool(8, 1, torch.float16, 2, 4, 1)
    k = torch.zeros(2, 2, 4)
    with pytest.raises(TypeError, match="float32"):
        pool.set_kv_buffer(0, torch.tensor([1.0, 2.0]), k, k)
    with pytest.raises(ValueError, match="3 slots for 2 tokens"):
        pool.set_kv_buffer(0, torch.tensor([1, 2, 3]), k, k)
    with pytest.raises(ValueError, match="do not make"):
        MHATokenToKVPool(8, 1, torch.float16, 2, 4, 2, start_layer=0, end_layer=4)


def test_set_kv_buffer_takes_a_write_loc():
    from memlab.sglang.write_loc import KVWriteLoc

    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 1)
    k = torch.ones(2, 1, 2)
    pool.set_kv_buffer(0, KVWriteLoc(torch.tensor([2, 4])), k, 2 * k)
    assert pool.k_buffer[0][[2, 4]].eq(1).all() and pool.v_buffer[0][[2, 4]].eq(2).all()
    with pytest.raises(TypeError, match="list"):
        pool.set_kv_buffer(0, [2, 4], k, k)


@pytest.mark.parametrize("bad", [-1, 9])
def test_slots_outside_the_buffer_are_named(bad):
    pool = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 1)  # rows 0..8
    k = torch.ones(2, 1, 2)
    with pytest.raises(ValueError, match=rf"loc\[1\] = {bad} is outside 0..8"):
        pool.set_kv_buffer(0, torch.tensor([3, bad]), k, k)
    assert not pool.k_buffer[0].any()  # refused before writing
