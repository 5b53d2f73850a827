"""memlab's BlockPool / FreeKVCacheBlockQueue against vLLM 0.33's, in lockstep.

Random streams drive both pools with the same calls: admissions that hit cached blocks (some of
them free, in the middle of the queue) and take fresh ones, caching of full blocks, growth by
one block, frees in reverse order, twins with one content cached twice (duplicates of one
hash), over-asks and reset_prefix_cache. After every step the returned block ids, every refusal
and the books (free queue content and order, get_num_free_blocks(), ref counts, block hashes,
the hash map) must be equal.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from memlab.vllm.block_pool import BlockPool
from memlab.vllm.hashing import hash_block_tokens, sha256
from memlab_tests.tools.engines.vllm_loader import assert_same_books, load, pool_books

STREAMS = 64
STEPS = 200


def chain(doc: list[int]) -> list[bytes]:
    """Block hashes of a document of content ids (one id per block)."""
    hashes, parent = [], None
    for cid in doc:
        parent = hash_block_tokens(sha256, parent, (cid,))
        hashes.append(parent)
    return hashes


class Lockstep:
    """The two pools, and the requests holding blocks in both."""

    def __init__(self, num_blocks: int, rng: random.Random):
        self.V = load()
        self.ours = BlockPool(num_blocks)
        self.theirs = self.V.block_pool.BlockPool(
            num_blocks, enable_caching=True, hash_block_size=1
        )
        self.rng = rng
        # {doc, hashes, ours: blocks, theirs: blocks, num_cached}
        self.held: list[dict] = []
        # contents seen so far: new requests share their prefixes
        self.docs: list[list[int]] = []
        self.next_cid = 0
        self.step = 0

    def strip(self, key):
        return self.V.kv_cache_utils.get_block_hash(key)

    def check(self, what: str) -> None:
        assert_same_books(
            pool_books(self.ours),
            pool_books(self.theirs, self.strip),
            f"step {self.step} ({what})",
        )

    def fresh(self, n: int) -> list[int]:
        self.next_cid += n
        return list(range(self.next_cid - n, self.next_cid))

    def pick_doc(self, n_blocks: int) -> list[int]:
        # share a prefix with an earlier request
        if self.docs and self.rng.random() < 0.6:
            base = self.rng.choice(self.docs)
            keep = self.rng.randint(1, len(base))
            return base[:keep] + self.fresh(max(0, n_blocks - keep))
        return self.fresh(n_blocks)

    # -- operations, each applied to both pools --------------------------------------------

    def lookup(self, hashes: list[bytes]):
        ours, theirs = [], []
        for h in hashes:
            a, b = self.ours.get_cached_block(h), self.theirs.get_cached_block(h, [0])
            assert (a is None) == (b is None), f"step {self.step}: hit on one side only"
            if a is None:
                break
            ours.append(a)
            theirs.append(b[0])
        assert [b.block_id for b in ours] == [b.block_id for b in theirs], (
            f"step {self.step}: hit blocks differ"
        )
        return ours, theirs

    def admit(self, doc: list[int], n_blocks: int, hits=None) -> dict | None:
        """Touch the longest cached prefix, take fresh blocks for the rest (refused when the
        free queue cannot supply them, hit blocks that were free included), cache the full ones."""
        hashes = chain(doc)
        hit_ours, hit_theirs = (
            hits if hits is not None else self.lookup(hashes[: n_blocks - 1])
        )
        need = n_blocks - len(hit_ours)
        evictable = sum(1 for b in hit_ours if b.ref_cnt == 0)
        if need + evictable > self.ours.get_num_free_blocks():
            return None
        self.ours.touch(hit_ours)
        self.theirs.touch(hit_theirs)
        new_ours, new_theirs = (
            self.ours.get_new_blocks(need),
            self.theirs.get_new_blocks(need),
        )
        assert [b.block_id for b in new_ours] == [b.block_id for b in new_theirs], (
            f"step {self.step}: get_new_blocks({need}) handed out different blocks"
        )
        req = {
            "doc": doc,
            "hashes": hashes,
            "ours": hit_ours + new_ours,
            "theirs": hit_theirs + new_theirs,
            "num_cached": len(hit_ours),
        }
        self.cache(req, self.rng.randint(len(hit_ours), min(n_blocks, len(doc))))
        self.held.append(req)
        self.docs.append(doc)
        return req

    def cache(self, req: dict, num_full: int) -> None:
        start = req["num_cached"]
        self.ours.cache_full_blocks(
            SimpleNamespace(block_hashes=req["hashes"]), req["ours"], start, num_full
        )
        self.theirs.cache_full_blocks(
            SimpleNamespace(block_hashes=req["hashes"], request_id="r"),
            req["theirs"],
            start,
            num_full,
            block_size=1,
            kv_cache_group_id=0,
        )
        req["num_cached"] = max(start, num_full)

    def grow(self, req: dict) -> None:
        """Decode filled the last block: it gets its content and is cached; one more block is
        taken."""
        if len(req["doc"]) < len(req["ours"]):
            req["doc"] = req["doc"] + self.fresh(len(req["ours"]) - len(req["doc"]))
            req["hashes"] = chain(req["doc"])
        self.cache(req, len(req["ours"]))
        if self.ours.get_num_free_blocks() == 0:
            return
        req["ours"] += self.ours.get_new_blocks(1)
        req["theirs"] += self.theirs.get_new_blocks(1)
        assert req["ours"][-1].block_id == req["theirs"][-1].block_id, (
            f"step {self.step}: growth differs"
        )

    def free(self, req: dict) -> None:
        self.held.remove(req)
        self.ours.free_blocks(req["ours"][::-1])
        self.theirs.free_blocks(reversed(req["theirs"]))

    def twins(self) -> None:
        """Two requests with one new content, both looked up before either is admitted: each
        computes and caches its own copy, so one hash maps to two blocks."""
        doc = self.pick_doc(self.rng.randint(1, 4))
        n = len(doc) + self.rng.randint(0, 1)
        hits = [self.lookup(chain(doc)[: n - 1]) for _ in range(2)]
        for h in hits:
            self.admit(doc, n, hits=h)

    def over_ask(self) -> None:
        n = self.ours.get_num_free_blocks() + 1
        with pytest.raises(ValueError) as ours:
            self.ours.get_new_blocks(n)
        with pytest.raises(ValueError) as theirs:
            self.theirs.get_new_blocks(n)
        assert str(ours.value) == str(theirs.value)  # vLLM's words

    def reset(self) -> None:
        # also the accepted case: everything freed
        if self.held and self.rng.random() < 0.5:
            for req in list(self.held):
                self.free(req)
        ok_ours, ok_theirs = (
            self.ours.reset_prefix_cache(),
            self.theirs.reset_prefix_cache(),
        )
        assert ok_ours == ok_theirs, (
            f"step {self.step}: reset_prefix_cache() {ok_ours} vs {ok_theirs}"
        )


def run_stream(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.choice([4, 9, 16, 40])
    ls = Lockstep(num_blocks, rng)
    ls.check("start")
    ops = (
        ["admit"] * 6
        + ["grow"] * 4
        + ["free"] * 5
        + ["twins"] * 2
        + ["over_ask", "reset"]
    )
    for ls.step in range(1, STEPS + 1):
        op = rng.choice(ops)
        if op == "admit":
            n = rng.randint(1, max(1, num_blocks // 3))
            ls.admit(ls.pick_doc(n), n)
        elif op == "grow" and ls.held:
            ls.grow(rng.choice(ls.held))
        elif op == "free" and ls.held:
            ls.free(rng.choice(ls.held))
        elif op == "twins":
            ls.twins()
        elif op == "over_ask":
            ls.over_ask()
        elif op == "reset":
            ls.reset()
        ls.check(op)
        ls.ours.check_invariants()


@pytest.mark.parametrize("seed", range(STREAMS))
def test_block_pool_streams_match_vllm(seed, tally):
    run_stream(seed)  # ls.check raises at the first step where the books differ
    tally("BlockPool + FreeKVCacheBlockQueue (vLLM)", 1, STEPS)


def test_duplicates_of_one_hash_and_lookup_order_match_vllm():
    """A hand-made case the streams reach only by chance: a hash cached by twins, the first
    twin's copy evicted, lookups then served by the second."""
    ls = Lockstep(6, random.Random(0))
    doc = ls.fresh(2)
    hits = [ls.lookup(chain(doc)[:1]) for _ in range(2)]
    a, b = (ls.admit(doc, 2, hits=h) for h in hits)
    for req in (a, b):
        ls.cache(req, 2)
    ls.check("twins cached")
    assert pool_books(ls.ours)["hash map"][chain(doc)[0]] == [1, 3]
    ls.free(a)
    ls.free(b)
    ls.check("both freed")
    ls.admit(ls.fresh(3), 3)  # takes 5, then evicts a's copies from the queue's head
    ls.check("a's copies evicted")
    hit_ours, hit_theirs = ls.lookup(chain(doc))
    assert [blk.block_id for blk in hit_ours] == [3, 4]
    ls.check("hit b's copies")


