"""The write location (``KVWriteLoc`` of sglang/srt/mem_cache/memory_pool.py): every id space.

The allocator hands out ``out_cache_loc`` (one slot per new token). A plain pool writes there.
A hybrid sliding-window pool has two id spaces (full and SWA), so it also needs the same
tokens' SWA-side ids, translated once per batch. All of that travels in one value, next to the
attention metadata, never inside the pool.

The ``physical`` mark guards one thing: SGLang's unified pools hand out VIRTUAL ids, which a
per-batch plan translates into physical slots; their write doors refuse a location not marked
physical, so an untranslated id never lands in the wrong rows (``requires_physical_write_loc``).
Every other pool, the SWA pool included, holds physical ids by allocation and takes a plain
location. memlab's unified pools (``memlab.sglang.unified``, chapter 12) demand the mark; their
allocator's ``write_loc`` translates a batch once and marks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.common import _checks


@dataclass(slots=True)
class KVWriteLoc:
    """``loc``: generic per-token slots (``out_cache_loc``); ``swa_loc``: the same tokens in the
    sliding-window sub-pool (None when there is none); ``full_loc``: the full-attention sub-pool's
    ids when they differ from ``loc`` (None: use ``loc``); ``physical``: the ids are real slots."""

    loc: torch.Tensor
    swa_loc: torch.Tensor | None = None
    full_loc: torch.Tensor | None = None
    physical: bool = False

    def __post_init__(self):
        _check_kv_write_loc(self)
        # The side ids are resolved once from the padded batch; later paths may narrow ``loc``,
        # so cut them to match (same per-token order).
        n = self.loc.shape[0]
        if self.swa_loc is not None:
            self.swa_loc = self.swa_loc[:n]
        if self.full_loc is not None:
            self.full_loc = self.full_loc[:n]

    @classmethod
    def for_batch(
        cls, out_cache_loc: torch.Tensor, *, physical: bool, swa_loc=None, full_loc=None
    ) -> KVWriteLoc:
        """The batch's ``out_cache_loc`` under the batch's mark; side ids passed here travel
        under the same mark, so they must come from the same allocation."""
        return cls(out_cache_loc, swa_loc, full_loc, physical)

    def full_ids(self) -> torch.Tensor:
        return self.loc if self.full_loc is None else self.full_loc

    def narrow(self, n: int) -> KVWriteLoc:
        """The first ``n`` tokens (a padded batch cut back to its real tokens)."""
        n = _checks.integer("n", n, 0, self.loc.shape[0])
        return KVWriteLoc(self.loc[:n], self.swa_loc, self.full_loc, self.physical)


def write_loc_is_physical(loc) -> bool:
    """Whether ``loc`` is a KVWriteLoc marked physical; a bare tensor is not."""
    return isinstance(loc, KVWriteLoc) and loc.physical


def unwrap_write_loc(loc) -> tuple:
    """``(loc, swa_loc, full_loc)`` of a KVWriteLoc, or ``(loc, None, None)`` of a bare tensor."""
    if isinstance(loc, KVWriteLoc):
        return loc.loc, loc.swa_loc, loc.full_loc
    return loc, None, None


# The write door of a pool with virtual ids (``requires_physical_write_loc``): anything but a
# physically marked KVWriteLoc is refused, and the message says what to pass (a flag read, no
# device sync). It lives in the boundary, shared with the pools' write doors; it returns ``loc``.
check_physical_write_loc = _checks.physical_write_loc


def plain_loc(loc, where: str) -> torch.Tensor:
    """The generic location ``loc`` for a pool with one id space (as SGLang's plain pools: a
    KVWriteLoc's ``swa_loc`` and ``full_loc`` are for the hybrid pools)."""
    loc = unwrap_write_loc(loc)[0]
    _checks.plain_loc(loc, where)
    return loc


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_kv_write_loc(w) -> None:
    """1-D id tensors (side ids at least as many as ``loc``: they are cut to it) and a bool mark;
    ``loc`` first, since the sides are measured against it."""
    for name in ("loc", "swa_loc", "full_loc"):
        if (t := getattr(w, name)) is not None or name == "loc":
            _checks.index_tensor(name, t, ndim=1)  # a tensor of int32/int64 ids, 1-D
            if t.shape[0] < len(w.loc):
                raise ValueError(f"{name}: {t.shape[0]} ids for {len(w.loc)} tokens")
    _checks.instance("physical", w.physical, bool, "a bool")
