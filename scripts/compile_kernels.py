"""Compile every kernel ahead of time for real GPUs (no GPU needed), printing one line per build.

The Triton interpreter runs kernels as NumPy code: it accepts things a GPU compile rejects (a
loop-carried value that changes type, an op sm_75 lacks). Compiling to cubin for a Colab T4
(sm_75) and a Hopper (sm_90) catches those here. Run without TRITON_INTERPRET.
Usage: python scripts/compile_kernels.py  (exit status 1 if any build fails)
"""

import importlib.util
import os
import pathlib
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
P64, I32 = "*i64", "i32"

# kernel file -> [(kernel name, signature, constexprs)]; add an entry with every new kernel.
BUILDS = {
    "canary.py": [("_axpb_kernel", dict(x_ptr=P64, y_ptr=P64, n=I32, a=I32, b=I32), dict(BLOCK=64))],
    "alloc_extend.py": [("alloc_extend_kernel", dict(prefix_lens_ptr=P64, seq_lens_ptr=P64, last_loc_ptr=P64,
                                                     free_pages_ptr=P64, out_ptr=P64, page_size=I32),
                         dict(BS_BLOCK=128, PAGE_BLOCK=pb, TOK_BLOCK=256)) for pb in (1, 16, 64)],
    "alloc_decode.py": [("alloc_decode_kernel", dict(seq_lens_ptr=P64, last_loc_ptr=P64, free_pages_ptr=P64,
                                                     out_ptr=P64, page_size=I32), dict(BS_BLOCK=128))],
    "slot_mapping.py": [("_slot_mapping_kernel", dict(block_table_ptr="*i32", block_table_stride=I32, num_rows=I32,
                                                      max_num_blocks=I32, req_indices_ptr="*i32", positions_ptr=P64,
                                                      slot_mapping_ptr=P64, num_tokens=I32, num_padded=I32,
                                                      block_size=I32), dict(BLOCK=128))],
    "store_kv.py": [("_store_kv_kernel", dict(key_ptr=dt, value_ptr=dt, key_cache_ptr=dt, value_cache_ptr=dt,
                                              slot_mapping_ptr=P64,
                                              **{n: I32 for n in ("k_stride_tok", "k_stride_head", "v_stride_tok",
                                                                  "v_stride_head", "kc_stride_blk", "kc_stride_slot",
                                                                  "kc_stride_head", "vc_stride_blk", "vc_stride_slot",
                                                                  "vc_stride_head", "num_slots", "block_size",
                                                                  "head_dim", "head_dim_v", "k_elems", "v_elems")}),
                     dict(BLOCK_K=1024, BLOCK_V=1024))
                    for dt in ("*fp16", "*fp32")],
    "paged_decode_attention.py": [
        ("_paged_decode_kernel", dict(q_ptr=dt, q_pe_ptr=dt, k_ptr=dt, v_ptr=dt, o_ptr=dt, table_ptr="*i32",
                                      req_pool_indices_ptr=P64, seq_lens_ptr="*i32", sm_scale="fp32",
                                      **{n: I32 for n in ("page_size", "kv_group_num", "d_main", "d_pe", "d_v",
                                                          "stride_qb", "stride_qh", "stride_qpb", "stride_qph",
                                                          "stride_ks", "stride_kh", "stride_vs", "stride_vh",
                                                          "stride_ob", "stride_oh", "stride_table")}),
         dict(USE_BLOCK_TABLE=bt, V_FROM_K=mla, BLOCK_N=16 if mla else 32, BLOCK_D=512 if mla else 128,
              BLOCK_DPE=64 if mla else 0, BLOCK_DV=512 if mla else 128))
        for dt in ("*fp16", "*fp32") for bt in (False, True) for mla in (False, True)],
    "page_copy.py": [("_page_copy_kernel", dict(src_ptr=dt, dst_ptr=dt, src_pages_ptr=P64, dst_pages_ptr=P64, src_num_pages=I32, dst_num_pages=I32, page_elems=I32), dict(BLOCK=1024)) for dt in ("*fp16", "*fp32", "*u8")],
}
CAPABILITIES = (75, 90)


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"aot_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    failed = 0
    for fname, builds in BUILDS.items():
        mod = load(ROOT / "kernels" / fname)
        for name, sig, constexprs in builds:
            for cap in CAPABILITIES:
                try:
                    src = ASTSource(fn=getattr(mod, name), signature=sig | {k: "constexpr" for k in constexprs},
                                    constexprs=constexprs)
                    n = len(triton.compile(src, target=GPUTarget("cuda", cap, 32)).asm["cubin"])
                    print(f"ok   {fname}:{name} {next(iter(sig.values()))} {constexprs} sm_{cap} ({n} bytes of cubin)")
                except Exception as exc:  # report every failure, not just the first
                    failed += 1
                    print(f"FAIL {fname}:{name} {constexprs} sm_{cap}: {type(exc).__name__}: {exc}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
