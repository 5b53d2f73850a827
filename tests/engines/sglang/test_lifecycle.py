"""A request's lifecycle around the radix cache, memlab against SGLang 0.5.23 (sglang_loader.py).

Both sides run the same scheduler streams on their own books: SGLang's real ``RadixCache``, its
token or paged allocator, its ``ReqToTokenPool`` and ``ReqKvInfo``, driven through its real
``common.checkpoint_kv_cache`` / ``release_kv_cache``; memlab's ``RadixCache``, allocator, request
table and ``memlab.sglang.allocation``'s functions of the same names. A stream admits requests
(match their tokens but the last, lock the match), computes their prefills in chunks with a
checkpoint after every chunk (two requests prefilling the same prompt at once make duplicates),
decodes, finishes requests (``checkpoint=True``: the split at the prompt), retracts some
(``checkpoint=False``, then they come back with their output), touches waiting prompts, runs the
decode batch's fit check (``check_decode_mem``, which evicts from the tree inside the check) and
evicts. After every step the two must agree on: the whole tree (every node's key, slots, lock
count, priority and hit count), evictable and protected sizes, the free list (order included),
and per running request its row, ``cache_protected_len``, ``cache_inserted_len``,
``kv_committed_len``, ``prefix_len`` and the node its lock holds. The same streams run against a
disabled tree (``RadixCache(disable=True)``: nothing kept, a release frees the whole row).

Ties: SGLang's LRU heap breaks equal access times by the iteration order of a set of nodes,
memlab's by node id. Before every eviction the stream checks memlab's evictable leaves for two
equal stamps and skips that eviction (and the allocation that needed it) when it finds one; the
count of skipped steps is part of the test (a tie would show there, not as a mismatch).
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from memlab.sglang.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    coalesce_ranges,
    evict_from_tree_cache,
    release_kv_cache,
)
from memlab.sglang.allocator import make_allocator
from memlab.sglang.radix_cache import RadixCache
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.schedule_policy import match_and_lock
from memlab.sglang.sizing import RunningReq, check_decode_mem
from memlab_tests.tools.engines.sglang_loader import load

ROWS, WIDTH = 4, 64


class SgReq:
    """SGLang's ``Req`` where the lifecycle reads it: its real ``ReqKvInfo`` and methods."""

    def __init__(self, sg, rid, prompt):
        sb = sg.schedule_batch
        self.rid, self.kv = rid, sg.ReqKvInfo()
        self.origin_input_ids, self.output_ids = array("q", prompt), array("q")
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids
        self.extra_key = self.cache_salt = self.priority = self.finished_reason = (
            self.finished_len
        ) = None
        self.lock = self.last_node = self.extend_end = self.input_embeds = None
        self.prefix_len = self.retraction_count = 0
        self.skip_radix_cache_insert = False
        self._methods = {
            name: getattr(sb, name).__get__(self)
            for name in (
                "finished",
                "refresh_fill_ids",
                "owned_kv_len",
                "reset_for_retract",
            )
        }

    def __getattr__(self, name):
        try:
            return self.__dict__["_methods"][name]
        except KeyError:
            raise AttributeError(name) from None


