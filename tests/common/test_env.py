import os
import subprocess
import sys

import pytest

from memlab.common import env
from memlab.course import doctor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_py(code, cwd=ROOT, **extra_env):
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | extra_env
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.kernel
def test_canary_returns_real_numbers():
    doctor.run_canary()


@pytest.mark.kernel
def test_a_canary_returning_zeros_fails_loudly(monkeypatch):
    import torch

    from memlab.kernels import canary

    monkeypatch.setattr(canary, "axpb", lambda x, a, b: torch.zeros_like(x))
    with pytest.raises(RuntimeError, match=r"canary returned \[0, 0"):
        doctor.run_canary()


def test_importing_memlab_never_imports_triton():
    code = (
        "import pkgutil, importlib, sys, memlab\n"
        "mods = [m.name for m in pkgutil.walk_packages(memlab.__path__, 'memlab.')\n"
        "        if not m.name.startswith('memlab.kernels') and m.name != 'memlab.__main__']\n"
        "moved = {'memlab.common.sizing', 'memlab.capstone.compare', "
        "'memlab.capstone.trace_replay'}\n"
        "for m in mods:\n"
        "    if m in moved:  # an ImportError naming the new home\n"
        "        try: importlib.import_module(m)\n"
        "        except ImportError as e: assert 'moved to' in str(e), e\n"
        "        else: raise AssertionError(m + ' imported')\n"
        "    else: importlib.import_module(m)\n"
        "bad = 'triton' in sys.modules\n"
        "print(len(mods), 'modules;', 'triton imported' if bad else 'no triton')\n"
        "sys.exit(1 if bad else 0)"
    )
    r = run_py(code)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kernel_mode_is_set_before_the_first_kernel_import():
    r = run_py(
        "import os, memlab.kernels\n"
        "from memlab.common import env\n"
        "print(env.ensure_kernel_mode(), os.environ.get('TRITON_INTERPRET'))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == (
        ["gpu", "None"] if env.has_cuda() else ["interpreter", "1"]
    )


@pytest.mark.skipif(env.has_cuda(), reason="on a GPU, importing triton first is fine")
def test_triton_imported_too_early_is_refused():
    r = run_py("import triton\nimport memlab.kernels")
    assert (
        r.returncode != 0
        and "imported before memlab could set TRITON_INTERPRET" in r.stderr
    )


def test_doctor_reports_versions_device_and_mode():
    r = subprocess.run(
        [sys.executable, "-m", "memlab", "doctor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for key in (
        "python",
        "torch",
        "triton",
        "numpy",
        "device",
        "compute capability",
        "kernel mode",
        "canary",
    ):
        assert any(
            line.strip().startswith(key + "  ") for line in r.stdout.splitlines()
        ), f"doctor does not report {key}:\n{r.stdout}"
    assert "OK" in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "memlab", "docter"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "docter" in bad.stderr


def test_generic_folders_are_not_installed_as_top_level_names(tmp_path):
    # memlab installs one top-level name; another distribution may own `kernels` (Hugging
    # Face's, which transformers needs) and must find it free.
    r = run_py(
        "import importlib.metadata as m, importlib.util as u\n"
        "names = ('kernels', 'exercises', 'solutions', 'tests', 'chapters')\n"
        "print(sorted(n for n in names if n in m.packages_distributions().keys()\n"
        "             and 'memlab' in m.packages_distributions()[n]))\n"
        "spec = u.find_spec('kernels')\n"
        f"print(spec is None or not spec.origin.startswith({os.path.join(ROOT, 'kernels')!r}))\n"
        "import memlab.kernels.canary",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "True"], r.stdout


def test_resolve_device_fills_in_the_cuda_index():
    import torch

    assert env.resolve_device("cpu") == torch.device("cpu")
    # why the books keep the resolved form
    assert torch.device("cuda") != torch.device("cuda:0")
    if env.has_cuda():
        assert env.resolve_device("cuda") == torch.empty(1, device="cuda").device
