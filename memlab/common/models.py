"""Real model configurations, with the numbers the memory books need.

Every field is copied from the model's published ``config.json`` on Hugging Face (the
source is named per model); parameter counts come from the model card or, for dense
decoders, from the config's shapes (``tests/common/test_models.py`` redoes that
arithmetic by hand). The bytes-per-token formulas are written here once, for both engines:
SGLang's KV pools (``memlab.sglang.kv_pool``) and vLLM's layout (``memlab.vllm.kv_layout``)
size a token the same way, so the table and the pools can never disagree.

Layer kinds, as the configs' ``layer_types`` spell them:
``full_attention`` (KV for every token), ``sliding_attention`` (KV for the last ``sliding_window``
tokens only) and ``linear_attention`` (no per-token KV: a fixed-size state per request).
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.common._checks import integer

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
LAYER_KINDS = (FULL, SLIDING, LINEAR)
PER_TOKEN_KINDS = (FULL, SLIDING)


# ---- bytes per token: the formulas both engines' pools follow (chapter 02) ------------------
def mha_bytes_per_token(
    layer_num: int,
    head_num: int,
    head_dim: int,
    v_head_dim: int | None = None,
    dtype_bytes: int = 2,
) -> int:
    """K and V for every layer: ``L * H * (d + d_v) * b`` (``2 * L * H * d * b`` when d_v == d)."""
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    _bytes_args(layer_num, head_num, head_dim, v_head_dim, dtype_bytes)
    return layer_num * head_num * (head_dim + v_head_dim) * dtype_bytes


def mla_bytes_per_token(
    layer_num: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 2
) -> int:
    """One latent vector per layer: ``L * (r + d_r) * b``; V is a view of it, so nothing more."""
    _bytes_args(layer_num, kv_lora_rank, qk_rope_head_dim, dtype_bytes)
    return layer_num * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


def _bytes_args(*counts) -> None:
    """The formulas' counts: ints, a layer count of 0 allowed (a model without such layers)."""
    for i, v in enumerate(counts):
        integer(f"count {i + 1} of the formula", v, 0 if i == 0 else 1)


# SGLang's DSATokenToKVPool.quant_block_size: one fp32 scale per 128 fp8 values
DSA_QUANT_BLOCK = 128