class Side:
    """One engine's books and the scheduler steps on them."""

    def __init__(self, sg, page_size: int, size: int, disable: bool, theirs: bool):
        self.sg, self.theirs, self.ps = sg, theirs, page_size
        if theirs:
            self.alloc = (
                sg.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
                if page_size == 1
                else sg.PagedTokenToKVPoolAllocator(
                    size, page_size, torch.float16, "cpu", None, False
                )
            )
            self.pool = sg.ReqToTokenPool(
                size=ROWS,
                max_context_len=WIDTH,
                device="cpu",
                enable_memory_saver=False,
            )
            self.tree = sg.RadixCache(
                sg.CacheInitParams(
                    disable=disable,
                    req_to_token_pool=self.pool,
                    token_to_kv_pool_allocator=self.alloc,
                    page_size=page_size,
                )
            )
        else:
            self.alloc = make_allocator(size, page_size, debug_mode=True)
            self.pool = ReqToTokenPool(ROWS, WIDTH)
            self.tree = RadixCache(
                self.alloc,
                disable=disable,
                debug_mode=True,
                req_to_token_pool=self.pool,
            )

    def new_req(self, rid, tokens, prompt_len):
        r = (
            SgReq(self.sg, rid, tokens[:prompt_len])
            if self.theirs
            else Req(rid, tokens[:prompt_len])
        )
        # a retracted request comes back with its output
        r.output_ids.extend(tokens[prompt_len:])
        if self.theirs:
            r.refresh_fill_ids()
        return r

    def admit(self, r) -> list[int]:
        """Match all tokens but the last, lock the match (SGLang's ``match_kv_cache``, then the
        adder's lock); returns the matched slots."""
        if not self.theirs:
            return match_and_lock(self.tree, r)[0].tolist()
        fill = r.full_untruncated_fill_ids
        m = self.tree.match_prefix(
            self.sg.base_prefix_cache.MatchPrefixParams(
                key=self.sg.radix_cache.RadixKey(fill, limit=len(fill) - 1)
            )
        )
        r.prefix_len = r.kv.cache_protected_len = m.device_prefix_len
        r.last_node, r.lock = m.last_device_node, self.tree.lock(m.last_device_node)
        return self.tree.path_device_indices(r.last_node).tolist()

    def evict(self, n: int) -> int:
        if self.theirs:
            return self.tree.evict(
                self.sg.base_prefix_cache.EvictParams(num_tokens=n)
            ).num_tokens_evicted
        return self.tree.evict(n).num_tokens_evicted

    def extend(self, r, n: int, prefix) -> None:
        """Slots for the next ``n`` tokens (a new request's row starts with its matched slots),
        then the chunk's checkpoint."""
        start = r.prefix_len
        if not self.theirs:
            p = torch.tensor(prefix, dtype=torch.int64) if not r.kv.holds_kv else None
            assert alloc_for_extend(self.pool, self.alloc, [r], [n], [p]) is not None
        else:
            if not r.kv.holds_kv:
                assert self.pool.alloc([r]) is not None
                self.pool.write(
                    (r.kv.req_pool_idx, slice(0, start)),
                    torch.tensor(prefix, dtype=torch.int32),
                )
            row = r.kv.req_pool_idx
            if self.ps == 1:
                out = self.alloc.alloc(n)
            else:
                pre, seq = torch.tensor([start]), torch.tensor([start + n])
                last = (
                    self.pool.req_to_token[row, start - 1].long().view(1)
                    if start
                    else torch.tensor([-1])
                )
                out = self.alloc.alloc_extend(pre, pre, seq, seq, last, n)
            self.pool.write((row, slice(start, start + n)), out.to(torch.int32))
            r.kv.kv_allocated_len = r.kv.kv_committed_len = start + n
        r.extend_end = start + n
        row = self.pool.req_to_token[r.kv.req_pool_idx, : start + n].clone()
        (self.sg.common.checkpoint_kv_cache if self.theirs else checkpoint_kv_cache)(
            r, self.tree
        )
        # the tree held part of the chunk already: the row now points at the tree's slots
        self.rewrote = not torch.equal(
            row, self.pool.req_to_token[r.kv.req_pool_idx, : start + n]
        )

    def decode(self, r, token: int) -> None:
        if not self.theirs:
            assert alloc_for_decode(self.pool, self.alloc, [r]) is not None
        else:
            seq, row = r.kv.kv_allocated_len, r.kv.req_pool_idx
            if self.ps == 1:
                out = self.alloc.alloc(1)
            else:
                last = self.pool.req_to_token[row, seq - 1].long().view(1)
                out = self.alloc.alloc_decode(
                    torch.tensor([seq + 1]), torch.tensor([seq + 1]), last
                )
            self.pool.write((row, seq), out.to(torch.int32)[0])
            r.kv.kv_allocated_len += 1
            r.kv.kv_committed_len += 1
        r.output_ids.append(token)

    def release(self, r, finished: bool) -> None:
        if self.theirs:
            r.finished_reason = "length" if finished else None
            self.sg.common.release_kv_cache(r, self.tree, checkpoint=finished)
            if not finished:
                r.reset_for_retract()
        else:
            release_kv_cache(r, self.tree, checkpoint=finished)
            if not finished:
                r.reset_for_retract()

    def touch(self, tokens) -> None:
        if self.theirs:
            self.tree.touch_prefix(self.sg.radix_cache.RadixKey(array("q", tokens)))
        else:
            self.tree.touch_prefix(tokens)

    # -- the books ------------------------------------------------------------------------------
    def free_list(self) -> list[int]:
        # both engines' allocators have it
        return self.alloc.get_all_free_pages().tolist()

    def nodes(self) -> list:
        key = (
            (lambda n: tuple(n.key.token_ids))
            if self.theirs
            else (lambda n: tuple(n.key))
        )
        out, stack = [], [((), self.tree.root_node)]
        while stack:
            path, node = stack.pop()
            for child in node.children.values():
                q = path + (key(child),)
                out.append(
                    (
                        q,
                        child.value.tolist(),
                        child.lock_ref,
                        child.priority,
                        child.hit_count,
                    )
                )
                stack.append((q, child))
        return sorted(out)

    def lock_path(self, r):
        node, keys = r.lock.node if r.lock is not None else None, []
        while node is not None and node is not self.tree.root_node:
            keys.append(tuple(node.key.token_ids) if self.theirs else node.key)
            node = node.parent
        return keys[::-1]

    def req_books(self, r):
        kv = r.kv
        row = (
            self.pool.req_to_token[kv.req_pool_idx, : kv.kv_allocated_len].tolist()
            if kv.holds_kv
            else None
        )
        return (
            row,
            kv.cache_protected_len,
            kv.cache_inserted_len,
            kv.kv_committed_len,
            r.prefix_len,
            self.lock_path(r),
        )

    def tie(self) -> bool:
        """Two evictable leaves with one access time: the engines would break the tie
        differently."""
        times = [n.last_access_time for n in self.tree.evictable_leaves]
        return len(times) != len(set(times))


