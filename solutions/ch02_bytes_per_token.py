"""Chapter 02 exercise: how many bytes one token's KV takes, summed over the layers.

Write ``mha_bytes_per_token`` and ``mla_bytes_per_token``. Grade with ``./course grade 02``.
"""


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def mha_bytes_per_token(
    layer_num: int,
    head_num: int,
    head_dim: int,
    v_head_dim: int | None = None,
    dtype_bytes: int = 2,
) -> int:
    """Bytes of KV one token takes in an MHA/GQA pool over ``layer_num`` layers.

    Every layer stores a K row of ``head_num * head_dim`` values and a V row of
    ``head_num * v_head_dim`` values (``v_head_dim`` defaults to ``head_dim``), each value
    ``dtype_bytes`` bytes (2 for fp16/bf16, 1 for fp8). ``head_num`` is the number of KV heads.
    Raise ValueError (naming it) for an argument that is not a positive int (bools are not ints
    here). See chapter 02 (MHA: K and V).
    """
    # BEGIN SOLUTION
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    _check_positive(
        layer_num=layer_num,
        head_num=head_num,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        dtype_bytes=dtype_bytes,
    )
    return layer_num * head_num * (head_dim + v_head_dim) * dtype_bytes
    # END SOLUTION


def mla_bytes_per_token(
    layer_num: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 2
) -> int:
    """Bytes of KV one token takes in an MLA pool over ``layer_num`` layers.

    Every layer stores ONE latent row of ``kv_lora_rank + qk_rope_head_dim`` values, shared by all
    heads; there is no separate V. Raise ValueError (naming it) for an argument that is not a
    positive int. See chapter 02 (MLA: one latent row).
    """
    # BEGIN SOLUTION
    _check_positive(
        layer_num=layer_num,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        dtype_bytes=dtype_bytes,
    )
    return layer_num * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes
    # END SOLUTION
