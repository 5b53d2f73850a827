"""The capstone: a Llama-style model served through memlab's books.

``TinyLlama`` is a real transformer (RMSNorm, rotary positions, grouped-query attention, SwiGLU)
with random weights from a fixed seed, or a Hugging Face Llama checkpoint's weights
(``memlab.checkpoint``; the tests check it against transformers). Its forward pass takes an
``attend`` callback, so the same model runs two ways: ``generate_reference`` keeps each request's
K/V in one contiguous tensor; ``Engine`` serves a batch through the request table, a KV pool, an
allocator (page size 1 or more), a prefix cache and a scheduler with chunked prefill, decode
batches, admission against the allocator's capacity and retraction when a decode step cannot
fit. Greedy outputs of the two must agree token for token; a request ends after
``max_new_tokens`` or on one of the model's end-of-sequence tokens.

The prefix cache is vLLM's idea on SGLang's pages: each full page of a finished request is
indexed by a chained hash of its tokens (the hash of a page stands for the whole prefix up to
it); a later request whose prompt starts with the same pages maps them into its row instead of
recomputing them. Unreferenced cached pages are evicted LRU-first when the allocator runs short.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

import torch

from memlab.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.kv_pool import MHATokenToKVPool
from memlab.req_to_token import Req, ReqToTokenPool
from memlab.sizing import RunningReq, ceil_ps, retract_order
from memlab.write_loc import KVWriteLoc


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
    # What a real checkpoint may set (memlab.checkpoint reads them from its config.json):
    tie_word_embeddings: bool = False  # the output head is the embedding matrix itself
    rope_scaling: dict | None = None  # None, {"rope_type": "linear", ...} or {"rope_type": "llama3", ...}
    eos_token_ids: tuple[int, ...] = ()  # a request stops after emitting one of these


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
        raise ValueError(f"rope_scaling type {kind!r} is not implemented (default, linear, llama3)")
    return inv_freq


class TinyLlama:
    """Weights and a forward pass; attention is whatever ``attend(layer, q, k, v)`` does.

    By default the weights are random from ``cfg.seed`` (no download). ``weights`` takes a real
    checkpoint's instead (``memlab.checkpoint.load`` builds them from a Hugging Face Llama
    folder): a dict with ``embed`` (vocab, hidden), ``norm``, ``lm_head`` (hidden, vocab; None
    when tied to ``embed``) and ``layers``, one dict per layer with ``attn_norm``, ``wq``, ``wk``,
    ``wv``, ``wo``, ``mlp_norm``, ``w_gate``, ``w_up``, ``w_down``, each matrix (in, out) so that
    a layer is ``x @ w``. Rotary positions rotate the two halves of each head (the layout of
    Hugging Face's Llama checkpoints, whose q/k rows are already permuted for it).
    """

    def __init__(self, cfg: TinyConfig = TinyConfig(), device="cpu", dtype=torch.float32, weights: dict | None = None):
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(f"num_heads {cfg.num_heads} is not a multiple of num_kv_heads {cfg.num_kv_heads}")
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        w = random_weights(cfg) if weights is None else weights

        def put(t):
            return t.to(self.device, dtype)

        self.embed = put(w["embed"])
        self.layers = [{name: put(t) for name, t in layer.items()} for layer in w["layers"]]
        self.norm = put(w["norm"])
        # A tied head is a view of the embedding, not a copy (Hugging Face ties them the same way).
        self.lm_head = self.embed.T if cfg.tie_word_embeddings else put(w["lm_head"])
        self.inv_freq = rope_inv_freq(cfg).to(self.device)

    def _rms(self, x, weight):
        xf = x.float()  # the norm in float32 whatever the model dtype, as Hugging Face computes it
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)).to(x.dtype) * weight

    def _rope(self, x, positions):
        ang = positions.to(torch.float32)[:, None] * self.inv_freq  # (T, D/2)
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend, logits_rows=None) -> torch.Tensor:
        """Logits (T, vocab) for tokens ``input_ids`` at ``positions``; only the rows ``logits_rows``
        when given (a prefill needs the next token after each request's last one, not every token's)."""
        c = self.cfg
        x = self.embed[input_ids]
        for i, p in enumerate(self.layers):
            hn = self._rms(x, p["attn_norm"])
            q = self._rope((hn @ p["wq"]).view(-1, c.num_heads, c.head_dim), positions)
            k = self._rope((hn @ p["wk"]).view(-1, c.num_kv_heads, c.head_dim), positions)
            v = (hn @ p["wv"]).view(-1, c.num_kv_heads, c.head_dim)
            x = x + attend(i, q, k, v).reshape(len(x), -1) @ p["wo"]
            hn = self._rms(x, p["mlp_norm"])
            x = x + (torch.nn.functional.silu(hn @ p["w_gate"]) * (hn @ p["w_up"])) @ p["w_down"]
        if logits_rows is not None:
            x = x[logits_rows]
        return self._rms(x, self.norm) @ self.lm_head


def random_weights(cfg: TinyConfig) -> dict:
    """Random weights from ``cfg.seed``, scaled so that greedy choices are far from ties."""
    g = torch.Generator().manual_seed(cfg.seed)
    h, q, kv, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size

    def w(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

    embed = torch.randn(cfg.vocab_size, h, generator=g)
    layers = [dict(attn_norm=torch.ones(h), wq=w(h, q), wk=w(h, kv), wv=w(h, kv), wo=w(q, h), mlp_norm=torch.ones(h),
                   w_gate=w(h, f), w_up=w(h, f), w_down=w(f, h)) for _ in range(cfg.num_layers)]
    lm_head = None if cfg.tie_word_embeddings else w(h, cfg.vocab_size) * 4  # sharp logits
    return dict(embed=embed, layers=layers, norm=torch.ones(h), lm_head=lm_head)


def generate_reference(model: TinyLlama, prompts, max_new_tokens: int) -> list[list[int]]:
    """Greedy generation one request at a time, K/V kept in one contiguous tensor per layer;
    a request stops after ``max_new_tokens`` or after emitting an end-of-sequence token."""
    c, outs = model.cfg, []
    group = c.num_heads // c.num_kv_heads
    for prompt in prompts:
        ks, vs = [None] * c.num_layers, [None] * c.num_layers

        def attend(i, q, k, v):
            ks[i] = k if ks[i] is None else torch.cat((ks[i], k))
            vs[i] = v if vs[i] is None else torch.cat((vs[i], v))
            kk, vv = ks[i].repeat_interleave(group, 1), vs[i].repeat_interleave(group, 1)
            s = torch.einsum("thd,shd->hts", q.float(), kk.float()) / math.sqrt(c.head_dim)
            past = len(kk) - len(q)  # query t sees keys 0..past+t
            causal = torch.arange(len(kk), device=q.device)[None, :] <= past + torch.arange(len(q), device=q.device)[:, None]
            s = s.masked_fill(~causal, float("-inf"))
            return torch.einsum("hts,shd->thd", s.softmax(-1), vv.float()).to(q.dtype)

        tokens, out = list(prompt), []
        ids, pos = torch.tensor(tokens, device=model.device), torch.arange(len(tokens), device=model.device)
        for _ in range(max_new_tokens):
            nxt = int(model.forward(ids, pos, attend)[-1].argmax())
            out.append(nxt)
            if nxt in c.eos_token_ids:
                break
            ids, pos = torch.tensor([nxt], device=model.device), torch.tensor([len(tokens)], device=model.device)
            tokens.append(nxt)
        outs.append(out)
    return outs


class PrefixCache:
    """Full pages indexed by chained token hashes; unreferenced pages wait in LRU order."""

    __slots__ = ("page_size", "page_of", "hash_of", "ref", "lru")

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.page_of: dict = {}  # chained hash -> page id
        self.hash_of: dict = {}  # page id -> chained hash
        self.ref: Counter = Counter()  # running requests mapping each cached page
        self.lru: OrderedDict = OrderedDict()  # cached pages nobody maps, oldest first

    def hashes(self, tokens, n_pages: int) -> list:
        ps, out, h = self.page_size, [], None
        for i in range(n_pages):
            h = hash((h, tuple(tokens[i * ps:(i + 1) * ps])))  # ints and tuples hash the same in every run
            out.append(h)
        return out

    def match(self, tokens) -> list[int]:
        """Pages of the longest cached prefix, at most len - 1 tokens (the last token is recomputed for its logits)."""
        pages = []
        for h in self.hashes(tokens, (len(tokens) - 1) // self.page_size):
            page = self.page_of.get(h)
            if page is None:
                break
            pages.append(page)
        for page in pages:
            self.ref[page] += 1
            self.lru.pop(page, None)
        return pages

    def release(self, pages) -> None:
        for page in pages:
            self.ref[page] -= 1
            if self.ref[page] == 0:
                del self.ref[page]
                self.lru[page] = None

    def insert(self, tokens, pages, start: int) -> list[int]:
        """Index a finished request's full pages from ``start`` on; returns the pages not kept (duplicates)."""
        dup = []
        for i, h in enumerate(self.hashes(tokens, len(pages))[start:], start):
            if h in self.page_of:
                dup.append(pages[i])
            else:
                self.page_of[h], self.hash_of[pages[i]] = pages[i], h
                self.lru[pages[i]] = None
        return dup

    def evictable(self) -> int:
        return len(self.lru)

    def evict(self, n: int) -> list[int]:
        out = []
        while self.lru and len(out) < n:
            page, _ = self.lru.popitem(last=False)
            del self.page_of[self.hash_of.pop(page)]
            out.append(page)
        return out


class EngineReq:
    __slots__ = ("rid", "prompt", "max_new_tokens", "output", "req", "kv_len", "cached_pages", "finished")

    def __init__(self, rid, prompt, max_new_tokens):
        self.rid, self.prompt, self.max_new_tokens = rid, list(prompt), max_new_tokens
        self.output: list[int] = []
        self.req = Req(rid)  # its row in the request table
        self.kv_len = 0  # tokens whose K/V sit in the pool
        self.cached_pages = 0  # leading pages mapped from the prefix cache (not ours to free)
        self.finished = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def prefilling(self) -> bool:
        """Still computing its prompt (or, after a retraction, prompt and output again)."""
        return not self.output or self.kv_len < len(self.prompt) + len(self.output) - 1


class Engine:
    """Serve greedy generation for a stream of requests through memlab's books."""

    def __init__(self, model: TinyLlama, *, page_size: int = 1, num_tokens: int = 2048, max_running: int = 8,
                 max_context: int = 512, chunk_size: int = 64, attention: str = "triton",
                 alloc_backend: str = "torch", prefix_cache: bool = True, ignore_eos: bool = False,
                 all_logits: bool = False, debug_mode: bool = False):
        if attention not in ("triton", "torch"):
            raise ValueError(f"attention must be 'triton' or 'torch', got {attention!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        c, dev = model.cfg, model.device
        self.model, self.page_size, self.chunk_size, self.attention = model, page_size, chunk_size, attention
        self.req_to_token_pool = ReqToTokenPool(max_running, max_context, device=dev)
        self.kv_pool = MHATokenToKVPool(num_tokens, page_size, model.dtype, c.num_kv_heads, c.head_dim, c.num_layers,
                                        device=dev)
        if page_size == 1:
            self.allocator = TokenToKVPoolAllocator(num_tokens, model.dtype, dev, self.kv_pool, debug_mode=debug_mode)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(num_tokens, page_size, model.dtype, dev, self.kv_pool,
                                                         debug_mode=debug_mode, backend=alloc_backend)
        self.cache = PrefixCache(page_size) if prefix_cache else None
        # A request finishes at max_new_tokens or on an end-of-sequence token (SGLang's ignore_eos)
        self.stop_token_ids = frozenset(() if ignore_eos else c.eos_token_ids)
        self.waiting: deque[EngineReq] = deque()
        self.running: list[EngineReq] = []
        self.finished: list[EngineReq] = []  # in the order they finished
        # The last forward pass's logits: one row per request (its last token), or, with
        # all_logits, every token's (the tests compare a whole prefill with transformers).
        self.all_logits = all_logits
        self.last_logits: torch.Tensor | None = None
        self.stats = Counter()

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt, max_new_tokens: int) -> EngineReq:
        if len(prompt) == 0:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        total = len(prompt) + max_new_tokens
        if total > self.req_to_token_pool.max_context_len:
            raise ValueError(f"a request of {total} tokens exceeds max_context {self.req_to_token_pool.max_context_len}")
        if ceil_ps(total, self.page_size) + self.page_size > self.allocator.num_pages * self.page_size:
            raise ValueError(f"a request of {total} tokens can never fit a pool of {self.allocator.size} slots")
        r = EngineReq(self.stats["requests"], prompt, max_new_tokens)
        self.stats["requests"] += 1
        self.waiting.append(r)
        return r

    def generate(self, prompts, max_new_tokens: int) -> list[list[int]]:
        reqs = [self.add_request(p, max_new_tokens) for p in prompts]
        while self.step():
            pass
        return [r.output for r in reqs]

    # -- capacity --------------------------------------------------------------------------
    def available(self) -> int:
        """Slots a request could get now: free ones plus cached pages nobody maps (evictable)."""
        return self.allocator.available_size() + (self.cache.evictable() * self.page_size if self.cache else 0)

    def _make_room(self, slots: int) -> None:
        short = slots - self.allocator.available_size()
        if short > 0 and self.cache:
            self._free_pages(self.cache.evict(-(-short // self.page_size)))

    def _free_pages(self, pages) -> None:
        if pages:
            self.allocator.free_page_ids(torch.tensor(pages, dtype=torch.int64, device=self.model.device))

    # -- scheduling ------------------------------------------------------------------------
    def step(self) -> bool:
        """One forward pass: a prefill batch if one can be formed, else a decode batch."""
        batch = self._schedule_prefill()
        if batch:
            self._run_extend(batch)
            return True
        decoding = [r for r in self.running if not r.prefilling]
        if decoding:
            self._run_decode(decoding)
            return True
        if self.waiting or self.running:
            raise RuntimeError(f"stuck: {len(self.waiting)} waiting and {len(self.running)} running, none can run")
        return False

    def _schedule_prefill(self) -> list[tuple[EngineReq, int]]:
        """Chunks to compute this step as (request, tokens): unfinished chunked prefills first, then
        waiting requests in order while the allocator can hold them (nobody overtakes)."""
        ps, budget, batch, taken = self.page_size, self.chunk_size, [], 0
        reserve = ps * sum(1 for r in self.running if not r.prefilling)  # the next decode step's pages
        for r in [r for r in self.running if r.prefilling] + list(self.waiting):
            if budget <= 0:
                break
            new = r.req.req_pool_idx is None
            if new and self.req_to_token_pool.available_size() == 0:
                break
            pages = self.cache.match(r.tokens) if new and self.cache else []  # hits leave the evictable set
            start = len(pages) * ps if new else r.kv_len
            n = min(len(r.tokens) - start, budget)
            need = ceil_ps(start + n, ps) - ceil_ps(start, ps)
            if need > self.available() - reserve - taken:
                if pages:
                    self.cache.release(pages)
                break
            if new:
                self._admit(r, pages)
            reserve += ps if start + n == len(r.tokens) else 0  # it decodes next step
            batch.append((r, n))
            budget -= n
            taken += need
        return batch

    def _admit(self, r: EngineReq, pages: list[int]) -> None:
        self.req_to_token_pool.alloc([r.req])
        self.waiting.remove(r)
        self.running.append(r)
        self.stats["prompt_tokens"] += len(r.tokens)
        r.cached_pages, r.kv_len = len(pages), len(pages) * self.page_size
        if pages:
            p = torch.tensor(pages, dtype=torch.int64, device=self.model.device)
            slots = (p[:, None] * self.page_size + torch.arange(self.page_size, device=p.device)).reshape(-1)
            self.req_to_token_pool.write((r.req.req_pool_idx, slice(0, len(slots))), slots.to(torch.int32))
            self.stats["cached_tokens"] += len(slots)
            r.req.kv_allocated_len = r.kv_len

    # -- forward passes --------------------------------------------------------------------
    def _forward(self, ids, positions, rows, out_cache_loc, logits_rows=None, extend=None):
        """Write each token's K/V to its slot, then let each token attend to its row up to itself.

        Triton: every token is a one-query decode through chapter 09's kernel (a prefill chunk
        too: causal by construction). Torch: a decode batch goes through ``attention_over_slots``;
        a prefill batch (``extend``: per request, its row, its first token in the batch, its token
        count and how many were already in the pool) attends request by request with a causal mask,
        SGLang's extend attention, so a prefill gathers each row once instead of once per token.
        """
        from memlab import attention

        loc = KVWriteLoc(out_cache_loc, physical=True)
        seq_lens = (positions + 1).to(torch.int32)
        table = self.req_to_token_pool.req_to_token
        if self.attention == "torch" and extend is None:  # the same slots for every layer: gather once
            slots, mask = attention.slots_from_req_to_token(table, rows, seq_lens)
        elif self.attention == "torch":
            segments = [self._extend_segment(*e) for e in extend]

        def attend(layer, q, k, v):
            self.kv_pool.set_kv_buffer(layer, loc, k, v)
            k_buf, v_buf = self.kv_pool.get_kv_buffer(layer)
            if self.attention == "triton":
                return attention.decode_attention_fwd(q, k_buf, v_buf, table, rows, seq_lens)
            if extend is None:
                return attention.attention_over_slots(q, k_buf, v_buf, slots, mask, 1 / math.sqrt(q.shape[-1]))
            return self._extend_attention(q, k_buf, v_buf, segments)

        logits = self.last_logits = self.model.forward(ids, positions, attend,
                                                       None if self.all_logits else logits_rows)
        return logits[logits_rows] if self.all_logits and logits_rows is not None else logits

    def _extend_segment(self, row: int, off: int, n: int, pre: int):
        """One request of a prefill batch: its slots (what was in the pool and this chunk) and which
        keys each of its ``n`` queries must not see (key j is visible to query t iff j <= pre + t)."""
        dev = self.model.device
        slots = self.req_to_token_pool.req_to_token[row, :pre + n].to(torch.int64)
        future = torch.arange(pre + n, device=dev)[None, :] > pre + torch.arange(n, device=dev)[:, None]
        return off, n, slots, future

    @staticmethod
    def _extend_attention(q, k_buf, v_buf, segments):
        """Causal attention of each request's new queries over its slots, in float32."""
        _, h, d = q.shape
        kvh = k_buf.shape[1]
        out = torch.empty_like(q)
        for off, n, slots, future in segments:
            qs = q[off:off + n].float().view(n, kvh, h // kvh, d)  # grouped query heads share a KV head
            k, v = k_buf[slots].float(), v_buf[slots].float()  # (keys, kv heads, d)
            s = torch.einsum("nkgd,skd->kgns", qs, k) / math.sqrt(d)
            p = s.masked_fill(future, float("-inf")).softmax(-1)
            out[off:off + n] = torch.einsum("kgns,skd->nkgd", p, v).reshape(n, h, -1).to(q.dtype)
        return out

    def _run_extend(self, batch) -> None:
        dev, ps, table = self.model.device, self.page_size, self.req_to_token_pool.req_to_token
        rows = torch.tensor([r.req.req_pool_idx for r, _ in batch], device=dev)
        pre = torch.tensor([r.kv_len for r, _ in batch], dtype=torch.int64)
        seq = pre + torch.tensor([n for _, n in batch], dtype=torch.int64)
        last = torch.where(pre.to(dev) > 0, table[rows, (pre.to(dev) - 1).clamp(min=0)].to(torch.int64), -1)
        ext = seq - pre
        total = int(ext.sum())
        self._make_room(int((-(-seq // ps) - (-(-pre // ps))).sum()) * ps)
        out = self.allocator.alloc_extend(pre.to(dev), pre, seq.to(dev), seq, last, total)
        if out is None:
            raise RuntimeError("alloc_extend refused a batch the scheduler admitted")
        # Token-level views of the batch: each token's request, position and row.
        tok_req = torch.repeat_interleave(torch.arange(len(batch)), ext)
        pos = (torch.arange(total) - (torch.cumsum(ext, 0) - ext)[tok_req] + pre[tok_req]).to(dev)
        tok_rows = rows[tok_req.to(dev)]
        table[tok_rows, pos] = out.to(torch.int32)  # the request table records every new slot
        ids = torch.tensor([t for (r, n), p in zip(batch, pre.tolist()) for t in r.tokens[p:p + n]], device=dev)
        starts = torch.cumsum(ext, 0) - ext  # each request's first and last token in the batch
        ends = (starts + ext - 1).to(dev)
        extend = [(r.req.req_pool_idx, off, n, p) for (r, n), off, p in zip(batch, starts.tolist(), pre.tolist())]
        picks = self._forward(ids, pos, tok_rows, out, logits_rows=ends, extend=extend).argmax(-1).tolist()
        self.stats["prefill_tokens"] += total
        for (r, n), nxt in zip(batch, picks):
            r.kv_len += n
            r.req.kv_allocated_len = r.kv_len
            if r.kv_len == len(r.tokens):  # the whole sequence is in: its last logits give the next token
                self._append(r, nxt)

    def _run_decode(self, decoding: list[EngineReq]) -> None:
        ps, dev = self.page_size, self.model.device
        while True:  # retract until the step fits; always keep one request
            opening = sum(1 for r in decoding if r.kv_len % ps == 0)  # the new token starts a page
            if opening * ps <= self.available() or len(decoding) == 1:
                break
            views = [RunningReq(r.rid, len(r.prompt), len(r.output), r.kv_len) for r in decoding]
            victim = decoding.pop(retract_order(views)[0])
            self._retract(victim)
        self._make_room(opening * ps)
        seq = torch.tensor([r.kv_len + 1 for r in decoding], dtype=torch.int64)
        rows = torch.tensor([r.req.req_pool_idx for r in decoding], device=dev)
        last = self.req_to_token_pool.req_to_token[rows, seq.to(dev) - 2].to(torch.int64)
        out = self.allocator.alloc_decode(seq.to(dev), seq, last)
        if out is None:
            raise RuntimeError(f"the pool ({self.allocator.size} slots) cannot hold one more token of a single request")
        self.req_to_token_pool.req_to_token[rows, seq.to(dev) - 1] = out.to(torch.int32)
        ids = torch.tensor([r.tokens[-1] for r in decoding], device=dev)
        logits = self._forward(ids, seq.to(dev) - 1, rows, out)
        self.stats["decode_tokens"] += len(decoding)
        for r, nxt in zip(decoding, logits.argmax(-1).tolist()):
            r.kv_len += 1
            r.req.kv_allocated_len = r.kv_len
            self._append(r, nxt)

    def _append(self, r: EngineReq, token: int) -> None:
        r.output.append(token)
        if len(r.output) == r.max_new_tokens or token in self.stop_token_ids:
            r.finished = True
            self.running.remove(r)
            self.finished.append(r)
            self._release(r, to_cache=True)

    def _retract(self, r: EngineReq) -> None:
        """Give back a decoding request's memory; it waits at the front and recomputes later."""
        self.running.remove(r)
        self._release(r, to_cache=False)
        self.waiting.appendleft(r)
        self.stats["retracted"] += 1

    def _release(self, r: EngineReq, to_cache: bool) -> None:
        ps = self.page_size
        slots = self.req_to_token_pool.req_to_token[r.req.req_pool_idx, :r.kv_len].to(torch.int64)
        pages = (slots[::ps] // ps).tolist()
        k = r.cached_pages
        if self.cache:
            self.cache.release(pages[:k])
        if self.cache and to_cache:
            full = r.kv_len // ps  # only whole pages are cached; the partial last one is freed
            self._free_pages(self.cache.insert(r.tokens[:r.kv_len], pages[:full], start=k) + pages[full:])
        elif r.kv_len > k * ps:
            self.allocator.free(slots[k * ps:])
        self.req_to_token_pool.free(r.req)
        r.req.kv_allocated_len = r.kv_len = r.cached_pages = 0

    # -- books -----------------------------------------------------------------------------
    def check_books(self) -> None:
        """Every page is exactly one of: free, owned by a running request, or cached."""
        ps, seen = self.page_size, {}
        for r in self.running:
            slots = self.req_to_token_pool.req_to_token[r.req.req_pool_idx, :r.kv_len].tolist()
            for s in slots[r.cached_pages * ps:]:
                assert seen.setdefault(s // ps, r.rid) == r.rid, f"page {s // ps} held by requests {seen[s // ps]} and {r.rid}"
        cached = set(self.cache.hash_of) if self.cache else set()
        free = torch.cat((self.allocator.free_pages, self.allocator.release_pages)).tolist()
        assert not cached & set(seen), f"pages {sorted(cached & set(seen))} are cached and owned"
        assert not set(free) & (cached | set(seen)), f"pages {sorted(set(free) & (cached | set(seen)))} are free and in use"
        assert len(free) + len(cached) + len(seen) == self.allocator.num_pages, (
            f"{len(free)} free + {len(cached)} cached + {len(seen)} owned != {self.allocator.num_pages} pages")
        if self.cache:
            assert set(self.cache.lru) | set(self.cache.ref) == cached, "cached pages out of the LRU and unreferenced"


def throughput(engine: Engine, prompts, max_new_tokens: int) -> dict:
    """Run a batch to completion; tokens per second of the whole run (prefill + decode)."""
    t0 = time.perf_counter()
    outs = engine.generate(prompts, max_new_tokens)
    dt = time.perf_counter() - t0
    gen = sum(len(o) for o in outs)
    return dict(seconds=dt, generated=gen, prefill=engine.stats["prefill_tokens"],
                tokens_per_s=(gen + engine.stats["prefill_tokens"]) / dt, generated_per_s=gen / dt)
