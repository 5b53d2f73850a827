"""Sizing from a GPU's memory to pool sizes (sglang/srt/mem_cache/kv_cache_configurator.py).

And the per-step rules of ``sglang/srt/mem_cache/allocation_sizing.py``, the decode capacity
check and retraction of ``managers/schedule_batch.py``.

Every knob lives in a configuration object (model, GPU, schedule, speculative decoding,
parallelism), never in a global: change one and every derived number moves with it.

As SGLang 0.5.23 (``KVCacheConfigurator._profile_available_bytes``): ``mem_fraction_static`` is
the share of the GPU's free memory before the weights load that weights and KV pools may take;
activations, CUDA graphs and the rest live in the other ``1 - f``. SGLang measures the free
memory before and after the load:

    usable = free after load - (1 - mem_fraction_static) * free before load
           = mem_fraction_static * free before load - weights
    tokens = usable // bytes per token (summed over the layers of each kind), floored to pages

memlab computes it: free before load is the GPU's memory less what is already in use
(``GPUConfig.in_use_bytes``: the CUDA context, other processes), and the load adds exactly the
weights. SGLang computes its default ``mem_fraction_static`` from the GPU's size and the
scheduler's activation estimate; memlab's default is a fixed 0.88.

Hybrid models split ``usable`` between ledgers first: sliding-window models keep
``swa_full_tokens_ratio`` SWA tokens per full token; linear-attention models give the state pool
``ratio / (1 + ratio)`` of it (``mamba_full_memory_ratio``). Both ratios use SGLang's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memlab.common._checks import integer, real
from memlab.common.models import FULL, LINEAR, SLIDING, ModelConfig
from memlab.common.utils import ceil_align, ceil_div
from memlab.sglang.mamba import mamba_tracking_slots

GiB = 1 << 30


def _pos_int(name: str, v) -> int:
    return integer(name, v, 1)


def _nonneg_int(name: str, v) -> int:
    return integer(name, v, 0)


def floor_ps(n: int, page_size: int) -> int:
    return n // page_size * page_size


# ---- configuration objects ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GPUConfig:
    total_bytes: int
    name: str = "gpu"
    in_use_bytes: int = (
        0  # already taken before the weights load (CUDA context, other processes)
    )

    def __post_init__(self):
        _pos_int("total_bytes", self.total_bytes)
        _nonneg_int("in_use_bytes", self.in_use_bytes)
        if self.in_use_bytes >= self.total_bytes:
            raise ValueError(
                f"in_use_bytes {self.in_use_bytes} leaves nothing of {self.total_bytes}"
            )

    @property
    def free_before_load_bytes(self) -> int:
        """SGLang's ``pre_model_load_memory``: the free memory measured before the weights load."""
        return self.total_bytes - self.in_use_bytes

    @classmethod
    def gib(cls, n: float, name: str | None = None, in_use: float = 0.0) -> GPUConfig:
        return cls(int(n * GiB), name or f"{n:g} GiB", int(in_use * GiB))


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    page_size: int = 1
    mem_fraction_static: float = (
        0.88  # (weights + KV pools) / free memory before the load
    )
    kv_dtype_bytes: int = 2  # bf16/fp16 KV; 1 for fp8 KV
    weight_dtype_bytes: int | None = None  # None: the checkpoint's dtype
    context_len: int | None = None  # None: the model's max_position_embeddings
    enable_overlap: bool = True
    swa_full_tokens_ratio: float = 0.8  # SGLang's --swa-full-tokens-ratio default
    mamba_full_memory_ratio: float = 0.9  # SGLang's --mamba-full-memory-ratio default
    mamba_conv_dtype_bytes: int = 2  # conv state in the model dtype
    mamba_ssm_dtype_bytes: int = (
        4  # temporal state in float32 (SGLang's --mamba-ssm-dtype default)
    )
    enable_mamba_extra_buffer: bool = (
        False  # tracking slots for prefix caching of linear states
    )
    mamba_extra_buffer_lazy: bool = False

    def __post_init__(self):
        for name in (
            "page_size",
            "kv_dtype_bytes",
            "mamba_conv_dtype_bytes",
            "mamba_ssm_dtype_bytes",
        ):
            _pos_int(name, getattr(self, name))
        real("mem_fraction_static", self.mem_fraction_static, 0.0, 1.0, lo_open=True)
        for name in ("weight_dtype_bytes", "context_len"):
            if getattr(self, name) is not None:
                _pos_int(name, getattr(self, name))
        for name in ("swa_full_tokens_ratio", "mamba_full_memory_ratio"):
            real(name, getattr(self, name), 0.0, float("inf"), lo_open=True)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    algorithm: str | None = None  # None: no speculative decoding; "EAGLE", "NGRAM", ...
    num_steps: int = 1  # draft depth (speculative_num_steps)
    eagle_topk: int = 1  # branches per step; 1 is a chain, > 1 a tree
    num_draft_tokens: int = (
        1  # tokens verified per step (max_speculative_num_draft_tokens)
    )
    has_draft_kv: bool = True  # False for drafts without KV of their own (NGRAM)

    def __post_init__(self):
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            _pos_int(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tp_size: int = 1
    dcp_size: int = (
        1  # decode context parallelism: each rank pages dcp_size times coarser
    )

    def __post_init__(self):
        _pos_int("tp_size", self.tp_size)
        _pos_int("dcp_size", self.dcp_size)


@dataclass(frozen=True, slots=True)
class ServingConfig:
    model: ModelConfig
    gpu: GPUConfig
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    spec: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        for name, cls in (
            ("model", ModelConfig),
            ("gpu", GPUConfig),
            ("schedule", ScheduleConfig),
            ("spec", SpeculativeConfig),
            ("parallel", ParallelConfig),
        ):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}"
                )