def test_the_comparison_catches_a_lookup_of_the_newest_copy(monkeypatch):
    """Bug zoo: with twins cached under one hash, a map that serves the newest copy instead of
    the oldest. Hits then take other blocks than vLLM's, and the streams must notice."""
    from memlab.vllm.block_pool import BlockHashToBlockMap, KVCacheBlock

    def newest(self, key):
        blocks = self._cache.get(key)
        return (
            blocks
            if blocks is None or isinstance(blocks, KVCacheBlock)
            else list(blocks.values())[-1]
        )

    monkeypatch.setattr(BlockHashToBlockMap, "get_one_block", newest)
    with pytest.raises(AssertionError, match="hit blocks differ|differs"):
        for seed in range(8):
            run_stream(seed)


def outcome(call):
    """What a call does: its value, or the type and message of what it raised."""
    try:
        return "ok", call()
    except Exception as exc:
        return type(exc).__name__, str(exc)


def test_an_empty_free_queue_refuses_as_vllms_does(tally):
    """``popleft`` on an empty queue: ValueError "No free blocks available"; ``popleft_n(0)``:
    nothing, even empty; ``BlockPool.get_new_blocks`` past the free count: "Cannot get N free
    blocks from the pool". ``popleft_n`` past the free count is vLLM's bare AssertionError
    (its one caller counts first); memlab refuses it with get_new_blocks' ValueError and words,
    and both leave the queue as it was."""
    V = load()
    steps = 0
    for size in (2, 3):
        ours, theirs = (
            BlockPool(size),
            V.block_pool.BlockPool(size, enable_caching=True, hash_block_size=1),
        )
        qo, qt = ours.free_block_queue, theirs.free_block_queue
        for call in (
            "popleft_n(2)",
            "popleft_n(size)",
            "popleft()",
            "popleft_n(0)",
            "popleft()",
            "popleft()",
            "popleft_n(1)",
            "popleft_n(0)",
            "popleft_n(2)",
        ):
            a = norm(outcome(lambda: _call(qo, call, size)))
            b = norm(outcome(lambda: _call(qt, call, size)))
            if call.startswith("popleft_n") and b == ("AssertionError", ""):
                n = size if "size" in call else int(call[10:-1])
                b = ("ValueError", f"Cannot get {n} free blocks from the pool")
            assert a == b, f"{call} on {size} blocks: memlab {a}, vLLM {b}"
            assert queue_ids(qo) == queue_ids(qt)
            assert qo.num_free_blocks == qt.num_free_blocks
            steps += 1
        for n in (1, 5):
            assert outcome(lambda: ours.get_new_blocks(n)) == outcome(
                lambda: theirs.get_new_blocks(n)
            )
            steps += 1
    tally("FreeKVCacheBlockQueue / BlockPool on an empty queue (errors)", 2, steps)


