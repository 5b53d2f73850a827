"""Moved to ``memlab.sglang.sizing``: pool sizing mirrors SGLang's ``kv_cache_configurator.py``
and ``allocation_sizing.py``, so it lives with the SGLang side."""

raise ImportError(
    "memlab.common.sizing moved to memlab.sglang.sizing: "
    "from memlab.sglang import sizing (the same names)"
)