# ---- per-step rules -----------------------------------------------------------------------
def alloc_page_size(
    schedule: ScheduleConfig, parallel: ParallelConfig = ParallelConfig()
) -> int:
    """Allocation page size: ``page_size * dcp_size``."""
    return schedule.page_size * parallel.dcp_size


def alloc_len_per_decode(spec: SpeculativeConfig, page_size: int) -> int:
    """KV slots one request may take in one decode step (SGLang's ``get_alloc_len_per_decode``).

    1 without speculative decoding; otherwise the larger of the draft (``steps * topk``) and the
    verify block (``num_draft_tokens``). A tree (topk > 1) on pages > 1 copies each branch's
    partial last page, so each branch may need ``ceil((page_size - 1 + steps) / page_size)``
    whole pages of its own. UNO keeps one more position beside its draft tokens.
    """
    _checks_spec(spec)
    _pos_int("page_size", page_size)
    if spec.algorithm is None:
        return 1
    steps, topk, tokens = spec.num_steps, spec.eagle_topk, spec.num_draft_tokens
    if spec.algorithm.upper() == "UNO":
        return tokens + 1
    if page_size == 1 or topk == 1 or not spec.has_draft_kv:
        return max(steps * topk, tokens)
    pages_per_branch = ceil_div(page_size - 1 + steps, page_size)
    return max(pages_per_branch * page_size * topk, tokens)


def alloc_reserve_per_decode(spec: SpeculativeConfig, page_size: int) -> int:
    """KV slots reserved per request per decode step: twice the step's footprint, always.

    SGLang 0.5.23's ``get_alloc_reserve_per_decode``: a double buffer that absorbs the lag of
    the host's committed length under the overlap scheduler, kept in every scheduler mode.
    """
    return 2 * alloc_len_per_decode(spec, page_size)


def what_if_reserve_without_overlap_lag(spec: SpeculativeConfig, page_size: int) -> int:
    """NOT SGLang: the reserve if no lag had to be absorbed (1x), for comparison in chapter 08.
    SGLang 0.5.23 reserves ``alloc_reserve_per_decode`` (2x) whether or not overlap is on."""
    return alloc_len_per_decode(spec, page_size)


