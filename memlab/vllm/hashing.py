"""Block hashing for the prefix cache (vLLM keeps this in vllm/v1/core/kv_cache_utils.py, its
hash functions in vllm/utils/hashing.py).

A full block's hash is hash(parent hash, the block's token ids, extra keys). The parent chain
makes one hash stand for the whole prefix up to that block, so a lookup only ever compares one
key per block. Only FULL blocks are hashed: a partial block's content is still changing.

Two hash functions:
- ``sha256`` (vLLM's default, ``prefix_caching_hash_algo="sha256"``): SHA-256 of the pickled
  key. memlab's hashes are vLLM 0.33's, byte for byte: same serialisation, same first parent,
  same extra keys (``./course engines`` checks them against the wheel's own functions).
- ``fast_hash`` (memlab only): CPython's built-in tuple hash over ints (strings are first folded
  to ints by a stable digest), 64 bits and non-cryptographic: fast, reproducible across
  processes, but a collision (two prefixes sharing KV) is possible in principle. vLLM's fast
  options are xxHash-based instead.

The first block's parent is ``NONE_HASH = hash_fn("vllm-none-hash")``. vLLM 0.33 uses that fixed
seed with sha256 (so processes and nodes compute the same hashes and can share cached KV), takes
PYTHONHASHSEED instead when it is set, and a random seed for its non-cryptographic hashes (a
predictable seed would let an attacker precompute collisions). memlab always uses the fixed seed.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from memlab.common import _checks

MAX_BLOCKS = 2**31 - 1  # as memlab.vllm.block_pool (which imports this module)

BlockHash = bytes | int
HashFn = Callable[[Any], BlockHash]

NONE_HASH_SEED = "vllm-none-hash"


def sha256(obj: Any) -> bytes:
    """SHA-256 of the pickled object (vLLM's ``sha256``). Block keys are ints, strings, bytes,
    None and tuples of them, whose pickled bytes are the same in every process. Pickle writes an
    object it has already written as a back-reference, so a key holding one string object twice
    hashes unlike one holding two equal copies; vLLM's hash does the same."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(
            f"sha256 pickles its key, and {type(obj).__name__}: {exc}"
        ) from None
    return hashlib.sha256(data).digest()


@lru_cache(maxsize=4096)
def _stable_int(value: str | bytes) -> int:
    # str hashing is salted per process; fold it to an int once, stably, and cache it.
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return int.from_bytes(
        hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True
    )


def _to_ints(obj: Any) -> Any:
    if isinstance(obj, bool):
        return (2, int(obj))  # keep True apart from 1
    if isinstance(obj, int):
        return obj
    if isinstance(obj, (str, bytes)):
        return (1, _stable_int(obj))
    if obj is None:
        return ()  # hash(None) is per-process before Python 3.12
    if isinstance(obj, (tuple, list)):
        return tuple(_to_ints(x) for x in obj)
    raise TypeError(
        f"cannot hash a {type(obj).__name__} ({obj!r}): block hash keys are made "
        "of ints, strings, bytes, None and tuples of them"
    )


def fast_hash(obj: Any) -> int:
    """Built-in hash over ints only (stable across processes); obj made of ints, strings, bytes,
    None and tuples of them. memlab's own: vLLM 0.33 has no built-in-hash option."""
    if (
        type(obj) is tuple
        and len(obj) == 3
        and type(obj[1]) is tuple
        and obj[2] is None
    ):
        return hash((_to_ints(obj[0]), obj[1], ()))  # the common block: no extra keys
    return hash(_to_ints(obj))


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256, "fast": fast_hash}


def get_hash_fn_by_name(name: str) -> HashFn:
    if name not in HASH_FUNCTIONS:
        raise ValueError(
            f"unknown block hash function {name!r}; choose one of {sorted(HASH_FUNCTIONS)}"
        )
    return HASH_FUNCTIONS[name]


def init_none_hash(hash_fn: HashFn, seed: str = NONE_HASH_SEED) -> BlockHash:
    """The parent of every request's first block: the hash of the seed string itself."""
    _checks.function("hash_fn", hash_fn)
    _checks.instance("seed", seed, str)
    return hash_fn(seed)


# ---- one block -------------------------------------------------------------------------------


def hash_block_tokens(
    hash_fn: HashFn,
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple | None = None,
) -> BlockHash:
    """hash(parent, token ids, extra keys); a None parent means this is a request's first block."""
    _checks.function("hash_fn", hash_fn)
    _checks.instance("extra_keys", extra_keys, (tuple, type(None)), "a tuple or None")
    token_ids = tuple(
        _checks.int_list("curr_block_token_ids (token ids)", curr_block_token_ids)
    )
    if parent_block_hash is None:
        parent_block_hash = init_none_hash(hash_fn)
    return hash_fn((parent_block_hash, token_ids, extra_keys))


# ---- extra keys: what besides the token ids decides a block's KV ------------------------------


