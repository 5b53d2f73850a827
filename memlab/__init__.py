"""memlab: the KV-cache memory books of LLM serving engines, one module per layer.

Teaching order: req_to_token (request -> row), kv_pool (slot -> bytes), allocator
(logical token -> slot), vllm (block pool, prefix cache), hybrid (SWA, Mamba), sizing.
Importing memlab never imports Triton; kernels load lazily from memlab.kernels.
"""

__version__ = "0.1.0"
