"""Hugging Face Llama checkpoints in and out of memlab's model
(``memlab.capstone.tiny_llama.TinyLlama``).

A checkpoint folder holds ``config.json`` (the shapes) and ``*.safetensors`` files (the tensors,
by name; a big model splits them over shards listed in ``model.safetensors.index.json``).
``LlamaForCausalLM`` names them, with ``torch.nn.Linear`` weights stored (out, in):

    model.embed_tokens.weight                       (vocab, hidden)
    model.layers.{i}.input_layernorm.weight         (hidden,)
    model.layers.{i}.self_attn.q_proj.weight        (heads * head_dim, hidden)
    model.layers.{i}.self_attn.k_proj.weight        (kv_heads * head_dim, hidden)   and v_proj
    model.layers.{i}.self_attn.o_proj.weight        (hidden, heads * head_dim)
    model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.gate_proj.weight           (intermediate, hidden)          and up_proj
    model.layers.{i}.mlp.down_proj.weight           (hidden, intermediate)
    model.norm.weight
    lm_head.weight                                  (vocab, hidden); absent when tied
                                                    to the embedding

``TinyLlama`` computes ``x @ w`` with ``w`` (in, out), so each matrix is used transposed (a view,
not a copy). q/k rows are already laid out for rotating the two halves of a head, as memlab does.

What the forward pass does not implement is refused with the field's name (a bias, a rope
scaling type other than linear and llama3, partial or interleaved rotary, another activation,
another architecture, quantized weights). ``safetensors`` is imported only to load or save, and
``transformers`` never here: the course runs without either until a learner loads a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from memlab.capstone.tiny_llama import TinyConfig, TinyLlama

ROPE_TYPES = ("default", "linear", "llama3")
_ROPE_NEEDS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
_LAYER_TENSORS = {  # TinyLlama's name -> the checkpoint's, under model.layers.{i}.
    "attn_norm": "input_layernorm",
    "wq": "self_attn.q_proj",
    "wk": "self_attn.k_proj",
    "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj",
    "mlp_norm": "post_attention_layernorm",
    "w_gate": "mlp.gate_proj",
    "w_up": "mlp.up_proj",
    "w_down": "mlp.down_proj",
}
_NORMS = ("attn_norm", "mlp_norm")
# a buffer old checkpoints saved; recomputed from the config
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedCheckpoint(ValueError):
    """The checkpoint asks for something memlab's Llama forward pass does not do."""


# ---- config.json -----------------------------------------------------------------------------
def read_config(folder) -> TinyConfig:
    """``config.json`` (and ``generation_config.json``'s end-of-sequence ids) as a TinyConfig.

    Missing optional fields take ``transformers.LlamaConfig``'s defaults. Both spellings of the
    rotary settings are read: ``rope_theta`` + ``rope_scaling`` (transformers 4) and
    ``rope_parameters`` (transformers 5).
    """
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{folder} has no config.json: not a Hugging Face checkpoint folder"
        )
    c = json.loads(path.read_text())
    return config_from_dict(c, eos_token_ids=_eos_ids(folder, c))


