"""Graded: chapter 06, the order of vLLM's free queue (exercises/ch06_free_queue.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal, plain
from memlab.course.grading.loader import load


def fields(blocks):
    """Each block's (block_id, ref_cnt, block_hash, is_null), read as plain values."""
    return [
        plain((b.block_id, b.ref_cnt, b.block_hash, b.is_null), "a block's fields")
        for b in blocks
    ]


def free(m, q, blocks):
    """free_request_blocks, which must leave the caller's list of blocks as it was (same
    blocks, same order), decrement each non-null block's ref_cnt once and change no other
    field (a freed block keeps its hash: a prefix hit may still revive it)."""
    before = list(blocks)
    was = fields(blocks)
    got = m.free_request_blocks(q, blocks)
    expect(
        got is None,
        f"free_request_blocks returns nothing (it changes the queue), got {got!r}",
    )
    expect(
        len(blocks) == len(before) and all(a is b for a, b in zip(blocks, before)),
        f"free_request_blocks changed the caller's list of blocks to {blocks} (was "
        f"{before}): walk it with reversed(blocks), do not reverse it in place",
    )
    # A block listed twice would be decremented twice: the tests list each block once.
    want = [(i, r if null else r - 1, h, null) for i, r, h, null in was]
    expect_equal(
        fields(blocks),
        want,
        "the blocks' (block_id, ref_cnt, block_hash, is_null) after the free: one ref "
        "dropped per non-null block, nothing else changed (vLLM keeps a freed block's "
        "hash: a later request may still hit it; the hash goes only when the block is "
        "evicted for reuse)",
    )


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch06.free_queue", requires=requires)


def setup(spec, queue_ids):
    """spec: (block_id, ref_cnt, hash or None, is_null) per block of the request, in table
    order; the queue holds blocks of the ids given, head first."""
    m = load("ch06_free_queue")
    blocks = [m.Block(i, ref_cnt=r, block_hash=h, is_null=n) for i, r, h, n in spec]
    queue = m.FreeQueue([m.Block(i) for i in queue_ids])
    return m, queue, blocks


def block_ids(rng, n):
    """n distinct block ids (never 0, the null block's) and 2 more for the queue's blocks."""
    got = rng.sample(range(1, 100_000), n + 2)
    return got[:n], got[n:]


def some_hashes(rng, n):
    """n distinct block hashes, of the kinds a hash may be (bytes, str, int)."""
    kinds = (lambda i: bytes([i % 256]) * 8, lambda i: f"h{i}", lambda i: 1000 + i)
    return [rng.choice(kinds)(rng.randint(0, 10**6) * 8 + i) for i in range(n)]


@points(2)
def test_reverse_order_hashed_to_tail(rng):
    (a, b, c), queued = block_ids(rng, 3)
    ha, hb, hc = some_hashes(rng, 3)
    m, q, blocks = setup(
        [(a, 1, ha, False), (b, 1, hb, False), (c, 1, hc, False)], queued
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [*queued, c, b, a],
        f"free queue (head first) after freeing a request's hashed blocks {a}, {b}, {c}: "
        "they go to the tail in REVERSE order, so the end of the prefix is evicted first",
    )


@points(2)
def test_unhashed_to_head(rng):
    (a, b, c), queued = block_ids(rng, 3)
    ha, hb = some_hashes(rng, 2)
    m, q, blocks = setup(
        [(a, 1, ha, False), (b, 1, hb, False), (c, 1, None, False)], queued
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [c, *queued, b, a],
        f"free queue after freeing blocks {a}, {b} (hashed) and {c} (its partial last "
        "block, no hash): an unhashed block goes to the HEAD, to be reused first",
    )
    # A hash is any value that is not None, even one that reads as false.
    (a, b, c, d), queued = block_ids(rng, 4)
    m, q, blocks = setup(
        [(a, 1, 0, False), (b, 1, b"", False), (c, 1, None, False), (d, 1, (), False)],
        queued,
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [c, *queued, d, b, a],
        f"free queue after freeing blocks with hashes 0, b'', None and (): only block {c} "
        "(hash None) is unhashed; a hash of 0 or b'' is still a hash (test `is not "
        "None`, not truthiness)",
    )


@points(1)
def test_several_unhashed_keep_walk_order(rng):
    (a, b, c), queued = block_ids(rng, 3)
    (ha,) = some_hashes(rng, 1)
    m, q, blocks = setup(
        [(a, 1, ha, False), (b, 1, None, False), (c, 1, None, False)], queued
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [c, b, *queued, a],
        f"free queue after freeing blocks {a} (hashed), {b} and {c} (unhashed): the walk "
        f"goes {c}, {b}, {a}; the unhashed ones are prepended as a group in walk order",
    )


@points(1)
def test_shared_blocks_stay_out(rng):
    (a, b, c), queued = block_ids(rng, 3)
    ha, hc = some_hashes(rng, 2)
    ra, rb = rng.randint(2, 5), rng.randint(2, 5)
    m, q, blocks = setup(
        [(a, ra, ha, False), (b, rb, None, False), (c, 1, hc, False)], queued
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [*queued, c],
        f"blocks {a} and {b} are still used by other requests (ref_cnt {ra} -> {ra - 1}, "
        f"{rb} -> {rb - 1}): only block {c} may enter the free queue",
    )


