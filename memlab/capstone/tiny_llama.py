"""The capstone's model: a Llama-style transformer (RMSNorm, rotary positions,
grouped-query attention, SwiGLU) with random weights from a fixed seed, or a Hugging
Face Llama checkpoint's weights (``memlab.capstone.checkpoint``). Its forward pass takes
an ``attend`` callback, so the same model runs two ways: ``generate_reference`` below
keeps each request's K/V in one contiguous tensor; ``memlab.capstone.engine.Engine``
serves it through the books the chapters taught."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memlab.common.env import resolve_device


@dataclass(frozen=True, slots=True)
class TinyConfig:
    vocab_size: int = 128
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0
    # What a real checkpoint may set (memlab.capstone.checkpoint reads them from its config.json):
    tie_word_embeddings: bool = False  # the output head is the embedding matrix itself
    rope_scaling: dict | None = (
        None  # None, {"rope_type": "linear", ...} or {"rope_type": "llama3", ...}
    )
    eos_token_ids: tuple[int, ...] = ()  # a request stops after emitting one of these
    # Sliding-window layers (Gemma-style hybrids): with a window, every
    # ``sliding_window_pattern``-th layer from layer 0 attends only to the last
    # ``sliding_window`` positions (itself included).
    sliding_window: int | None = None
    sliding_window_pattern: int = 2

    def is_sliding(self, layer: int) -> bool:
        return (
            self.sliding_window is not None and layer % self.sliding_window_pattern == 0
        )


def rope_inv_freq(cfg: TinyConfig) -> torch.Tensor:
    """Rotary frequencies ``theta ** (-2i / d)``, rescaled the way ``cfg.rope_scaling`` asks.

    "linear" divides every frequency by ``factor`` (positions stretched evenly). "llama3" (Llama
    3.1) keeps the fast ones, whose wavelength is under ``original / high_freq_factor`` tokens,
    divides the slow ones, longer than ``original / low_freq_factor``, by ``factor``, and blends
    the two in between, so local word order is seen exactly as in pretraining.
    """
    half = cfg.head_dim // 2
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half)
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        original = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        # 1 for the fast frequencies (kept), 0 for the slow ones (divided by factor), linear between
        keep = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - keep) * inv_freq / factor + keep * inv_freq
    if kind != "default":
        raise ValueError(
            f"rope_scaling type {kind!r} is not implemented (default, linear, llama3)"
        )
    return inv_freq


class TinyLlama:
    """Weights and a forward pass; attention is whatever ``attend(layer, q, k, v)`` does.

    By default the weights are random from ``cfg.seed`` (no download). ``weights`` takes a real
    checkpoint's instead (``memlab.capstone.checkpoint.load`` builds them from a Hugging Face Llama
    folder): a dict with ``embed`` (vocab, hidden), ``norm``, ``lm_head`` (hidden, vocab; None
    when tied to ``embed``) and ``layers``, one dict per layer with ``attn_norm``, ``wq``, ``wk``,
    ``wv``, ``wo``, ``mlp_norm``, ``w_gate``, ``w_up``, ``w_down``, each matrix (in, out) so that
    a layer is ``x @ w``. Rotary positions rotate the two halves of each head (the layout of
    Hugging Face's Llama checkpoints, whose q/k rows are already permuted for it).
    """

    def __init__(
        self,
        cfg: TinyConfig = TinyConfig(),
        device="cpu",
        dtype=torch.float32,
        weights: dict | None = None,
    ):
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(
                f"num_heads {cfg.num_heads} is not a multiple of num_kv_heads {cfg.num_kv_heads}"
            )
        self.cfg, self.device, self.dtype = cfg, resolve_device(device), dtype
        w = random_weights(cfg) if weights is None else weights

        def put(t):
            return t.to(self.device, dtype)

        self.embed = put(w["embed"])
        self.layers = [
            {name: put(t) for name, t in layer.items()} for layer in w["layers"]
        ]
        self._fused: list = [None] * len(self.layers)
        self.norm = put(w["norm"])
        # A tied head is a view of the embedding, not a copy (Hugging Face ties them the same way).
        self.lm_head = self.embed.T if cfg.tie_word_embeddings else put(w["lm_head"])
        self.inv_freq = rope_inv_freq(cfg).to(self.device)

    def _rms(self, x, weight):
        """RMSNorm, in float32 whatever the model dtype, as Hugging Face computes it."""
        return (
            F.rms_norm(x.float(), (x.shape[-1],), eps=self.cfg.rms_eps).to(x.dtype)
            * weight
        )

    _FUSED = dict(wqkv=("wq", "wk", "wv"), w_gate_up=("w_gate", "w_up"))

    def _fused_weights(self, i: int) -> dict:
        """Layer ``i``'s projections that read the same input, side by side: one matmul instead
        of three and of two (a tiny model's step is mostly per-operation overhead). Built again
        when a weight of the layer was replaced."""
        p, f = self.layers[i], self._fused[i]
        if f is None or any(f["from"][n] is not p[n] for n in f["from"]):
            names = [n for group in self._FUSED.values() for n in group]
            f = self._fused[i] = {"from": {n: p[n] for n in names}}
            for fused, group in self._FUSED.items():
                f[fused] = torch.cat([p[n] for n in group], dim=1)
        return f

    def _rope_cos_sin(self, positions):
        """cos and sin of each position's rotation angles, (T, 1, D/2): once per forward."""
        ang = positions.to(torch.float32)[:, None] * self.inv_freq  # (T, D/2)
        return ang.cos()[:, None, :].to(self.dtype), ang.sin()[:, None, :].to(
            self.dtype
        )

    @staticmethod
    def _rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attend, logits_rows=None
    ) -> torch.Tensor:
        """Logits (T, vocab) for tokens ``input_ids`` at ``positions``; only the rows
        ``logits_rows`` when given (a prefill needs the next token after each request's last one,
        not every token's)."""
        c = self.cfg
        x = self.embed[input_ids]
        cos, sin = self._rope_cos_sin(positions)
        nq, nkv = c.num_heads, c.num_kv_heads
        for i, p in enumerate(self.layers):
            f = self._fused_weights(i)
            qkv = (self._rms(x, p["attn_norm"]) @ f["wqkv"]).view(
                -1, nq + 2 * nkv, c.head_dim
            )
            qk = self._rope(qkv[:, : nq + nkv], cos, sin)  # q and k rotate alike
            q, k, v = qk[:, :nq], qk[:, nq:], qkv[:, nq + nkv :]
            x = x + attend(i, q, k, v).reshape(len(x), -1) @ p["wo"]
            gate, up = (self._rms(x, p["mlp_norm"]) @ f["w_gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ p["w_down"]
        if logits_rows is not None:
            x = x[logits_rows]
        return self._rms(x, self.norm) @ self.lm_head


def random_weights(cfg: TinyConfig) -> dict:
    """Random weights from ``cfg.seed``, scaled so that greedy choices are far from ties."""
    g = torch.Generator().manual_seed(cfg.seed)
    h, q, kv, f = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )

    def w(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

    embed = torch.randn(cfg.vocab_size, h, generator=g)
    layers = [
        dict(
            attn_norm=torch.ones(h),
            wq=w(h, q),
            wk=w(h, kv),
            wv=w(h, kv),
            wo=w(q, h),
            mlp_norm=torch.ones(h),
            w_gate=w(h, f),
            w_up=w(h, f),
            w_down=w(f, h),
        )
        for _ in range(cfg.num_layers)
    ]
    # sharp logits
    lm_head = None if cfg.tie_word_embeddings else w(h, cfg.vocab_size) * 4
    return dict(embed=embed, layers=layers, norm=torch.ones(h), lm_head=lm_head)


def generate_reference(
    model: TinyLlama, prompts, max_new_tokens: int
) -> list[list[int]]:
    """Greedy generation one request at a time, K/V kept in one contiguous tensor per layer;
    a request stops after ``max_new_tokens`` or after emitting an end-of-sequence token."""
    c, outs = model.cfg, []
    group = c.num_heads // c.num_kv_heads
    for prompt in prompts:
        ks, vs = [None] * c.num_layers, [None] * c.num_layers

        def attend(i, q, k, v):
            ks[i] = k if ks[i] is None else torch.cat((ks[i], k))
            vs[i] = v if vs[i] is None else torch.cat((vs[i], v))
            kk, vv = (
                ks[i].repeat_interleave(group, 1),
                vs[i].repeat_interleave(group, 1),
            )
            s = torch.einsum("thd,shd->hts", q.float(), kk.float()) / math.sqrt(
                c.head_dim
            )
            past = len(kk) - len(q)  # query t sees keys 0..past+t
            key_pos = torch.arange(len(kk), device=q.device)[None, :]
            q_pos = past + torch.arange(len(q), device=q.device)[:, None]
            visible = key_pos <= q_pos
            # only the last sliding_window positions, the query's own included
            if c.is_sliding(i):
                visible &= q_pos - key_pos < c.sliding_window
            s = s.masked_fill(~visible, float("-inf"))
            return torch.einsum("hts,shd->thd", s.softmax(-1), vv.float()).to(q.dtype)

        tokens, out = list(prompt), []
        ids, pos = (
            torch.tensor(tokens, device=model.device, dtype=torch.int64),
            torch.arange(len(tokens), device=model.device),
        )
        for _ in range(max_new_tokens):
            nxt = int(model.forward(ids, pos, attend)[-1].argmax())
            out.append(nxt)
            if nxt in c.eos_token_ids:
                break
            ids, pos = (
                torch.tensor([nxt], device=model.device),
                torch.tensor([len(tokens)], device=model.device),
            )
            tokens.append(nxt)
        outs.append(out)
    return outs