def norm(result):
    """An outcome with the blocks it returned as their ids."""
    kind, value = result
    if kind != "ok":
        return kind, value
    if isinstance(value, list):
        return kind, [blk.block_id for blk in value]
    return kind, value.block_id


def queue_ids(queue) -> list[int]:
    return [blk.block_id for blk in queue.get_all_free_blocks()]


def _call(q, call: str, size: int):
    name, arg = call.rstrip(")").split("(")
    return getattr(q, name)(*([] if not arg else [size if arg == "size" else int(arg)]))


# ---- the two behaviours issue 32 found apart from vLLM's, now the same ---------------------------


def map_shape(hash_map, strip=lambda key: key) -> dict:
    """The map as vLLM lays it out: {hash: block id} for one copy, {hash: {ids}} for copies."""
    out = {}
    for key, blocks in hash_map._cache.items():
        out[strip(key)] = (
            ("dict", sorted(blocks)) if isinstance(blocks, dict) else blocks.block_id
        )
    return out


def hash_map_lockstep(seed: int, steps: int = 300) -> int:
    """Random inserts (copies of one hash included), pops of copies that are there and that are
    not, and lookups, on memlab's map and vLLM's; the layout and every answer must be equal.
    A block is inserted only while it is in no entry, as a pool inserts it (set_block_hash
    refuses a block that has a hash)."""
    from memlab.vllm.block_pool import BlockHashToBlockMap, KVCacheBlock

    V = load()
    rng = random.Random(seed)
    ours, theirs = BlockHashToBlockMap(), V.block_pool.BlockHashToBlockMap()
    key = V.kv_cache_utils.make_block_hash_with_group_id
    blocks = [(KVCacheBlock(i), V.kv_cache_utils.KVCacheBlock(i)) for i in range(12)]
    hashes = [bytes([h]) * 4 for h in range(4)]
    mapped: dict[int, bytes] = {}
    for step in range(steps):
        h = rng.choice(hashes)
        i = rng.randrange(len(blocks))
        op = rng.choice(["insert", "insert", "pop", "get"])
        if op == "insert" and i not in mapped:
            ours.insert(h, blocks[i][0])
            theirs.insert(key(h, 0), blocks[i][1])
            mapped[i] = h
            a = b = None
        elif op == "pop":
            a, b = ours.pop(h, i), theirs.pop(key(h, 0), i)
            if a is not None:
                del mapped[i]
        else:
            a, b = ours.get_one_block(h), theirs.get_one_block(key(h, 0))
        a = None if a is None else a.block_id
        b = None if b is None else b.block_id
        assert a == b, f"seed {seed} step {step}: {op} answered {a} vs vLLM's {b}"
        shape = map_shape(theirs, V.kv_cache_utils.get_block_hash)
        assert map_shape(ours) == shape, f"seed {seed} step {step}: after {op}"
        assert len(ours) == len(theirs)
    return steps


