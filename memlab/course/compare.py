"""The same request stream through SGLang's allocators and vLLM's block pool, side by side.

Three books for one stream:
- SGLang, page size 1 (TokenToKVPoolAllocator): a slot per token, written into the request's
  row of ReqToTokenPool; nothing wasted; frees append slots to the free list's tail (FIFO).
- SGLang, page size = block size (PagedTokenToKVPoolAllocator): whole pages; frees put the
  request's distinct pages at the head (LIFO).
- vLLM (KVCacheManager over a BlockPool): whole blocks, listed in the request's BlockTable row;
  frees go block by block in reverse: full (hashed) blocks to the tail, where a later prefix
  hit can still find them, the partial last block to the head.
Paged books waste at most page_size - 1 slots per request, in its last page or block.

    rows = compare(make_stream(8, seed=0), block_size=16)
    print(format_table(rows))
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from memlab.common.utils import ceil_div as cdiv
from memlab.sglang.allocation import alloc_for_decode, alloc_for_extend, release_kv_row
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.vllm.block_table import BlockTable
from memlab.vllm.kv_cache_manager import KVCacheManager
from memlab.vllm.request import Request


@dataclass(frozen=True)
class StreamRequest:
    rid: str
    prompt_len: int
    output_len: int  # decode steps; each stores one more token's KV
    arrival: int = 0  # the step at which it arrives


@dataclass
class ComparisonRow:
    engine: str
    rid: str
    tokens: int  # tokens whose KV the request held when it finished
    slots: list[int]  # slot of each token, position order
    reserved: int  # slots set aside for it (whole pages or blocks)
    tail_waste: int  # reserved - tokens: the unused rest of its last page or block
    free_unit: str  # what free() hands back: slot, page or block
    freed_to_head: int  # units that became free at the free list's head (reused first)
    freed_to_tail: (
        int  # units that became free at its tail (reused last; vLLM: still hittable)
    )


def make_stream(
    n: int,
    seed: int = 0,
    max_prompt: int = 100,
    max_output: int = 20,
    max_arrival: int = 5,
) -> list[StreamRequest]:
    """A small random stream; arrivals spread over a few steps so requests overlap."""
    rng = random.Random(seed)
    return [
        StreamRequest(
            f"r{i}",
            rng.randint(1, max_prompt),
            rng.randint(0, max_output),
            rng.randint(0, max_arrival),
        )
        for i in range(n)
    ]


def _check_stream(stream: list[StreamRequest]) -> None:
    seen = set()
    for r in stream:
        if r.rid in seen:
            raise ValueError(f"request id {r.rid!r} appears twice in the stream")
        seen.add(r.rid)
        if r.prompt_len < 1 or r.output_len < 0 or r.arrival < 0:
            raise ValueError(
                f"{r}: prompt_len must be >= 1, output_len and arrival >= 0"
            )


class _SGLangBooks:
    """A request table row per request plus a token or paged allocator."""

    def __init__(self, allocator, num_reqs: int, max_len: int):
        self.allocator = allocator
        self.pool = ReqToTokenPool(num_reqs, max_len)
        self.reqs: dict[str, Req] = {}
        ps = allocator.page_size
        self.engine = "sglang page 1" if ps == 1 else f"sglang page {ps}"

    def prefill(self, batch: list[StreamRequest]) -> None:
        reqs = [Req(r.rid) for r in batch]
        if (
            alloc_for_extend(
                self.pool, self.allocator, reqs, [r.prompt_len for r in batch]
            )
            is None
        ):
            raise RuntimeError(
                f"{self.engine}: out of capacity admitting {[r.rid for r in batch]}"
            )
        self.reqs.update((r.rid, r) for r in reqs)

    def decode(self, batch: list[StreamRequest]) -> None:
        if (
            alloc_for_decode(
                self.pool, self.allocator, [self.reqs[r.rid] for r in batch]
            )
            is None
        ):
            raise RuntimeError(f"{self.engine}: out of capacity in a decode step")

    def finish(self, r: StreamRequest) -> ComparisonRow:
        slots = release_kv_row(self.pool, self.allocator, self.reqs.pop(r.rid))
        n, ps = len(slots), self.allocator.page_size
        units = len(torch.unique(slots // ps))
        # the paged allocator frees to the head (LIFO), the token one to the tail
        head = units if ps > 1 else 0
        return ComparisonRow(
            self.engine,
            r.rid,
            n,
            slots.tolist(),
            units * ps,
            units * ps - n,
            "slot" if ps == 1 else "page",
            head,
            units - head,
        )


class _VLLMBooks:
    """KVCacheManager (scheduler side) plus a BlockTable (worker side)."""

    def __init__(self, manager: KVCacheManager, num_reqs: int, max_len: int):
        self.manager = manager
        bs = manager.block_size
        self.table = BlockTable(bs, num_reqs, cdiv(max_len, bs), max_len)
        self.free_rows = list(range(num_reqs - 1, -1, -1))
        self.reqs: dict[str, Request] = {}
        self.row: dict[str, int] = {}
        self.num_admitted = 0
        self.engine = f"vllm block {bs}"

    def prefill(self, batch: list[StreamRequest]) -> None:
        for r in batch:
            # Distinct token ids per request: the side-by-side compares books, not prefix sharing.
            self.num_admitted += 1
            base = 1_000_000 * self.num_admitted
            req = Request(
                r.rid,
                [base + t for t in range(r.prompt_len)],
                block_hasher=self.manager.request_block_hasher,
            )
            hits, n = self.manager.get_computed_blocks(req)
            new = self.manager.allocate_slots(req, req.num_tokens - n, n, hits)
            if new is None:
                raise RuntimeError(f"{self.engine}: out of capacity admitting {r.rid}")
            req.num_computed_tokens = req.num_tokens
            row = self.free_rows.pop()
            self.table.add_row(self.manager.get_block_ids(r.rid), row)
            self.reqs[r.rid], self.row[r.rid] = req, row

    def decode(self, batch: list[StreamRequest]) -> None:
        for r in batch:
            req = self.reqs[r.rid]
            req.append_output_token_ids(7)
            new = self.manager.allocate_slots(req, 1)
            if new is None:
                raise RuntimeError(f"{self.engine}: out of capacity in a decode step")
            self.table.append_row([b.block_id for b in new], self.row[r.rid])
            req.num_computed_tokens += 1

    def finish(self, r: StreamRequest) -> ComparisonRow:
        req, row = self.reqs.pop(r.rid), self.row.pop(r.rid)
        n, bs = req.num_tokens, self.manager.block_size
        slots = self.table.compute_slot_mapping(
            torch.full((n,), row, dtype=torch.int32), torch.arange(n), backend="torch"
        ).tolist()
        blocks = self.manager.get_blocks(r.rid)
        to_tail = sum(1 for b in blocks if b.ref_cnt == 1 and b.block_hash is not None)
        to_head = sum(1 for b in blocks if b.ref_cnt == 1 and b.block_hash is None)
        self.manager.free(req)
        self.free_rows.append(row)
        return ComparisonRow(
            self.engine,
            r.rid,
            n,
            slots,
            len(blocks) * bs,
            len(blocks) * bs - n,
            "block",
            to_head,
            to_tail,
        )


def _run(books, stream: list[StreamRequest]) -> list[ComparisonRow]:
    """Step by step: finish what is done, admit arrivals (one prefill batch), decode the rest."""
    pending = sorted(stream, key=lambda r: r.arrival)
    running: list[StreamRequest] = []
    done_steps: dict[str, int] = {}
    rows, step = [], 0
    while pending or running:
        for r in [r for r in running if done_steps[r.rid] == r.output_len]:
            running.remove(r)
            rows.append(books.finish(r))
        decoding = list(running)  # admitted in an earlier step
        arrivals = [r for r in pending if r.arrival <= step]
        if arrivals:
            pending = pending[len(arrivals) :]
            books.prefill(arrivals)
            running.extend(arrivals)
            for r in arrivals:
                done_steps[r.rid] = 0
        if decoding:
            books.decode(decoding)
            for r in decoding:
                done_steps[r.rid] += 1
        step += 1
    return rows


def compare(
    stream: list[StreamRequest], block_size: int = 16
) -> dict[str, list[ComparisonRow]]:
    """Run the stream through all three books (sized so nothing is refused); rows per engine."""
    _check_stream(stream)
    if not isinstance(block_size, int) or block_size < 2:
        raise ValueError(
            "block_size must be an int >= 2 (page size 1 is the token allocator), "
            f"got {block_size!r}"
        )
    max_len = max(r.prompt_len + r.output_len for r in stream)
    num_reqs = len(stream)
    capacity = (
        cdiv(sum(r.prompt_len + r.output_len for r in stream), block_size) * block_size
        + num_reqs * block_size
    )
    all_books = [
        _SGLangBooks(TokenToKVPoolAllocator(capacity), num_reqs, max_len),
        _SGLangBooks(
            PagedTokenToKVPoolAllocator(capacity, block_size), num_reqs, max_len
        ),
        _VLLMBooks(
            KVCacheManager(capacity // block_size + 1, block_size=block_size),
            num_reqs,
            max_len,
        ),
    ]
    return {books.engine: _run(books, stream) for books in all_books}


def describe_free(row: ComparisonRow) -> str:
    parts = [
        f"{n} {row.free_unit}{'s' if n != 1 else ''} -> {end}"
        for n, end in ((row.freed_to_head, "head"), (row.freed_to_tail, "tail"))
        if n
    ]
    return ", ".join(parts) or "-"


def format_table(results: dict[str, list[ComparisonRow]]) -> str:
    """One line per request: its tokens, then per engine the slots reserved, the tail waste and
    where free() put what it released."""
    engines = list(results)
    by_rid = {e: {row.rid: row for row in rows} for e, rows in results.items()}
    rids = [row.rid for row in results[engines[0]]]
    width = 36
    lines = [
        f"{'':>15} | " + " | ".join(f"{e:<{width}}" for e in engines),
        f"{'request':>8} {'tokens':>6} | "
        + " | ".join(f"{'reserved waste  freed':<{width}}" for _ in engines),
    ]
    for rid in rids:
        cells = [
            f"{by_rid[e][rid].reserved:>8} {by_rid[e][rid].tail_waste:>5}  "
            f"{describe_free(by_rid[e][rid])}"
            for e in engines
        ]
        lines.append(
            f"{rid:>8} {by_rid[engines[0]][rid].tokens:>6} | "
            + " | ".join(f"{c:<{width}}" for c in cells)
        )
    totals = [
        f"{sum(r.reserved for r in results[e]):>8} {sum(r.tail_waste for r in results[e]):>5}"
        for e in engines
    ]
    lines.append(
        f"{'total':>8} {sum(r.tokens for r in results[engines[0]]):>6} | "
        + " | ".join(f"{c:<{width}}" for c in totals)
    )
    return "\n".join(line.rstrip() for line in lines)
