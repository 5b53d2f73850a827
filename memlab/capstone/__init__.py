"""The capstone, built on both engines' books: the tiny model (``tiny_llama``), its checkpoints
(``checkpoint``), the engine that serves it (``engine``) and the workload simulator (``sim``),
chapter 10; the radix tree against block hashes on one stream (``prefix_compare``), chapter 11;
cache-aware scheduling against first come first served on a real trace (``schedule_compare``),
chapter 12. Chapter 06's drivers moved: ``memlab.course.compare`` (both engines side by side) and
``memlab.vllm.trace_replay`` (a real trace through vLLM's prefix cache); ``compare`` and
``trace_replay`` here are aliases that say so.
"""
