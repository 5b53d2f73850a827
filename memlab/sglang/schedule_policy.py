"""The scheduler's admission, sglang/srt/managers/schedule_policy.py (SGLang 0.5.23).

Which waiting requests join the next prefill batch. ``SchedulePolicy`` orders the waiting queue
(first come first served, or longest cached prefix first). ``PrefillAdder`` then walks it and
admits requests against a budget of KV slots: what the pool has free and the prefix cache could
evict, less what the running requests will still write (each one's remaining output, clipped to
``CLIP_MAX_NEW_TOKENS`` and scaled by ``new_token_ratio``), less what every request admitted this
round takes now (its prompt in whole pages, one page more) and later (its own clipped output).
``NewTokenRatioTracker`` keeps the ratio: it starts at 0.7, decays each decode step toward its
floor, is raised after a retraction and reset when the scheduler idles. ``match_kv_cache`` and
``match_and_lock`` are where a new request meets the prefix cache before the adder looks at it.

Where memlab differs from SGLang 0.5.23: one memory budget (SGLang's ``PrefillBudget``, from
``mem_cache/prefill_budget.py``) for every allocator, whose composite pools (two SWA pools, the
unified pool) answer through their ``prealloc_fits`` instead of a per-side budget
(``SWAPrefillBudget``); no priority preemption, LoRA, multimodal, disaggregation, Mamba slots,
page sharding or tile budgets; FCFS and LPM only; the in-batch prefix check compares prompts
directly where SGLang inserts them into a simulated radix tree (the same lengths).
"""

from __future__ import annotations

import math
from enum import Enum, auto
from typing import NamedTuple

from memlab.common import _checks
from memlab.common.sizing import estimate_swa_kv_tokens

# managers/schedule_policy.py: the estimate of a long output is clipped (SGLANG_CLIP_MAX_NEW_TOKENS_
# ESTIMATION); the request still stops at its own max_new_tokens.
CLIP_MAX_NEW_TOKENS = 4096
# In-batch prefix caching: a request whose cached prefix is at most CHECK tokens and that shares at
# least DEPRIORITIZE tokens with an earlier waiting one goes last this round (the earlier one
# computes the shared part, the later one then finds it cached).
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
# Past this many waiting requests LPM falls back to FCFS (matching them all costs too much).
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
IGNORE_EOS_RESERVE_TOKENS = 1
# sglang/srt/environ.py: the new-token ratio's defaults.
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_RETRACT_DECODE_STEPS = 20
POLICIES = ("fcfs", "lpm")


class SamplingParams:
    """The two fields of SGLang's ``SamplingParams`` (sampling/sampling_params.py) that the
    scheduler reads."""

    __slots__ = ("max_new_tokens", "ignore_eos")

    def __init__(self, max_new_tokens: int, ignore_eos: bool = False):
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = ignore_eos


