"""The model table: numbers from the published configs, redone here by hand."""

import dataclasses

import pytest
import torch

from memlab.common.models import (
    DEEPSEEK_V3,
    DEEPSEEK_V3_2,
    FULL,
    GEMMA_3_27B,
    LINEAR,
    LLAMA_3_1_8B,
    MODELS,
    QWEN2_5_7B,
    QWEN3_NEXT_80B_A3B,
    SLIDING,
    ModelConfig,
)
from memlab.sglang.kv_pool import (
    DSATokenToKVPool,
    MHATokenToKOnlyPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
)


def test_every_model_names_its_source():
    for m in MODELS.values():
        repo, file = m.source.split(" ", 1)
        assert repo.count("/") == 1 and "config.json" in file, m.source


def test_llama_kv_bytes_per_token_by_hand():
    # 32 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes
    assert LLAMA_3_1_8B.kv_bytes_per_token() == 32 * 8 * 128 * 2 * 2 == 131072
    assert LLAMA_3_1_8B.kv_bytes_per_token(FULL, dtype_bytes=1) == 65536  # fp8 KV
    assert LLAMA_3_1_8B.kinds() == (FULL,)


def test_qwen2_5_kv_bytes_per_token_by_hand():
    assert QWEN2_5_7B.kv_bytes_per_token() == 28 * 4 * 128 * 2 * 2 == 57344


def test_deepseek_mla_is_one_latent_per_layer_and_not_split_by_tp():
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
    assert DEEPSEEK_V3.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70272
    # every rank keeps the whole latent
    assert DEEPSEEK_V3.kv_bytes_per_token(tp_size=8) == 70272
    mha_equivalent = 61 * 128 * (192 + 128) * 2  # 128 heads of K (192) and V (128)
    assert mha_equivalent // DEEPSEEK_V3.kv_bytes_per_token() == 71


def test_deepseek_v3_2_adds_the_indexer_keys():
    # 61 layers x (latent 576 x 2 bytes + indexer key 128 fp8 + one fp32 scale per 128 = 132)
    assert DEEPSEEK_V3_2.kv_bytes_per_token() == 61 * (576 * 2 + 132) == 78324
    # fp8 latent, raw layout
    assert DEEPSEEK_V3_2.kv_bytes_per_token(dtype_bytes=1) == 61 * (576 + 132) == 43188
    assert (
        DEEPSEEK_V3_2.kv_bytes_per_token() - DEEPSEEK_V3.kv_bytes_per_token()
        == 61 * 132
        == 8052
    )
    # latent and indexer keys: every rank
    assert DEEPSEEK_V3_2.kv_bytes_per_token(tp_size=8) == 78324


def test_gemma3_layer_pattern_five_local_one_global():
    full, swa = GEMMA_3_27B.layer_ids(FULL), GEMMA_3_27B.layer_ids(SLIDING)
    # every 6th layer, starting local
    assert full == (5, 11, 17, 23, 29, 35, 41, 47, 53, 59)
    assert (
        len(swa) == 52
        and GEMMA_3_27B.layer_kind(0) == SLIDING
        and GEMMA_3_27B.layer_kind(61) == SLIDING
    )
    assert GEMMA_3_27B.sliding_window == 1024
    per_layer = 16 * 128 * 2 * 2
    assert GEMMA_3_27B.kv_bytes_per_token(FULL) == 10 * per_layer == 81920
    assert GEMMA_3_27B.kv_bytes_per_token(SLIDING) == 52 * per_layer == 425984
    assert GEMMA_3_27B.kv_bytes_per_token() == 62 * per_layer


def test_qwen3_next_pattern_and_linear_state_by_hand():
    m = QWEN3_NEXT_80B_A3B
    assert (
        m.layer_ids(FULL) == tuple(range(3, 48, 4)) and len(m.layer_ids(LINEAR)) == 36
    )
    # linear layers keep no per-token KV
    assert m.kv_bytes_per_token() == 12 * 2 * 256 * 2 * 2 == 24576
    # q and k channels (16 heads x 128) + v channels (32 x 128)
    conv_dim = 2 * 16 * 128 + 32 * 128
    assert m.conv_state_shape() == (conv_dim, 4 - 1) == (8192, 3)
    assert m.temporal_state_shape() == (32, 128, 128)
    # bf16 conv state + fp32 recurrent state
    per_layer = 8192 * 3 * 2 + 32 * 128 * 128 * 4
    assert m.state_bytes_per_request() == 36 * per_layer == 77_266_944
    assert m.conv_state_shape(tp_size=4) == (2048, 3) and m.temporal_state_shape(
        tp_size=4
    ) == (8, 128, 128)
    # 2 KV heads over 4 ranks: each rank keeps a replica
    assert m.kv_heads_per_rank(4) == 1


def _dense_params(
    L, h, inter, H, kv, d, V, tied, qkv_bias=False, norms_per_layer=2, qk_norm=0
):
    attn = (
        h * H * d
        + 2 * h * kv * d
        + H * d * h
        + ((H * d + 2 * kv * d) if qkv_bias else 0)
    )
    mlp = 3 * h * inter  # gate, up, down
    per_layer = attn + mlp + norms_per_layer * h + qk_norm
    return L * per_layer + V * h * (1 if tied else 2) + h  # + final norm


