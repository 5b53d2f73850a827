"""The ./course script: its help, its exit codes, the JupyterLab flags, and how it installs
(a pip log per run; `uv pip` or ensurepip where the environment has no pip). The script is
sourced here (it then only defines its functions), with fake python/uv/uname programs."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "course"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args, env=None):
    return subprocess.run([str(COURSE), *args], capture_output=True, text=True, timeout=60, env=env)


def sourced(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'source "{COURSE}"; set +e; {script}'], capture_output=True, text=True,
                          timeout=60, env=env)


def test_help_lists_the_commands_and_exits_0():
    for args in ((), ("help",), ("--help",), ("-h",)):
        proc = run(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "./course lab" in proc.stdout and "./course mutants" in proc.stdout, proc.stdout
        assert "set -euo" not in proc.stdout and "#" not in proc.stdout, proc.stdout


def test_unknown_command_exits_1_and_says_so():
    proc = run("tset")
    assert proc.returncode == 1
    assert "unknown command 'tset'" in proc.stderr and "./course test" in proc.stderr


def fake_bin(tmp_path: Path, **programs: str) -> Path:
    """A bin folder of small bash programs (name -> body), first on PATH, then only /usr/bin:/bin."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in programs.items():
        p = b / name
        p.write_text("#!/usr/bin/env bash\n" + body + "\n")
        p.chmod(0o755)
    return b


def env_with(bin_dir: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env.update(extra)
    return env


@pytest.mark.parametrize("system, display, flag, headless", [
    ("Darwin", ":0", "--headless", True),  # --headless counts everywhere, not only on Linux
    ("Darwin", ":0", "", False),
    ("Darwin", "", "", False),  # a Mac without DISPLAY still opens a browser
    ("Linux", "", "", True),  # a Linux box without a display: a container or ssh
    ("Linux", ":0", "", False),
    ("Linux", ":0", "--headless", True),
])
def test_lab_runs_headless_when_asked_or_without_a_display_on_linux(tmp_path, system, display, flag, headless):
    b = fake_bin(tmp_path, uname=f"echo {system}")
    env = env_with(b, **({"DISPLAY": display} if display else {}))
    proc = sourced(f'lab_args {flag}; echo "${{LAB_ARGS[@]}}"', env)
    assert proc.returncode == 0, proc.stderr
    assert ("--no-browser" in proc.stdout) == headless, proc.stdout
    assert f"--ServerApp.root_dir={ROOT}/chapters" in proc.stdout


FAKE_PYTHON = """
echo "$*" >> "$CALLS"
case "$*" in
  "-m pip --version") exit "${HAS_PIP:-0}" ;;
  "-m ensurepip --upgrade") exit 0 ;;
  "-m pip install"*) echo "pip failed installing: $*"; exit 1 ;;
esac
"""


def test_each_run_keeps_its_own_pip_log(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_PYTHON)
    env = env_with(b, CALLS=str(tmp_path / "calls"), TMPDIR=str(tmp_path))
    first = sourced(f'pipq "{b}/python" first-package', env)
    second = sourced(f'pipq "{b}/python" second-package', env)
    assert first.returncode == second.returncode == 1
    assert "first-package" in first.stderr and "first-package" not in second.stderr, second.stderr
    logs = sorted(tmp_path.glob("memlab-pip.*"))
    assert len(logs) == 2, logs  # one per run, each named in its failure message
    assert all(str(log) in (first.stderr + second.stderr) for log in logs)


def test_an_environment_without_pip_installs_with_uv(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_PYTHON, uv='echo "uv $*" >> "$CALLS"')
    calls = tmp_path / "calls"
    proc = sourced(f'pipq "{b}/python" -e ".[course]"', env_with(b, CALLS=str(calls), HAS_PIP="1"))
    assert proc.returncode == 0, proc.stderr
    assert f"uv pip install --python {b}/python -e .[course]" in calls.read_text(), calls.read_text()


def test_an_environment_without_pip_or_uv_gets_pip_from_ensurepip(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_PYTHON)
    if shutil.which("uv", path=f"{b}:/usr/bin:/bin"):
        pytest.skip("uv is installed in /usr/bin or /bin")
    calls = tmp_path / "calls"
    sourced(f'pipq "{b}/python" some-package', env_with(b, CALLS=str(calls), HAS_PIP="1"))
    lines = calls.read_text().splitlines()
    assert "-m ensurepip --upgrade" in lines and lines.index("-m ensurepip --upgrade") < lines.index(
        "-m pip install some-package"), lines