class NewTokenRatioTracker:
    """What share of its remaining ``max_new_tokens`` a running request is expected to still write
    (SGLang's managers/scheduler_components/new_token_ratio_tracker.py). Most requests stop early,
    so the scheduler starts at 0.7 and lowers the guess by ``decay`` every decode step that needed
    no retraction, down to ``min``; a retraction proves the guess too low and sets it from the
    batch that is left (``estimate_new_token_ratio_after_retract``); an idle scheduler resets it."""

    __slots__ = ("init", "min", "decay", "current")

    def __init__(self, schedule_conservativeness: float = 1.0):
        init = min(SGLANG_INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.init = self.current = init
        self.min = min(init * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (init - self.min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def reset(self) -> None:
        self.current = self.init

    @staticmethod
    def estimate_new_token_ratio_after_retract(reqs) -> float:
        """The kept requests' decoded share of their ``max_new_tokens``, as if each had decoded
        ``SGLANG_RETRACT_DECODE_STEPS`` more."""
        decoded = sum(len(r.output_ids) for r in reqs)
        max_new = sum(r.sampling_params.max_new_tokens for r in reqs)
        return min(
            1.0, (decoded + SGLANG_RETRACT_DECODE_STEPS * len(reqs)) / (max_new + 1)
        )


def common_prefix_len(a, b) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def match_kv_cache(req, tree_cache):
    """Match the request's tokens but the last (computed again for its logits) and adopt the hit as
    its prefix (SGLang's ``match_kv_cache``, mem_cache/common.py, from
    ``Req.init_next_round_input``): ``prefix_len``, ``last_node``, and for HiCache the host part
    (``last_host_node``, ``host_hit_length``). Nothing is locked: the adder locks what it admits."""
    fill = req.full_untruncated_fill_ids
    m = tree_cache.match_prefix(fill[: len(fill) - 1])
    req.prefix_len = req.kv.cache_protected_len = m.device_prefix_len
    req.last_node, req.last_host_node = m.last_device_node, m.last_host_node
    req.host_hit_length = m.host_hit_length
    return m


def match_and_lock(tree_cache, req) -> tuple:
    """A new request's whole meeting with the prefix cache in one call: match its tokens but the
    last, load a host-only part back to the device first (HiCache), lock the node the device part
    ends at (``match_kv_cache``, then what ``PrefillAdder.add_one_req`` does on admission: the
    load-back and ``_commit_prefill_admission``'s lock). Sets ``req.prefix_len``,
    ``req.last_node``, ``req.lock`` and ``req.kv.cache_protected_len``; returns (the matched
    slots, how many tokens came back from the host). Any of the course's prefix caches."""
    fill = req.full_untruncated_fill_ids
    m = tree_cache.match_prefix(fill[: len(fill) - 1])
    node, loaded = m.last_device_node, 0
    if m.host_hit_length:  # the load-back locks what it needs meanwhile
        indices, node = tree_cache.init_load_back(m.last_host_node, m.host_hit_length)
        loaded = len(indices)
    prefix = tree_cache.path_device_indices(node)
    req.prefix_len = req.kv.cache_protected_len = len(prefix)
    req.last_node, req.lock = node, tree_cache.lock(node)
    return prefix, loaded


class SchedulePolicy:
    """Orders the waiting queue before the adder walks it (SGLang's ``SchedulePolicy``). ``"fcfs"``
    leaves it as it is; ``"lpm"`` (longest prefix match) puts the longest cached prefix first. A
    cache-aware policy without a prefix cache to be aware of becomes FCFS."""

    __slots__ = ("policy", "tree_cache")

    def __init__(self, policy: str, tree_cache):
        _checks.one_of("schedule_policy", policy, POLICIES)
        disabled = getattr(tree_cache, "disable", True)
        self.policy = "fcfs" if policy == "lpm" and disabled else policy
        self.tree_cache = tree_cache

    def calc_priority(self, waiting_queue: list) -> None:
        """Sort ``waiting_queue`` in place. LPM: each request is matched against the prefix cache
        without a lock (the match refreshes its path's LRU time, as SGLang's does); one that would
        only recompute what an earlier waiting one is about to compute goes last; the sort is
        stable, so ties stay first come first served."""
        if self.policy != "lpm" or len(waiting_queue) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return
        matched, temporary_deprioritized, waiting_prefixes = {}, set(), []
        for r in waiting_queue:
            fill = r.full_untruncated_fill_ids
            m = self.tree_cache.match_prefix(fill[: len(fill) - 1])
            matched[r.rid] = m.device_prefix_len + m.host_hit_length
            if matched[r.rid] <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                shared = max(
                    (common_prefix_len(fill, p) for p in waiting_prefixes), default=0
                )
                if shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    temporary_deprioritized.add(r.rid)
                else:
                    waiting_prefixes.append(fill)
        waiting_queue.sort(
            key=lambda r: (
                math.inf if r.rid in temporary_deprioritized else -matched[r.rid]
            )
        )


class AddReqResult(Enum):
    CONTINUE = auto()  # the next request may be tried
    NO_TOKEN = auto()  # the memory budget is spent
    OTHER = auto()  # another budget (the chunk, the prefill tokens) is spent


class _PrefillAdmission(NamedTuple):
    prefix_len: int
    extend_len: int
    max_new_tokens: int
    is_chunked: bool


class PrefillBudget:
    """The KV slots one prefill round may still promise (SGLang's ``PrefillBudget``,
    mem_cache/prefill_budget.py). ``total_offset`` holds what the round promised for good (the
    running requests' future output, each admitted request's pages and output); ``current_offset``
    what it takes right now (the admitted pages). Both are read against the live books: free plus
    evictable slots, so a lock taken meanwhile counts. A composite allocator also prices each
    demand on its own sides (``prealloc_fits``; for a single pool that adds nothing)."""

    __slots__ = (
        "allocator",
        "tree_cache",
        "page_size",
        "sliding_window_size",
        "total_offset",
        "current_offset",
    )

    def __init__(
        self,
        allocator,
        tree_cache,
        sliding_window_size: int | None = None,
        *,
        num_mixed_decode_tokens: int = 0,
    ):
        self.allocator, self.tree_cache = allocator, tree_cache
        self.page_size = allocator.page_size
        self.sliding_window_size = sliding_window_size
        self.total_offset = self.current_offset = num_mixed_decode_tokens

    def ceil_paged_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def _available_and_evictable(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def remaining_total(self) -> float:
        return self._available_and_evictable() - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self._available_and_evictable() - self.current_offset

    def has_capacity(self) -> bool:
        return self.remaining_total > 0 and self.remaining_current > 0

    def _sides_fit(
        self, tokens: int, extend_input_len: int, max_new_tokens: int, budget
    ):
        swa = (
            tokens
            if self.sliding_window_size is None
            else estimate_swa_kv_tokens(
                extend_input_len,
                max_new_tokens,
                sliding_window_size=self.sliding_window_size,
                page_size=self.page_size,
            )
        )
        return self.allocator.prealloc_fits(
            self.tree_cache, tokens, swa, full_budget_tokens=math.floor(budget)
        )

    def check_prefill(
        self, *, extend_input_len: int, total_tokens: int, max_new_tokens: int
    ) -> bool:
        """Whether a request costing ``total_tokens`` for good may be admitted."""
        return total_tokens < self.remaining_total and self._sides_fit(
            total_tokens, extend_input_len, max_new_tokens, self.remaining_total
        )

    def can_allocate_prefill(
        self, *, paged_input: int, extend_input_len: int, max_new_tokens: int
    ) -> bool:
        """Whether ``paged_input`` slots can be taken now."""
        budget = min(self.remaining_current, self.remaining_total)
        return paged_input <= budget and self._sides_fit(
            paged_input, extend_input_len, max_new_tokens, budget
        )

    def available_chunk_tokens(self, chunk_limit: int) -> int:
        available = min(chunk_limit, int(self.remaining_total))
        # a continuing chunk must make progress, or its KV is never released
        return available if available > 0 else chunk_limit

    def reserve(
        self, extend_input_len: int, max_new_tokens: int, *, extra_tokens: int = 0
    ) -> None:
        immediate = self.ceil_paged_tokens(extend_input_len) + self.page_size
        immediate += extra_tokens
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate


class PrefillAdder:
    """One prefill round's admission (SGLang's ``PrefillAdder``). Build it with the running batch
    (their future output is reserved at once), then offer the continuing chunked request
    (``add_chunked_req``) and the waiting requests in order (``add_one_req``, after
    ``match_kv_cache``) until one comes back other than ``CONTINUE``. ``can_run_list`` is the
    batch, each request's ``extend_end`` where its chunk ends; ``new_chunked_req`` the one cut
    short. A request admitted here holds a lock on its matched prefix (``req.lock``).

    A request is read as SGLang's: ``sampling_params`` (``max_new_tokens``, ``ignore_eos``),
    ``origin_input_ids``, ``output_ids``, ``full_untruncated_fill_ids``, ``prefix_len``,
    ``last_node``, ``host_hit_length``, ``last_host_node``, ``kv.req_pool_idx``; a HiCache
    load-back sets ``host_loaded_length``."""

    def __init__(
        self,
        page_size: int,
        tree_cache,
        token_to_kv_pool_allocator,
        running_batch,
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        num_mixed_decode_tokens: int = 0,
        *,
        sliding_window_size: int | None = None,
    ):
        _validate_adder(page_size, new_token_ratio, rem_input_tokens, rem_chunk_tokens)
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        # the running requests (SGLang: a ScheduleBatch)
        self.running_batch = running_batch
        self.new_token_ratio = new_token_ratio
        # a mixed batch (--enable-mixed-chunk) also computes one token of each running request
        self.rem_input_tokens = rem_input_tokens - num_mixed_decode_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        if rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= num_mixed_decode_tokens
        self.memory_budget = PrefillBudget(
            token_to_kv_pool_allocator,
            tree_cache,
            sliding_window_size,
            num_mixed_decode_tokens=num_mixed_decode_tokens,
        )
        self.req_states = None
        self.can_run_list = []
        self.new_chunked_req = None
        self.log_hit_tokens = self.log_input_tokens = 0
        if running_batch is not None:
            # what the running requests will still write
            self.memory_budget.total_offset += sum(
                self._get_running_request_total_token_offset(r) for r in running_batch
            )
        # two pools (or a unified one) keep the SWA side apart: the ignore-EOS walk would
        # underestimate it, so it is skipped there
        self.is_hybrid_swa = hasattr(
            token_to_kv_pool_allocator, "translate_loc_from_full_to_swa"
        )
        self.per_req_token_overhead = page_size  # the page alloc_extend may open

    def _get_running_request_total_token_offset(self, req) -> float:
        # a fixed-length request cannot stop early: its whole remaining output counts
        ratio = 1.0 if req.sampling_params.ignore_eos else self.new_token_ratio
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        return min(remaining, CLIP_MAX_NEW_TOKENS) * ratio

    @property
    def rem_total_tokens(self) -> float:
        return self.memory_budget.remaining_total

    @property
    def cur_rem_tokens(self) -> float:
        return self.memory_budget.remaining_current

    def _max_new_left(self, req) -> int:
        remaining = max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)
        return min(remaining, CLIP_MAX_NEW_TOKENS)

    def _request_slot_reserve_for_req(self, req, extend_input_len: int | None = None):
        if extend_input_len is None:
            extend_input_len = len(req.full_untruncated_fill_ids) - req.prefix_len
        return self.token_to_kv_pool_allocator.request_slot_reserve(
            has_req_pool_slot=req.kv.req_pool_idx is not None,
            prefill_tokens=req.prefix_len + extend_input_len,
        )

    def ceil_paged_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if not self.memory_budget.has_capacity():
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(
        self,
        prefix_len: int,
        extend_input_len: int,
        max_new_tokens: int,
        request_slot_reserve: int = 0,
    ) -> None:
        """Charge an admitted chunk: its pages and one more now, its output later; the compute
        budgets take its pages."""
        raw_extend_input_len = extend_input_len
        extend_input_len = self.ceil_paged_tokens(extend_input_len)
        self.memory_budget.reserve(
            extend_input_len, max_new_tokens, extra_tokens=request_slot_reserve
        )
        self.rem_input_tokens -= extend_input_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += raw_extend_input_len

    def add_chunked_req(self, req):
        """The next chunk of the request cut short last round; returns it while it is unfinished,
        None once this chunk ends its prompt (it then reserves its clipped output)."""
        rem_tokens = self.memory_budget.available_chunk_tokens(self.rem_chunk_tokens)
        cand_extend_input_len = len(req.full_untruncated_fill_ids) - req.prefix_len
        truncated = cand_extend_input_len > rem_tokens
        new_len = min(cand_extend_input_len, rem_tokens)
        request_slot_reserve = self._request_slot_reserve_for_req(req, new_len)
        if request_slot_reserve and not self.memory_budget.can_allocate_prefill(
            paged_input=self.ceil_paged_tokens(new_len)
            + self.per_req_token_overhead
            + request_slot_reserve,
            extend_input_len=new_len,
            max_new_tokens=self._max_new_left(req),
        ):
            return req
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(req)
        max_new_tokens = (
            0
            if truncated
            else min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        )
        self._update_prefill_budget(
            0, req.extend_len, max_new_tokens, request_slot_reserve
        )
        return req if truncated else None

    def add_one_req_ignore_eos(self, req) -> AddReqResult:
        """Admission of a fixed-length request without a prefix cache: every request's exact
        future is known, so the adder checks that, finishing in order of what each has left to
        write, the pool never runs dry (``IGNORE_EOS_RESERVE_TOKENS`` spare per request)."""
        cand_extend_input_len = len(req.full_untruncated_fill_ids) - req.prefix_len
        paged_input = (
            self.ceil_paged_tokens(cand_extend_input_len) + self.per_req_token_overhead
        )
        paged_input += self._request_slot_reserve_for_req(req)
        if not self.memory_budget.can_allocate_prefill(
            paged_input=paged_input,
            extend_input_len=cand_extend_input_len,
            max_new_tokens=self._max_new_left(req),
        ):
            return AddReqResult.NO_TOKEN

        def add_req_state(r, insert_sort=False):
            ratio = 1.0 if r.sampling_params.ignore_eos else self.new_token_ratio
            tokens_left = r.sampling_params.max_new_tokens * ratio - len(r.output_ids)
            tokens_occupied = len(r.origin_input_ids) + len(r.output_ids)
            if tokens_left <= 0:
                return
            if not insert_sort:
                self.req_states.append((tokens_left, tokens_occupied))
                return
            i = 0
            for i in range(len(self.req_states)):
                if tokens_left <= self.req_states[i][0]:
                    break
            self.req_states.insert(i, (tokens_left, tokens_occupied))

        if self.req_states is None:
            self.req_states = []
            add_req_state(req)
            for r in self.running_batch or ():
                add_req_state(r)
            for r in self.can_run_list:
                add_req_state(r)
            self.req_states.sort(key=lambda x: x[0])
        else:
            add_req_state(req, insert_sort=True)

        if not self.is_hybrid_swa:
            cur_rem_tokens = self.cur_rem_tokens - paged_input
            tokens_freed = 0
            for i, (tokens_left, tokens_occupied) in enumerate(self.req_states):
                bs = len(self.req_states) - i
                min_free_tokens = cur_rem_tokens + tokens_freed - tokens_left * bs
                if min_free_tokens <= IGNORE_EOS_RESERVE_TOKENS * bs:
                    return AddReqResult.NO_TOKEN
                tokens_freed += tokens_occupied

        if (
            self.rem_chunk_tokens is None
            or cand_extend_input_len <= self.rem_chunk_tokens
        ):
            req.extend_end = len(req.full_untruncated_fill_ids)
            self.can_run_list.append(req)
            self._update_prefill_budget(
                0,
                req.extend_len,
                min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS),
                self._request_slot_reserve_for_req(req),
            )
        else:
            if self.rem_chunk_tokens <= 0:
                return AddReqResult.OTHER
            trunc_len = self.rem_chunk_tokens
            req.extend_end = req.prefix_len + trunc_len
            self.can_run_list.append(req)
            self.new_chunked_req = req
            self._update_prefill_budget(
                0, trunc_len, 0, self._request_slot_reserve_for_req(req, trunc_len)
            )
        return self.budget_state()  # no lock: there is no prefix cache to hold

    def add_one_req(self, req, has_chunked_req: bool = False) -> AddReqResult:
        """Admit one waiting request (matched already) when its prompt, a page and its clipped
        output fit what the round has left; a prompt longer than the chunk budget is cut to
        whole pages and reserves no output yet. Returns what the next request may expect."""
        if req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True):
            return self.add_one_req_ignore_eos(req)
        max_new = self._max_new_left(req)
        cand_extend_input_len = len(req.full_untruncated_fill_ids) - req.prefix_len
        total_tokens = cand_extend_input_len + max_new + self.per_req_token_overhead
        total_tokens += self._request_slot_reserve_for_req(req)
        # the temporary lock keeps the matched prefix out of the evictable budget
        lock = self.tree_cache.lock(req.last_node)
        try:
            admission = self._select_prefill_admission(
                req, total_tokens, req.host_hit_length
            )
            if isinstance(admission, AddReqResult):
                return admission
            if req.host_hit_length > 0:
                indices, req.last_node = self.tree_cache.init_load_back(
                    req.last_host_node, req.host_hit_length
                )
                req.host_loaded_length = len(indices)
                if req.host_loaded_length:
                    req.prefix_len += req.host_loaded_length
                    req.kv.cache_protected_len = req.prefix_len
                else:  # nothing came back: the host part is recomputed, if that fits
                    admission = self._select_prefill_admission(req, total_tokens, 0)
                    if isinstance(admission, AddReqResult):
                        return admission
            self._commit_prefill_admission(req, admission)
        finally:
            self.tree_cache.unlock(lock)
        return self.budget_state()

    def _select_prefill_admission(self, req, total_tokens: int, host_hit_length: int):
        """The shape of the request's prefill, or why it waits; nothing is allocated."""
        prefix_len = req.prefix_len + host_hit_length
        extend_len = len(req.full_untruncated_fill_ids) - prefix_len
        input_tokens = self.ceil_paged_tokens(extend_len)
        if not self.memory_budget.check_prefill(
            extend_input_len=extend_len,
            total_tokens=total_tokens,
            max_new_tokens=self._max_new_left(req),
        ):
            return AddReqResult.NO_TOKEN
        # without chunking, the first request is taken even above the input budget
        if (
            self.rem_chunk_tokens is None
            and self.can_run_list
            and input_tokens >= self.rem_input_tokens
        ):
            return AddReqResult.OTHER
        is_chunked = False
        max_new_tokens = min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if self.rem_chunk_tokens is not None and input_tokens > self.rem_chunk_tokens:
            extend_len = self.rem_chunk_tokens // self.page_size * self.page_size
            end = (prefix_len + extend_len) // self.page_size * self.page_size
            extend_len = end - prefix_len
            if extend_len <= 0:
                return AddReqResult.OTHER
            is_chunked = True
            max_new_tokens = 0  # its output is reserved with its last chunk
        return _PrefillAdmission(prefix_len, extend_len, max_new_tokens, is_chunked)

    def _commit_prefill_admission(self, req, admission: _PrefillAdmission) -> None:
        req.extend_end = admission.prefix_len + admission.extend_len
        req.lock = self.tree_cache.lock(req.last_node)
        self.can_run_list.append(req)
        if admission.is_chunked:
            self.new_chunked_req = req
        self._update_prefill_budget(
            admission.prefix_len,
            admission.extend_len,
            admission.max_new_tokens,
            self._request_slot_reserve_for_req(req, admission.extend_len),
        )


def _validate_adder(page_size, new_token_ratio, rem_input_tokens, rem_chunk_tokens):
    _checks.integer("page_size", page_size, 1)
    _checks.real("new_token_ratio", new_token_ratio, 0.0, 1.0)
    _checks.integer("rem_input_tokens", rem_input_tokens)
    if rem_chunk_tokens is not None:
        _checks.integer("rem_chunk_tokens", rem_chunk_tokens)
