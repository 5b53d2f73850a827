"""Block hashing: chained, full blocks only, incremental, extra keys, reproducible."""

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.vllm.hashing import (
    MultiModalFeature,
    fast_hash,
    generate_block_hash_extra_keys,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    hash_request_tokens,
    init_none_hash,
    sha256,
)
from memlab.vllm.request import Request

BS = 4
HASH_FNS = [sha256, fast_hash]


def hashes(tokens, hash_fn=sha256, **kw):
    return Request(
        "r", tokens, block_hasher=get_request_block_hasher(BS, hash_fn), **kw
    ).block_hashes


@pytest.mark.parametrize("hash_fn", HASH_FNS)
def test_only_full_blocks_are_hashed(hash_fn):
    assert len(hashes(list(range(11)), hash_fn)) == 2
    assert len(hashes(list(range(12)), hash_fn)) == 3
    assert hashes([1, 2, 3], hash_fn) == []


@pytest.mark.parametrize("hash_fn", HASH_FNS)
def test_the_chain_makes_each_hash_stand_for_the_whole_prefix(hash_fn):
    base = hashes(list(range(16)), hash_fn)
    early = hashes([99] + list(range(1, 16)), hash_fn)  # one token of block 0 differs
    # one token of block 2
    late = hashes(list(range(8)) + [99] + list(range(9, 16)), hash_fn)
    assert all(a != b for a, b in zip(base, early))
    assert late[:2] == base[:2] and all(a != b for a, b in zip(base[2:], late[2:]))
    # Same block content after a different prefix: different hash.
    assert hashes([7] * 8, hash_fn)[1] != hashes([8] * 4 + [7] * 4, hash_fn)[1]


@pytest.mark.parametrize("hash_fn", HASH_FNS)
def test_first_parent_is_a_fixed_seed(hash_fn):
    tokens = [5, 6, 7, 8]
    assert hashes(tokens, hash_fn)[0] == hash_block_tokens(hash_fn, None, tokens)
    assert hash_block_tokens(hash_fn, None, tokens) == hash_fn(
        (init_none_hash(hash_fn), tuple(tokens), None)
    )
    assert init_none_hash(hash_fn, "another seed") != init_none_hash(hash_fn)


def test_hashes_are_golden_values():
    # vLLM 0.33's digests (sha256 of the pickled key, first parent sha256("vllm-none-hash"));
    # tests/engines checks them against the wheel's own functions. A change in the
    # serialisation or the seed fails here without the wheel.
    assert (
        init_none_hash(sha256).hex()
        == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    )
    assert (
        hash_block_tokens(sha256, None, [1, 2, 3, 4]).hex()
        == "52a7f141c60918f65779927090482b5a24adbe68c8613a211a1eb4e3edd9361a"
    )
    assert hash_block_tokens(fast_hash, None, [1, 2, 3, 4]) == -8643900253965400307


def test_keys_keep_types_apart_and_fast_hash_refuses_others():
    assert sha256((1,)) != sha256((True,)) != sha256(("1",))
    assert sha256(("a", "bc")) != sha256(("ab", "c"))
    assert fast_hash((1, True)) != fast_hash((1, 1))
    with pytest.raises(TypeError, match="cannot hash a float"):
        fast_hash((1.5,))
    with pytest.raises(TypeError, match="cannot hash a set"):
        fast_hash(({1},))
    with pytest.raises(ValueError, match="unknown block hash function 'md5'"):
        get_hash_fn_by_name("md5")
    with pytest.raises(ValueError, match="block_size must be an int >= 1.*, got 0"):
        get_request_block_hasher(0, sha256)


