"""Random scheduler streams, driven on SGLang's allocators and memlab's in lockstep.

A stream is what a scheduler asks of the KV allocator: extend batches mixing new requests and
continuing chunked prefills, decode batches, frees (whole requests, or a request freed in two
pieces inside one free group, the way a finished request and its over-allocated tail are freed),
page-aligned ``free_segment`` tails, whole-page ``alloc`` calls and ``clear``. The stream keeps
the slots each request holds, taken from the first allocator's answers; every other allocator
must answer the same, and after every step their books must read the same.
"""

from __future__ import annotations

import random

import torch


def T(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def books(a) -> tuple[list, list, int]:
    """(free list, staged pages, available_size) of a memlab or an SGLang allocator."""
    # SGLang's paged allocator stages a list of tensors
    staged = getattr(a, "staged_pages", None)
    staged = (
        torch.cat(staged).tolist()
        if staged
        else (a.release_pages.tolist() if staged is None else [])
    )
    return a.free_pages.tolist(), staged, a.available_size()


class Stream:
    """Steps of one random stream; ``run`` applies each to every allocator and compares."""

    def __init__(self, seed: int, page_size: int, num_pages: int):
        self.rng = random.Random(seed)
        self.ps, self.num_pages = page_size, num_pages
        self.held: dict[int, list[int]] = {}
        self.next_rid = 0
        self.log: list[str] = []

    # -- drawing a step -------------------------------------------------------------------
    def new_rid(self) -> int:
        self.next_rid += 1
        return self.next_rid

    def draw(self):
        r, held = self.rng.random(), self.held
        if r < 0.36 or not held:
            return self.draw_extend()
        if r < 0.64:
            rids = self.rng.sample(sorted(held), self.rng.randint(1, min(6, len(held))))
            return ("decode", rids)
        # a whole request: free(), or free_segment() from position 0 (no dedup)
        if r < 0.78:
            return ("free", self.rng.choice(sorted(held)), self.rng.random() < 0.3)
        if r < 0.93:
            return self.draw_group()
        if r < 0.98:
            return ("alloc", self.rng.randint(0, 3) * self.ps)
        return ("clear",)

    def draw_extend(self):
        ps, rng, batch = self.ps, self.rng, []
        for _ in range(rng.randint(1, 4)):
            going = [r for r in self.held if r not in {b[0] for b in batch}]
            rid = rng.choice(going) if going and rng.random() < 0.5 else self.new_rid()
            batch.append((rid, rng.randint(1, 3 * ps + 2)))
        return ("extend", batch)

    def draw_group(self):
        """Several frees in one group; a request split in two hits its cut page from both."""
        ps, rng, frees = self.ps, self.rng, []
        for rid in rng.sample(
            sorted(self.held), rng.randint(1, min(3, len(self.held)))
        ):
            n = len(self.held[rid])
            cut = rng.randint(0, n)
            # an aligned tail goes through free_segment (page ids)
            if rng.random() < 0.3 and n:
                cut = rng.randint(0, (n - 1) // ps) * ps
                frees += [("free", rid, 0, cut), ("segment", rid, cut, n)]
            else:
                frees += [("free", rid, 0, cut), ("free", rid, cut, n)]
        rng.shuffle(frees)
        return ("group", frees)


def run(
    stream: Stream, sglang: list, memlab: list, steps: int, ext, dec, alloc=None
) -> int:
    """Drive ``steps`` steps on every allocator; return how many were compared.

    ``ext(a, prefix, prefix_cpu, seq, seq_cpu, last, n)`` and ``dec(a, seq, seq_cpu, last)`` say
    how each side is called for a batch (SGLang's token allocator takes ``alloc(n)`` there).
    """
    everyone = [("SGLang", a) for a in sglang] + [("memlab", a) for a in memlab]
    ref = sglang[0]
    for step in range(steps):
        op = stream.draw()
        stream.log.append(repr(op))
        where = f"step {step} of stream ({', '.join(stream.log[-3:])})"
        outs = [_apply(stream, a, op, ext, dec) for _, a in everyone]
        want = outs[0]
        for (who, a), got in zip(everyone, outs):
            assert (got is None) == (want is None), (
                f"{where}: {who} {type(a).__name__} answered {got}, SGLang {want}"
            )
            if got is not None:
                assert got == want, (
                    f"{where}: {who} {type(a).__name__} handed out {got}, SGLang {want}"
                )
            assert books(a) == books(ref), (
                f"{where}: {who} {type(a).__name__} books (free, staged, available) "
                f"{books(a)} != SGLang's {books(ref)}"
            )
        _record(stream, op, want)
    return steps


def _apply(stream: Stream, a, op, ext, dec):
    kind, held = op[0], stream.held
    if kind == "extend":
        pre = [len(held.get(rid, ())) for rid, _ in op[1]]
        seq = [p + n for p, (_, n) in zip(pre, op[1])]
        last = [held[rid][-1] if held.get(rid) else -1 for rid, _ in op[1]]
        out = ext(a, T(pre), T(pre), T(seq), T(seq), T(last), sum(n for _, n in op[1]))
    elif kind == "decode":
        seq = [len(held[r]) + 1 for r in op[1]]
        out = dec(a, T(seq), T(seq), T([held[r][-1] for r in op[1]]))
    elif kind == "free":
        a.free_segment(T(held[op[1]]), start_pos=0) if op[2] else a.free(T(held[op[1]]))
        return ()
    elif kind == "group":
        a.free_group_begin()
        for how, rid, lo, hi in op[1]:
            part = T(held[rid][lo:hi])
            a.free_segment(part, start_pos=lo) if how == "segment" else a.free(part)
        a.free_group_end()
        return ()
    elif kind == "alloc":
        out = a.alloc(op[1])
    else:
        a.clear()
        return ()
    return None if out is None else out.tolist()


def _record(stream: Stream, op, out) -> None:
    kind, held = op[0], stream.held
    if out is None:
        return
    if kind == "extend":
        at = 0
        for rid, n in op[1]:
            held[rid] = held.get(rid, []) + out[at : at + n]
            at += n
    elif kind == "decode":
        for rid, slot in zip(op[1], out):
            held[rid].append(slot)
    elif kind == "free":
        held.pop(op[1])
    elif kind == "group":
        for _, rid, _, _ in op[1]:
            held.pop(rid, None)
    elif kind == "alloc" and out:
        held[stream.new_rid()] = out  # whole pages, as a prefix cache would hold them
    elif kind == "clear":
        held.clear()
