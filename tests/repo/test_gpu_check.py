"""scripts/gpu_check.sh without a GPU: it parses, its dry run finds every command it would call
(and says which are missing), it installs a folder of wheels without network, and on a machine
without CUDA it stops at once with exit status 2 and a report that says nothing was run. The
kernel benchmark it runs last checks every kernel against its torch reference, and SGLang's
allocator kernels from its wheel beside memlab's (smoke sizes)."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run(*args, **env):
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MEMLAB_GPU_WHEELS", "MEMLAB_GPU_SITE")
    }
    full.update({"PYTHON": sys.executable, **env})
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_dry_run_says_what_is_missing(tmp_path):
    bare = tmp_path / "python3"  # a Python without torch
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I "$@"\n')
    bare.chmod(0o755)
    r = run(
        "--dry-run", PYTHON=str(bare), MEMLAB_ENGINES_CACHE=str(tmp_path / "no-engines")
    )
    assert (
        r.returncode == 3
        and "MISSING  python" in r.stdout
        and "some commands are missing" in r.stdout
    )
    assert "phase 3 would be skipped" in r.stdout
    assert (
        "SGLang's wheel missing: the benchmark would time memlab's kernels only"
        in r.stdout
    )


def _wheel(folder: Path) -> Path:
    """A one-module wheel, as pip download would leave it."""
    files = {
        "memlabprobe.py": b"OK = 1\n",
        "memlabprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\n"
        b"Name: memlabprobe\n"
        b"Version: 1.0\n",
        "memlabprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"
        b"Generator: test\n"
        b"Root-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
            f"{len(d)}\n"
            for n, d in files.items()
        )
        + "memlabprobe-1.0.dist-info/RECORD,,\n"
    )
    path = folder / "memlabprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("memlabprobe-1.0.dist-info/RECORD", record)
    return path


def test_dry_run_finds_every_command_and_installs_a_folder_of_wheels_without_network(
    tmp_path,
):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    (wheels / "engines").mkdir(parents=True)
    _wheel(wheels)
    # brought along, not installed
    sglang = wheels / "engines" / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    sglang.write_bytes(b"")
    r = run(
        "--dry-run",
        MEMLAB_GPU_WHEELS=str(wheels),
        MEMLAB_GPU_SITE=str(site),
        PIP_NO_INDEX="1",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MISSING" not in r.stdout and "every command is there" in r.stdout
    for phase in (
        "-m kernel\\ or\\ gpu",
        "memlab.grade --solutions",
        "run_notebooks.py --jobs",
        "bench_kernels.py",
        "compile check: tests/tools/compile_kernels.py",
        f"SGLang's wheel for the benchmark: {sglang}",
    ):
        assert phase in r.stdout, f"the dry run does not show {phase!r}:\n{r.stdout}"
    assert (
        site / "memlabprobe.py"
    ).is_file() and f"1 wheels from {wheels} installed in {site}" in r.stdout
    assert not (site / "sglang").exists()


def test_without_cuda_it_stops_at_once_and_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run bash scripts/gpu_check.sh itself")
    report = tmp_path / "report.txt"
    r = run(str(report))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "no CUDA device here" in report.read_text()
        and "nothing was run" in report.read_text()
    )


@pytest.mark.kernel
def test_the_kernel_benchmark_checks_every_kernel_against_torch_and_sglang():
    import torch

    from memlab_tests.tools.engines.wheels import extracted

    # skips without the wheel and network
    extracted("sglang", ["sglang/kernels/ops/memory/allocator.py"])
    r = subprocess.run(
        [sys.executable, "bench/bench_kernels.py", "--smoke", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    mode = (
        "mode: compiled kernels on"
        if torch.cuda.is_available()
        else "mode: Triton interpreter"
    )
    assert (
        lines[0].startswith(mode)
        and "from sglang/kernels/ops/memory/allocator.py in its wheel" in lines[1]
    ), r.stdout
    header = next(i for i, line in enumerate(lines) if line.startswith("case"))
    rows = [line for line in lines[header + 1 :] if line.strip()]
    assert len(rows) == 6 and not any("MISMATCH" in line for line in rows), r.stdout
    timed = [line.split() for line in rows if line.startswith("alloc_")]
    assert len(timed) == 3 and all(
        cols[-4] != "-" and cols[-2].endswith("x") for cols in timed
    ), r.stdout
