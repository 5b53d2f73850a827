"""Block hashing for the prefix cache (vLLM keeps this in vllm/v1/core/kv_cache_utils.py).

A full block's hash is hash(parent hash, the block's token ids, extra keys). The parent chain
makes one hash stand for the whole prefix up to that block, so a lookup only ever compares one
key per block. Only FULL blocks are hashed: a partial block's content is still changing.

Two hash functions:
- ``sha256`` (default): SHA-256 over a stable byte serialisation; collisions are out of reach
  and the digest is the same in every process and on every machine.
- ``fast_hash``: CPython's built-in tuple hash over ints (strings are first folded to ints by
  a stable digest), 64 bits and non-cryptographic: fast, reproducible across processes, but
  a collision (two prefixes sharing KV) is possible in principle.

The first block's parent is ``NONE_HASH``, derived from a FIXED seed so results reproduce
(vLLM seeds it from PYTHONHASHSEED, or randomly when that is unset).
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Sequence

BlockHash = bytes | int
HashFn = Callable[[Any], BlockHash]

NONE_HASH_SEED = "memlab"


# ---- a stable serialisation: type tag + length + payload, the same bytes everywhere ----------

def _encode(obj: Any, out: list[bytes]) -> None:
    if isinstance(obj, bool):  # before int: True must not serialise like 1
        out.append(b"?1" if obj else b"?0")
    elif isinstance(obj, int):
        raw = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
        out.append(b"i" + struct.pack("<I", len(raw)) + raw)
    elif isinstance(obj, (bytes, bytearray)):
        out.append(b"b" + struct.pack("<I", len(obj)) + bytes(obj))
    elif isinstance(obj, str):
        raw = obj.encode("utf-8")
        out.append(b"s" + struct.pack("<I", len(raw)) + raw)
    elif obj is None:
        out.append(b"n")
    elif isinstance(obj, (tuple, list)):
        # Fast path, a block's token ids: all plain ints (not bool, which array() would pack
        # as 0/1), packed in one C call.
        packed = None
        if set(map(type, obj)) <= {int}:
            try:
                packed = array("q", obj)
            except OverflowError:  # an int beyond 64 bits: the slow path encodes any size
                pass
        if packed is not None:
            out.append(b"q" + struct.pack("<I", len(obj)) + packed.tobytes())
        else:
            out.append(b"t" + struct.pack("<I", len(obj)))
            for item in obj:
                _encode(item, out)
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__} ({obj!r}): block hash keys are made "
                        "of ints, strings, bytes, None and tuples of them")


def serialize(obj: Any) -> bytes:
    """Stable bytes for ints, bools, str, bytes, None and (nested) tuples/lists of them."""
    out: list[bytes] = []
    _encode(obj, out)
    return b"".join(out)


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(serialize(obj)).digest()


@lru_cache(maxsize=4096)
def _stable_int(value: str | bytes) -> int:
    # str hashing is salted per process; fold it to an int once, stably, and cache it.
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)


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
    raise TypeError(f"cannot hash a {type(obj).__name__} ({obj!r}): block hash keys are made "
                    "of ints, strings, bytes, None and tuples of them")


def fast_hash(obj: Any) -> int:
    """Built-in hash over ints only (stable across processes); obj as for ``sha256``."""
    if type(obj) is tuple and len(obj) == 3 and type(obj[1]) is tuple and obj[2] is None:
        return hash((_to_ints(obj[0]), obj[1], ()))  # the common block: no extra keys
    return hash(_to_ints(obj))


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256, "fast": fast_hash}


def get_hash_fn_by_name(name: str) -> HashFn:
    if name not in HASH_FUNCTIONS:
        raise ValueError(f"unknown block hash function {name!r}; choose one of {sorted(HASH_FUNCTIONS)}")
    return HASH_FUNCTIONS[name]


def init_none_hash(hash_fn: HashFn, seed: str = NONE_HASH_SEED) -> BlockHash:
    """The parent of every request's first block."""
    return hash_fn(("none_hash", seed))


# ---- one block -------------------------------------------------------------------------------