@points(1, requires="test_reverse_order_hashed_to_tail")
def test_null_blocks_skipped(rng):
    # A sliding-window request whose first blocks fell out of the window: null placeholders.
    (a, b), queued = block_ids(rng, 2)
    (ha,) = some_hashes(rng, 1)
    m, q, blocks = setup(
        [
            (0, 1, None, True),
            (0, 1, None, True),
            (a, 1, ha, False),
            (b, 1, None, False),
        ],
        queued[:1],
    )
    free(m, q, blocks)
    expect(
        all(b.block_id != 0 for b in q.blocks),
        f"the null block entered the free queue: {q.ids()}",
    )
    expect_equal(
        q.ids(),
        [b, queued[0], a],
        f"free queue after freeing [null, null, {a} (hashed), {b} (unhashed)]",
    )
    m, q, blocks = setup([(0, 1, None, True)], ())
    free(m, q, blocks)
    expect_equal(
        q.ids(), [], "freeing a request that holds only a null block queues nothing"
    )
    m, q, blocks = setup(
        [(a, 1, ha, False), (0, 1, None, True), (b, 1, None, False)], queued[:1]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [b, queued[0], a],
        f"free queue after freeing [{a} (hashed), null, {b} (unhashed)]: a null block is "
        "skipped wherever it sits, and the walk goes on past it",
    )


# -- the learner's free against vLLM's (memlab's BlockPool.free_blocks), request after request -----

HASHES = (None, "h", 0, b"", b"\x07" * 8, ("t", 3))  # falsy hashes are hashes too


def random_case(d):
    from memlab.vllm.block_pool import BlockPool
    from memlab_tests.exercises.exercise_refs import INT31

    m = load("ch06_free_queue")
    n = d.size(1, 10)
    pool = BlockPool(n + 1)  # engine blocks 1..n; block 0 is vLLM's null block
    ids = d.ids(n, INT31)  # the learner's block ids: random order, small and large
    hashes = [d.pick(HASHES) for _ in range(n)]
    eng = pool.blocks[1:]
    for b, h in zip(eng, hashes):
        b._block_hash = h
    queued = set(d.sample(range(n), d.int(0, min(3, n))))  # free before the frees
    reqs = []  # block-table indices per request (-1: a null placeholder)
    for _ in d.count(1, 4):
        # a sliding window dropped its first blocks: null placeholders
        table = [-1] * (d.int(1, 2) if d.chance(0.2) else 0)
        table += [i for i in d.sample(range(n), d.int(0, n)) if i not in queued]
        reqs.append(table)
    # +1: another holder
    refs = [sum(r.count(i) for r in reqs) + d.chance(0.15) for i in range(n)]
    queued |= {i for i in range(n) if refs[i] == 0}
    order = [i for i in range(n) if i in queued]
    order = d.shuffled(order)
    for i in range(n):
        eng[i].ref_cnt = refs[i]
    for b in list(pool.free_block_queue.get_all_free_blocks()):
        pool.free_block_queue.remove(b)
    pool.free_block_queue.append_n([eng[i] for i in order])
    mine = [m.Block(ids[i], ref_cnt=refs[i], block_hash=hashes[i]) for i in range(n)]
    null = m.Block(0, ref_cnt=1, is_null=True)
    q = m.FreeQueue([mine[i] for i in order])
    d.given(
        blocks=[(ids[i], refs[i], hashes[i]) for i in range(n)],
        queue=[ids[i] for i in order],
        requests=[[ids[i] if i >= 0 else "null" for i in r] for r in reqs],
    )
    d.code(
        "blocks = {"
        + ", ".join(
            f"{ids[i]}: ex.Block({ids[i]}, ref_cnt={refs[i]}, block_hash={hashes[i]!r})"
            for i in range(n)
        )
        + "}"
    )
    d.code("null = ex.Block(0, ref_cnt=1, is_null=True)")
    d.code(f"q = ex.FreeQueue([blocks[i] for i in {[ids[i] for i in order]}])")
    for r in d.shuffled(range(len(reqs))):  # requests finish in any order
        table = reqs[r]
        d.step(
            f"free request {r}: free_request_blocks(q, "
            f"{[ids[i] if i >= 0 else 'null' for i in table]})"
        )
        d.code(
            "ex.free_request_blocks(q, ["
            + ", ".join("null" if i < 0 else f"blocks[{ids[i]}]" for i in table)
            + "])"
        )
        blocks = [null if i < 0 else mine[i] for i in table]
        before = list(blocks)
        d.returns(
            "free_request_blocks",
            d.call("free_request_blocks", m.free_request_blocks, q, blocks, keep=False),
            None,
        )
        d.same(
            "the caller's list of blocks (same blocks, same order)",
            [ids.index(b.block_id) if b is not null else -1 for b in blocks],
            table,
            "walk it with reversed(blocks), do not reverse it in place",
        )
        if len(blocks) != len(before) or any(
            a is not b for a, b in zip(blocks, before)
        ):
            d.fail(
                "list changed",
                f"your `free_request_blocks` changed the caller's list of blocks on {d.words()}",
            )
        pool.free_blocks(
            reversed([pool.null_block if i < 0 else eng[i] for i in table])
        )
        index = {id(b): i for i, b in enumerate(eng)}
        d.code(
            "print(q.ids(), [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) "
            "for b in blocks.values()])"
        )
        d.books(
            "free_request_blocks",
            "queue.ids()",
            d.call("ids", q.ids),
            [ids[index[id(b)]] for b in pool.free_block_queue.get_all_free_blocks()],
        )
        d.books(
            "free_request_blocks",
            "the blocks' (block_id, ref_cnt, block_hash, is_null)",
            [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in mine],
            [(ids[i], b.ref_cnt, b.block_hash, b.is_null) for i, b in enumerate(eng)],
            "a freed block keeps its hash: a later request may still hit it",
        )
        d.books(
            "free_request_blocks",
            "the null block's (block_id, ref_cnt, block_hash, is_null)",
            (null.block_id, null.ref_cnt, null.block_hash, null.is_null),
            (0, 1, None, True),
        )


@points(2)
def test_random_frees_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=150, name="ch06_free_queue")
