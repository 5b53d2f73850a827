"""Chapter 06 exercise: chained block hashes for vLLM's prefix cache.

Write ``request_block_hashes``. Grade with ``./course grade 06``.
"""

import hashlib
import pickle
from typing import NamedTuple


def hash_fn(obj) -> bytes:
    """Given: vLLM 0.33's ``sha256``, SHA-256 of the object pickled with the highest protocol."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


# the parent of every request's first block (vLLM's fixed seed)
NONE_HASH = hash_fn("vllm-none-hash")


class MMItem(NamedTuple):
    """One multimodal item: its content hash and the token positions [offset, offset + length)."""

    identifier: str
    offset: int
    length: int


def request_block_hashes(
    token_ids: list[int],
    block_size: int,
    lora_name: str | None = None,
    lora_path: str | None = None,
    mm_items: tuple = (),
    cache_salt: str | None = None,
) -> list[bytes]:
    """The hash of each FULL block of a request, first block first.

    Block i covers tokens ``[i * block_size, (i + 1) * block_size)``; a last partial block gets no
    hash (its content is still growing). Its hash is
    ``hash_fn((parent, tuple(block token ids), extra_keys))`` where ``parent`` is block i-1's
    hash (``NONE_HASH`` for block 0), so one hash stands for the whole prefix. ``extra_keys`` is a
    tuple of, in this order:

    - ``("lora", lora_name, lora_path)`` on every block when ``lora_name`` is not None;
    - ``("mm", item.identifier, item.offset - block_start)`` for each item of ``mm_items`` that
      overlaps the block's tokens, in the order of ``mm_items`` (which comes sorted by offset;
      keep that order, never sort the items by identifier);
    - ``("cache_salt", cache_salt)`` on block 0 only, last (after the items), when ``cache_salt``
      is a non-empty string (vLLM tests its truth: ``""`` is no salt): through the chain it
      changes every later hash too;
    and ``None`` instead of an empty tuple. ``token_ids`` and ``mm_items`` are only read.
    See chapter 06 (block hashes).
    """
    raise NotImplementedError
