"""Chapter 10 exercise: which waiting requests the scheduler admits in one step.

Write ``admit``. Grade with ``./course grade 10``.
"""


class Request:
    __slots__ = ("rid", "input_len", "max_new_tokens")

    def __init__(self, rid, input_len: int, max_new_tokens: int):
        self.rid = rid
        self.input_len = input_len
        self.max_new_tokens = max_new_tokens

    def __repr__(self):
        return (
            f"Request({self.rid!r}, input_len={self.input_len}, "
            f"max_new_tokens={self.max_new_tokens})"
        )


class CapacityHooks:
    """Given: what the allocator tells the scheduler (SGLang's scheduler-facing capacity hooks)."""

    def __init__(self, available: int, token_capacity: int, page_size: int):
        self.available = available  # free KV slots now
        self.token_capacity = token_capacity  # slots of the whole pool
        self.page_size = page_size

    def available_size(self) -> int:
        return self.available

    def max_new_tokens_for_memory(self, input_tokens: int, max_new_tokens: int) -> int:
        paged_input = -(-input_tokens // self.page_size) * self.page_size
        return max(
            0,
            min(max_new_tokens, self.token_capacity - paged_input - self.page_size - 1),
        )


def admit(
    waiting: list,
    running_seq_lens: list,
    hooks: CapacityHooks,
    max_running_requests: int,
) -> tuple[list, list]:
    """First come, first served: return ``(admitted, rejected)`` lists of requests from ``waiting``.

    ``running_seq_lens`` holds the committed length (SGLang's ``kv_committed_len``) of each request
    already running. Without speculative decoding a decode step writes one token per request, at
    position ``seq_len``: it opens a page exactly when ``seq_len % page_size == 0`` (at page size
    1: always), and that request then needs ``page_size`` free slots; the others need none (their
    token fits in their last page). SGLang 0.5.23 counts the next decode step this way
    (``new_tokens_required_next_decode``); its doubled ``alloc_reserve_per_decode`` is read only
    when decoding speculatively.

    - Budget: ``hooks.available_size()`` minus what the running requests' next decode step needs.
    - Walk ``waiting`` in order. Stop once ``len(running_seq_lens) + len(admitted)`` reaches
      ``max_running_requests`` (a rejected request takes no place among them).
    - ``clip = hooks.max_new_tokens_for_memory(r.input_len, r.max_new_tokens)``. When it is 0 but
      ``r.max_new_tokens > 0`` the request cannot run even in an empty pool: append it to
      ``rejected`` and go on with the next one.
    - A request costs its prompt rounded UP to whole pages, plus what its first decode step
      needs by the rule above at ``seq_len = r.input_len`` (``page_size`` when its prompt ends
      on a page boundary, else 0): charged to every request, a prefill-only one
      (``max_new_tokens == 0``) too. When the cost exceeds what is left of the budget, STOP: a
      later, smaller request must not overtake it (it would starve).
    - Otherwise admit it: set ``r.max_new_tokens = clip`` (only now: a request that waits keeps
      its own), append it, take its whole cost off the budget.
    Do not change ``waiting`` itself. See chapter 10 (admission).

    Where this simplifies the engine: memlab's engine admits as SGLang 0.5.23's ``PrefillAdder``
    does (``memlab.sglang.schedule_policy``). Its budget also holds back what the running
    requests will still write (each one's remaining ``max_new_tokens``, at most 4096, times
    ``new_token_ratio``, which starts at 0.7, decays every decode step and rises after a
    retraction), and a request costs its prompt, one page and its own ``max_new_tokens`` (at
    most 4096), admitted only while that stays below the budget. Here the budget keeps back only
    the running requests' next decode step and a request costs only its prompt and its first
    decode step: the check SGLang makes before each decode step (``check_decode_mem``), used as
    the admission rule. It admits more than the engine would, so a scheduler built on it
    retracts more often once the outputs grow.
    """
    # BEGIN SOLUTION
    ps = hooks.page_size
    budget = hooks.available_size() - ps * sum(
        1 for s in running_seq_lens if s % ps == 0
    )
    admitted, rejected = [], []
    for r in waiting:
        if len(running_seq_lens) + len(admitted) >= max_running_requests:
            break
        clip = hooks.max_new_tokens_for_memory(r.input_len, r.max_new_tokens)
        if clip == 0 and r.max_new_tokens > 0:
            rejected.append(r)
            continue
        cost = -(-r.input_len // ps) * ps + (ps if r.input_len % ps == 0 else 0)
        if cost > budget:
            break
        r.max_new_tokens = clip
        admitted.append(r)
        budget -= cost
    return admitted, rejected
    # END SOLUTION
