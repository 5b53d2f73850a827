"""Graded: chapter 06, chained block hashes (exercises/ch06_block_hash.py)."""

import pytest

from memlab.course.grading.checks import call_keeping_inputs, expect, expect_equal
from memlab.course.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch06.block_hash")


def ex():
    return load("ch06_block_hash")


def hashes(m, token_ids, bs, **kwargs):
    """request_block_hashes, which may only read its inputs; a list of bytes."""
    return call_keeping_inputs(
        m.request_block_hashes, "request_block_hashes", token_ids, bs, **kwargs
    )


def chain(m, token_ids, bs, extras):
    """The reference: hash_fn((parent, tokens, extra)) block by block, extras given per block."""
    out, parent = [], m.NONE_HASH
    for i in range(len(token_ids) // bs):
        parent = m.hash_fn((parent, tuple(token_ids[i * bs : (i + 1) * bs]), extras[i]))
        out.append(parent)
    return out


TOKENS = list(range(100, 110))


@points(2)
def test_full_blocks_only():
    m = ex()
    for n, want in ((10, 2), (12, 3), (3, 0), (4, 1), (0, 0)):
        got = hashes(m, list(range(n)), 4)
        expect(
            len(got) == want,
            f"{n} tokens in blocks of 4 make {want} full blocks, got {len(got)} hashes "
            "(a partial block is still growing: it gets no hash)",
        )
    expect_equal(
        hashes(m, TOKENS, 4),
        chain(m, TOKENS, 4, [None, None]),
        "hashes of 10 tokens in blocks of 4 (no extra keys): a list of bytes",
    )
    expect_equal(hashes(m, [], 4), [], "no token: an empty list")
    expect_equal(
        hashes(m, TOKENS[:3], 1),
        chain(m, TOKENS[:3], 1, [None] * 3),
        "3 tokens in blocks of 1",
    )


@points(1)
def test_chain_stands_for_the_prefix():
    m = ex()
    a = hashes(m, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = hashes(m, [9, 9, 9, 9, 5, 6, 7, 8], 4)
    expect(
        a[1] != b[1],
        "two requests with the same SECOND block but different first blocks got the same "
        "second hash: each block's hash must include its parent's",
    )
    expect_equal(
        a[1],
        m.hash_fn((a[0], (5, 6, 7, 8), None)),
        "block 1's hash = hash_fn((block 0's hash, tokens, None))",
    )


@points(2)
def test_salt_first_block_only():
    m = ex()
    got = hashes(m, TOKENS, 4, cache_salt="tenant-a")
    want = chain(m, TOKENS, 4, [(("cache_salt", "tenant-a"),), None])
    expect_equal(
        got[0],
        want[0],
        "block 0 with cache_salt='tenant-a' (extra keys (('cache_salt', 'tenant-a'),))",
    )
    expect_equal(
        got[1],
        want[1],
        "block 1 with a salt: the salt is on block 0 only (extra keys None); "
        "it still changes block 1's hash through the parent",
    )
    plain = hashes(m, TOKENS, 4)
    expect(
        got[1] != plain[1],
        "a salt must change every later hash too (through the chain)",
    )
    expect_equal(
        hashes(m, TOKENS, 4, cache_salt=""),
        plain,
        "cache_salt='' is no salt (vLLM tests its truth)",
    )
    item = m.MMItem("img", 1, 2)
    got = hashes(m, TOKENS, 4, mm_items=(item,), cache_salt="tenant-a")
    expect_equal(
        got[0],
        chain(m, TOKENS, 4, [(("mm", "img", 1), ("cache_salt", "tenant-a")), None])[0],
        "block 0 with an image and a salt: the salt comes last, after the items",
    )


@points(1)
def test_lora_on_every_block():
    m = ex()
    got = hashes(m, TOKENS, 4, lora_name="sql-adapter", cache_salt="s")
    key = ("lora", "sql-adapter", None)
    expect_equal(
        got,
        chain(m, TOKENS, 4, [(key, ("cache_salt", "s")), (key,)]),
        "hashes with lora_name='sql-adapter' and cache_salt='s' (lora on every block, then the salt "
        "on block 0)",
    )
    expect_equal(
        hashes(m, TOKENS, 4, lora_name=""),
        chain(m, TOKENS, 4, [(("lora", "", None),)] * 2),
        "lora_name='' is a name (the key is there whenever lora_name is not None)",
    )
    key = ("lora", "sql-adapter", "/adapters/v2")
    expect_equal(
        hashes(m, TOKENS, 4, lora_name="sql-adapter", lora_path="/adapters/v2"),
        chain(m, TOKENS, 4, [(key,)] * 2),
        "lora_path='/adapters/v2': the key is ('lora', name, path), so a name re-pointed at another "
        "adapter does not reuse KV",
    )
    expect_equal(
        hashes(m, TOKENS, 4, lora_path="/adapters/v2"),
        hashes(m, TOKENS, 4),
        "a lora_path without a lora_name adds no key",
    )


@points(1)
def test_multimodal_items_overlapping():
    m = ex()
    tokens = list(range(16))
    items = (
        m.MMItem("img-a", 2, 5),
        m.MMItem("img-b", 9, 2),
    )  # positions 2..6 and 9..10
    got = hashes(m, tokens, 4, mm_items=items)
    want = chain(
        m,
        tokens,
        4,
        [(("mm", "img-a", 2),), (("mm", "img-a", -2),), (("mm", "img-b", 1),), None],
    )
    for i in range(4):
        expect_equal(
            got[i],
            want[i],
            f"block {i} of 16 tokens with images at positions 2..6 and 9..10 "
            "(extra keys: ('mm', identifier, item offset - block start) per overlapping item)",
        )
    # Items that end exactly where a block starts, or start exactly where it ends, do
    # not overlap it; two items in one block keep their order; the lora key comes first.
    items = [
        m.MMItem("a", 0, 4),
        m.MMItem("b", 4, 1),
        m.MMItem("c", 7, 1),
        m.MMItem("d", 8, 8),
    ]
    got = hashes(m, tokens, 4, mm_items=items, lora_name="L")
    lora = ("lora", "L", None)
    want = chain(
        m,
        tokens,
        4,
        [
            (lora, ("mm", "a", 0)),
            (lora, ("mm", "b", 0), ("mm", "c", 3)),
            (lora, ("mm", "d", 0)),
            (lora, ("mm", "d", -4)),
        ],
    )
    got2 = hashes(
        m, tokens[:4], 4, mm_items=(m.MMItem("img-z", 0, 1), m.MMItem("img-a", 2, 1))
    )
    expect_equal(
        got2,
        chain(m, tokens[:4], 4, [(("mm", "img-z", 0), ("mm", "img-a", 2))]),
        "two items in one block, img-z at 0 and img-a at 2: their keys in offset order (the order of "
        "mm_items), never sorted by identifier",
    )
    for i in range(4):
        expect_equal(
            got[i],
            want[i],
            f"block {i} of 16 tokens with items at 0..3, 4, 7 and 8..15 and a lora: "
            "an item overlaps a block when it starts before the block's end and ends "
            "after its start",
        )


# -- the learner's hashes against vLLM's (memlab.vllm.hashing), on random requests ----------------


def random_case(d):
    from types import SimpleNamespace

    from memlab.vllm.hashing import get_request_block_hasher, sha256
    from memlab_tests.exercises.exercise_refs import INT31, SIZES

    m = ex()
    bs = d.pick(SIZES)
    n = (
        d.int(64, 2 * 64 + bs) if d.chance(0.3) else d.int(0, 3 * bs + 3)
    )  # past a 64-token block too
    kwargs = {}
    if d.chance(0.4):
        kwargs["lora_name"] = f"adapter{d.int(0, 9)}"
        kwargs["lora_path"] = d.pick((None, f"/loras/{d.int(0, 9)}"))
    items, pos = [], d.int(0, bs + 1)
    for k in d.count(
        0, 5, 0.5
    ):  # sorted by offset, disjoint; identifiers in another order
        length = d.int(1, bs + 2)
        items.append(m.MMItem(f"{d.pick('qbxma')}-image{k}", pos, length))
        pos += length + d.int(0, bs)
    if items:
        kwargs["mm_items"] = tuple(items)
    salt = d.pick((None, "", "tenant-a", "tenant-b"))
    if salt is not None:
        kwargs["cache_salt"] = salt
    tokens = [
        d.big(0, INT31) for _ in range(n)
    ]  # drawn last: shrinking the list keeps the rest
    d.given(
        token_ids=tokens,
        block_size=bs,
        **{k: (list(v) if k == "mm_items" else v) for k, v in kwargs.items()},
    )
    args = ", ".join(
        [repr(tokens), str(bs)] + [f"{k}={v!r}" for k, v in kwargs.items()]
    )
    d.code(f"print(ex.request_block_hashes({args.replace('MMItem(', 'ex.MMItem(')}))")
    got = d.call("request_block_hashes", m.request_block_hashes, tokens, bs, **kwargs)
    request = SimpleNamespace(
        block_hashes=[],
        num_tokens=n,
        all_token_ids=tokens,
        lora_name=kwargs.get("lora_name"),
        lora_path=kwargs.get("lora_path"),
        mm_features=list(items),
        cache_salt=salt,
    )
    d.returns(
        "request_block_hashes",
        got,
        get_request_block_hasher(bs, sha256)(request),
        "hashes are shown by their first bytes",
    )


@points(2)
def test_random_requests_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=660, trials=150, name="ch06_block_hash")
