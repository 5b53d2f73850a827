"""The capstone, built on both engines' books: one request stream through SGLang's allocators and
vLLM's block pool (``compare``) and a real trace through vLLM's prefix cache (``trace_replay``),
chapter 06; the tiny model (``tiny_llama``), its checkpoints (``checkpoint``), the engine that
serves it (``engine``) and the workload simulator (``sim``),
chapter 10; the radix tree against block hashes on one stream (``prefix_compare``), chapter 11.
"""
