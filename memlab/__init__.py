"""memlab: the KV-cache memory books of LLM serving engines, in the shape of the engines' own code.

The tree says what each part is; within a part, the layers come in teaching order (the chapter
that teaches each is in brackets).

- ``memlab.sglang``: what mirrors SGLang 0.5.23 (``sglang/srt/mem_cache``): ``req_to_token`` (01),
  ``kv_pool`` (02), ``allocator`` (03-05), ``allocation`` (04-05), ``swa``, ``mamba``,
  ``write_loc`` (07), ``radix_cache``, ``hicache``, ``page_copy`` (11).
- ``memlab.vllm``: what mirrors vLLM 0.33 (``vllm/v1``): ``block_pool``, ``hashing``, ``request``,
  ``kv_cache_manager``, ``block_table``, ``kv_layout`` (06-07).
- ``memlab.common``: what both engines share: ``utils``, ``env`` (device policy), ``models`` (02),
  ``sizing`` (08), ``attention`` (09); and ``memlab.kernels``, the Triton kernels.
- ``memlab.capstone``: the capstone built on both: ``compare`` and ``trace_replay`` (06),
  ``tiny_llama``, ``engine``, ``checkpoint``, ``sim`` (10), ``prefix_compare`` (11).
- ``memlab.course``: the course's machinery, apart from what a learner studies: ``notebook``,
  ``viz``, ``grading`` (with ``memlab.grade``, the command learners type), ``doctor``, ``home``,
  ``chat`` (chapter 10's real model, downloaded when the runtime can).

Importing memlab never imports Triton; kernels load lazily from memlab.kernels.
"""

__version__ = "0.1.0"
