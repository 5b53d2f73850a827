"""Allocation policies the simulator compares, and the placements that put reservations in the pool.

Reservation policies take one fixed amount of slots per request at admission and keep it until
the request finishes (no request ever needs more, so none is ever preempted); paged allocation
takes a block of B slots whenever a request's next token starts a new block.

A reservation is placed by one of three placements (``Reservation(placement=...)``):

- ``"buddy"`` (the default): a binary buddy allocator (``Buddy``), what the vLLM paper assumes
  its Orca baselines use to find the address of each request's KV cache (§6.1). Every
  reservation takes a power-of-two block;
- ``"first_fit"``: the first run of free slots long enough (``FirstFit``), exactly as long as the
  reservation;
- ``"any"``: any free slots serve (``AnySlots``); no engine that keeps a request's KV in one
  tensor can do this; it isolates what contiguity costs.
"""

from __future__ import annotations

import bisect

import numpy as np

from memlab.common.utils import ceil_div

PLACEMENTS = ("buddy", "first_fit", "any")


class Policy:
    name = "policy"
    paged = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Reservation(Policy):
    """Reserve ``reservation(...)`` slots per request on admission, placed by ``placement``."""

    base_name = "reservation"

    def __init__(self, placement: str = "buddy"):
        if placement not in PLACEMENTS:
            raise ValueError(
                f"placement must be one of {PLACEMENTS}, got {placement!r}"
            )
        self.placement = placement
        self.name = f"{self.base_name} ({placement.replace('_', ' ')})"

    def reservation(self, input_lens, output_lens, max_context):
        raise NotImplementedError

    def held(self, reserve):
        """Slots the placement takes for reservations of ``reserve`` slots (elementwise)."""
        return (
            next_pow2(reserve)
            if self.placement == "buddy"
            else np.asarray(reserve, dtype=np.int64)
        )

    def make_space(self, size: int, debug_mode: bool = False):
        if self.placement == "buddy":
            return Buddy(size, debug_mode=debug_mode)
        return FirstFit(size) if self.placement == "first_fit" else AnySlots(size)


class MaxContext(Reservation):
    """Reserve the model's whole context length for every request (Orca (Max): 2,048 tokens)."""

    base_name = "max"

    def reservation(self, input_lens, output_lens, max_context):
        return np.full_like(input_lens, max_context)


def next_pow2(x):
    """Smallest power of two >= x (x >= 1), elementwise on integer arrays."""
    x = np.asarray(x, dtype=np.int64)
    return np.left_shift(1, np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64))


class Pow2(Reservation):
    """Reserve the prompt plus the output rounded up to a power of two (Orca (Pow2)).

    The vLLM paper's Orca (Pow2) "over-reserves the space for outputs by at most 2x": a true
    output of 25 tokens reserves 32 positions for outputs. The rounding is of the output only;
    the prompt is reserved as it is. Capped at max_context, which every request fits by
    construction.
    """

    base_name = "pow2"

    def reservation(self, input_lens, output_lens, max_context):
        return np.minimum(input_lens + next_pow2(output_lens), max_context)


class Oracle(Reservation):
    """Reserve exactly the final length (input + output): Orca (Oracle), which knows the future."""

    base_name = "oracle"

    def reservation(self, input_lens, output_lens, max_context):
        return input_lens + output_lens


