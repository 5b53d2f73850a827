"""No folder of the repository shadows an installed distribution (issue 28).

Stand-in distributions named like each top-level folder (kernels, exercises, solutions, tests,
chapters, scripts, bench, data) are installed into a site folder; then, under pytest from the
repository root and in a chapter's kernel, each name imports the installed one, transformers
builds a model (it imports Hugging Face's ``kernels``, which the course's ``kernels/`` folder
once hid), and memlab's own kernels still run. The course's ``kernels/`` folder stays: it is
``memlab.kernels`` (memlab/kernels is a link to it).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memlab_tests.tools.loading import load_file
from memlab_tests.tools.shadow_probe import TOP

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    """A site folder holding a distribution (package and dist-info) for each name in TOP."""
    site = tmp_path_factory.mktemp("site-packages")
    for name in TOP:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("STAND_IN = True\n")
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        )
        (info / "RECORD").write_text("")
    return site


def clean_env(**extra) -> dict:
    drop = (
        "PYTHONPATH",
        "PYTEST_XDIST_WORKER",
        "PYTEST_CURRENT_TEST",
        "MEMLAB_EXERCISES",
    )
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def test_under_pytest_from_the_repository_root(standins):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ]
        + ["tests/tools/shadow_probe.py"],
        cwd=ROOT,
        env=clean_env(MEMLAB_STANDINS=str(standins)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "1 passed" in r.stdout, (
        r.stdout[-3000:] + r.stderr[-2000:]
    )


CHAPTER = """
import site, sys
from pathlib import Path
site.addsitedir(sys.argv[1])  # installed: after site-packages
exec(compile(Path(sys.argv[2]).read_text(), "setup-cell", "exec"))  # the chapters' first cell
from importlib.util import find_spec
for name in {top}:
    spec = find_spec(name)
    origin = Path(spec.origin or list(spec.submodule_search_locations)[0]).resolve()
    assert root / name not in origin.parents, (name, origin)
import torch
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
print("LOGITS", tuple(LlamaForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits.shape))
import memlab.kernels.canary as canary
print("AXPB", canary.axpb(torch.arange(4), a=3, b=2).tolist())
"""


def test_in_a_chapter(standins, tmp_path):
    sync = load_file("scripts/sync_notebooks.py")
    twin = next((ROOT / "chapters" / "py").glob("00_*.py"))
    cells = [c for c in sync.build(twin).cells if c.cell_type == "code"]
    (tmp_path / "setup.py").write_text(cells[0].source)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            CHAPTER.format(top=TOP),
            str(standins),
            str(tmp_path / "setup.py"),
        ],
        cwd=ROOT / "chapters",  # where JupyterLab starts a chapter's kernel
        env=clean_env(MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "LOGITS (1, 3, 64)" in r.stdout and "AXPB [2, 5, 8, 11]" in r.stdout, (
        r.stdout
    )


def test_the_probe_can_fail(standins):
    # With the repository first on sys.path (what `python -m pytest` does before the conftest
    # takes it out), the course's kernels/ folder hides the installed `kernels`.
    code = (
        "import sys, site; sys.path.insert(0, sys.argv[2]); site.addsitedir(sys.argv[1]); "
        "import kernels; print(kernels.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(standins), str(ROOT)],
        cwd="/",
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert Path(r.stdout.strip()).resolve() == ROOT / "kernels" / "__init__.py", (
        r.stdout
    )