class MultiModalFeature(NamedTuple):
    """One multimodal item: its content hash and the token range of its placeholder."""

    identifier: str
    offset: int
    length: int


def _validate_mm_features(mm_features, num_tokens: int) -> list[MultiModalFeature]:
    """Items as (identifier, offset, length): sorted, disjoint, inside the prompt."""
    _checks.instance("mm_features", mm_features, (list, tuple))
    for f in mm_features:
        _checks.instance("an mm_features item", f, (tuple, list))
        if len(f) != 3 or not isinstance(f[0], str):
            raise TypeError(f"an mm item is (identifier: str, offset, length), got {f}")
        _checks.int_list("an mm item's (offset, length)", f[1:])
    items = [MultiModalFeature(*f) for f in mm_features]
    ends = [0] + [f.offset + f.length for f in items]
    if (
        any(f.offset < end or f.length <= 0 for f, end in zip(items, ends))
        or ends[-1] > num_tokens
    ):
        raise ValueError(
            f"mm items unsorted, overlapping or outside the prompt: {items}"
        )
    return items


def _gen_mm_extra_hash_keys(
    mm_features: Sequence[MultiModalFeature], start: int, end: int, start_mm_idx: int
) -> tuple[list, int]:
    """("mm", identifier, item offset - start) for each item overlapping the block [start, end),
    and the index of the first item a later block can still overlap (items are sorted by
    offset and disjoint). The offset tells WHERE in the block the item sits: placeholder tokens
    alone are identical for every image."""
    keys = []
    idx = start_mm_idx
    while idx < len(mm_features):
        item = mm_features[idx]
        if item.offset >= end:  # not reached yet, nor any later item
            break
        if item.offset + item.length <= start:  # behind this block
            idx += 1
            continue
        keys.append(("mm", item.identifier, item.offset - start))
        # runs on into the next block: start there next time
        if item.offset + item.length > end:
            break
        idx += 1  # ends inside this block; the next item may start in it too
    return keys, idx


def generate_block_hash_extra_keys(
    request, start_token_idx: int, end_token_idx: int, start_mm_idx: int = 0
) -> tuple[tuple | None, int]:
    """Extra keys of the block [start_token_idx, end_token_idx), in vLLM 0.33's order: the LoRA
    adapter (``("lora", name, path)``, every block: a name re-pointed at another adapter must
    not reuse KV), the overlapping multimodal items, and the cache salt
    (``("cache_salt", salt)``, first block only: through the chain it changes every later hash
    too). vLLM adds a digest of prompt embeddings for requests given as embeddings; memlab's
    requests are token ids only. Returns (keys or None, next mm index)."""
    lora_keys = (
        [("lora", request.lora_name, request.lora_path)]
        if request.lora_name is not None
        else []
    )
    mm_keys, next_mm_idx = _gen_mm_extra_hash_keys(
        request.mm_features, start_token_idx, end_token_idx, start_mm_idx
    )
    salt_keys = (
        [("cache_salt", request.cache_salt)]
        if start_token_idx == 0 and request.cache_salt
        else []
    )
    keys = lora_keys + mm_keys + salt_keys
    return (tuple(keys) if keys else None), next_mm_idx


# ---- a request's chain, grown incrementally ---------------------------------------------------


def get_request_block_hasher(
    block_size: int, hash_fn: HashFn
) -> Callable[[Any], list[BlockHash]]:
    """A function request -> the hashes of its blocks that became full since the last call.

    Incremental: it starts after ``len(request.block_hashes)`` blocks, so a request growing by
    one token per decode step hashes each block once, when it fills.
    """
    _checks.integer("block_size", block_size, 1, MAX_BLOCKS)
    _checks.function("hash_fn", hash_fn)
    none_hash = init_none_hash(hash_fn)

    def request_block_hasher(request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else none_hash
        token_ids = request.all_token_ids
        need_extra = (
            request.lora_name is not None
            or bool(request.mm_features)
            or bool(request.cache_salt)
        )
        mm_idx = 0
        new_hashes = []
        while start + block_size <= num_tokens:  # full blocks only
            end = start + block_size
            extra = None
            if need_extra:
                extra, mm_idx = generate_block_hash_extra_keys(
                    request, start, end, mm_idx
                )
            parent = hash_fn((parent, tuple(token_ids[start:end]), extra))
            new_hashes.append(parent)
            start = end
        return new_hashes

    return request_block_hasher


def hash_request_tokens(
    hash_fn: HashFn,
    block_size: int,
    token_ids: Sequence[int],
    extra_keys: Sequence[tuple | None] | None = None,
) -> list[BlockHash]:
    """All full-block hashes of a token list in one go (a reference for the incremental hasher)."""
    hashes: list[BlockHash] = []
    parent = None
    for i in range(len(token_ids) // block_size):
        extra = extra_keys[i] if extra_keys is not None else None
        parent = hash_block_tokens(
            hash_fn, parent, token_ids[i * block_size : (i + 1) * block_size], extra
        )
        hashes.append(parent)
    return hashes
