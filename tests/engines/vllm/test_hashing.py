"""memlab's block hashes against vLLM 0.33's own functions: equal, byte for byte.

The first block's parent (NONE_HASH), the sha256 serialisation, the extra keys (LoRA name and
path, multimodal items with their offsets, the cache salt on the first block) and whole
requests' chains, built at once and grown token by token.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from memlab.vllm.hashing import (
    MultiModalFeature,
    generate_block_hash_extra_keys,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    sha256,
)
from memlab.vllm.request import Request
from memlab_tests.tools.engines.vllm_loader import EngineRequest, load

REQUESTS = 300


@pytest.fixture
def V(monkeypatch):
    V = load()
    # vLLM then seeds sha256 with its fixed string
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    V.kv_cache_utils.init_none_hash(V.hashing.sha256)
    return V


def engine_request(tokens, block_hasher=None, lora=None, mm=(), salt=None):
    return EngineRequest(
        "r",
        tokens,
        block_hasher,
        lora_request=None
        if lora is None
        else SimpleNamespace(lora_name=lora[0], lora_path=lora[1]),
        mm_features=[
            SimpleNamespace(
                identifier=i, mm_position=SimpleNamespace(offset=o, length=n)
            )
            for i, o, n in mm
        ],
        cache_salt=salt,
    )


def random_request(rng: random.Random):
    n = rng.randint(1, 70)
    tokens = [rng.randrange(50_000) for _ in range(n)]
    lora = (
        (f"adapter-{rng.randint(0, 2)}", f"/loras/{rng.randint(0, 2)}")
        if rng.random() < 0.3
        else None
    )
    mm, pos = [], rng.randint(0, 6)
    while rng.random() < 0.5 and pos < n:
        length = rng.randint(1, min(12, n - pos))
        mm.append((f"img-{rng.randint(0, 3)}", pos, length))
        pos += length + rng.randint(0, 8)
    salt = rng.choice([None, None, "", "tenant-a"])
    return tokens, lora, mm, salt


def test_first_parent_and_serialisation_match_vllm(V):
    assert init_none_hash(sha256) == V.kv_cache_utils.NONE_HASH
    for key in (
        ("a", 1),
        (b"x" * 32, (1, 2, 3), None),
        (b"p", (7,), (("lora", "n", "/p"), ("cache_salt", "s"))),
    ):
        assert sha256(key) == V.hashing.sha256(key)
    assert hash_block_tokens(
        sha256, None, [1, 2, 3, 4]
    ) == V.kv_cache_utils.hash_block_tokens(V.hashing.sha256, None, [1, 2, 3, 4])


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_extra_keys_and_chains_match_vllm(V, block_size):
    rng = random.Random(block_size)
    engine_hasher = V.kv_cache_utils.get_request_block_hasher(
        block_size, V.hashing.sha256
    )
    ours_hasher = get_request_block_hasher(block_size, sha256)
    for _ in range(REQUESTS):
        tokens, lora, mm, salt = random_request(rng)
        kw = dict(
            lora_name=lora and lora[0],
            lora_path=lora and lora[1],
            mm_features=[MultiModalFeature(*f) for f in mm],
            cache_salt=salt,
        )
        ours = Request("r", tokens, block_hasher=ours_hasher, **kw)
        theirs = engine_request(tokens, engine_hasher, lora, mm, salt)
        for start in range(0, len(tokens) - block_size + 1, block_size):
            keys = generate_block_hash_extra_keys(ours, start, start + block_size)[0]
            want = V.kv_cache_utils.generate_block_hash_extra_keys(
                theirs, start, start + block_size, 0
            )[0]
            assert keys == want, (tokens, lora, mm, salt, start)
        assert ours.block_hashes == theirs.block_hashes, (tokens, lora, mm, salt)


def test_growing_requests_match_vllm(V):
    """Decode appends a few tokens at a time; each block is hashed once, when it fills.
    (Requests with multimodal items are hashed from scratch above: vLLM's growth path looks
    items up with a helper that is a stub here.)"""
    rng = random.Random(1)
    engine_hasher = V.kv_cache_utils.get_request_block_hasher(4, V.hashing.sha256)
    ours_hasher = get_request_block_hasher(4, sha256)
    for _ in range(REQUESTS):
        tokens, lora, _, salt = random_request(rng)
        ours = Request(
            "r",
            tokens[:1],
            block_hasher=ours_hasher,
            lora_name=lora and lora[0],
            lora_path=lora and lora[1],
            cache_salt=salt,
        )
        theirs = engine_request(tokens[:1], engine_hasher, lora, (), salt)
        i = 1
        while i < len(tokens):
            step = tokens[i : i + rng.randint(1, 6)]
            ours.append_output_token_ids(step)
            theirs.append_output_token_ids(step)
            i += len(step)
            assert ours.block_hashes == theirs.block_hashes
