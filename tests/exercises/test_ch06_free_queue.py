"""Graded: chapter 06, the order of vLLM's free queue (exercises/ch06_free_queue.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal
from memlab.course.grading.loader import load


def free(m, q, blocks):
    """free_request_blocks, which must leave the caller's list of blocks as it was (same blocks, same order)."""
    before = list(blocks)
    got = m.free_request_blocks(q, blocks)
    expect(
        got is None,
        f"free_request_blocks returns nothing (it changes the queue), got {got!r}",
    )
    expect(
        len(blocks) == len(before) and all(a is b for a, b in zip(blocks, before)),
        f"free_request_blocks changed the caller's list of blocks to {blocks} (was {before}): walk it with "
        "reversed(blocks), do not reverse it in place",
    )


def points(n):
    return pytest.mark.points(n, exercise="ch06.free_queue")


def setup(spec, queue_ids=(90, 91)):
    """spec: (block_id, ref_cnt, hash or None, is_null) per block of the request, in table order."""
    m = load("ch06_free_queue")
    blocks = [m.Block(i, ref_cnt=r, block_hash=h, is_null=n) for i, r, h, n in spec]
    queue = m.FreeQueue([m.Block(i) for i in queue_ids])
    return m, queue, blocks


@points(2)
def test_reverse_order_hashed_to_tail():
    m, q, blocks = setup(
        [(1, 1, "h1", False), (2, 1, "h2", False), (3, 1, "h3", False)]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [90, 91, 3, 2, 1],
        "free queue (head first) after freeing a request's hashed blocks "
        "1, 2, 3: they go to the tail in REVERSE order, so the end of the prefix is evicted first",
    )
    expect_equal([b.ref_cnt for b in blocks], [0, 0, 0], "ref counts after the free")


@points(2)
def test_unhashed_to_head():
    m, q, blocks = setup(
        [(1, 1, "h1", False), (2, 1, "h2", False), (4, 1, None, False)]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [4, 90, 91, 2, 1],
        "free queue after freeing blocks 1, 2 (hashed) and 4 (its partial "
        "last block, no hash): an unhashed block goes to the HEAD, to be reused first",
    )
    # A hash is any value that is not None, even one that reads as false.
    m, q, blocks = setup(
        [(1, 1, 0, False), (2, 1, b"", False), (3, 1, None, False), (4, 1, (), False)]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [3, 90, 91, 4, 2, 1],
        "free queue after freeing blocks with hashes 0, b'', None and (): "
        "only block 3 (hash None) is unhashed; a hash of 0 or b'' is still a hash (test `is not None`, "
        "not truthiness)",
    )


@points(1)
def test_several_unhashed_keep_walk_order():
    m, q, blocks = setup(
        [(1, 1, "h1", False), (5, 1, None, False), (6, 1, None, False)]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [6, 5, 90, 91, 1],
        "free queue after freeing blocks 1 (hashed), 5 and 6 (unhashed): "
        "the walk goes 6, 5, 1; the unhashed ones are prepended as a group in walk order",
    )


@points(1)
def test_shared_blocks_stay_out():
    m, q, blocks = setup(
        [(1, 2, "h1", False), (2, 3, None, False), (3, 1, "h3", False)]
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [90, 91, 3],
        "blocks 1 and 2 are still used by other requests (ref_cnt 2 -> 1, "
        "3 -> 2): only block 3 may enter the free queue",
    )
    expect_equal(
        [b.ref_cnt for b in blocks],
        [1, 2, 0],
        "ref counts after the free (one decrement each)",
    )


@points(1)
def test_null_blocks_skipped():
    # A sliding-window request whose first blocks fell out of the window: null placeholders.
    m, q, blocks = setup(
        [
            (0, 1, None, True),
            (0, 1, None, True),
            (7, 1, "h7", False),
            (8, 1, None, False),
        ],
        queue_ids=(90,),
    )
    free(m, q, blocks)
    expect(
        all(b.block_id != 0 for b in q.blocks),
        f"the null block entered the free queue: {q.ids()}",
    )
    expect_equal(
        q.ids(),
        [8, 90, 7],
        "free queue after freeing [null, null, 7 (hashed), 8 (unhashed)]",
    )
    expect_equal(
        [b.ref_cnt for b in blocks],
        [1, 1, 0, 0],
        "ref counts: a null block's ref_cnt must be left alone",
    )
    m, q, blocks = setup([(0, 1, None, True)], queue_ids=())
    free(m, q, blocks)
    expect_equal(
        q.ids(), [], "freeing a request that holds only a null block queues nothing"
    )
    m, q, blocks = setup(
        [(5, 1, "h5", False), (0, 1, None, True), (6, 1, None, False)], queue_ids=(90,)
    )
    free(m, q, blocks)
    expect_equal(
        q.ids(),
        [6, 90, 5],
        "free queue after freeing [5 (hashed), null, 6 (unhashed)]: a null block is "
        "skipped wherever it sits, and the walk goes on past it",
    )


# -- the learner's free against vLLM's (memlab's BlockPool.free_blocks), request after request -----

HASHES = (None, "h", 0, b"", b"\x07" * 8, ("t", 3))  # falsy hashes are hashes too


def random_case(d):
    from memlab.vllm.block_pool import BlockPool
    from memlab_tests.exercises.exercise_refs import INT31

    m = load("ch06_free_queue")
    n = d.int(1, 10)
    pool = BlockPool(n + 1)  # engine blocks 1..n; block 0 is vLLM's null block
    ids = d.ids(n, INT31)  # the learner's block ids: random order, small and large
    hashes = [d.pick(HASHES) for _ in range(n)]
    eng = pool.blocks[1:]
    for b, h in zip(eng, hashes):
        b._block_hash = h
    queued = set(
        d.sample(range(n), d.int(0, min(3, n)))
    )  # already free before the frees
    reqs = []  # block-table indices per request (-1: a null placeholder)
    for _ in d.count(1, 4):
        table = [-1] * (
            d.int(1, 2) if d.chance(0.2) else 0
        )  # a sliding window dropped its first blocks
        table += [i for i in d.sample(range(n), d.int(0, n)) if i not in queued]
        reqs.append(table)
    refs = [
        sum(r.count(i) for r in reqs) + (1 if d.chance(0.15) else 0) for i in range(n)
    ]  # +1: another holder
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
            f"free request {r}: free_request_blocks(q, {[ids[i] if i >= 0 else 'null' for i in table]})"
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
        d.code("print(q.ids(), [b.ref_cnt for b in blocks.values()])")
        d.books(
            "free_request_blocks",
            "queue.ids()",
            d.call("ids", q.ids),
            [ids[index[id(b)]] for b in pool.free_block_queue.get_all_free_blocks()],
        )
        d.books(
            "free_request_blocks",
            "the blocks' ref_cnt",
            [b.ref_cnt for b in mine],
            [b.ref_cnt for b in eng],
        )
        d.books("free_request_blocks", "the null block's ref_cnt", null.ref_cnt, 1)


@points(2)
def test_random_frees_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=606, trials=150, name="ch06_free_queue")