def config_from_dict(c: dict, eos_token_ids: tuple[int, ...] = ()) -> TinyConfig:
    _check_supported(c)
    missing = [
        k
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
        if k not in c
    ]
    if missing:
        raise UnsupportedCheckpoint(f"config.json lacks {missing}")
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    if heads % kv_heads:
        raise UnsupportedCheckpoint(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if head_dim % 2:
        raise UnsupportedCheckpoint(
            f"head_dim {head_dim} is odd: rotary positions rotate pairs of features"
        )
    rope, theta, scaling = _rope(c)
    return TinyConfig(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=c["intermediate_size"],
        rope_theta=float(theta),
        rms_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        eos_token_ids=eos_token_ids,
    )


def _check_supported(c: dict) -> None:
    """Refuse, by field, what the forward pass does not compute."""
    if c.get("model_type", "llama") != "llama":
        raise UnsupportedCheckpoint(
            f"model_type {c['model_type']!r}: only 'llama' (LlamaForCausalLM) is supported"
        )
    arch = c.get("architectures") or ["LlamaForCausalLM"]
    if "LlamaForCausalLM" not in arch:
        raise UnsupportedCheckpoint(
            f"architectures {arch}: only LlamaForCausalLM is supported"
        )
    if c.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(
            f"hidden_act {c['hidden_act']!r}: only 'silu' (SwiGLU) is supported"
        )
    for field in ("attention_bias", "mlp_bias"):
        if c.get(field):
            raise UnsupportedCheckpoint(
                f"{field} is true: memlab's Llama has no biases"
            )
    # nanotron's field (SmolLM2 writes false): rotate adjacent pairs
    if c.get("rope_interleaved"):
        raise UnsupportedCheckpoint(
            "rope_interleaved is true: memlab rotates the two halves of each head"
        )
    if c.get("quantization_config"):
        raise UnsupportedCheckpoint(
            "quantization_config is set: memlab loads unquantized weights only"
        )
    # pretraining_tp > 1 only made transformers 4 split each matmul in slices: the same function.


def _rope(c: dict):
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    field = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
    if kind not in ROPE_TYPES:
        raise UnsupportedCheckpoint(
            f"{field}.rope_type {kind!r} is not implemented (memlab: {', '.join(ROPE_TYPES)})"
        )
    partial = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedCheckpoint(
            f"partial_rotary_factor {partial}: memlab rotates the whole head"
        )
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    if kind == "default":
        return kind, theta, None
    lacking = [k for k in _ROPE_NEEDS[kind] if k not in rope]
    if lacking:
        raise UnsupportedCheckpoint(f"{field} of type {kind!r} lacks {lacking}")
    scaling = {"rope_type": kind, **{k: float(rope[k]) for k in _ROPE_NEEDS[kind]}}
    if kind == "llama3":  # the pretraining context the frequencies were tuned for
        scaling["original_max_position_embeddings"] = int(
            rope.get("original_max_position_embeddings")
            or c.get("max_position_embeddings", 2048)
        )
    return kind, theta, scaling


def _eos_ids(folder: Path, c: dict) -> tuple[int, ...]:
    """What transformers' generate stops on: generation_config.json's eos_token_id, else
    config.json's."""
    gen = folder / "generation_config.json"
    eos = json.loads(gen.read_text()).get("eos_token_id") if gen.exists() else None
    eos = c.get("eos_token_id") if eos is None else eos
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


# ---- tensors ---------------------------------------------------------------------------------
def _safetensors():
    try:
        import safetensors.torch
    except ImportError as exc:
        raise ImportError(
            "loading a checkpoint needs the safetensors package: pip install safetensors"
        ) from exc
    return safetensors.torch


def read_tensors(folder) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``*.safetensors`` files (the shards an index names, if any), on
    the CPU."""
    st, folder = _safetensors(), Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{folder} has no *.safetensors file (memlab does not read pytorch_model.bin)"
        )
    tensors = {}
    for f in files:
        tensors.update(st.load_file(str(folder / f), device="cpu"))
    return tensors


def weights_from_tensors(cfg: TinyConfig, tensors: dict) -> dict:
    """TinyLlama's weights dict from a LlamaForCausalLM state dict; every name and shape checked."""
    h, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {
        "attn_norm": (h,),
        "mlp_norm": (h,),
        "wq": (q, h),
        "wk": (kv, h),
        "wv": (kv, h),
        "wo": (h, q),
        "w_gate": (f, h),
        "w_up": (f, h),
        "w_down": (h, f),
    }
    used = set()

    def take(name, shape):
        if name not in tensors:
            raise UnsupportedCheckpoint(f"tensor {name} is missing from the checkpoint")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise UnsupportedCheckpoint(
                f"tensor {name} has shape {tuple(t.shape)}, config.json implies {shape}"
            )
        used.add(name)
        return t

    layers = []
    for i in range(cfg.num_layers):
        layer = {}
        for ours, theirs in _LAYER_TENSORS.items():
            t = take(f"model.layers.{i}.{theirs}.weight", shapes[ours])
            # Linear keeps (out, in); TinyLlama multiplies by (in, out)
            layer[ours] = t if ours in _NORMS else t.T
        layers.append(layer)
    weights = dict(
        embed=take("model.embed_tokens.weight", (v, h)),
        layers=layers,
        norm=take("model.norm.weight", (h,)),
        lm_head=None if cfg.tie_word_embeddings else take("lm_head.weight", (v, h)).T,
    )
    if cfg.tie_word_embeddings:
        # some tied checkpoints store the copy anyway; the embedding is what counts
        used.add("lm_head.weight")
    extra = sorted(
        n for n in tensors if n not in used and not n.endswith(_IGNORED_SUFFIXES)
    )
    if extra:
        what = "biases" if any(n.endswith(".bias") for n in extra) else "tensors"
        raise UnsupportedCheckpoint(
            f"unexpected {what} in the checkpoint (memlab's Llama does not use them): "
            f"{extra[:4]}{' ...' if len(extra) > 4 else ''}"
        )
    return weights


def load(folder, device="cpu", dtype=torch.float32) -> TinyLlama:
    """A TinyLlama with the checkpoint's weights, cast to ``dtype`` (float32 by default, as the
    engine's portable attention kernel takes float16 or float32)."""
    cfg = read_config(folder)
    return TinyLlama(
        cfg,
        device=device,
        dtype=dtype,
        weights=weights_from_tensors(cfg, read_tensors(folder)),
    )


# ---- the other way: memlab's model as a checkpoint ---------------------------------------------
def save(model: TinyLlama, folder) -> Path:
    """Write ``model`` as a LlamaForCausalLM folder (config.json + model.safetensors) that
    transformers loads: how memlab's random model meets transformers in the tests and the bench."""
    c, folder = model.cfg, Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        rms_norm_eps=c.rms_eps,
        rope_theta=c.rope_theta,
        rope_scaling=_scaling_fields(c.rope_scaling),
        tie_word_embeddings=c.tie_word_embeddings,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=list(c.eos_token_ids) or None,
        torch_dtype=str(model.dtype).removeprefix("torch."),
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {
        "model.embed_tokens.weight": model.embed,
        "model.norm.weight": model.norm,
    }
    for i, layer in enumerate(model.layers):
        for ours, theirs in _LAYER_TENSORS.items():
            t = layer[ours]
            tensors[f"model.layers.{i}.{theirs}.weight"] = t if ours in _NORMS else t.T
    if not c.tie_word_embeddings:
        tensors["lm_head.weight"] = model.lm_head.T
    _safetensors().save_file(
        {k: t.detach().cpu().contiguous() for k, t in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def _scaling_fields(rope_scaling):
    """Only what memlab computes with (a stray rope_theta in the dict would override the
    config's)."""
    if not rope_scaling:
        return None
    kind = rope_scaling.get("rope_type", "default")
    keep = (
        "rope_type",
        *_ROPE_NEEDS.get(kind, ()),
        *(("original_max_position_embeddings",) if kind == "llama3" else ()),
    )
    return {k: rope_scaling[k] for k in keep}


# ---- sizing ----------------------------------------------------------------------------------
def num_params(cfg: TinyConfig) -> int:
    """Parameters of the checkpoint, from its shapes (a tied head counted once)."""
    h, q, kv = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    )
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size + 2 * h
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    return cfg.vocab_size * h + cfg.num_layers * per_layer + h + head


def sizing_model(
    cfg: TinyConfig,
    name: str,
    max_position_embeddings: int = 4096,
    weight_dtype_bytes: int = 2,
):
    """The checkpoint as a ``memlab.common.models.ModelConfig``, for
    ``memlab.sglang.sizing.report``."""
    from memlab.common.models import ModelConfig

    return ModelConfig(
        name=name,
        source=f"{name} config.json",
        num_hidden_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=max_position_embeddings,
        num_params=num_params(cfg),
        weight_dtype_bytes=weight_dtype_bytes,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
