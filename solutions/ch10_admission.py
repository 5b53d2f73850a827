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
        return f"Request({self.rid!r}, input_len={self.input_len}, max_new_tokens={self.max_new_tokens})"


class CapacityHooks:
    """Given: what the allocator tells the scheduler (SGLang's scheduler-facing capacity hooks)."""

    def __init__(self, available: int, token_capacity: int, page_size: int, decode_reserve: int):
        self.available = available  # free KV slots now
        self.token_capacity = token_capacity  # slots of the whole pool
        self.page_size = page_size
        self.decode_reserve = decode_reserve  # slots a running request keeps for its next decode steps

    def available_size(self) -> int:
        return self.available

    def max_new_tokens_for_memory(self, input_tokens: int, max_new_tokens: int) -> int:
        paged_input = -(-input_tokens // self.page_size) * self.page_size
        return max(0, min(max_new_tokens, self.token_capacity - paged_input - self.page_size - 1))


def admit(waiting: list, num_running: int, hooks: CapacityHooks, max_running_requests: int) -> tuple[list, list]:
    """First come, first served: return ``(admitted, rejected)`` lists of requests from ``waiting``.

    - Budget: ``hooks.available_size()`` minus ``hooks.decode_reserve`` for each of the
      ``num_running`` requests already running.
    - Walk ``waiting`` in order. Stop once ``num_running + len(admitted)`` reaches
      ``max_running_requests``.
    - ``clip = hooks.max_new_tokens_for_memory(r.input_len, r.max_new_tokens)``. When it is 0 but
      ``r.max_new_tokens > 0`` the request cannot run even in an empty pool: append it to
      ``rejected`` and go on with the next one.
    - A request costs its prompt rounded UP to whole pages plus ``hooks.decode_reserve``. When
      the cost exceeds what is left of the budget, STOP: a later, smaller request must not
      overtake it (it would starve).
    - Otherwise admit it: set ``r.max_new_tokens = clip``, append it, take its cost off the budget.
    Do not change ``waiting`` itself. See chapter 10 (admission).
    """
    ps = hooks.page_size
    budget = hooks.available_size() - num_running * hooks.decode_reserve
    admitted, rejected = [], []
    for r in waiting:
        if num_running + len(admitted) >= max_running_requests:
            break
        clip = hooks.max_new_tokens_for_memory(r.input_len, r.max_new_tokens)
        if clip == 0 and r.max_new_tokens > 0:
            rejected.append(r)
            continue
        cost = -(-r.input_len // ps) * ps + hooks.decode_reserve
        if cost > budget:
            break
        r.max_new_tokens = clip
        admitted.append(r)
        budget -= cost
    return admitted, rejected