def test_param_counts_from_the_configs_shapes():
    assert LLAMA_3_1_8B.num_params == _dense_params(
        32, 4096, 14336, 32, 8, 128, 128256, False
    )
    assert QWEN2_5_7B.num_params == _dense_params(
        28, 3584, 18944, 28, 4, 128, 152064, False, qkv_bias=True
    )
    assert GEMMA_3_27B.num_params == _dense_params(
        62, 5376, 21504, 32, 16, 128, 262208, True, norms_per_layer=4, qk_norm=2 * 128
    )
    # the cards' rounded figures
    assert 8.03e9 <= LLAMA_3_1_8B.num_params < 8.04e9
    assert 7.61e9 <= QWEN2_5_7B.num_params < 7.62e9
    non_embedding = GEMMA_3_27B.num_params - 262208 * 5376
    assert round(non_embedding / 1e9, 1) == 25.6  # the Gemma 3 report's figure


def test_weight_bytes_use_the_checkpoint_dtype_and_split_by_tp():
    assert LLAMA_3_1_8B.weight_bytes() == 8_030_261_248 * 2
    assert LLAMA_3_1_8B.weight_bytes(dtype_bytes=1) == 8_030_261_248
    assert DEEPSEEK_V3.weight_bytes() == 671_000_000_000  # fp8 checkpoint
    assert DEEPSEEK_V3.weight_bytes(tp_size=8) == 671_000_000_000 // 8


@pytest.mark.parametrize(
    "model", [LLAMA_3_1_8B, QWEN2_5_7B, GEMMA_3_27B, QWEN3_NEXT_80B_A3B]
)
def test_table_agrees_with_real_pool_tensors(model):
    layers = len(model.layer_ids(FULL)) + len(model.layer_ids(SLIDING))
    pool = MHATokenToKVPool(
        4, 1, torch.bfloat16, model.num_key_value_heads, model.head_dim, layers
    )
    assert pool.bytes_per_token == model.kv_bytes_per_token()
    per_slot = sum(t[0].nbytes for t in pool.k_buffer + pool.v_buffer)
    assert per_slot == model.kv_bytes_per_token()


def test_mla_table_agrees_with_real_pool_tensors():
    pool = MLATokenToKVPool(2, 1, torch.bfloat16, 512, 64, 61)
    assert sum(t[0].nbytes for t in pool.kv_buffer) == DEEPSEEK_V3.kv_bytes_per_token()


@pytest.mark.parametrize("page_size", [1, 64])
def test_dsa_table_agrees_with_real_pool_tensors(page_size):
    pool = DSATokenToKVPool(4 * page_size, page_size, torch.bfloat16, 512, 64, 61)
    latent = sum(t[0].nbytes for t in pool.kv_buffer)
    # one page-major row per page
    index = sum(t[0].nbytes for t in pool.index_k_with_scale_buffer) // page_size
    assert latent + index == pool.bytes_per_token == DEEPSEEK_V3_2.kv_bytes_per_token()
    assert pool.index_k_with_scale_buffer[0].shape == (
        (4 * page_size + page_size + 1) // page_size,
        page_size * 132,
    )
    assert (
        pool.get_kv_size_bytes()  # one int for a latent pool, as SGLang's
        == latent * (5 * page_size)
        + index * page_size * pool.index_k_with_scale_buffer[0].shape[0]
    )
    with pytest.raises(ValueError, match="128 values"):
        DSATokenToKVPool(4, 1, torch.bfloat16, 512, 64, 1, index_head_dim=64)


def test_k_only_pool_is_half_an_mha_pool():
    # MiniMax's sparse index layers that never read V: one head of 128 (sparse_index_dim) per layer
    k_only = MHATokenToKOnlyPool(
        8, 1, torch.bfloat16, head_num=1, head_dim=128, layer_num=3
    )
    full = MHATokenToKVPool(8, 1, torch.bfloat16, head_num=1, head_dim=128, layer_num=3)
    assert k_only.bytes_per_token == 3 * 256 == full.bytes_per_token // 2
    assert sum(t[0].nbytes for t in k_only.k_buffer) == k_only.bytes_per_token
    k_bytes, v_bytes = full.get_kv_size_bytes()
    assert k_only.get_kv_size_bytes() == (k_bytes, 0) and k_bytes == v_bytes
    k = torch.ones(2, 1, 128)
    k_only.set_k_buffer(1, torch.tensor([3, 4]), k)
    assert torch.equal(k_only.get_key_buffer(1)[3:5], k.bfloat16())
    for call in (
        lambda: k_only.get_value_buffer(1),
        lambda: k_only.set_kv_buffer(1, torch.tensor([3]), k, k),
    ):
        with pytest.raises(NotImplementedError, match="V"):
            call()


def test_configs_are_frozen_and_slotted():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LLAMA_3_1_8B.num_hidden_layers = 1
    assert not hasattr(LLAMA_3_1_8B, "__dict__")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(layer_types=(FULL,) * 3), "3 layer_types for 4 layers"),
        (dict(layer_types=(FULL, "local", FULL, FULL)), "unknown layer kinds"),
        (dict(layer_types=(FULL, SLIDING, FULL, FULL)), "sliding_window"),
        (dict(layer_types=(FULL, LINEAR, FULL, FULL)), "linear_"),
        (dict(attention="mla"), "kv_lora_rank"),
        (dict(attention="gqa"), "'mha' or 'mla'"),
    ],
)
def test_bad_configs_are_refused(bad, match):
    base = dict(
        name="toy",
        source="x/y config.json",
        num_hidden_layers=4,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=100,
        max_position_embeddings=256,
        num_params=1000,
    )
    with pytest.raises(ValueError, match=match):
        ModelConfig(**base, **bad)
    with pytest.raises(ValueError, match="unknown layer kind"):
        ModelConfig(**base).layer_ids("global")
