"""One request stream, three sets of books: SGLang page 1, SGLang paged, vLLM's block pool."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.course.compare import (
    StreamRequest,
    compare,
    describe_free,
    format_table,
    make_stream,
)

BS = 4


def check_books(results, stream, bs):
    """What must hold for any stream: every token has a slot, slots of live requests never
    collide, page/block books waste under one page per request, page size 1 wastes nothing,
    paged slots follow slot = unit * bs + pos % bs."""
    want_tokens = {r.rid: r.prompt_len + r.output_len for r in stream}
    for engine, rows in results.items():
        assert sorted(r.rid for r in rows) == sorted(want_tokens)
        for row in rows:
            assert row.tokens == want_tokens[row.rid] == len(row.slots)
            # slot 0 is padding
            assert len(set(row.slots)) == row.tokens and min(row.slots) >= 1
            if engine == "sglang page 1":
                assert row.tail_waste == 0 and row.reserved == row.tokens
            else:
                assert 0 <= row.tail_waste <= bs - 1
                assert row.reserved == -(-row.tokens // bs) * bs
                units = [s // bs for s in row.slots]
                assert all(s % bs == pos % bs for pos, s in enumerate(row.slots)), (
                    "slot offset != position offset"
                )
                assert all(units[p] == units[p - p % bs] for p in range(row.tokens)), (
                    "a page holds two requests' runs"
                )
                assert min(units) >= 1, (
                    "page/block 0 is padding/null and never handed out"
                )
    # SGLang paged and vLLM reserve the same: both round each request up to whole units.
    paged, vllm = (results[e] for e in results if e != "sglang page 1")
    assert sorted((r.rid, r.reserved) for r in paged) == sorted(
        (r.rid, r.reserved) for r in vllm
    )


def test_side_by_side_on_a_fixed_stream():
    stream = [
        StreamRequest("a", 5, 2),
        StreamRequest("b", 8, 0),
        StreamRequest("c", 3, 4, arrival=1),
    ]
    res = compare(stream, block_size=BS)
    check_books(res, stream, BS)
    rows = {e: {r.rid: r for r in rs} for e, rs in res.items()}
    a_tok, a_pag, a_vllm = (rows[e]["a"] for e in res)
    assert (a_tok.tokens, a_tok.tail_waste) == (7, 0)
    assert (
        (a_pag.reserved, a_pag.tail_waste)
        == (8, 1)
        == (a_vllm.reserved, a_vllm.tail_waste)
    )
    # How each frees: SGLang page 1 appends slots (FIFO); paged SGLang prepends pages
    # (LIFO); vLLM sends the full, hashed block to the tail (still a cache hit) and the
    # partial one to the head.
    assert (a_tok.freed_to_head, a_tok.freed_to_tail, a_tok.free_unit) == (0, 7, "slot")
    assert (a_pag.freed_to_head, a_pag.freed_to_tail, a_pag.free_unit) == (2, 0, "page")
    assert (a_vllm.freed_to_head, a_vllm.freed_to_tail, a_vllm.free_unit) == (
        1,
        1,
        "block",
    )
    b_vllm = rows["vllm block 4"]["b"]
    # 8 tokens: 2 full blocks
    assert (b_vllm.freed_to_head, b_vllm.freed_to_tail, b_vllm.tail_waste) == (0, 2, 0)
    assert describe_free(a_vllm) == "1 block -> head, 1 block -> tail"
    table = format_table(res)
    assert (
        "sglang page 1" in table
        and "vllm block 4" in table
        and "1 block -> head" in table
    )


def test_concurrent_requests_never_share_a_slot():
    # All arrive at step 0 and none finishes before the last prefill: every slot must differ.
    stream = [StreamRequest(f"r{i}", 3 + i, 5) for i in range(6)]
    for rows in compare(stream, block_size=BS).values():
        slots = [s for r in rows for s in r.slots]
        assert len(slots) == len(set(slots))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), bs=st.sampled_from([2, 4, 16]))
def test_random_streams(seed, n, bs):
    stream = make_stream(n, seed=seed, max_prompt=40, max_output=6, max_arrival=3)
    check_books(compare(stream, block_size=bs), stream, bs)


def test_bad_streams_are_refused_by_value():
    with pytest.raises(ValueError, match="prompt_len must be >= 1"):
        compare([StreamRequest("a", 0, 1)])
    with pytest.raises(ValueError, match="request id 'a' appears twice"):
        compare([StreamRequest("a", 1, 1), StreamRequest("a", 2, 1)])
    with pytest.raises(ValueError, match="block_size must be an int >= 2.*got 1"):
        compare([StreamRequest("a", 1, 1)], block_size=1)