def req_to_token_extra_len(spec: SpeculativeConfig, page_size: int) -> int:
    """Row headroom past the context length for the decode over-allocation
    (SGLang's ``get_req_to_token_extra_context_len``)."""
    _checks_spec(spec)
    _pos_int("page_size", page_size)
    extra = 4 + (spec.num_draft_tokens if spec.algorithm is not None else 0)
    if spec.algorithm is not None and (
        page_size > 1 or spec.algorithm.upper() == "UNO"
    ):
        # the double-buffer reserve, and a page-aligned footprint may end up to
        # page_size - 1 past it
        extra = max(extra, alloc_reserve_per_decode(spec, page_size) + page_size - 1)
    return extra


def req_to_token_row_width(
    context_len: int, spec: SpeculativeConfig, page_size: int
) -> int:
    return _pos_int("context_len", context_len) + req_to_token_extra_len(
        spec, page_size
    )


def max_new_tokens_for_memory(
    input_tokens: int, max_new_tokens: int, token_capacity: int, page_size: int
) -> int:
    """Clip generation to what an empty pool could hold next to the prompt.

    The prompt rounded up to pages, one page for the page a decode may open, and one slot more.
    """
    _nonneg_int("input_tokens", input_tokens)
    _nonneg_int("max_new_tokens", max_new_tokens)
    _nonneg_int("token_capacity", token_capacity)
    _pos_int("page_size", page_size)
    return max(
        0,
        min(
            max_new_tokens,
            token_capacity - ceil_align(input_tokens, page_size) - page_size - 1,
        ),
    )


# ---- decode capacity and retraction -------------------------------------------------------
@dataclass(slots=True)
class RunningReq:
    """What the capacity check and retraction need of a decoding request."""

    rid: object
    input_len: int
    output_len: int
    kv_allocated_len: int | None = None  # slots held; None: exactly seq_len

    def __post_init__(self):
        _nonneg_int("input_len", self.input_len)
        _nonneg_int("output_len", self.output_len)
        if self.kv_allocated_len is not None:
            _nonneg_int("kv_allocated_len", self.kv_allocated_len)

    @property
    # SGLang's kv_committed_len: the tokens whose KV is written
    def seq_len(self) -> int:
        return self.input_len + self.output_len

    @property
    def allocated(self) -> int:
        return self.seq_len if self.kv_allocated_len is None else self.kv_allocated_len


def new_tokens_required_next_decode(
    reqs, page_size: int, reserve: int | None = None
) -> int:
    """Free slots the next decode step needs (SGLang's ``new_tokens_required_next_decode``).

    Without speculative decoding (``reserve`` None) a step takes one token per request, so only a
    request whose committed length sits on a page boundary needs a page (its next token opens
    one): a page for each of those, nothing for the others. ``alloc_reserve_per_decode`` is read
    only with speculative decoding (SGLang 0.5.23 reads it on no other decode path): then each
    request grows to its committed length plus ``reserve``, counted in whole pages past what it
    already holds.
    """
    _pos_int("page_size", page_size)
    if reserve is not None:
        _nonneg_int("reserve", reserve)
    reqs = _running_reqs(reqs)
    if reserve is None:
        return sum(1 for r in reqs if r.seq_len % page_size == 0) * page_size
    total = 0
    for r in reqs:
        grow = max(0, r.seq_len + reserve - r.allocated)
        total += ceil_align(r.allocated + grow, page_size) - ceil_align(
            r.allocated, page_size
        )
    return total


def check_decode_mem(
    reqs, available_tokens, page_size: int, reserve: int | None = None, evict=None
) -> bool:
    """Whether the next decode step fits (SGLang's ``ScheduleBatch.check_decode_mem``).

    As SGLang's allocator (``check_decode_capacity``), the check itself evicts: ``evict(n)``, when
    given, makes ``n`` slots free from the prefix cache if it can (the engine passes
    ``evict_from_tree_cache``), and then the free slots are read. ``available_tokens``: a number,
    or a function that reads the books (read after the eviction).
    """
    if not callable(available_tokens):
        _nonneg_int("available_tokens", available_tokens)
    num_tokens = new_tokens_required_next_decode(reqs, page_size, reserve)
    if evict is not None:
        evict(num_tokens)
    available = available_tokens() if callable(available_tokens) else available_tokens
    return available >= num_tokens


