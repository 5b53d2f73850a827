"""The ./course script: its help, its exit codes, the JupyterLab flags, and how it installs
(a pip log per run; `uv pip` or ensurepip where the environment has no pip). The script is
sourced here (it then only defines its functions), with fake python/uv/uname programs."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COURSE = ROOT / "course"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args, env=None):
    return subprocess.run(
        [str(COURSE), *args], capture_output=True, text=True, timeout=60, env=env
    )


def sourced(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'source "{COURSE}"; set +e; {script}'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_help_lists_the_commands_and_exits_0():
    for args in ((), ("help",), ("--help",), ("-h",)):
        proc = run(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "./course lab" in proc.stdout and "./course mutants" in proc.stdout, (
            proc.stdout
        )
        assert "set -euo" not in proc.stdout and "#" not in proc.stdout, proc.stdout


def test_unknown_command_exits_1_and_says_so():
    proc = run("tset")
    assert proc.returncode == 1
    assert "unknown command 'tset'" in proc.stderr and "./course test" in proc.stderr


def fake_bin(tmp_path: Path, **programs: str) -> Path:
    """A bin folder of small bash programs (name -> body), first on PATH, then only
    /usr/bin:/bin."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in programs.items():
        p = b / name
        p.write_text("#!/usr/bin/env bash\n" + body + "\n")
        p.chmod(0o755)
    return b


def env_with(bin_dir: Path, **extra) -> dict:
    """The caller's environment less what the script reads (CI sets MEMLAB_FRESH, a learner may
    have a venv active): each test names what it sets."""
    read = ("DISPLAY", "WAYLAND_DISPLAY", "VIRTUAL_ENV", "CONDA_PREFIX")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in read and not k.startswith("MEMLAB_")
    }
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "system, display, flag, headless",
    [
        (
            "Darwin",
            ":0",
            "--headless",
            True,
        ),  # --headless counts everywhere, not only on Linux
        ("Darwin", ":0", "", False),
        ("Darwin", "", "", False),  # a Mac without DISPLAY still opens a browser
        ("Linux", "", "", True),  # a Linux box without a display: a container or ssh
        ("Linux", ":0", "", False),
        ("Linux", ":0", "--headless", True),
    ],
)
def test_lab_runs_headless_when_asked_or_without_a_display_on_linux(
    tmp_path, system, display, flag, headless
):
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
    assert "first-package" in first.stderr and "first-package" not in second.stderr, (
        second.stderr
    )
    logs = sorted(tmp_path.glob("memlab-pip.*"))
    assert len(logs) == 2, logs  # one per run, each named in its failure message
    assert all(str(log) in (first.stderr + second.stderr) for log in logs)


def test_an_environment_without_pip_installs_with_uv(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_PYTHON, uv='echo "uv $*" >> "$CALLS"')
    calls = tmp_path / "calls"
    proc = sourced(
        f'pipq "{b}/python" -e ".[course]"', env_with(b, CALLS=str(calls), HAS_PIP="1")
    )
    assert proc.returncode == 0, proc.stderr
    assert f"uv pip install --python {b}/python -e .[course]" in calls.read_text(), (
        calls.read_text()
    )


def test_an_environment_without_pip_or_uv_gets_pip_from_ensurepip(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_PYTHON)
    if shutil.which("uv", path=f"{b}:/usr/bin:/bin"):
        pytest.skip("uv is installed in /usr/bin or /bin")
    calls = tmp_path / "calls"
    sourced(
        f'pipq "{b}/python" some-package', env_with(b, CALLS=str(calls), HAS_PIP="1")
    )
    lines = calls.read_text().splitlines()
    assert "-m ensurepip --upgrade" in lines and lines.index(
        "-m ensurepip --upgrade"
    ) < lines.index("-m pip install some-package"), lines


# -- set-up progress and JupyterLab's address -----------------------------------------------------

