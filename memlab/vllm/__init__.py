"""vLLM v1's half of the books: block pool and prefix cache (scheduler side), block table and
slot_mapping (worker side), a side-by-side with SGLang's allocators, and a trace replay.

Modules, in the order chapter 06 teaches them:
    block_pool        KVCacheBlock, FreeKVCacheBlockQueue, BlockPool
    hashing           chained block hashes (vLLM 0.33's sha256 digests, a fast option), extra keys
    request           the slice of a request the books read
    kv_cache_manager  KVCacheManager, SlidingWindowKVCacheManager
    block_table       BlockTable, slot_mapping and store_kv (kernel + torch + Python references)
    kv_layout         the cache vLLM 0.33 stores into: logical [layer, block, head, token, content]
    compare           the same request stream through SGLang's allocators and the block pool
    replay            Mooncake traces through the prefix cache: hit rate against capacity
"""

from memlab.vllm.block_pool import BlockHashToBlockMap, BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from memlab.vllm.hashing import (NONE_HASH_SEED, MultiModalFeature, fast_hash, get_request_block_hasher,
                                 hash_block_tokens, init_none_hash, sha256)
from memlab.vllm.kv_cache_manager import KVCacheManager, SlidingWindowKVCacheManager
from memlab.vllm.request import Request

__all__ = [
    "BlockHashToBlockMap", "BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock",
    "NONE_HASH_SEED", "MultiModalFeature", "fast_hash", "get_request_block_hasher", "hash_block_tokens",
    "init_none_hash", "sha256", "KVCacheManager", "SlidingWindowKVCacheManager", "Request",
]