def hash_block_tokens(hash_fn: HashFn, parent_block_hash: BlockHash | None,
                      curr_block_token_ids: Sequence[int], extra_keys: tuple | None = None) -> BlockHash:
    """hash(parent, token ids, extra keys); a None parent means this is a request's first block."""
    if parent_block_hash is None:
        parent_block_hash = init_none_hash(hash_fn)
    return hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


# ---- extra keys: what besides the token ids decides a block's KV ------------------------------

class MultiModalFeature(NamedTuple):
    """One multimodal item: its content hash and the token range of its placeholder."""

    identifier: str
    offset: int
    length: int


def _mm_extra_keys(mm_features: Sequence[MultiModalFeature], start: int, end: int,
                   start_mm_idx: int) -> tuple[list, int]:
    """Items overlapping [start, end): (identifier, item offset - start) each, and the index of
    the first item that may still overlap a later block (items are sorted by offset).

    Earlier vLLM v1 releases appended only the identifier; memlab adds the item's offset in the
    block (as its issue asked), and so does recent vLLM (``_gen_mm_extra_hash_keys``). Hashes
    therefore match only vLLM versions that include the offset."""
    keys = []
    idx = start_mm_idx
    next_idx = start_mm_idx
    while idx < len(mm_features):
        item = mm_features[idx]
        if item.offset >= end:
            break
        item_end = item.offset + item.length
        if item_end > start:
            # The offset tells WHERE in the block the item sits; placeholder tokens alone are
            # identical for every image.
            keys.append((item.identifier, item.offset - start))
        if item_end <= end and next_idx == idx:
            next_idx = idx + 1  # done with it: no later block overlaps it
        idx += 1
    return keys, next_idx


def generate_block_hash_extra_keys(request, start_token_idx: int, end_token_idx: int,
                                   start_mm_idx: int = 0) -> tuple[tuple | None, int]:
    """Extra keys of the block [start_token_idx, end_token_idx): LoRA adapter identity,
    overlapping multimodal items with their offsets, and the cache salt (first block only, which
    through the chain changes every later hash too). Returns (keys or None, next mm index)."""
    keys: list = []
    if request.lora_name is not None:
        keys.append(("lora", request.lora_name))
    next_mm_idx = start_mm_idx
    if request.mm_features:
        mm_keys, next_mm_idx = _mm_extra_keys(request.mm_features, start_token_idx, end_token_idx, start_mm_idx)
        keys.extend(mm_keys)
    if start_token_idx == 0 and request.cache_salt:
        keys.append(("salt", request.cache_salt))
    return (tuple(keys) if keys else None), next_mm_idx


# ---- a request's chain, grown incrementally ---------------------------------------------------

def get_request_block_hasher(block_size: int, hash_fn: HashFn) -> Callable[[Any], list[BlockHash]]:
    """A function request -> the hashes of its blocks that became full since the last call.

    Incremental: it starts after ``len(request.block_hashes)`` blocks, so a request growing by
    one token per decode step hashes each block once, when it fills.
    """
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    none_hash = init_none_hash(hash_fn)

    def request_block_hasher(request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else none_hash
        token_ids = request.all_token_ids
        need_extra = request.lora_name is not None or bool(request.mm_features) or bool(request.cache_salt)
        mm_idx = 0
        new_hashes = []
        while start + block_size <= num_tokens:  # full blocks only
            end = start + block_size
            extra = None
            if need_extra:
                extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            parent = hash_fn((parent, tuple(token_ids[start:end]), extra))
            new_hashes.append(parent)
            start = end
        return new_hashes

    return request_block_hasher


def hash_request_tokens(hash_fn: HashFn, block_size: int, token_ids: Sequence[int],
                        extra_keys: Sequence[tuple | None] | None = None) -> list[BlockHash]:
    """All full-block hashes of a token list in one go (a reference for the incremental hasher)."""
    hashes: list[BlockHash] = []
    parent = None
    for i in range(len(token_ids) // block_size):
        extra = extra_keys[i] if extra_keys is not None else None
        parent = hash_block_tokens(hash_fn, parent, token_ids[i * block_size:(i + 1) * block_size], extra)
        hashes.append(parent)
    return hashes
