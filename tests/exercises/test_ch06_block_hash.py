"""Graded: chapter 06, chained block hashes (exercises/ch06_block_hash.py)."""

import pytest

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    plural,
)
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch06.block_hash", requires=requires)


def ex():
    return load("ch06_block_hash")


def hashes(m, token_ids, bs, **kwargs):
    """request_block_hashes, which may only read its inputs; a list of bytes."""
    return call_keeping_inputs(
        m.request_block_hashes, "request_block_hashes", token_ids, bs, **kwargs
    )


def chain(token_ids, bs, extras):
    """The reference, with the engine's hash (memlab.vllm.hashing, vLLM's sha256 and seed):
    hash((parent, tokens, extra)) block by block, extras given per block."""
    from memlab.vllm.hashing import init_none_hash, sha256

    out, parent = [], init_none_hash(sha256)
    for i in range(len(token_ids) // bs):
        parent = sha256((parent, tuple(token_ids[i * bs : (i + 1) * bs]), extras[i]))
        out.append(parent)
    return out


def tokens(rng, n):
    return [rng.randint(0, 2**31 - 1) for _ in range(n)]


@points(2)
def test_full_blocks_only(rng):
    m = ex()
    bs = rng.choice((2, 3, 4, 5, 8))
    k = rng.randint(1, 6)
    for n, want in (
        (k * bs + rng.randint(1, bs - 1), k),
        ((k + 1) * bs, k + 1),
        (bs - 1, 0),
        (bs, 1),
        (0, 0),
    ):
        got = hashes(m, tokens(rng, n), bs)
        expect(
            len(got) == want,
            f"{plural(n, 'token')} in blocks of {bs} make {plural(want, 'full block')}, "
            f"got {plural(len(got), 'hash')} (a partial block is still growing: it gets no "
            "hash)",
        )
    ids = tokens(rng, 2 * bs + rng.randint(1, bs - 1))
    expect_equal(
        hashes(m, ids, bs),
        chain(ids, bs, [None, None]),
        f"hashes of {plural(len(ids), 'token')} in blocks of {bs} (no extra keys): a list of bytes",
    )
    expect_equal(hashes(m, [], bs), [], "no token: an empty list")
    ids = tokens(rng, 3)
    expect_equal(
        hashes(m, ids, 1), chain(ids, 1, [None] * 3), "3 tokens in blocks of 1"
    )


@points(1)
def test_chain_stands_for_the_prefix(rng):
    m = ex()
    bs = rng.choice((2, 3, 4, 5, 8))
    first, second, other = tokens(rng, bs), tokens(rng, bs), tokens(rng, bs)
    a = hashes(m, first + second, bs)
    b = hashes(m, other + second, bs)
    expect(
        a[1] != b[1],
        "two requests with the same SECOND block but different first blocks got the same "
        "second hash: each block's hash must include its parent's",
    )
    expect_equal(
        a,
        chain(first + second, bs, [None, None]),
        "block 1's hash = hash_fn((block 0's hash, tokens, None))",
    )


@points(2)
def test_salt_first_block_only(rng):
    m = ex()
    bs = rng.choice((2, 3, 4, 5, 8))
    ids = tokens(rng, 2 * bs + rng.randint(0, bs - 1))
    salt = f"tenant-{rng.randint(0, 999)}"
    got = hashes(m, ids, bs, cache_salt=salt)
    want = chain(ids, bs, [(("cache_salt", salt),), None])
    expect_equal(
        got[0],
        want[0],
        f"block 0 with cache_salt={salt!r} (extra keys (('cache_salt', {salt!r}),))",
    )
    expect_equal(
        got[1],
        want[1],
        "block 1 with a salt: the salt is on block 0 only (extra keys None); it still "
        "changes block 1's hash through the parent",
    )
    plain = hashes(m, ids, bs)
    expect(
        got[1] != plain[1],
        "a salt must change every later hash too (through the chain)",
    )
    expect_equal(
        hashes(m, ids, bs, cache_salt=""),
        plain,
        "cache_salt='' is no salt (vLLM tests its truth)",
    )
    image = f"img{rng.randint(0, 99)}"
    start = rng.randint(0, bs - 1)
    item = m.MMItem(image, start, 1)
    got = hashes(m, ids, bs, mm_items=(item,), cache_salt=salt)
    expect_equal(
        got[0],
        chain(ids, bs, [(("mm", image, start), ("cache_salt", salt)), None])[0],
        "block 0 with an image and a salt: the salt comes last, after the items",
    )


@points(1)
def test_lora_on_every_block(rng):
    m = ex()
    bs = rng.choice((2, 3, 4, 5, 8))
    ids = tokens(rng, 2 * bs + rng.randint(0, bs - 1))
    name, salt = f"adapter-{rng.randint(0, 99)}", f"s{rng.randint(0, 9)}"
    got = hashes(m, ids, bs, lora_name=name, cache_salt=salt)
    key = ("lora", name, None)
    expect_equal(
        got,
        chain(ids, bs, [(key, ("cache_salt", salt)), (key,)]),
        f"hashes with lora_name={name!r} and cache_salt={salt!r} (lora on every block, "
        "then the salt on block 0)",
    )
    expect_equal(
        hashes(m, ids, bs, lora_name=""),
        chain(ids, bs, [(("lora", "", None),)] * 2),
        "lora_name='' is a name (the key is there whenever lora_name is not None)",
    )
    path = f"/adapters/v{rng.randint(0, 9)}"
    key = ("lora", name, path)
    expect_equal(
        hashes(m, ids, bs, lora_name=name, lora_path=path),
        chain(ids, bs, [(key,)] * 2),
        f"lora_path={path!r}: the key is ('lora', name, path), so a name re-pointed at "
        "another adapter does not reuse KV",
    )
    expect_equal(
        hashes(m, ids, bs, lora_path=path),
        hashes(m, ids, bs),
        "a lora_path without a lora_name adds no key",
    )


@points(1)
def test_multimodal_items_overlapping(rng):
    m = ex()
    ids = tokens(rng, 16)
    a, b = (f"img-{c}{rng.randint(0, 99)}" for c in "ab")
    items = (m.MMItem(a, 2, 5), m.MMItem(b, 9, 2))  # positions 2..6 and 9..10
    got = hashes(m, ids, 4, mm_items=items)
    want = chain(ids, 4, [(("mm", a, 2),), (("mm", a, -2),), (("mm", b, 1),), None])
    for i in range(4):
        expect_equal(
            got[i],
            want[i],
            f"block {i} of 16 tokens with images at positions 2..6 and 9..10 (extra keys: "
            "('mm', identifier, item offset - block start) per overlapping item)",
        )
    # Items that end exactly where a block starts, or start exactly where it ends, do
    # not overlap it; two items in one block keep their order; the lora key comes first.
    names = [f"{c}{rng.randint(0, 9)}" for c in "abcd"]
    items = [
        m.MMItem(names[0], 0, 4),
        m.MMItem(names[1], 4, 1),
        m.MMItem(names[2], 7, 1),
        m.MMItem(names[3], 8, 8),
    ]
    got = hashes(m, ids, 4, mm_items=items, lora_name="L")
    lora = ("lora", "L", None)
    want = chain(
        ids,
        4,
        [
            (lora, ("mm", names[0], 0)),
            (lora, ("mm", names[1], 0), ("mm", names[2], 3)),
            (lora, ("mm", names[3], 0)),
            (lora, ("mm", names[3], -4)),
        ],
    )
    z = f"img-z{rng.randint(0, 99)}"
    got2 = hashes(m, ids[:4], 4, mm_items=(m.MMItem(z, 0, 1), m.MMItem(a, 2, 1)))
    expect_equal(
        got2,
        chain(ids[:4], 4, [(("mm", z, 0), ("mm", a, 2))]),
        f"two items in one block, {z} at 0 and {a} at 2: their keys in offset order (the "
        "order of mm_items), never sorted by identifier",
    )
    for i in range(4):
        expect_equal(
            got[i],
            want[i],
            f"block {i} of 16 tokens with items at 0..3, 4, 7 and 8..15 and a lora: an "
            "item overlaps a block when it starts before the block's end and ends after "
            "its start",
        )


# -- the learner's hashes against vLLM's (memlab.vllm.hashing), on random requests ----------------


def random_case(d):
    from types import SimpleNamespace

    from memlab.vllm.hashing import get_request_block_hasher, sha256
    from memlab_tests.exercises.exercise_refs import INT31, SIZES

    m = ex()
    bs = d.pick(SIZES)
    # past a 64-token block too
    n = d.int(64, 2 * 64 + bs) if d.chance(0.3) else d.int(0, 3 * bs + 3)
    kwargs = {}
    if d.chance(0.4):
        kwargs["lora_name"] = f"adapter{d.int(0, 9)}"
        kwargs["lora_path"] = d.pick((None, f"/loras/{d.int(0, 9)}"))
    items, pos = [], d.int(0, bs + 1)
    # sorted by offset, disjoint; identifiers in another order
    for k in d.count(0, 5, 0.5):
        length = d.int(1, bs + 2)
        items.append(m.MMItem(f"{d.pick('qbxma')}-image{k}", pos, length))
        pos += length + d.int(0, bs)
    if items:
        kwargs["mm_items"] = tuple(items)
    salt = d.pick((None, "", "tenant-a", "tenant-b"))
    if salt is not None:
        kwargs["cache_salt"] = salt
    ids = [d.big(0, INT31) for _ in range(n)]  # drawn last: shrinking keeps the rest
    d.given(
        token_ids=ids,
        block_size=bs,
        **{k: (list(v) if k == "mm_items" else v) for k, v in kwargs.items()},
    )
    args = ", ".join([repr(ids), str(bs)] + [f"{k}={v!r}" for k, v in kwargs.items()])
    d.code(f"print(ex.request_block_hashes({args.replace('MMItem(', 'ex.MMItem(')}))")
    got = d.call("request_block_hashes", m.request_block_hashes, ids, bs, **kwargs)
    request = SimpleNamespace(
        block_hashes=[],
        num_tokens=n,
        all_token_ids=ids,
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

    check(random_case, trials=150, name="ch06_block_hash")