class Paged(Policy):
    """Blocks of ``block_size`` slots allocated as tokens arrive (vLLM / SGLang paging).

    Admission takes the blocks for the prompt plus the first generated token, and leaves
    ``watermark`` (a fraction of all blocks) free, as vLLM v0's block manager did (0.01 there) to
    damp preemption; 0 admits greedily. When a decode step needs more blocks than are free, the
    youngest running requests are preempted (recompute: their blocks are freed, they go back to
    the front of the queue and re-prefill prompt + generated tokens when readmitted).
    """

    paged = True

    def __init__(self, block_size: int = 16, watermark: float = 0.0):
        if int(block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.block_size = int(block_size)
        self.watermark = float(watermark)
        self.name = f"paged B={self.block_size}" + (
            f" wm={watermark:g}" if watermark else ""
        )

    def watermark_blocks(self, total_blocks: int) -> int:
        return int(self.watermark * total_blocks)

    def blocks_for(self, tokens):
        """Blocks that hold ``tokens`` tokens: ceil(tokens / B)."""
        return ceil_div(tokens, self.block_size)


def make_policy(policy, block_size: int = 16, placement: str = "buddy") -> Policy:
    """A Policy from itself or from a name: 'max', 'pow2', 'oracle' (placed by ``placement``),
    'paged'."""
    if isinstance(policy, Policy):
        return policy
    table = {"max": MaxContext, "pow2": Pow2, "oracle": Oracle}
    if policy == "paged":
        return Paged(block_size)
    if policy not in table:
        raise ValueError(
            f"policy must be one of 'max', 'pow2', 'oracle', 'paged' or a Policy, got {policy!r}"
        )
    return table[policy](placement)


# ---------------------------------------------------------------------------------------------
# Placements. Each keeps the free slots of a pool of ``size`` slots and offers
#   alloc(n) -> start of the slots taken for n, or -1 (nothing taken) when they do not fit;
#   release(start, n) for what alloc(n) returned; held(n): slots alloc(n) takes; free: slots free.
# ---------------------------------------------------------------------------------------------
class AnySlots:
    """Any free slots serve: a counter (no addresses; ``alloc`` returns 0 when it fits)."""

    __slots__ = ("size", "free")

    def __init__(self, size: int):
        self.size, self.free = size, size

    @staticmethod
    def held(n: int) -> int:
        return n

    def alloc(self, n: int) -> int:
        if n > self.free:
            return -1
        self.free -= n
        return 0

    def release(self, start: int, n: int) -> None:
        if self.free + n > self.size:
            raise ValueError(
                f"releasing {n} slots would leave {self.free + n} free in a pool of {self.size}"
            )
        self.free += n


class FirstFit:
    """Free runs of a pool of ``size`` slots, sorted by start and merged on release."""

    __slots__ = ("starts", "ends", "free")

    def __init__(self, size: int):
        self.starts, self.ends, self.free = [0], [size], size

    @staticmethod
    def held(n: int) -> int:
        return n

    def alloc(self, n: int) -> int:
        """Start of the first free run of >= n slots, taken from its front; -1 (nothing taken) if
        none."""
        for i, (s, e) in enumerate(zip(self.starts, self.ends)):
            if e - s >= n:
                if e - s == n:
                    del self.starts[i], self.ends[i]
                else:
                    self.starts[i] = s + n
                self.free -= n
                return s
        return -1

    def release(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if (i > 0 and self.ends[i - 1] > start) or (
            i < len(self.starts) and self.starts[i] < start + n
        ):
            raise ValueError(
                f"slots {start}..{start + n - 1} are already (partly) free"
            )
        end = start + n
        if i < len(self.starts) and self.starts[i] == end:  # merge with the run after
            end = self.ends[i]
            del self.starts[i], self.ends[i]
        if i > 0 and self.ends[i - 1] == start:  # and with the run before
            self.ends[i - 1] = end
        else:
            self.starts.insert(i, start)
            self.ends.insert(i, end)
        self.free += n


class Buddy:
    """A binary buddy allocator over a pool of ``size`` slots, ``size`` any positive integer.

    A request for n slots takes a block of 2^k slots, k = ceil(log2 n), that starts at a multiple
    of 2^k. ``free_lists[k]`` holds the starts of the free blocks of order k, sorted.

    - alloc: take the lowest free block of the smallest order j >= k; while j > k split it in two
      halves (buddies), keep the lower one and put the upper one on the free list of order j - 1.
    - release: while the block's buddy (start XOR 2^k) is a free block of the same order, take it
      off its free list and merge the two into the block of order k + 1; then list the result.

    A pool whose size is not a power of two is cut into its maximal power-of-two blocks, one per
    set bit of ``size``, largest first from slot 0 (15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64
    + 32 + 16). Each starts at a multiple of its own size (every start is a sum of larger powers),
    and these top blocks never merge, without a special case: the buddy of a top block of order
    K lies just past it, where the smaller top blocks together hold fewer than 2^K slots, so no
    free block of order K is ever there. So a request can never take more than the largest top
    block (8,192 slots of 15,728), and slots of smaller top blocks serve only smaller requests.

    ``debug_mode`` checks each release (a block alloc could have returned, none of it free yet):
    a scan of every order's free list, so off by default, as in SGLang's allocators.
    """

    __slots__ = ("size", "free", "free_lists", "debug_mode")

    def __init__(self, size: int, debug_mode: bool = False):
        self.size, self.free, self.debug_mode = size, size, debug_mode
        self.free_lists = [[] for _ in range(size.bit_length())]
        start = 0
        for k in reversed(range(size.bit_length())):
            if size >> k & 1:
                self.free_lists[k].append(start)
                start += 1 << k

    @staticmethod
    def order(n: int) -> int:
        """The smallest k with 2^k >= n (n >= 1)."""
        return (n - 1).bit_length()

    @classmethod
    def held(cls, n: int) -> int:
        return 1 << cls.order(n)

    def alloc(self, n: int) -> int:
        k = self.order(n)
        j = next(
            (j for j in range(k, len(self.free_lists)) if self.free_lists[j]), None
        )
        if j is None:
            return -1
        start = self.free_lists[j].pop(0)
        while j > k:  # split: keep the lower half, list its buddy (the upper half)
            j -= 1
            bisect.insort(self.free_lists[j], start + (1 << j))
        self.free -= 1 << k
        return start

    def release(self, start: int, n: int) -> None:
        k = self.order(n)
        if self.debug_mode:
            self._check_release(start, k)
        self.free += 1 << k
        while True:  # coalesce with the buddy while it is free at the same order
            buddy = start ^ (1 << k)
            free = self.free_lists[k]
            i = bisect.bisect_left(free, buddy)
            if i == len(free) or free[i] != buddy:
                break
            del free[i]
            start, k = min(start, buddy), k + 1
        bisect.insort(self.free_lists[k], start)

    def _check_release(self, start: int, k: int) -> None:
        # A block must be one alloc() could have returned, and none of its slots may be free yet.
        if start % (1 << k) or start < 0 or start + (1 << k) > self.size:
            raise ValueError(
                f"no block of {1 << k} slots starts at {start} "
                "(blocks start at multiples of their size)"
            )
        for j, free in enumerate(self.free_lists):
            # a larger free block would start here
            lo = start & ~((1 << j) - 1) if j >= k else start
            i = bisect.bisect_left(free, lo)
            if i < len(free) and free[i] < start + (1 << k):
                raise ValueError(
                    f"slots {start}..{start + (1 << k) - 1} are already (partly) free"
                )

    def blocks(self) -> list:
        """The free blocks as (start, size) pairs, by start (for tests and pictures)."""
        return sorted(
            (s, 1 << k) for k, free in enumerate(self.free_lists) for s in free
        )
