"""Compile every kernel ahead of time for real GPUs (no GPU needed), printing one line per build.

The Triton interpreter runs kernels as NumPy code: it accepts things a GPU compile
rejects (a loop-carried value that changes type, an op sm_75 lacks). Compiling to cubin
for a Colab T4 (sm_75) and a Hopper (sm_90) catches those here. ``variant`` says,
without a GPU, which compiled variant Triton's JIT would pick for a launch: the tests
use it to show that memlab's launches need no variant BUILDS lacks, and no second one
for a re-sliced free list. Usage: python tests/tools/compile_kernels.py  (exit status 1 if
any build fails; TRITON_INTERPRET is ignored)"""

import functools
import importlib.util
import os
import pathlib
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = pathlib.Path(__file__).resolve().parents[2]
P64, P32, I32 = "*i64", "*i32", "i32"
# The allocator kernels take the page size as a constexpr: one build per page size memlab uses
# (1: SGLang's default; 4: chapters 04, 05 and 10; 16: the engine; 64: SGLang's MLA backends) and
# one that is not a power of two (3: // and % become a multiply, not a shift).
PAGE_SIZES = (1, 3, 4, 16, 64)


def _extend(ps: int, lens: str = P64) -> tuple:
    """alloc_extend_kernel's (signature, constexprs) for one page size."""
    return (
        dict(
            prefix_lens_ptr=lens,
            seq_lens_ptr=lens,
            last_loc_ptr=lens,
            free_pages_ptr=P64,
            out_ptr=P64,
        ),
        dict(
            page_size=ps,
            BS_BLOCK=128,
            PAGE_BLOCK=triton.next_power_of_2(ps),
            TOK_BLOCK=256,
        ),
    )


def _decode(ps: int, last_loc: str = P64, seq_lens: str = P64) -> tuple:
    """alloc_decode_kernel's (signature, constexprs) for one page size."""
    return (
        dict(
            seq_lens_ptr=seq_lens,
            last_loc_ptr=last_loc,
            free_pages_ptr=P64,
            out_ptr=P64,
        ),
        dict(page_size=ps, BS_BLOCK=128),
    )


# kernel file -> [(kernel name, signature, constexprs)]; add an entry with every new kernel. The
# signatures are the dtypes the launches use: SGLang's and memlab's free lists and slots are int64,
# SGLang's lengths int64; SGLang's decode reads last_loc from req_to_token (int32), memlab's engine
# widens it first; memlab accepts int32 lengths too (one build shows the kernel takes them).
BUILDS = {
    "canary.py": [
        (
            "_axpb_kernel",
            dict(x_ptr=P64, y_ptr=P64, n=I32, a=I32, b=I32),
            dict(BLOCK=64),
        )
    ],
    "alloc_extend.py": [("alloc_extend_kernel", *_extend(ps)) for ps in PAGE_SIZES]
    + [("alloc_extend_kernel", *_extend(16, lens=P32))],
    "alloc_decode.py": [
        ("alloc_decode_kernel", *_decode(ps, last))
        for ps in PAGE_SIZES
        for last in (P64, P32)
    ]
    + [("alloc_decode_kernel", *_decode(16, P32, seq_lens=P32))],
    # vLLM's block table is int32, its positions and slots int64; memlab's
    # token-to-request index int32.
    "slot_mapping.py": [
        (
            "_slot_mapping_kernel",
            dict(
                block_table_ptr=P32,
                block_table_stride=I32,
                num_rows=I32,
                max_num_blocks=I32,
                req_indices_ptr=P32,
                positions_ptr=P64,
                slot_mapping_ptr=P64,
                num_tokens=I32,
                num_padded=I32,
                block_size=I32,
            ),
            dict(BLOCK=128),
        )
    ],
    "store_kv.py": [
        (
            "_store_kv_kernel",
            dict(
                key_ptr=dt,
                value_ptr=dt,
                key_cache_ptr=dt,
                value_cache_ptr=dt,
                slot_mapping_ptr=P64,
                **{
                    n: I32
                    for n in (
                        "k_stride_tok",
                        "k_stride_head",
                        "v_stride_tok",
                        "v_stride_head",
                        "kc_stride_blk",
                        "kc_stride_slot",
                        "kc_stride_head",
                        "vc_stride_blk",
                        "vc_stride_slot",
                        "vc_stride_head",
                        "num_slots",
                        "block_size",
                        "head_dim",
                        "head_dim_v",
                        "k_elems",
                        "v_elems",
                    )
                },
            ),
            dict(BLOCK_K=1024, BLOCK_V=1024),
        )
        for dt in ("*fp16", "*fp32")
    ],
    # req_to_token and block tables are int32, seq_lens int32; SGLang's spelling takes int64 row
    # indices, vLLM's passes seq_lens again where the block table needs no row (so int32).
    "paged_decode_attention.py": [
        (
            "_paged_decode_kernel",
            dict(
                q_ptr=dt,
                q_pe_ptr=dt,
                k_ptr=dt,
                v_ptr=dt,
                o_ptr=dt,
                table_ptr=P32,
                req_pool_indices_ptr=P32 if bt else P64,
                seq_lens_ptr=P32,
                sm_scale="fp32",
                **{
                    n: I32
                    for n in (
                        "page_size",
                        "kv_group_num",
                        "d_main",
                        "d_pe",
                        "d_v",
                        "stride_qb",
                        "stride_qh",
                        "stride_qpb",
                        "stride_qph",
                        "stride_ks",
                        "stride_kh",
                        "stride_vs",
                        "stride_vh",
                        "stride_ob",
                        "stride_oh",
                        "stride_table",
                    )
                },
            ),
            dict(
                USE_BLOCK_TABLE=bt,
                V_FROM_K=mla,
                BLOCK_N=16 if mla else 32,
                BLOCK_D=512 if mla else 128,
                BLOCK_DPE=64 if mla else 0,
                BLOCK_DV=512 if mla else 128,
            ),
        )
        for dt in ("*fp16", "*fp32")
        for bt in (False, True)
        for mla in (False, True)
    ],
    "page_copy.py": [
        (
            "_page_copy_kernel",
            dict(
                src_ptr=dt,
                dst_ptr=dt,
                src_pages_ptr=P64,
                dst_pages_ptr=P64,
                src_num_pages=I32,
                dst_num_pages=I32,
                page_elems=I32,
            ),
            dict(BLOCK=1024),
        )
        for dt in ("*fp16", "*fp32", "*u8")
    ],
}
CAPABILITIES = (75, 90)


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"aot_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def as_jit(kernel):
    """The kernel as Triton's JIT sees it, also under the interpreter (an InterpretedFunction keeps
    the Python function and its jit options, do_not_specialize among them)."""
    from triton.runtime.jit import JITFunction

    return (
        kernel
        if isinstance(kernel, JITFunction)
        else JITFunction(kernel.fn, **kernel.kwargs)
    )


