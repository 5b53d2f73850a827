"""Allocation policies the simulator compares, and the contiguous free-range allocator they use.

Reservation policies take one fixed amount of slots per request at admission and keep it until
the request finishes (no request ever needs more, so none is ever preempted); paged allocation
takes a block of B slots whenever a request's next token starts a new block.
"""

from __future__ import annotations

import bisect

import numpy as np


class Policy:
    name = "policy"
    paged = False
    contiguous = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Reservation(Policy):
    """Reserve ``reservation(...)`` slots per request on admission.

    ``contiguous=True`` places each reservation in one run of slots, first fit (an engine that
    keeps a request's KV in one contiguous tensor must): free slots split into runs too short for
    the next request are external fragmentation. ``False`` lets any free slots serve.
    """

    def __init__(self, contiguous: bool = True):
        self.contiguous = bool(contiguous)

    def reservation(self, input_lens, output_lens, max_context):
        raise NotImplementedError


class MaxContext(Reservation):
    """Reserve the model's whole context length for every request."""

    name = "max"

    def reservation(self, input_lens, output_lens, max_context):
        return np.full_like(input_lens, max_context)


def next_pow2(x):
    """Smallest power of two >= x (x >= 1), elementwise on integer arrays."""
    x = np.asarray(x, dtype=np.int64)
    return np.left_shift(1, np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64))


class Pow2(Reservation):
    """Reserve the prompt plus the expected output rounded up to a power of two.

    The expected output is the request's own output length: a perfect length predictor that only
    says which power-of-two bucket (S3-style bucketing), so this policy isolates the cost of
    rounding. Capped at max_context, which every request fits by construction.
    """

    name = "pow2"

    def reservation(self, input_lens, output_lens, max_context):
        return np.minimum(input_lens + next_pow2(output_lens), max_context)


class Oracle(Reservation):
    """Reserve exactly the final length (input + output): knows the future, wastes nothing."""

    name = "oracle"

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
        self.name = f"paged B={self.block_size}" + (f" wm={watermark:g}" if watermark else "")

    def watermark_blocks(self, total_blocks: int) -> int:
        return int(self.watermark * total_blocks)

    def blocks_for(self, tokens):
        """Blocks that hold ``tokens`` tokens: ceil(tokens / B)."""
        return -(-tokens // self.block_size)


def make_policy(policy, block_size: int = 16) -> Policy:
    """A Policy from itself or from a name: 'max', 'pow2', 'oracle', 'paged'."""
    if isinstance(policy, Policy):
        return policy
    table = {"max": MaxContext, "pow2": Pow2, "oracle": Oracle}
    if policy == "paged":
        return Paged(block_size)
    if policy not in table:
        raise ValueError(f"policy must be one of 'max', 'pow2', 'oracle', 'paged' or a Policy, got {policy!r}")
    return table[policy]()


class FirstFit:
    """Free runs of a pool of ``size`` slots, sorted by start and merged on release."""

    __slots__ = ("starts", "ends", "free")

    def __init__(self, size: int):
        self.starts, self.ends, self.free = [0], [size], size

    def alloc(self, n: int) -> int:
        """Start of the first free run of >= n slots, taken from its front; -1 (nothing taken) if none."""
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
        if (i > 0 and self.ends[i - 1] > start) or (i < len(self.starts) and self.starts[i] < start + n):
            raise ValueError(f"slots {start}..{start + n - 1} are already (partly) free")
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