def test_hashes_reproduce_in_another_process():
    code = (
        "from memlab.vllm.hashing import *; from memlab.vllm.request import Request;"
        "r = Request('r', list(range(12)), block_hasher=get_request_block_hasher(4, {fn}),"
        " lora_name='adapter', cache_salt='s');"
        "print([h.hex() if isinstance(h, bytes) else h for h in r.block_hashes])"
    )
    for fn in ("sha256", "fast_hash"):
        here = hashes(
            list(range(12)), globals()[fn], lora_name="adapter", cache_salt="s"
        )
        here = [h.hex() if isinstance(h, bytes) else h for h in here]
        env = dict(os.environ, PYTHONHASHSEED="12345")  # str hashing salted differently
        out = subprocess.run(
            [sys.executable, "-c", code.format(fn=fn)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.strip()
        assert out == str(here), fn


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 50_000), min_size=1, max_size=40),
    steps=st.lists(st.integers(1, 6), max_size=8),
    salt=st.sampled_from([None, "tenant-a"]),
    lora=st.sampled_from([None, "lora-1"]),
)
def test_incremental_hashing_equals_hashing_everything_at_once(
    tokens, steps, salt, lora
):
    """A request growing a few tokens at a time gets the same chain as one built in one go."""
    hasher = get_request_block_hasher(BS, sha256)
    grown = Request(
        "r", tokens[:1], block_hasher=hasher, cache_salt=salt, lora_name=lora
    )
    i = 1
    for step in steps:
        grown.append_output_token_ids(tokens[i : i + step])
        i += step
    grown.append_output_token_ids(tokens[i:])
    full = Request("r", tokens, block_hasher=hasher, cache_salt=salt, lora_name=lora)
    extra = [
        generate_block_hash_extra_keys(full, k * BS, (k + 1) * BS)[0]
        for k in range(len(tokens) // BS)
    ]
    assert (
        grown.block_hashes
        == full.block_hashes
        == hash_request_tokens(sha256, BS, tokens, extra)
    )


def buggy_partial_hasher(block_size, hash_fn):
    """Bug zoo: hashes the partial last block too (its content is still changing)."""

    def hasher(request):
        start = len(request.block_hashes) * block_size
        parent = (
            request.block_hashes[-1]
            if request.block_hashes
            else init_none_hash(hash_fn)
        )
        out = []
        while start < request.num_tokens:
            parent = hash_fn(
                (parent, tuple(request.all_token_ids[start : start + block_size]), None)
            )
            out.append(parent)
            start += block_size
        return out

    return hasher


@pytest.mark.parametrize(
    "make_hasher, ok", [(get_request_block_hasher, True), (buggy_partial_hasher, False)]
)
def test_growing_request_keeps_correct_hashes_and_buggy_partial_hashing_is_caught(
    make_hasher, ok
):
    hasher = make_hasher(BS, sha256)
    r = Request("r", [1, 2, 3, 4, 5, 6], block_hasher=hasher)
    r.append_output_token_ids([7, 8, 9])
    want = hash_request_tokens(sha256, BS, r.all_token_ids)
    assert (r.block_hashes == want) is ok


def test_salt_goes_on_the_first_block_only_and_so_changes_every_hash():
    r = Request("r", list(range(12)), cache_salt="tenant-a")
    assert generate_block_hash_extra_keys(r, 0, 4)[0] == (("cache_salt", "tenant-a"),)
    assert generate_block_hash_extra_keys(r, 4, 8)[0] is None
    plain, salted = (
        hashes(list(range(12))),
        hashes(list(range(12)), cache_salt="tenant-a"),
    )
    other = hashes(list(range(12)), cache_salt="tenant-b")
    assert all(p != s != o for p, s, o in zip(plain, salted, other))
    # Blocks after the first carry no salt themselves: they differ only through their parent.
    assert salted[1] == hash_block_tokens(sha256, salted[0], [4, 5, 6, 7])


def salt_on_every_block(request, start, end, start_mm_idx=0):
    """Bug zoo: the salt on every block. Tenants stay apart, but the key no longer matches
    vLLM's contract, and it hides the point: the chain alone carries the salt onwards."""
    keys, nxt = generate_block_hash_extra_keys(request, start, end, start_mm_idx)
    if start and request.cache_salt:
        keys = (keys or ()) + (("cache_salt", request.cache_salt),)
    return keys, nxt


@pytest.mark.parametrize(
    "extra_keys_fn, ok",
    [(generate_block_hash_extra_keys, True), (salt_on_every_block, False)],
)
def test_salt_check_catches_salt_on_every_block(extra_keys_fn, ok):
    r = Request("r", list(range(12)), cache_salt="tenant-a")
    later = [extra_keys_fn(r, k * BS, (k + 1) * BS)[0] for k in (1, 2)]
    assert (later == [None, None]) is ok


def test_lora_identity_separates_adapters():
    base = hashes(list(range(8)))
    a, a2, b = (
        hashes(list(range(8)), lora_name=n, lora_path="/p") for n in ("a", "a", "b")
    )
    # the name re-pointed at another adapter
    moved = hashes(list(range(8)), lora_name="a", lora_path="/q")
    assert a == a2 and len({base[0], a[0], b[0], moved[0]}) == 4
    r = Request("r", list(range(8)), lora_name="a", lora_path="/p")
    # every block, unlike salt
    assert generate_block_hash_extra_keys(r, 4, 8)[0] == (("lora", "a", "/p"),)


def test_multimodal_items_key_the_blocks_they_overlap_with_their_offset():
    # placeholder tokens are all alike; only the extra keys tell images apart
    tokens = [0] * 16
    img = MultiModalFeature("img-A", offset=2, length=7)  # tokens 2..8: blocks 0, 1, 2
    r = Request("r", tokens, mm_features=[img])
    keys = [
        generate_block_hash_extra_keys(r, k * BS, (k + 1) * BS)[0] for k in range(4)
    ]
    assert keys == [
        (("mm", "img-A", 2),),
        (("mm", "img-A", -2),),
        (("mm", "img-A", -6),),
        None,
    ]
    other = hashes(tokens, mm_features=[MultiModalFeature("img-B", 2, 7)])
    moved = hashes(tokens, mm_features=[MultiModalFeature("img-A", 3, 7)])
    same = hashes(tokens, mm_features=[img])
    assert (
        same
        == Request(
            "r",
            tokens,
            mm_features=[img],
            block_hasher=get_request_block_hasher(BS, sha256),
        ).block_hashes
    )
    assert all(x != y for x, y in zip(same, other)) and same[0] != moved[0]


def test_multimodal_index_advances_past_finished_items():
    items = [
        MultiModalFeature("a", 0, 2),
        MultiModalFeature("b", 3, 3),
        MultiModalFeature("c", 9, 1),
    ]
    r = Request("r", list(range(12)), mm_features=items)
    keys, nxt = generate_block_hash_extra_keys(r, 0, 4)
    # "b" runs into the next block
    assert keys == (("mm", "a", 0), ("mm", "b", 3)) and nxt == 1
    keys, nxt = generate_block_hash_extra_keys(r, 4, 8, nxt)
    assert keys == (("mm", "b", -1),) and nxt == 2
    keys, nxt = generate_block_hash_extra_keys(r, 8, 12, nxt)
    assert keys == (("mm", "c", 1),) and nxt == 3


def test_request_rejects_bad_inputs_by_value():
    with pytest.raises(ValueError, match="Neither prompt_token_ids nor prompt_embeds"):
        Request("r", None)
    with pytest.raises(ValueError, match=r"token ids\) must hold ints >= 0, got -1"):
        Request("r", [1, -1])
    with pytest.raises(
        ValueError, match="mm items unsorted, overlapping or outside the prompt"
    ):
        Request("r", list(range(10)), mm_features=[("a", 4, 3), ("b", 5, 1)])
    with pytest.raises(ValueError, match="outside the prompt"):
        Request("r", list(range(10)), mm_features=[("a", 8, 3)])
    with pytest.raises(TypeError, match="cache_salt must be a str"):
        Request("r", [1], cache_salt=5)


def test_request_accepts_an_empty_prompt_as_vllms_does():
    from memlab.vllm.hashing import get_request_block_hasher, sha256

    r = Request("r", [], block_hasher=get_request_block_hasher(2, sha256))
    assert (r.num_tokens, r.block_hashes) == (0, [])
    r.append_output_token_ids([5, 6, 7])
    # the first block filled: hashed now
    assert r.num_tokens == 3 and len(r.block_hashes) == 1