FAKE_BASE = """
echo "$*" >> "$CALLS"
case "$*" in
  "-c import sys; sys.exit(sys.version_info < (3, 10))") exit 0 ;;
  "-c import torch") exit "${NO_TORCH:-1}" ;;
  "-m venv"*) d="${@: -1}"; mkdir -p "$d/bin"; cp "$0" "$d/bin/python" ;;
  "-m pip install"*) echo "Collecting something"; sleep 0.2 ;;
esac
exit 0
"""


def setup_run(tmp_path, **env):
    """setup() in a scratch folder (ROOT moved there) with a fake python3: what it prints."""
    b = fake_bin(tmp_path, python3=FAKE_BASE)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "requirements").mkdir(exist_ok=True)
    for lock in ("torch.txt", "torch-cuda.txt", "course.txt"):
        (tmp_path / "requirements" / lock).write_text(f"# {lock}\n")
    return sourced(
        f'ROOT="{tmp_path}"; cd "{tmp_path}"; setup .venv-t course.txt',
        env_with(b, CALLS=str(tmp_path / "calls"), TMPDIR=str(tmp_path), **env),
    )


def test_setup_prints_a_line_per_step_and_nothing_once_done(tmp_path):
    proc = setup_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("memlab:")]
    assert [line.split(" (")[0] for line in lines] == [
        "memlab: setting up .venv-t from the lock",
        "memlab: [1/3] creating .venv-t",
        "memlab: [2/3] installing torch from requirements/torch.txt",
        "memlab: [3/3] installing memlab and what it needs from requirements/course.txt",
        "memlab: .venv-t is ready",
    ], proc.stderr
    # Everything comes from the lock, each file checked against its hash; memlab itself is
    # installed without resolving anything more.
    installs = [
        c for c in (tmp_path / "calls").read_text().splitlines() if "pip install" in c
    ]
    assert installs, "no pip install ran"
    for call in installs:
        assert re.search(r"--require-hashes (--no-index )?-r requirements/", call) or (
            call.endswith("--no-deps --no-build-isolation -e .")
        ), call
    # pip's own lines stay in its log (a terminal sees one live line)
    assert "Collecting" not in proc.stderr
    again = setup_run(tmp_path)
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_setup_with_a_torch_already_there_says_so_and_skips_it(tmp_path):
    proc = setup_run(tmp_path, NO_TORCH="0")
    assert proc.returncode == 0, proc.stderr
    assert (
        "[1/2] creating .venv-t (it reuses the torch python3 already has)"
        in proc.stderr
    ), proc.stderr
    assert "torch.txt" not in proc.stderr and "[2/2] installing memlab" in proc.stderr


def test_a_fresh_setup_never_borrows_the_base_pythons_torch(tmp_path):
    # CI (MEMLAB_FRESH=1) builds what a newcomer builds: torch from the lock, even when the
    # machine's Python has one.
    proc = setup_run(tmp_path, NO_TORCH="0", MEMLAB_FRESH="1")
    assert proc.returncode == 0, proc.stderr
    assert "reuses the torch" not in proc.stderr, proc.stderr
    assert "installing torch from requirements/torch.txt" in proc.stderr, proc.stderr
    calls = (tmp_path / "calls").read_text()
    assert "--system-site-packages" not in calls and "-m pip check" in calls, calls


FAKE_LAB = """
if [ "$1 $2" = "-m jupyter" ]; then
  trap 'echo stopped > "$CALLS.stopped"; exit 0' TERM
  for i in $(seq 25); do echo "[I 2026-01-01 ServerApp] server log line $i"; done
  [ -n "${NO_URL:-}" ] && exit 1
  echo "    http://127.0.0.1:8888/lab?token=abc123"
  echo "[I 2026-01-01 ServerApp] a line after the address"
  sleep "${LAB_SECONDS:-1}" & wait $!
fi
"""


