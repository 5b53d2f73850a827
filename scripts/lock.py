"""Regenerate the course's lock: ``./course lock`` (this script, run with uv from the lock itself).

Everything ``./course`` installs, in both of its virtual environments, and ``environment.yml``
come from the files this writes under ``requirements/``. One resolution per environment, made by
``uv pip compile --universal`` (every platform, Python 3.10 and newer, from PyPI alone), exact
versions and every file's sha256:

- ``torch.txt``: torch itself. Which file a machine takes differs (a CUDA build from PyPI on
  Linux, a CPU build where the machine provides one locally), so every file's hash is listed,
  those of a local build of the same version that pip's ``find-links`` offers included.
- ``torch-cuda.txt``: the CUDA libraries a CUDA build of torch loads (``nvidia-*``, ``cuda-*``),
  installed only when the torch installed is such a build.
- ``course.txt``: the rest of ``.venv`` (``.[course,test]``, uv for this script).
- ``colab.txt``: the rest of ``.venv-colab`` (``.[test]``), with Colab's Triton and NumPy
  (``requirements/colab-overrides.txt``).

Moving to newer versions: edit the pins in ``requirements/lock.in`` or the ranges in
``pyproject.toml``, run ``./course lock``, then ``./course test``; commit what it wrote.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
INDEX = "https://pypi.org/simple"
PYTHON_FLOOR = "3.10"
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-)")
HEADER = """\
# Written by `./course lock` (scripts/lock.py) from pyproject.toml and requirements/lock.in:
# do not edit by hand. pyproject's dependencies when it was written: {stamp}
"""


def pyproject_stamp(root: Path = ROOT) -> str:
    """A short hash of what the lock is resolved from: pyproject's dependency tables and the
    files under requirements/ that feed the resolution. The tests compare it with the lock's."""
    text = (root / "pyproject.toml").read_text()
    deps = re.search(r"(?ms)^dependencies = \[.*?^\]", text).group(0)
    extras = re.search(
        r"(?ms)^\[project.optional-dependencies\].*?(?=^\[)", text
    ).group(0)
    feed = [deps, extras] + [
        (root / "requirements" / f).read_text()
        for f in ("lock.in", "colab-overrides.txt")
    ]
    return hashlib.sha256("\n".join(feed).encode()).hexdigest()[:16]


def compile_lock(uv: str, out: Path, extras: list[str], *more: str) -> list[str]:
    cmd = [
        uv, "pip", "compile", "pyproject.toml", "requirements/lock.in",
        *(f"--extra={e}" for e in extras),
        "--universal", "--python-version", PYTHON_FLOOR,
        "--generate-hashes", "--index-url", INDEX, "--no-header", "--quiet",
        "-o", str(out), *more,
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)
    return out.read_text().splitlines()


def entries(lines: list[str]) -> list[list[str]]:
    """The lock's requirements, each with its continuation lines (hashes, "# via")."""
    out: list[list[str]] = []
    for line in lines:
        if line.startswith((" ", "\t")) and out:
            out[-1].append(line)
        elif line and not line.startswith(("#", "--")):
            out.append([line])
    return out


def name(entry: list[str]) -> str:
    return re.split(r"[=<>;\s\[]", entry[0], maxsplit=1)[0].lower()


def local_torch_hashes(version: str) -> list[str]:
    """sha256 of the torch wheels of this exact version (local builds such as ``+cpu``) in the
    folders pip's configuration names as find-links."""
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    folders = re.findall(r"find-links='([^']+)'", got)
    hashes: list[str] = []
    # pip lists a setting once per place it is set
    for folder in dict.fromkeys(folders):
        for wheel in sorted(
            Path(folder.removeprefix("file://")).glob(f"torch-{version}+*.whl")
        ):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            hashes += [digest] if digest not in hashes else []
    return hashes


def write(path: Path, stamp: str, body: list[list[str]], note: str) -> None:
    text = HEADER.format(stamp=stamp) + note + f"--index-url {INDEX}\n\n"
    path.write_text(text + "\n".join("\n".join(e) for e in body) + "\n")


def environment_yml(stamp: str) -> str:
    return f"""\
# Written by `./course lock` (scripts/lock.py): do not edit by hand. pyproject: {stamp}
# conda env create -f environment.yml && conda activate memlab && pip install --no-deps -e .
# conda gives Python and pip; every package comes from the course's lock (requirements/), exact
# versions checked by hash, as `./course` installs them.
name: memlab
channels:
  - conda-forge
dependencies:
  - python=3.12
  - pip
  - pip:
      - -r requirements/torch.txt
      - -r requirements/torch-cuda.txt
      - -r requirements/course.txt
"""


def main() -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    stamp = pyproject_stamp()
    with tempfile.TemporaryDirectory() as tmp:
        main_lock = entries(
            compile_lock(uv, Path(tmp) / "course.txt", ["course", "test"])
        )
        colab_lock = entries(
            compile_lock(
                uv,
                Path(tmp) / "colab.txt",
                ["test"],
                "--override",
                "requirements/colab-overrides.txt",
            )
        )
    torch = [e for e in main_lock if name(e) == "torch"]
    version = torch[0][0].split("==")[1].split()[0]
    extra = local_torch_hashes(version)
    last_hash = max(i for i, line in enumerate(torch[0]) if "--hash=" in line)
    torch[0][last_hash:last_hash] = [f"    --hash=sha256:{h} \\" for h in extra]
    note = "# torch, one entry: every file of this version on PyPI"
    note += (
        f", and {len(extra)} local build(s) offered by pip's find-links"
        if extra
        else ""
    )
    write(REQ / "torch.txt", stamp, torch, note + "\n")
    cuda = [e for e in main_lock if CUDA_ONLY.match(name(e))]
    write(
        REQ / "torch-cuda.txt",
        stamp,
        cuda,
        "# the CUDA libraries a CUDA build of torch loads\n",
    )

    def rest(lock):
        return [e for e in lock if name(e) != "torch" and not CUDA_ONLY.match(name(e))]

    write(
        REQ / "course.txt",
        stamp,
        rest(main_lock),
        "# .venv: memlab[course,test], without torch\n",
    )
    colab_note = (
        "# .venv-colab: memlab[test] with Colab's Triton and NumPy, without torch\n"
    )
    write(REQ / "colab.txt", stamp, rest(colab_lock), colab_note)
    (ROOT / "environment.yml").write_text(environment_yml(stamp))
    print(f"requirements/ written: torch {version}, {len(rest(main_lock))} packages (.venv), "
          f"{len(rest(colab_lock))} (.venv-colab), {len(cuda)} CUDA libraries")  # fmt: skip


if __name__ == "__main__":
    main()