def retract_order(reqs) -> list[int]:
    """Indices in the order they are retracted (SGLang's ``_get_decode_retraction_order``, read
    from the end): fewest decoded tokens first (least work lost), ties broken by the longest
    prompt (most memory back). The same order with or without speculative decoding."""
    idx = list(range(len(reqs)))
    idx.sort(key=lambda i: (reqs[i].output_len, -reqs[i].input_len), reverse=True)
    return idx[::-1]


def retract_decode(
    reqs,
    available_tokens,
    page_size: int,
    reserve: int | None = None,
    release=None,
    evict=None,
):
    """Retract requests until the rest fit the next decode step; always keeps one.

    As SGLang's ``ScheduleBatch.retract_decode``, which the scheduler calls only after
    ``check_decode_mem`` failed: its first pass retracts without checking again. Returns
    ``(kept, retracted, fits)``; ``fits`` is False only when one request is left and still does
    not fit (SGLang aborts it; memlab leaves that to the caller).

    ``available_tokens`` is a number (the free slots now: a retracted request is counted as giving
    back all its pages) or, for an engine, a function that reads the books; then ``release`` is
    called on each victim as it is chosen (the engine frees its KV there, as SGLang's
    ``release_req``) and the books are read again, so a victim whose pages stay (a cached prefix
    another request maps) is counted as it really is. ``evict``: as for ``check_decode_mem``.
    """
    reqs = _running_reqs(reqs)
    _pos_int("page_size", page_size)
    if not callable(available_tokens):
        _nonneg_int("available_tokens", available_tokens)
    order = retract_order(reqs)[::-1]  # popped from the end, as SGLang's sorted_indices
    avail = available_tokens
    read = available_tokens if callable(available_tokens) else (lambda: avail)
    retracted = []
    first_iter = True
    while first_iter or not check_decode_mem(
        [reqs[i] for i in order], read, page_size, reserve, evict
    ):
        if len(order) == 1:
            break  # always keep at least one request
        first_iter = False
        victim = reqs[order.pop()]
        retracted.append(victim)
        if release is not None:
            release(victim)
        if not callable(available_tokens):
            avail += ceil_align(victim.allocated, page_size)
    kept = [reqs[i] for i in sorted(order)]
    return kept, retracted, check_decode_mem(kept, read, page_size, reserve, evict)


# ---- pool sizes from a budget -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PoolSizes:
    usable_bytes: (
        int  # fraction * free before load - weights (may be negative: does not fit)
    )
    weight_bytes: int
    page_size: int  # allocation page size
    full_tokens: (
        int  # full-attention pool (every per-token layer of a non-hybrid model)
    )
    swa_tokens: int  # sliding-window pool (0 when none)
    mamba_slots: int  # linear-attention state slots (0 when none)
    bytes_by_kind: dict  # kind -> bytes the pools of that kind take

    @property
    def fits(self) -> bool:
        return self.usable_bytes > 0 and self.full_tokens + self.swa_tokens > 0


