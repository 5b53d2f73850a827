"""What mirrors vLLM 0.33 (``vllm/v1``): the block pool and prefix cache (scheduler side), the block
table and slot_mapping (worker side).

Modules, in the order chapter 06 teaches them:
    block_pool        KVCacheBlock, FreeKVCacheBlockQueue, BlockPool
    hashing           chained block hashes (vLLM 0.33's sha256 digests, a fast option), extra keys
    request           the slice of a request the books read
    kv_cache_manager  KVCacheManager over a coordinator and a FullAttentionManager or
                      SlidingWindowManager
    block_table       BlockTable, slot_mapping and store_kv (kernel + torch + Python references)
    kv_layout         the cache vLLM 0.33 stores into: logical [layer, block, head, token, content]

Chapter 06's drivers: memlab.vllm.trace_replay runs a trace through these books;
memlab.course.compare runs one stream through both engines' books, side by side.
"""

from memlab.vllm.block_pool import (
    BlockHashToBlockMap,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
)
from memlab.vllm.hashing import (
    NONE_HASH_SEED,
    MultiModalFeature,
    fast_hash,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    sha256,
)
from memlab.vllm.kv_cache_manager import (
    FullAttentionManager,
    KVCacheManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    UnitaryKVCacheCoordinator,
)
from memlab.vllm.request import Request

__all__ = [
    "BlockHashToBlockMap",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "NONE_HASH_SEED",
    "MultiModalFeature",
    "fast_hash",
    "get_request_block_hasher",
    "hash_block_tokens",
    "init_none_hash",
    "sha256",
    "KVCacheManager",
    "UnitaryKVCacheCoordinator",
    "SingleTypeKVCacheManager",
    "FullAttentionManager",
    "SlidingWindowManager",
    "Request",
]