def test_the_hash_map_keeps_vllms_layout_after_a_copy_is_popped(tally):
    """vLLM's BlockHashToBlockMap (vllm/v1/core/block_pool.py) turns two inserts under one hash
    into a dict and keeps the dict when one copy is popped ({h: {id: block}}); memlab kept the
    bare block until issue 32. A hand-made case, then random streams."""
    from memlab.vllm.block_pool import BlockHashToBlockMap, KVCacheBlock

    V = load()
    key = V.kv_cache_utils.make_block_hash_with_group_id(b"h", 0)
    ours, theirs = BlockHashToBlockMap(), V.block_pool.BlockHashToBlockMap()
    for i in (1, 2):
        ours.insert(b"h", KVCacheBlock(i))
        theirs.insert(key, V.kv_cache_utils.KVCacheBlock(i))
    assert ours.pop(b"h", 1).block_id == theirs.pop(key, 1).block_id == 1
    strip = V.kv_cache_utils.get_block_hash
    assert map_shape(ours) == map_shape(theirs, strip) == {b"h": ("dict", [2])}
    steps = sum(hash_map_lockstep(seed) for seed in range(8))
    tally("BlockHashToBlockMap (vLLM)", 8, steps)


def test_the_map_comparison_catches_a_collapsed_copy(monkeypatch):
    """Bug zoo: the pre-issue-32 pop, which turned a dict of one copy back into the bare block."""
    from memlab.vllm.block_pool import BlockHashToBlockMap

    real_pop = BlockHashToBlockMap.pop

    def collapsing_pop(self, key, block_id):
        block = real_pop(self, key, block_id)
        blocks = self._cache.get(key)
        if isinstance(blocks, dict) and len(blocks) == 1:
            self._cache[key] = next(iter(blocks.values()))
        return block

    monkeypatch.setattr(BlockHashToBlockMap, "pop", collapsing_pop)
    with pytest.raises(AssertionError, match="after pop|== map_shape"):
        for seed in range(8):
            hash_map_lockstep(seed)