def pool_sizes(cfg: ServingConfig) -> PoolSizes:
    m, s, p = cfg.model, cfg.schedule, cfg.parallel
    ps = alloc_page_size(s, p)
    kvb, tp = s.kv_dtype_bytes, p.tp_size
    weights = m.weight_bytes(s.weight_dtype_bytes, tp)
    free_before = cfg.gpu.free_before_load_bytes
    # SGLang: free after the load minus the non-static slack, (1 - f) of the free memory before it
    usable = int((free_before - weights) - free_before * (1 - s.mem_fraction_static))
    full_b = m.kv_bytes_per_token(FULL, kvb, tp)
    swa_b = m.kv_bytes_per_token(SLIDING, kvb, tp)
    state_b = m.state_bytes_per_request(
        s.mamba_conv_dtype_bytes, s.mamba_ssm_dtype_bytes, tp
    )
    full = swa = slots = 0
    if usable > 0:
        kv_budget = usable
        if state_b:
            r = s.mamba_full_memory_ratio
            slots = int(usable * r / (1 + r)) // state_b
            kv_budget = usable - slots * state_b
        if swa_b and full_b:
            # full_tokens * F + ratio * full_tokens * S = budget
            r = s.swa_full_tokens_ratio
            full = floor_ps(int(kv_budget / (full_b + r * swa_b)), ps)
            swa = floor_ps(int(full * r), ps)
        elif swa_b:  # every attention layer slides
            swa = floor_ps(kv_budget // swa_b, ps)
        else:
            full = floor_ps(kv_budget // full_b, ps)
    by_kind = {}
    if full_b:
        by_kind[FULL] = full * full_b
    if swa_b:
        by_kind[SLIDING] = swa * swa_b
    if state_b:
        by_kind[LINEAR] = slots * state_b
    return PoolSizes(usable, weights, ps, full, swa, slots, by_kind)


def request_footprint(cfg: ServingConfig, seq_len: int) -> dict:
    """What ONE request of ``seq_len`` tokens holds in each ledger at most (whole pages).

    Full attention: every token. Sliding window: the last ``sliding_window`` tokens plus the
    page the window starts in (older whole pages are released). Linear attention: one state
    slot plus its tracking slots.
    """
    _pos_int("seq_len", seq_len)
    m, s = cfg.model, cfg.schedule
    ps = alloc_page_size(s, cfg.parallel)
    out = {}
    if m.layer_ids(FULL):
        out[FULL] = ceil_align(seq_len, ps)
    if m.layer_ids(SLIDING):
        out[SLIDING] = min(
            ceil_align(seq_len, ps), ceil_align(m.sliding_window, ps) + ps
        )
    if m.layer_ids(LINEAR):
        out[LINEAR] = 1 + mamba_tracking_slots(
            s.enable_mamba_extra_buffer, s.enable_overlap, s.mamba_extra_buffer_lazy
        )
    return out


def max_requests_at(
    cfg: ServingConfig, seq_len: int, sizes: PoolSizes | None = None
) -> int:
    """How many requests of ``seq_len`` tokens fit at once: the tightest ledger decides."""
    sizes = pool_sizes(cfg) if sizes is None else sizes
    caps = {
        FULL: sizes.full_tokens,
        SLIDING: sizes.swa_tokens,
        LINEAR: sizes.mamba_slots,
    }
    need = request_footprint(cfg, seq_len)
    return min(caps[k] // n for k, n in need.items())


@dataclass(frozen=True, slots=True)
class SizingReport:
    config: ServingConfig
    sizes: PoolSizes
    seq_len: int
    requests: int
    bytes_per_token: dict  # kind -> KV bytes per token summed over that kind's layers
    state_bytes_per_request: int
    row_width: int

    @property
    def pages(self) -> int:
        return self.sizes.full_tokens // self.sizes.page_size

    def format(self) -> str:
        c, z = self.config, self.sizes
        lines = [
            f"{c.model.name} on {c.gpu.name}: weights {z.weight_bytes / GiB:.2f} GiB, "
            f"usable for KV/state {max(z.usable_bytes, 0) / GiB:.2f} GiB"
        ]
        if not z.fits:
            lines.append("  does not fit: no memory left for the KV pools")
            return "\n".join(lines)
        lines.append(
            f"  full tokens {z.full_tokens:,} ({self.pages:,} pages of {z.page_size})"
            + (f", SWA tokens {z.swa_tokens:,}" if z.swa_tokens else "")
            + (f", state slots {z.mamba_slots:,}" if z.mamba_slots else "")
        )
        total = sum(z.bytes_by_kind.values())
        for kind, b in z.bytes_by_kind.items():
            per = (
                f"{self.bytes_per_token[kind]:,} B/token"
                if kind != LINEAR
                else f"{self.state_bytes_per_request:,} B/request"
            )
            lines.append(
                f"  {kind:<18} {per:>20}  {b / GiB:7.2f} GiB  {100 * b / total:5.1f}%"
            )
        lines.append(
            f"  requests of {self.seq_len:,} tokens at once: {self.requests:,}"
        )
        return "\n".join(lines)


def report(
    model: ModelConfig,
    gpu_mem,
    seq_len: int = 4096,
    schedule: ScheduleConfig = ScheduleConfig(),
    spec: SpeculativeConfig = SpeculativeConfig(),
    parallel: ParallelConfig = ParallelConfig(),
) -> SizingReport:
    """Tokens, pages, requests at ``seq_len``, and the byte split per layer kind.

    ``gpu_mem``: a GPUConfig, or a size in GiB.
    """
    gpu = (
        gpu_mem
        if isinstance(gpu_mem, GPUConfig)
        else GPUConfig.gib(real("gpu_mem (GiB)", gpu_mem, 0.0, 1 << 20, lo_open=True))
    )
    cfg = ServingConfig(model, gpu, schedule, spec, parallel)
    sizes = pool_sizes(cfg)
    kvb, tp = schedule.kv_dtype_bytes, parallel.tp_size
    per_tok = {
        k: model.kv_bytes_per_token(k, kvb, tp)
        for k in (FULL, SLIDING)
        if model.layer_ids(k)
    }
    state = model.state_bytes_per_request(
        schedule.mamba_conv_dtype_bytes, schedule.mamba_ssm_dtype_bytes, tp
    )
    reqs = max_requests_at(cfg, seq_len, sizes) if sizes.fits else 0
    ctx = schedule.context_len or model.max_position_embeddings
    width = req_to_token_row_width(ctx, spec, alloc_page_size(schedule, parallel))
    return SizingReport(cfg, sizes, seq_len, reqs, per_tok, state, width)


def estimate_swa_kv_tokens(
    extend_input_len: int,
    max_new_tokens: int,
    *,
    sliding_window_size: int | None,
    page_size: int,
    allocation_limit: int | None = None,
) -> int:
    """The most SWA slots one request holds at once (SGLang's
    ``prefill_budget.estimate_swa_kv_tokens``, without the host tier): with no window, all
    its tokens and a page; with one, the part of the first chunk beyond the window plus at most
    a window of its tokens, and a page."""
    _check_estimate(
        extend_input_len,
        max_new_tokens,
        sliding_window_size,
        page_size,
        allocation_limit,
    )
    if sliding_window_size is None or sliding_window_size <= 0:
        return extend_input_len + max_new_tokens + page_size
    allocated = (
        extend_input_len
        if allocation_limit is None
        else min(extend_input_len, allocation_limit)
    )
    tail = max(allocated - sliding_window_size, 0)
    return (
        tail + min(extend_input_len + max_new_tokens, sliding_window_size) + page_size
    )


# -- argument checks --------------------------------------------------------------------------


def _checks_spec(spec) -> None:
    if not isinstance(spec, SpeculativeConfig):
        raise TypeError(f"spec must be a SpeculativeConfig, got {type(spec).__name__}")


def _check_estimate(extend_input_len, max_new_tokens, window, page_size, limit) -> None:
    _nonneg_int("extend_input_len", extend_input_len)
    _nonneg_int("max_new_tokens", max_new_tokens)
    _pos_int("page_size", page_size)
    for name, v in (("sliding_window_size", window), ("allocation_limit", limit)):
        if v is not None:
            integer(name, v, -(2**31))


def _running_reqs(reqs) -> list:
    if isinstance(reqs, (str, bytes)) or not hasattr(reqs, "__iter__"):
        raise TypeError(f"reqs must be a list of RunningReq, got {type(reqs).__name__}")
    reqs = list(reqs)
    for r in reqs:
        if not all(
            hasattr(r, a) for a in ("input_len", "output_len", "seq_len", "allocated")
        ):
            raise TypeError(
                f"reqs must hold RunningReq (input_len, output_len, kv_allocated_len), got {r!r}"
            )
    return reqs