class Stream:
    def __init__(self, sg, seed: int, page_size: int, size: int, disable: bool):
        self.rng = random.Random(seed)
        self.ps, self.size = page_size, size
        self.mine, self.theirs = (
            Side(sg, page_size, size, disable, False),
            Side(sg, page_size, size, disable, True),
        )
        # (rid, tokens, prompt_len, new tokens to generate)
        self.waiting: list[tuple] = []
        self.running: dict = {}  # rid -> dict(mine, theirs, tokens, prompt_len, left, prefix)
        self.seqs = [
            [self.rng.randrange(4) for _ in range(self.rng.randrange(4, 20))]
            for _ in range(3)
        ]
        self.steps = self.tie_skips = self.finished = self.retracted = (
            self.duplicates
        ) = self.checkpoints = self.floors = 0
        self.evicted = self.decode_checks = self.decode_refusals = (
            self.evicted_in_checks
        ) = 0
        self.next_rid = 0

    def both(self, method, *args):
        return getattr(self.mine, method)(*args), getattr(self.theirs, method)(*args)

    def check(self):
        m, t = self.mine, self.theirs
        assert m.nodes() == t.nodes(), "the trees differ"
        assert (m.tree.evictable_size(), m.tree.protected_size()) == (
            t.tree.evictable_size(),
            t.tree.protected_size(),
        )
        assert m.free_list() == t.free_list(), "free lists differ"
        for rid, r in self.running.items():
            assert m.req_books(r["mine"]) == t.req_books(r["theirs"]), (
                f"request {rid}'s books differ"
            )
        self.steps += 1

    def make_room(self, need: int) -> bool:
        """Evict what the allocation needs (SGLang's ``evict_from_tree_cache``); False when a tie
        forbids it or the pool cannot hold it even then."""
        short = need - self.mine.alloc.available_size()
        if short > 0:
            if self.mine.tie() or self.theirs.tie():
                self.tie_skips += 1
                return False
            a, b = self.both("evict", short)
            assert a == b, f"evict({short}) freed {a} here, {b} in SGLang"
            self.evicted += a
        return need <= self.mine.alloc.available_size()

    def arrive(self):
        base = self.rng.choice(self.seqs)
        tokens = base[: self.rng.randrange(len(base) + 1)] + [
            self.rng.randrange(4) for _ in range(self.rng.randrange(1, 12))
        ]
        self.seqs.append(tokens)
        self.next_rid += 1
        self.waiting.append(
            (self.next_rid, tokens, len(tokens), self.rng.randrange(1, 8))
        )

    def admit(self):
        if not self.waiting or len(self.running) >= ROWS:
            return
        rid, tokens, prompt_len, left = self.waiting.pop(0)
        rm, rt = (
            self.mine.new_req(rid, tokens, prompt_len),
            self.theirs.new_req(rid, tokens, prompt_len),
        )
        pm, pt = self.mine.admit(rm), self.theirs.admit(rt)
        assert pm == pt, f"request {rid} matched {pm} here, {pt} in SGLang"
        self.running[rid] = dict(
            mine=rm,
            theirs=rt,
            tokens=list(tokens),
            left=left,
            prefix=pm,
            decoding=False,
        )

    def prefill(self, rid):
        r = self.running[rid]
        rm, ps = r["mine"], self.ps
        total, start = len(r["tokens"]), rm.prefix_len
        n = self.rng.randrange(1, total - start + 1)
        # a new request cut short: its chunk ends on a page
        if not rm.kv.holds_kv and start + n < total:
            n = (start + n) // ps * ps - start
            if n <= 0:
                return
        need = -(-(start + n) // ps) * ps - -(-start // ps) * ps
        if not self.make_room(need):
            return
        self.mine.extend(rm, n, r["prefix"])
        self.theirs.extend(r["theirs"], n, r["prefix"])
        if self.rng.random() < 0.3:
            # prefill-aware SWA: SGLang's scheduler shields the prefill from the window, and
            # later checkpoints key nothing past it (RadixCache.checkpoint's key_limit)
            for req in (rm, r["theirs"]):
                req.kv.swa_evict_floor = req.extend_end
            self.floors += 1
        self.checkpoints += 1
        self.duplicates += self.mine.rewrote
        # prefill done: its first output token comes with the last chunk
        if rm.prefix_len == total:
            tok = self.rng.randrange(4)
            for side, req in ((self.mine, rm), (self.theirs, r["theirs"])):
                req.output_ids.append(tok)
                if side.theirs:
                    req.refresh_fill_ids()
            r["tokens"].append(tok)
            r["left"] -= 1
            r["decoding"] = True
            if r["left"] <= 0:
                self.finish(rid)

    def decode(self, rid):
        r = self.running[rid]
        rm = r["mine"]
        seq = rm.kv.kv_allocated_len
        need = self.ps if seq % self.ps == 0 else 0
        if not self.make_room(need):
            return
        tok = self.rng.randrange(4)
        self.mine.decode(rm, tok)
        self.theirs.decode(r["theirs"], tok)
        r["theirs"].refresh_fill_ids()
        r["tokens"].append(tok)
        r["left"] -= 1
        if r["left"] <= 0:
            self.finish(rid)

    def finish(self, rid):
        r = self.running.pop(rid)
        self.mine.release(r["mine"], True)
        self.theirs.release(r["theirs"], True)
        self.seqs.append(r["tokens"])
        self.finished += 1

    def retract(self, rid):
        r = self.running.pop(rid)
        self.mine.release(r["mine"], False)
        self.theirs.release(r["theirs"], False)
        prompt = len(r["mine"].origin_input_ids)
        self.waiting.insert(0, (rid, r["tokens"], prompt, r["left"]))
        self.retracted += 1

    def decode_check(self):
        """The decode batch's fit check, which evicts from the tree inside it: SGLang's real
        ``ScheduleBatch.check_decode_mem`` (through its allocator's ``check_decode_capacity``)
        against ``sizing.check_decode_mem`` with ``evict_from_tree_cache``."""
        running = [r for r in self.running.values() if r["decoding"]]
        if not running:
            return
        if self.mine.tie() or self.theirs.tie():
            self.tie_skips += 1
            return
        before = self.mine.tree.num_evicted_tokens
        views = [
            RunningReq(
                r["mine"].rid,
                r["mine"].kv.kv_committed_len,
                0,
                r["mine"].kv.kv_allocated_len,
            )
            for r in running
        ]
        mine = check_decode_mem(
            views,
            self.mine.alloc.available_size,
            self.ps,
            evict=lambda n: evict_from_tree_cache(self.mine.tree, n),
        )
        batch = type("Batch", (), {})()
        batch.reqs, batch.tree_cache = [r["theirs"] for r in running], self.theirs.tree
        batch.token_to_kv_pool_allocator = self.theirs.alloc
        batch.spec_algorithm = type(
            "NoSpec", (), {"is_none": staticmethod(lambda: True)}
        )()
        sb = self.theirs.sg.schedule_batch
        batch.new_tokens_required_next_decode = lambda selected=None: (
            sb.new_tokens_required_next_decode(batch, selected)
        )
        theirs = sb.check_decode_mem(batch)
        assert mine == theirs, f"check_decode_mem: memlab {mine}, SGLang {theirs}"
        self.decode_checks += 1
        self.decode_refusals += not mine
        self.evicted_in_checks += self.mine.tree.num_evicted_tokens - before

    def step(self):
        op = self.rng.random()
        decoding = [rid for rid, r in self.running.items() if r["decoding"]]
        prefilling = [rid for rid in self.running if rid not in decoding]
        if op < 0.17:
            self.arrive()
        elif op < 0.3:
            self.admit()
        elif op < 0.52 and prefilling:
            self.prefill(self.rng.choice(prefilling))
        elif op < 0.7 and decoding:
            self.decode(self.rng.choice(decoding))
        elif op < 0.75 and (
            held := [rid for rid, r in self.running.items() if r["mine"].kv.holds_kv]
        ):
            self.retract(self.rng.choice(sorted(held)))
        elif op < 0.8 and self.waiting:
            w = self.rng.choice(self.waiting)
            self.both("touch", w[1])
        elif op < 0.93:
            self.decode_check()
        elif op < 0.96:
            if self.mine.tie() or self.theirs.tie():
                self.tie_skips += 1
            else:
                a, b = self.both("evict", self.rng.randrange(1, 3 * self.ps + 6))
                assert a == b
                self.evicted += a
        self.check()

    def drain(self):
        for rid in sorted(self.running):
            r = self.running[rid]
            # matched, never allocated: it gives its lock back
            if not r["mine"].kv.holds_kv:
                self.running.pop(rid)
                for side, req in ((self.mine, r["mine"]), (self.theirs, r["theirs"])):
                    side.tree.unlock(req.lock)
            else:
                self.retract(rid) if self.rng.random() < 0.3 else self.finish(rid)
            self.check()


STREAMS, STEPS = 10, 120


@pytest.mark.parametrize("disable", [False, True], ids=["tree", "disabled"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_request_lifecycle_streams_match_sglang(page_size, disable, tally):
    sg = load()
    totals = dict(
        steps=0,
        finished=0,
        retracted=0,
        checkpoints=0,
        floors=0,
        duplicates=0,
        tie_skips=0,
        evicted=0,
        decode_checks=0,
        decode_refusals=0,
        evicted_in_checks=0,
    )
    for seed in range(STREAMS):
        s = Stream(
            sg,
            100 * page_size + seed + 7 * disable,
            page_size,
            size=48 if page_size == 1 else 40,
            disable=disable,
        )
        for _ in range(STEPS):
            s.step()
        s.drain()
        free = s.size // page_size * page_size
        assert s.mine.tree.evictable_size() + s.mine.alloc.available_size() == free
        for k in totals:
            totals[k] += getattr(s, k)
    what = "disabled RadixCache" if disable else "RadixCache"
    tally(
        f"{what} lifecycle page_size={page_size} (checkpoints, release, retraction)",
        STREAMS,
        totals["steps"],
    )
    # every path ran: finished and retracted requests, checkpoints; duplicates only with a tree
    assert (
        totals["finished"] > 10
        and totals["retracted"] > 5
        and totals["checkpoints"] > 50
        and totals["floors"] > 10
    )
    assert (totals["duplicates"] > 0) != disable and (totals["evicted"] > 0) != disable
    assert totals["tie_skips"] < totals["steps"] // 20 and totals["decode_checks"] > 20
    assert (totals["evicted_in_checks"] > 0) != disable  # the check itself evicted


def test_worked_examples_match_sglang(tally):
    """The notes' hand-worked cases: a finished request at page size 1 (prompt 7, 6 outputs) and
    page size 4 (prompt 9, 8 outputs), then evict(1); and a disabled tree's release."""
    sg = load()
    steps = 0
    for ps, prompt, outputs, disable, freed in (
        (1, 7, 6, False, 5),
        (4, 9, 8, False, 8),
        (1, 7, 6, True, 0),
    ):
        s = Stream(sg, 0, ps, 64, disable)
        tokens = list(range(100, 100 + prompt))
        s.waiting.append((1, tokens, prompt, outputs))
        s.admit()
        r = s.running[1]
        s.mine.extend(r["mine"], prompt, r["prefix"])
        s.theirs.extend(r["theirs"], prompt, r["prefix"])
        for side, req in ((s.mine, r["mine"]), (s.theirs, r["theirs"])):
            req.output_ids.append(899)
            if side.theirs:
                req.refresh_fill_ids()
        r["tokens"].append(899)
        r["left"] -= 1
        s.check()
        while 1 in s.running:
            s.decode(1)
            s.check()
        assert s.both("evict", 1) == (freed, freed)
        s.check()
        steps += s.steps
    tally(
        "RadixCache worked examples (split at the prompt, disabled release)", 3, steps
    )


def test_coalesce_ranges_is_sglangs():
    sg = load()
    for ranges in (
        [],
        [(0, 4)],
        [(0, 4), (4, 9)],
        [(0, 3), (5, 9), (9, 12)],
        [(2, 2), (2, 5)],
    ):
        assert coalesce_ranges(ranges) == sg.common.coalesce_ranges(ranges)