def test_lab_prints_its_address_last_on_its_own(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_LAB)
    proc = sourced(
        f'PY="{b}/python"; LAB_ARGS=(); serve_lab',
        env_with(b, CALLS=str(tmp_path / "calls"), TMPDIR=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr
    assert "server log line" not in proc.stderr and "a line after" not in proc.stderr, (
        proc.stderr
    )
    assert (
        proc.stderr.strip().splitlines()[-1].strip()
        == "http://127.0.0.1:8888/lab/tree/00_orientation.ipynb?token=abc123"
    ), proc.stderr
    (log,) = tmp_path.glob("memlab-lab.*")  # the server's log is kept, and named
    assert "server log line 25" in log.read_text() and str(log) in proc.stderr


def test_lab_that_does_not_start_shows_its_log(tmp_path):
    b = fake_bin(tmp_path, python=FAKE_LAB)
    proc = sourced(
        f'PY="{b}/python"; LAB_ARGS=(); serve_lab',
        env_with(b, CALLS=str(tmp_path / "calls"), TMPDIR=str(tmp_path), NO_URL="1"),
    )
    assert proc.returncode == 1 and "JupyterLab did not start" in proc.stderr
    assert "server log line 25" in proc.stderr, proc.stderr


def test_stopping_the_command_stops_jupyterlab(tmp_path):
    import signal
    import time

    b = fake_bin(tmp_path, python=FAKE_LAB)
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        proc = subprocess.Popen(
            [
                "bash",
                "-c",
                f'source "{COURSE}"; PY="{b}/python"; LAB_ARGS=(); serve_lab',
            ],
            stderr=f,
            env=env_with(
                b, CALLS=str(tmp_path / "calls"), TMPDIR=str(tmp_path), LAB_SECONDS="60"
            ),
        )
        deadline = time.monotonic() + 30
        while "00_orientation" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # what Ctrl-C's trap does too
        assert proc.wait(timeout=30) == 130
    assert (tmp_path / "calls.stopped").read_text().strip() == "stopped", (
        "JupyterLab was left running"
    )


NOTIFICATION = "@jupyterlab/apputils-extension:notification"


def lab_notification_settings(tmp_path: Path, *extra: str) -> dict:
    """Start JupyterLab as ./course lab does (its settings written, its flags), with a learner's
    empty user settings, and read the notification plugin's defaults as the page gets them (the
    server applies overrides to the schema's defaults; the user's own settings are empty)."""
    import json
    import socket
    import sys
    import time
    import urllib.request

    env = dict(os.environ, PY=sys.executable)
    for var, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTERLAB_SETTINGS_DIR", "user"),
    ):
        env[var] = str(tmp_path / sub)
    proc = sourced(
        'lab_settings && lab_args --headless && printf "%s\\n" "${LAB_ARGS[@]}"', env
    )
    assert proc.returncode == 0, proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "jupyter", "lab", *proc.stdout.split(), *extra]
    cmd += [
        f"--port={port}",
        "--IdentityProvider.token=t",
        "--ServerApp.port_retries=0",
    ]
    lab = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/lab/api/settings/{NOTIFICATION}?token=t"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    answer = json.loads(r.read())
                assert answer["settings"] == {}, answer["settings"]
                props = answer["schema"]["properties"]
                return {name: p.get("default") for name, p in props.items()}
            except OSError:
                if time.monotonic() > deadline or lab.poll() is not None:
                    raise
                time.sleep(0.3)
    finally:
        lab.terminate()
        lab.wait(timeout=30)


def test_the_lab_asks_the_learner_nothing(tmp_path):
    """JupyterLab asks about its news when fetchNews is 'none' (its default), whatever the
    server's news_url: ./course lab's settings answer it for the learner."""
    settings = lab_notification_settings(tmp_path)
    assert settings["fetchNews"] == "false" and settings["checkForUpdates"] is False
    # without the course's settings (an empty settings folder): the question comes back
    bare = lab_notification_settings(
        tmp_path, f"--LabApp.app_settings_dir={tmp_path / 'none'}"
    )
    assert bare["fetchNews"] == "none", bare
