"""memlab's RadixCache against SGLang 0.5.23's, loaded from the wheel (see radix_loader.py).

Both trees get the same random streams of insert, match, lock, unlock and evict, on keys that
share prefixes (so nodes split), with slots handed out by one memlab allocator. After every step
the two must agree on: the matched length and the matched slots, insert's prefix_len, the lock
deltas, the slots each eviction frees (in order), evictable/protected/total sizes, and the whole
tree (every node's key, slots and lock count).
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from memlab.sglang import radix_cache as ml
from memlab.sglang.allocator import make_allocator
from memlab.sglang.radix_cache import RadixCache
from memlab_tests.tools.engines.radix_loader import load

STREAMS, STEPS = 12, 80


class Recorder:
    """An allocator front that records what the tree frees (memlab calls free, SGLang
    free_segment)."""

    def __init__(self, allocator=None, page_size=1):
        self.allocator, self.page_size, self.device = (
            allocator,
            page_size,
            torch.device("cpu"),
        )
        self.freed: list[list[int]] = []

    def free(self, idx):
        if idx.numel():
            self.freed.append(idx.tolist())
            self.allocator.free(idx)

    def free_segment(self, idx, start_pos=0):
        if idx.numel():
            self.freed.append(idx.tolist())
            if self.allocator is not None:
                self.allocator.free_segment(idx, start_pos)

    def available_size(self):
        return self.allocator.available_size()

    def alloc(self, n):
        return self.allocator.alloc(n)


def dump(root, key_of):
    """Every node as (path of keys, slots, lock_ref), in a canonical order."""
    out, stack = [], [((), root)]
    while stack:
        path, node = stack.pop()
        for child in node.children.values():
            p = path + (tuple(key_of(child)),)
            out.append((p, child.value.tolist(), child.lock_ref))
            stack.append((p, child))
    return sorted(out)


class Pair:
    def __init__(self, page_size: int, pool_tokens: int):
        s = load()
        self.rc, self.base, self.ps = s.radix_cache, s.base, page_size
        alloc = make_allocator(pool_tokens, page_size, debug_mode=True)
        self.mine_alloc, self.theirs_alloc = (
            Recorder(alloc, page_size),
            Recorder(page_size=page_size),
        )
        self.mine = RadixCache(self.mine_alloc, page_size=page_size, debug_mode=True)
        self.theirs = self.rc.RadixCache.create_simulated(
            mock_allocator=self.theirs_alloc, page_size=page_size
        )
        self.locks: list[tuple] = []
        self.steps = 0
        # memlab is called as SGLang is (its parameter objects, a RadixKey over an array) on
        # every other call, with memlab's short calls in between: both must give the same
        self.sglang_style = False

    def key(self, tokens):
        return self.rc.RadixKey(array("q", tokens))

    def check_books(self):
        m, t = self.mine, self.theirs
        assert (m.evictable_size(), m.protected_size(), m.total_size()) == (
            t.evictable_size(),
            t.protected_size(),
            t.total_size(),
        )
        assert dump(m.root_node, lambda n: n.key) == dump(
            t.root_node, lambda n: n.key.token_ids
        )
        assert self.mine_alloc.freed == self.theirs_alloc.freed
        self.steps += 1

    def _style(self) -> bool:
        self.sglang_style = not self.sglang_style
        return self.sglang_style

    def evict(self, n):
        params = ml.EvictParams(num_tokens=n) if self._style() else n
        a = self.mine.evict(params).num_tokens_evicted
        b = self.theirs.evict(self.base.EvictParams(num_tokens=n)).num_tokens_evicted
        assert a == b, f"evict({n}) freed {a} here, {b} in SGLang"

    def insert(self, tokens):
        n = len(tokens) // self.ps * self.ps
        short = n - self.mine_alloc.available_size()
        if short > 0:
            self.evict(short)
        value = self.mine_alloc.alloc(n)
        if value is None:
            return  # everything left is locked: neither side may insert
        if self._style():
            a = self.mine.insert(
                ml.InsertParams(key=ml.RadixKey(array("q", tokens)), value=value)
            )
        else:
            a = self.mine.insert(tokens, value)
        b = self.theirs.insert(
            self.base.InsertParams(key=self.key(tokens), value=value.clone())
        )
        assert a.prefix_len == b.prefix_len
        assert a.last_device_node.key == tuple(b.last_device_node.key.token_ids)
        # the caller frees the duplicates
        self.mine_alloc.allocator.free(value[: a.prefix_len])

    def match(self, tokens, lock: bool):
        if self._style():
            a = self.mine.match_prefix(
                ml.MatchPrefixParams(key=ml.RadixKey(array("q", tokens)))
            )
        else:
            a = self.mine.match_prefix(tokens)
        b = self.theirs.match_prefix(self.base.MatchPrefixParams(key=self.key(tokens)))
        assert a.device_prefix_len == b.device_prefix_len
        assert (
            self.mine.path_device_indices(a.last_device_node).tolist()
            == self.theirs.path_device_indices(b.last_device_node).tolist()
        )
        if lock:
            da, db = (
                self.mine.inc_lock_ref(a.last_device_node).delta,
                self.theirs.inc_lock_ref(b.last_device_node).delta,
            )
            assert da == db
            self.locks.append((a.last_device_node, b.last_device_node))

    def unlock(self, i):
        a, b = self.locks.pop(i)
        assert self.mine.dec_lock_ref(a).delta == self.theirs.dec_lock_ref(b).delta


def run_stream(seed: int, page_size: int, pool_tokens: int = 96) -> int:
    rng = random.Random(seed)
    pair = Pair(page_size, pool_tokens)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 24))] for _ in range(3)]
    for _ in range(STEPS):
        base = rng.choice(seqs)
        tokens = base[: rng.randrange(len(base) + 1)] + [
            rng.randrange(4) for _ in range(rng.randrange(0, 12))
        ]
        op = rng.random()
        if op < 0.35:
            pair.insert(tokens)
            seqs.append(tokens)
        elif op < 0.6:
            pair.match(tokens, lock=False)
        elif op < 0.75 and len(pair.locks) < 4:
            pair.match(tokens, lock=True)
        elif op < 0.87 and pair.locks:
            pair.unlock(rng.randrange(len(pair.locks)))
        else:
            pair.evict(rng.randrange(1, 3 * page_size + 8))
        pair.check_books()
    while pair.locks:
        pair.unlock(0)
    pair.evict(10**6)  # with every lock released the whole tree goes, in the same order
    pair.check_books()
    assert pair.mine.total_size() == 0
    pair.mine.check_idle(pool_tokens // page_size * page_size)
    return pair.steps


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_cache_streams_match_sglang(page_size, tally):
    steps = sum(run_stream(1000 * page_size + s, page_size) for s in range(STREAMS))
    tally(f"RadixCache page_size={page_size}", STREAMS, steps)


def test_split_and_lru_by_hand_match_sglang(tally):
    """The hand-worked case of tests/sglang/test_radix_cache.py, step by step on both trees."""
    pair = Pair(1, 32)
    pair.insert([1, 2, 3, 4, 5])
    pair.check_books()
    pair.insert([1, 2, 3, 9, 9])  # splits (1, 2, 3, 4, 5) after 3
    pair.check_books()
    pair.match([1, 2, 3, 4], lock=True)  # splits (4, 5) after 4, locks the path
    pair.check_books()
    pair.insert([7, 7])
    pair.check_books()
    pair.evict(3)  # LRU: (9, 9) then (7, 7); the locked path stays
    pair.check_books()
    pair.unlock(0)
    pair.evict(1)
    pair.check_books()
    tally("RadixCache by hand", 1, pair.steps)