def variant(kernel, *args, capability: int = 90, **kwargs) -> tuple:
    """The compiled variant a launch ``kernel[grid](*args, **kwargs)`` needs on a GPU of that
    compute capability: (name, signature, constexprs, specializations), computed the way the JIT
    keys its cache (a pointer's 16-byte alignment, an int's divisibility by 16 or being 1, each
    constexpr's value). Two launches with different tuples compile twice."""
    from triton.compiler import make_backend

    # the JIT's own binder
    from triton.runtime.jit import create_function_from_signature

    jit = as_jit(kernel)
    binder = create_function_from_signature(
        jit.signature, jit.params, make_backend(GPUTarget("cuda", capability, 32))
    )
    bound, spec, _ = binder(*args, **kwargs)
    names = [p.name for p in jit.params]
    sig = tuple((n, t) for n, (t, _) in zip(names, spec) if t != "constexpr")
    cx = tuple((n, bound[n]) for n, (t, _) in zip(names, spec) if t == "constexpr")
    return jit.fn.__name__, sig, cx, tuple(a for t, a in spec if t != "constexpr")


def built(v: tuple) -> bool:
    """Whether BUILDS compiles variant ``v``'s signature and constexprs (its specializations
    aside)."""
    name, sig, cx, _ = v
    return any(
        n == name and s == dict(sig) and c == dict(cx)
        for builds in BUILDS.values()
        for n, s, c in builds
    )


def main() -> int:
    # before the kernel files run: triton.jit reads it then
    os.environ.pop("TRITON_INTERPRET", None)
    failed = 0
    for fname, builds in BUILDS.items():
        mod = load(ROOT / "kernels" / fname)
        for name, sig, constexprs in builds:
            for cap in CAPABILITIES:
                try:
                    src = ASTSource(
                        fn=getattr(mod, name),
                        signature=sig | {k: "constexpr" for k in constexprs},
                        constexprs=constexprs,
                    )
                    n = len(
                        triton.compile(src, target=GPUTarget("cuda", cap, 32)).asm[
                            "cubin"
                        ]
                    )
                    ptrs = ",".join(t for t in sig.values() if t.startswith("*"))
                    print(
                        f"ok   {fname}:{name} {ptrs} {constexprs} sm_{cap} ({n} bytes of cubin)"
                    )
                except Exception as exc:  # report every failure, not just the first
                    failed += 1
                    print(
                        f"FAIL {fname}:{name} {constexprs} sm_{cap}: {type(exc).__name__}: {exc}"
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
