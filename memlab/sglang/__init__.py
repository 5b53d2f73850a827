"""What mirrors SGLang 0.5.23: the memory books of ``sglang/srt/mem_cache``, one module per layer.

In teaching order: ``req_to_token`` (01), ``kv_pool`` (02), ``allocator`` (03-05),
``allocation`` (04-05), ``swa``, ``mamba``, ``write_loc`` (07), ``radix_cache``,
``hicache``, ``page_copy`` (11), ``unified`` (12). Import the modules themselves (``from
memlab.sglang.allocator import ...``)."""
