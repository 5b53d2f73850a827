"""SGLang 0.5.23's unified memory pool (``--enable-unified-memory``), chapter 12.

``pool``: the one byte buffer and its sub-pool specs and views
(``unified_memory_pool.py``); ``sub_pool``: ``MultiEndedAllocator``, each sub-pool grown
from its own end in virtual pages bound to physical ones
(``allocator/unified_sub_pool.py``); ``hybrid_swa``: full attention and sliding window
over one buffer with one virtual id (``allocator/unified_hybrid_swa.py``)."""

from memlab.sglang.unified.hybrid_swa import UnifiedSWATokenToKVPoolAllocator
from memlab.sglang.unified.pool import (
    MambaSubPoolSpec,
    MHASubPoolSpec,
    MLASubPoolSpec,
    SubPoolSpec,
    UnifiedKVPool,
    UnifiedMHATokenToKVPool,
    UnifiedSWAKVPool,
    reserved_floor_bytes,
)
from memlab.sglang.unified.sub_pool import MultiEndedAllocator, translate_token_ids

__all__ = [
    "MHASubPoolSpec",
    "MLASubPoolSpec",
    "MambaSubPoolSpec",
    "MultiEndedAllocator",
    "SubPoolSpec",
    "UnifiedKVPool",
    "UnifiedMHATokenToKVPool",
    "UnifiedSWAKVPool",
    "UnifiedSWATokenToKVPoolAllocator",
    "reserved_floor_bytes",
    "translate_token_ids",
]
