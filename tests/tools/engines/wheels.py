"""The real engines' published wheels, fetched once into a cache outside the repository.

Nothing of SGLang or vLLM is committed or vendored: the differential tests download the official
wheels with ``pip download --no-deps``, unpack them into the cache, and import only the modules
they need (with small stubs for the rest, see each engine's loader). Without network the tests
skip with a message that says how to run them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no lock; run the engines tests with one worker there
    fcntl = None

import pytest

ENGINES = {"sglang": "0.5.23", "vllm": "0.33.0"}
# The same Linux x86-64 wheels on every machine (a Mac or a newer Python included): only their
# pure-Python and Triton files are read, so the platform of the wheel does not matter.
PLATFORM = [
    "--only-binary=:all:",
    "--implementation",
    "cp",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_34_x86_64",
    "--platform",
    "manylinux_2_28_x86_64",
]
HOW = (
    "run `./course engines` on a machine that can reach PyPI "
    "(or set MEMLAB_ENGINES_CACHE to a folder holding the wheels)"
)


def cache_dir() -> Path:
    d = Path(
        os.environ.get("MEMLAB_ENGINES_CACHE")
        or Path.home() / ".cache" / "memlab" / "engines"
    )
    d.mkdir(parents=True, exist_ok=True)
    return d


# engine -> why, so a failed download is tried once per process
_UNAVAILABLE: dict[str, str] = {}


def wheel(name: str) -> Path:
    """The path of the engine's wheel, downloading it the first time; skips the test without one."""
    if name in _UNAVAILABLE:
        pytest.skip(_UNAVAILABLE[name])
    try:
        return _wheel(name)
    except pytest.skip.Exception as exc:
        _UNAVAILABLE[name] = str(exc.msg)
        raise


def _wheel(name: str) -> Path:
    version, d = ENGINES[name], cache_dir()
    # one worker downloads; the others wait, then find the file
    with _locked(f"{name}.download"):
        return _download(name, version, d)


def _download(name: str, version: str, d: Path) -> Path:
    found = sorted(d.glob(f"{name}-{version}-*.whl"))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            *PLATFORM,
            "-d",
            str(d),
            f"{name}=={version}",
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"downloading {name}=={version} timed out: {HOW}")
        found = sorted(d.glob(f"{name}-{version}-*.whl"))
        if r.returncode or not found:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"could not download {name}=={version} ({last[0]}): {HOW}")
    return found[0]


@contextlib.contextmanager
def _locked(name: str):
    """One process at a time downloads and unpacks (pytest-xdist runs several)."""
    if fcntl is None:
        yield
        return
    with open(cache_dir() / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def unpacked(name: str) -> Path:
    """A folder holding the wheel's files (unpacked once); put it on sys.path to import from it."""
    with _locked(name):
        whl = wheel(name)
        dest = cache_dir() / whl.stem
        if not (dest / ".memlab-unpacked").exists():
            tmp = dest.with_name(dest.name + f".partial-{os.getpid()}")
            with zipfile.ZipFile(whl) as z:
                z.extractall(tmp)
            (tmp / ".memlab-unpacked").write_text(whl.name)
            if dest.exists():  # an interrupted earlier unpack
                shutil.rmtree(dest)
            tmp.rename(dest)  # all at once: a reader never sees half a wheel
    return dest


def extracted(name: str, members: list[str]) -> Path:
    """A folder holding the given files of the wheel (paths inside it, e.g.
    ``vllm/v1/core/block_pool.py``), extracted once each.

    A loader that needs a few pure-Python modules uses this instead of ``unpacked``: it writes a
    few hundred kB instead of the whole wheel (vLLM's unpacks to about 800 MB, mostly compiled
    libraries). Each file is written to a temporary name and renamed, so parallel test workers
    never read a half-written file.
    """
    whl = wheel(name)
    dest = cache_dir() / whl.stem
    missing = [m for m in members if not (dest / m).is_file()]
    if missing:
        with zipfile.ZipFile(whl) as z:
            for member in missing:
                target = dest / member
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
                tmp.write_bytes(z.read(member))
                os.replace(tmp, target)
    return dest


if __name__ == "__main__":
    # .ci/run fetches both wheels before the suite, so that no test's time (at most 60 s in
    # CI) holds a download. Without network it says so; the engines' tests then fail in CI.
    for engine in ENGINES:
        try:
            print(f"memlab: {engine} wheel: {wheel(engine)}")
        except pytest.skip.Exception as exc:
            print(f"memlab: {engine} wheel: {exc.msg}")