def broken_queues(V):
    """(memlab's, vLLM's) queues of two blocks with one sentinel link cut, as vLLM's own test
    cuts it (tests/v1/core/test_kv_cache_utils.py)."""
    from memlab.vllm.block_pool import FreeKVCacheBlockQueue, KVCacheBlock

    for end in ("tail", "head"):
        ours = FreeKVCacheBlockQueue([KVCacheBlock(0), KVCacheBlock(1)])
        theirs = V.kv_cache_utils.FreeKVCacheBlockQueue(
            [V.kv_cache_utils.KVCacheBlock(0), V.kv_cache_utils.KVCacheBlock(1)]
        )
        for q in (ours, theirs):
            if end == "tail":
                q.fake_free_list_tail.prev_free_block = None
            else:
                q.fake_free_list_head.next_free_block = None
        yield end, ours, theirs


def test_append_n_and_prepend_n_on_a_broken_queue_raise_vllms_assertion(tally):
    """vLLM's append_n asserts the fake tail's link (and prepend_n the fake head's) before it
    links anything: AssertionError, nothing changed. memlab raised AttributeError half-way."""
    from memlab.vllm.block_pool import KVCacheBlock

    V = load()
    steps = 0
    for end, ours, theirs in broken_queues(V):
        call = "append_n" if end == "tail" else "prepend_n"
        results = []
        for q, block in (
            (ours, KVCacheBlock(5)),
            (theirs, V.kv_cache_utils.KVCacheBlock(5)),
        ):
            results.append(outcome(lambda: getattr(q, call)([block])))
            assert q.num_free_blocks == 2, f"{call} changed the count before refusing"
            assert block.prev_free_block is None and block.next_free_block is None
        assert results[0] == results[1], f"{call} on a broken queue: {results}"
        assert results[0][0] == "AssertionError"
        steps += 1
    tally("FreeKVCacheBlockQueue on a broken queue (errors)", 2, steps)


def test_the_broken_queue_comparison_catches_linking_before_the_assert(monkeypatch):
    """Bug zoo: append_n linking without vLLM's assert (memlab's pre-issue-32 append_n)."""
    from memlab.vllm.block_pool import FreeKVCacheBlockQueue

    def unchecked_append_n(self, blocks):
        last = self.fake_free_list_tail.prev_free_block
        for block in blocks:
            last.next_free_block = block  # AttributeError on None, as before
            block.prev_free_block = last
            last = block

    monkeypatch.setattr(FreeKVCacheBlockQueue, "append_n", unchecked_append_n)
    with pytest.raises(AssertionError, match="append_n on a broken queue"):
        test_append_n_and_prepend_n_on_a_broken_queue_raise_vllms_assertion(
            lambda *a: None
        )