def dsa_index_bytes_per_token(layer_num: int, index_head_dim: int = 128) -> int:
    """The DeepSeek sparse-attention indexer's key cache: per layer one fp8 key of
    ``index_head_dim`` values and one fp32 scale per 128 of them, whatever the KV dtype:
    ``L * (d_idx + d_idx / 128 * 4)`` (132 bytes a layer for d_idx = 128)."""
    _bytes_args(layer_num, index_head_dim)
    return layer_num * (index_head_dim + index_head_dim // DSA_QUANT_BLOCK * 4)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    source: str  # Hugging Face repo id + file the numbers come from
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    num_params: int  # weights loaded for serving (see each entry's note)
    weight_dtype_bytes: int = 2  # the checkpoint's dtype: bf16 = 2, fp8 = 1
    tie_word_embeddings: bool = False
    v_head_dim: int | None = None
    # MLA (DeepSeek): one latent per token and layer instead of per-head K and V
    attention: str = "mha"  # "mha" (incl. GQA/MQA) or "mla"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    # DeepSeek sparse attention (V3.2): the indexer keeps one small fp8 key per token and layer
    index_head_dim: int | None = None
    # hybrid models: one kind per layer; None means every layer is full attention
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    # linear attention (Gated DeltaNet / Mamba-style) state, per layer
    linear_conv_kernel_dim: int | None = None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    notes: str = ""

    def __post_init__(self):
        _validate(self)
        if self.attention not in ("mha", "mla"):
            raise ValueError(
                f"{self.name}: attention must be 'mha' or 'mla', got {self.attention!r}"
            )
        if self.attention == "mla" and (
            self.kv_lora_rank is None or self.qk_rope_head_dim is None
        ):
            raise ValueError(
                f"{self.name}: MLA needs kv_lora_rank and qk_rope_head_dim"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"{self.name}: {len(self.layer_types)} layer_types for "
                    f"{self.num_hidden_layers} layers"
                )
            bad = sorted(set(self.layer_types) - set(LAYER_KINDS))
            if bad:
                raise ValueError(
                    f"{self.name}: unknown layer kinds {bad}; known: {LAYER_KINDS}"
                )
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise ValueError(
                    f"{self.name}: sliding_attention layers need sliding_window"
                )
            if LINEAR in self.layer_types and self.linear_conv_kernel_dim is None:
                raise ValueError(
                    f"{self.name}: linear_attention layers need the linear_* fields"
                )

    # ---- layers ---------------------------------------------------------------------------
    def layer_kind(self, layer_id: int) -> str:
        return FULL if self.layer_types is None else self.layer_types[layer_id]

    def layer_ids(self, kind: str) -> tuple[int, ...]:
        """Model layer ids of one kind, in order."""
        if not isinstance(kind, str):
            raise TypeError(
                f"kind must be a str, one of {LAYER_KINDS}, got {type(kind).__name__} {kind!r}"
            )
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r}; known: {LAYER_KINDS}")
        return tuple(
            i for i in range(self.num_hidden_layers) if self.layer_kind(i) == kind
        )

    def kinds(self) -> tuple[str, ...]:
        """The layer kinds this model has, in LAYER_KINDS order."""
        return tuple(k for k in LAYER_KINDS if self.layer_ids(k))

    # ---- per-token KV ---------------------------------------------------------------------
    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        # Fewer KV heads than ranks: each rank keeps a replica of one head (SGLang's
        # get_num_kv_heads).
        return max(1, self.num_key_value_heads // tp_size)

    def kv_bytes_per_token_per_layer(
        self, dtype_bytes: int = 2, tp_size: int = 1
    ) -> int:
        """KV bytes one token occupies in ONE attention layer (full or sliding) on one rank. A DSA
        model adds its indexer's key, stored in fp8 with fp32 scales whatever ``dtype_bytes`` is."""
        integer("dtype_bytes", dtype_bytes, 1)
        integer("tp_size", tp_size, 1)
        if self.attention == "mla":  # the latent is not split across ranks
            index = (
                0
                if self.index_head_dim is None
                else dsa_index_bytes_per_token(1, self.index_head_dim)
            )
            return (
                mla_bytes_per_token(
                    1, self.kv_lora_rank, self.qk_rope_head_dim, dtype_bytes
                )
                + index
            )
        return mha_bytes_per_token(
            1,
            self.kv_heads_per_rank(tp_size),
            self.head_dim,
            self.v_head_dim,
            dtype_bytes,
        )

    def kv_bytes_per_token(
        self, kind: str | None = None, dtype_bytes: int = 2, tp_size: int = 1
    ) -> int:
        """KV bytes per token summed over the layers of ``kind`` (None: every per-token kind)."""
        kinds = PER_TOKEN_KINDS if kind is None else (kind,)
        n = sum(len(self.layer_ids(k)) for k in kinds if k != LINEAR)
        return n * self.kv_bytes_per_token_per_layer(dtype_bytes, tp_size)

    # ---- per-request linear-attention state -----------------------------------------------
    def conv_state_shape(self, tp_size: int = 1) -> tuple[int, int]:
        """Conv state of one linear layer: (channels, kernel - 1) past inputs per channel."""
        _check_linear(self, tp_size)
        # q, k and v channels
        conv_dim = (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )
        return conv_dim // tp_size, self.linear_conv_kernel_dim - 1

    def temporal_state_shape(self, tp_size: int = 1) -> tuple[int, int, int]:
        """Recurrent state of one linear layer: a (d_k, d_v) matrix per value head."""
        _check_linear(self, tp_size)
        return (
            self.linear_num_value_heads // tp_size,
            self.linear_key_head_dim,
            self.linear_value_head_dim,
        )

    def state_bytes_per_request(
        self, conv_dtype_bytes: int = 2, ssm_dtype_bytes: int = 4, tp_size: int = 1
    ) -> int:
        """Conv + temporal state bytes of one request over all linear layers (0 if none)."""
        for name, v in (
            ("conv_dtype_bytes", conv_dtype_bytes),
            ("ssm_dtype_bytes", ssm_dtype_bytes),
        ):
            integer(name, v, 1)
        integer("tp_size", tp_size, 1)
        n = len(self.layer_ids(LINEAR))
        if n == 0:
            return 0
        c, k = self.conv_state_shape(tp_size)
        h, dk, dv = self.temporal_state_shape(tp_size)
        return n * (c * k * conv_dtype_bytes + h * dk * dv * ssm_dtype_bytes)

    # ---- weights --------------------------------------------------------------------------
    def weight_bytes(self, dtype_bytes: int | None = None, tp_size: int = 1) -> int:
        """Weight bytes per rank; ``dtype_bytes`` overrides the checkpoint's (e.g. 1 for fp8).

        Tensor parallelism is taken as an even split: the few replicated tensors (norms) are
        too small to matter here.
        """
        b = (
            self.weight_dtype_bytes
            if dtype_bytes is None
            else integer("dtype_bytes", dtype_bytes, 1)
        )
        integer("tp_size", tp_size, 1)
        return self.num_params * b // tp_size


_COUNTS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "num_params",
    "weight_dtype_bytes",
)
_OPTIONAL_COUNTS = (
    "v_head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
    "sliding_window",
    "linear_conv_kernel_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)


def _validate(m: ModelConfig) -> None:
    """Every count a positive int (None where the field is optional)."""
    for name in _COUNTS:
        integer(f"{m.name}: {name}", getattr(m, name), 1)
    for name in _OPTIONAL_COUNTS:
        if getattr(m, name) is not None:
            integer(f"{m.name}: {name}", getattr(m, name), 1)


def _check_linear(m: ModelConfig, tp_size) -> None:
    integer("tp_size", tp_size, 1)
    if m.linear_conv_kernel_dim is None:
        raise ValueError(
            f"{m.name} has no linear-attention layers: no per-request state"
        )


def _every_nth_full(n_layers: int, period: int, other: str) -> tuple[str, ...]:
    """``period - 1`` layers of ``other`` then one full-attention layer, repeated."""
    return tuple(FULL if (i + 1) % period == 0 else other for i in range(n_layers))


LLAMA_3_1_8B = ModelConfig(
    name="Llama-3.1-8B",
    source="meta-llama/Llama-3.1-8B config.json",
    num_hidden_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    num_params=8_030_261_248,  # from the config's shapes; the card says 8.03B
)

QWEN2_5_7B = ModelConfig(
    name="Qwen2.5-7B",
    source="Qwen/Qwen2.5-7B config.json",
    num_hidden_layers=28,
    hidden_size=3584,
    intermediate_size=18944,
    num_attention_heads=28,
    num_key_value_heads=4,
    head_dim=128,  # head_dim = 3584 / 28
    vocab_size=152064,
    max_position_embeddings=131072,  # the -Instruct config says 32768
    num_params=7_615_616_512,  # from the config's shapes (q/k/v carry biases); the card says 7.61B
)

DEEPSEEK_V3 = ModelConfig(
    name="DeepSeek-V3",
    source="deepseek-ai/DeepSeek-V3 config.json",
    num_hidden_layers=61,
    hidden_size=7168,
    intermediate_size=18432,
    num_attention_heads=128,
    num_key_value_heads=128,
    head_dim=192,
    v_head_dim=128,  # qk_nope_head_dim 128 + qk_rope_head_dim 64; unused by the MLA pool
    vocab_size=129280,
    max_position_embeddings=163840,
    attention="mla",
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    num_params=671_000_000_000,  # card: 671B main model (+14B MTP module, 685B on the Hub)
    weight_dtype_bytes=1,  # released as fp8 e4m3 with 128x128 block scales (scales not counted)
    notes="MoE: 256 routed experts (8 per token) + 1 shared, first 3 layers dense; "
    "q_lora_rank 1536; num_nextn_predict_layers 1",
)

DEEPSEEK_V3_2 = ModelConfig(
    name="DeepSeek-V3.2",
    source="deepseek-ai/DeepSeek-V3.2 config.json",
    num_hidden_layers=61,
    hidden_size=7168,
    intermediate_size=18432,
    num_attention_heads=128,
    num_key_value_heads=128,
    head_dim=192,
    v_head_dim=128,  # as DeepSeek-V3: qk_nope_head_dim 128 + qk_rope_head_dim 64
    vocab_size=129280,
    max_position_embeddings=163840,
    attention="mla",
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,  # no index_topk_freq / index_kpool: every layer keeps indexer keys
    num_params=671_000_000_000,  # card: 671B, DeepSeek-V3's shapes plus the indexer (685B with MTP)
    weight_dtype_bytes=1,  # released in fp8, as V3
    notes="DeepSeek sparse attention: a lightning indexer (index_n_heads 64, "
    "index_head_dim 128) picks index_topk 2048 cached tokens for each query; MoE as DeepSeek-V3",
)

GEMMA_3_27B = ModelConfig(
    name="Gemma-3-27B",
    source="google/gemma-3-27b-it config.json (text_config)",
    num_hidden_layers=62,
    hidden_size=5376,
    intermediate_size=21504,
    num_attention_heads=32,
    num_key_value_heads=16,
    head_dim=128,
    vocab_size=262208,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    # sliding_window_pattern 6: five local layers, then one global, starting with a local one
    layer_types=_every_nth_full(62, 6, SLIDING),
    sliding_window=1024,
    num_params=27_009_346_304,  # text decoder from the config's shapes (report: 25.6B + 1.4B
    # embedding); the ~0.4B SigLIP vision tower of the -it checkpoint is not counted
)

QWEN3_NEXT_80B_A3B = ModelConfig(
    name="Qwen3-Next-80B-A3B",
    source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json",
    num_hidden_layers=48,
    hidden_size=2048,
    intermediate_size=5120,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    vocab_size=151936,
    max_position_embeddings=262144,
    # full_attention_interval 4: three Gated DeltaNet layers, then one gated-attention layer
    layer_types=_every_nth_full(48, 4, LINEAR),
    linear_conv_kernel_dim=4,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    num_params=80_000_000_000,  # card: "80B in total and 3B activated" (exact count not verified)
    notes="MoE: 512 experts, 10 routed + 1 shared per token, expert size 512",
)

MODELS = {
    m.name: m
    for m in (
        LLAMA_3_1_8B,
        QWEN2_5_7B,
        DEEPSEEK_V3,
        DEEPSEEK_V3_2,
        GEMMA_3_27B,
        QWEN3_NEXT_80B_A3B,
    )
}
