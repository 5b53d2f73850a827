"""The kernels as a GPU compiles them (tests/tools/compile_kernels.py): every BUILDS entry compiles
for a T4 and a Hopper, and the variants the allocator's launches need are BUILDS' own, one per page
size whatever the free list's alignment (computed here the way Triton's JIT keys its cache; on a
GPU, counted in that cache too)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from memlab.common.env import ensure_kernel_mode, kernel_device

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.kernel
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="Triton builds only on Linux"
)
def test_every_kernel_compiles_for_a_t4_and_a_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tools" / "compile_kernels.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    kernels = {p.name for p in (ROOT / "kernels").glob("*.py")} - {"__init__.py"}
    listed = {
        line.split()[1].split(":")[0]
        for line in r.stdout.splitlines()
        if line.startswith("ok")
    }
    assert kernels <= listed, (
        "kernels with no ahead-of-time build listed in tests/tools/compile_kernels.py: "
        f"{sorted(kernels - listed)}"
    )


def compile_kernels():
    ensure_kernel_mode()  # the script imports triton: the mode must be fixed first
    spec = importlib.util.spec_from_file_location(
        "compile_kernels", ROOT / "tests" / "tools" / "compile_kernels.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Recorder:
    """Stands in for a kernel in its module: keeps each launch's arguments, then launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


def drive(page_size: int) -> None:
    """A scheduler's calls: prefills and decodes that re-slice the free list by one page and by
    two, so the kernels see it at both alignments; one decode with SGLang's int32 last_loc."""
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
    from memlab_tests.tools.alloc import check_books, decode, extend

    alloc = PagedTokenToKVPoolAllocator(
        64 * page_size,
        page_size,
        backend="triton",
        device=kernel_device(),
        debug_mode=True,
    )
    held = {}
    # one page: the next launch sees the list 8 bytes on
    extend(alloc, held, "a", page_size)
    extend(alloc, held, "b", 2 * page_size + 1)
    extend(alloc, held, "a", page_size + 2)
    for _ in range(page_size + 1):
        decode(alloc, held, ["a", "b"])
    seq = torch.tensor([len(held["a"]) + 1])
    out = alloc.alloc_decode(
        seq.to(alloc.device),
        seq,
        torch.tensor([held["a"][-1]], dtype=torch.int32, device=alloc.device),
    )
    held["a"].append(int(out[0]))
    check_books(alloc, held)


@pytest.mark.kernel
@pytest.mark.parametrize("name", ["alloc_extend", "alloc_decode"])
def test_one_compiled_variant_per_page_size_and_each_one_built(name, monkeypatch):
    import importlib

    from triton.runtime.jit import JITFunction

    aot = compile_kernels()
    module = importlib.import_module(f"memlab.kernels.{name}")
    kernel = getattr(module, f"{name}_kernel")
    gpu = ensure_kernel_mode() == "gpu"
    if gpu:  # a kernel with an empty cache, to count what the JIT really compiles
        kernel = JITFunction(kernel.fn, do_not_specialize=kernel.do_not_specialize)
    rec = Recorder(kernel)
    monkeypatch.setattr(module, f"{name}_kernel", rec)
    for ps in aot.PAGE_SIZES:
        drive(ps)

    free_lists = [
        args[list(aot.as_jit(kernel).arg_names).index("free_pages_ptr")]
        for args, _ in rec.launches
    ]
    assert {f.data_ptr() % 16 for f in free_lists} == {0, 8}, (
        "the stream must re-slice the free list both ways"
    )
    variants = {aot.variant(kernel, *args, **kwargs) for args, kwargs in rec.launches}
    page_sizes = {dict(cx)["page_size"] for _, _, cx, _ in variants}
    # decode also ran with SGLang's int32 last_loc
    lens = 2 if name == "alloc_decode" else 1
    assert page_sizes == set(aot.PAGE_SIZES) and len(variants) == lens * len(
        aot.PAGE_SIZES
    ), sorted(variants)
    assert [v for v in variants if not aot.built(v)] == [], (
        "launches need variants BUILDS does not compile"
    )
    # The check can fail: the same launches without do_not_specialize need a variant per alignment.
    plain = JITFunction(kernel.fn)
    assert len(
        {aot.variant(plain, *args, **kwargs) for args, kwargs in rec.launches}
    ) > len(variants)
    if gpu:
        assert len(kernel.device_caches[torch.cuda.current_device()][0]) == len(
            variants
        )


@pytest.mark.kernel
def test_variant_tells_apart_what_the_jit_compiles_apart():
    """Per page size, per pointer dtype, per alignment where not switched off; nothing else."""
    aot = compile_kernels()
    from memlab.kernels import alloc_decode

    k = alloc_decode.alloc_decode_kernel
    seq, last, out = (
        torch.ones(2, dtype=torch.int64),
        torch.full((2,), -1),
        torch.empty(2, dtype=torch.int64),
    )
    free = torch.arange(1, 9)
    v = lambda *a, ps=4: aot.variant(k, *a, ps, BS_BLOCK=128)  # noqa: E731
    assert (
        v(seq, last, free, out)
        == v(seq, last, free[1:], out)
        == v(seq[:1], last[:1], free[3:], out[:1])
    )
    assert v(seq, last, free, out) != v(seq, last, free, out, ps=3)
    assert v(seq, last, free, out) != v(seq, last.to(torch.int32), free, out)
    # last_loc keeps its alignment key
    assert v(seq, last, free, out) != v(seq, last[1:], free, out)
    assert not aot.built(v(seq, last, free, out, ps=5)) and aot.built(
        v(seq, last, free, out)
    )
