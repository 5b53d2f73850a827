"""Graded: chapter 06, the order of vLLM's free queue (exercises/ch06_free_queue.py)."""

import pytest

from memlab.grading.checks import expect, expect_equal
from memlab.grading.loader import load


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
    m, q, blocks = setup([(1, 1, "h1", False), (2, 1, "h2", False), (3, 1, "h3", False)])
    m.free_request_blocks(q, blocks)
    expect_equal(q.ids(), [90, 91, 3, 2, 1], "free queue (head first) after freeing a request's hashed blocks "
                 "1, 2, 3: they go to the tail in REVERSE order, so the end of the prefix is evicted first")
    expect_equal([b.ref_cnt for b in blocks], [0, 0, 0], "ref counts after the free")


@points(2)
def test_unhashed_to_head():
    m, q, blocks = setup([(1, 1, "h1", False), (2, 1, "h2", False), (4, 1, None, False)])
    m.free_request_blocks(q, blocks)
    expect_equal(q.ids(), [4, 90, 91, 2, 1], "free queue after freeing blocks 1, 2 (hashed) and 4 (its partial "
                 "last block, no hash): an unhashed block goes to the HEAD, to be reused first")


@points(1)
def test_several_unhashed_keep_walk_order():
    m, q, blocks = setup([(1, 1, "h1", False), (5, 1, None, False), (6, 1, None, False)])
    m.free_request_blocks(q, blocks)
    expect_equal(q.ids(), [6, 5, 90, 91, 1], "free queue after freeing blocks 1 (hashed), 5 and 6 (unhashed): "
                 "the walk goes 6, 5, 1; the unhashed ones are prepended as a group in walk order")


@points(1)
def test_shared_blocks_stay_out():
    m, q, blocks = setup([(1, 2, "h1", False), (2, 2, "h2", False), (3, 1, "h3", False)])
    m.free_request_blocks(q, blocks)
    expect_equal(q.ids(), [90, 91, 3], "blocks 1 and 2 are still used by another request (ref_cnt 2 -> 1): "
                 "only block 3 may enter the free queue")
    expect_equal([b.ref_cnt for b in blocks], [1, 1, 0], "ref counts after the free")


@points(1)
def test_null_blocks_skipped():
    # A sliding-window request whose first blocks fell out of the window: null placeholders.
    m, q, blocks = setup([(0, 1, None, True), (0, 1, None, True), (7, 1, "h7", False), (8, 1, None, False)],
                         queue_ids=(90,))
    null = blocks[0]
    m.free_request_blocks(q, blocks)
    expect(all(b.block_id != 0 for b in q.blocks), f"the null block entered the free queue: {q.ids()}")
    expect_equal(q.ids(), [8, 90, 7], "free queue after freeing [null, null, 7 (hashed), 8 (unhashed)]")
    expect_equal(null.ref_cnt, 1, "a null block's ref_cnt must be left alone")
