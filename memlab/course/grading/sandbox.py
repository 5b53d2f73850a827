"""Learner code in a process of its own: the grader's side of the sandbox.

``open_module(path, name)`` starts a learner process for one exercise file and returns a proxy of
its module; the graded tests (memlab.course.grading.loader.load) drive the learner's code through
it: attribute access gives proxies of the learner's functions, classes and objects, a call sends
the call across and returns data (memlab.course.grading.wire says what crosses). Nothing that
decides or records a grade runs in the learner's process: pytest, the comparisons, the points and
the event log stay here.

The learner's process is forked from a zygote that imported torch (and Triton) once, so a new
exercise file costs milliseconds. It runs with a clean environment (no grader variables), in a
folder of its own holding a copy of the learner's file, with memlab, the solutions, the tests,
pytest and the grader neither importable nor readable (a meta-path finder and an audit hook,
installed before the learner's file is imported); an attempt is reported here and the exercise
earns nothing. On Gradescope it also runs as an unprivileged user (``MEMLAB_SANDBOX_USER``) with
resource limits (``MEMLAB_SANDBOX_LIMITS``), so the operating system keeps it out as well;
``MEMLAB_SANDBOX_BLOCK`` names more folders it may not read (``os.pathsep``-separated).

A learner process that dies, hangs past the test's alarm (it is killed; a new one serves the next
test) or sends what is not data fails that test with a message saying why.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
import weakref
from pathlib import Path

from memlab.course.grading import wire

ROOT = Path(__file__).resolve().parents[3]
MAX_LIVE = 4  # learner processes kept at once; the oldest is stopped (and restarted when used again)
READ_LIMIT = 1 << 30  # bytes one message from the learner may hold
IMPORT_TIMEOUT = 120.0  # seconds for the learner's file to import (outside a graded test's alarm too)
USER_ENV = "MEMLAB_SANDBOX_USER"
LIMITS_ENV = "MEMLAB_SANDBOX_LIMITS"
BLOCK_ENV = "MEMLAB_SANDBOX_BLOCK"
PYTHON_ENV = "MEMLAB_SANDBOX_PYTHON"  # the Python the learner's processes run (default: this one)
PRELOAD = ("torch", "numpy", "triton", "triton.language")
FORBIDDEN = wire.FORBIDDEN
# What the learner's process may see of this process's environment: locale, paths to libraries
# and the GPU, Triton's and CUDA's own settings. Never the grader's variables.
PASS_ENV = re.compile(
    r"(PATH|LD_LIBRARY_PATH|LANG|LC_\w+|TZ|CUDA_\w+|NVIDIA_\w+|TRITON_\w+|CC|CXX|HIP_\w+|ROCM_\w+)$"
)


# -- what goes wrong, in plain words ----------------------------------------------------------------


class SandboxFailure(BaseException):
    """Something about the learner's process itself went wrong; the test fails with the message.
    A BaseException, so that no ``except Exception`` in a graded test's helper can swallow it."""

    kind = "SandboxFailure"


class LearnerCrashed(SandboxFailure):
    kind = "Crash"


class NotDataError(SandboxFailure):
    kind = "NotData"


class LearnerGone(SandboxFailure):
    kind = "Gone"


class CourseCodeUsed(SandboxFailure):
    """The learner's file imports or reads the course's own implementation (or attacks the grader)."""

    kind = "CourseCodeUsed"

    def __init__(self, file: str, what: list[str]):
        self.file, self.what = file, what
        super().__init__(
            f"write it yourself: your file {file} {'; '.join(what)}. The grader gives no points "
            "to an exercise file that uses the course's own implementation, reads the course's files "
            "(the tests, the solutions, the grader) or meddles with the grader"
        )


class LearnerError(Exception):
    """Mixed into the exceptions raised by the learner's code, rebuilt here with the same builtin
    kind (ValueError, NotImplementedError, ...): ``where`` is the learner's line that raised it."""

    where = ""
    learner_traceback = ""
    _text = ""

    def __str__(self):
        return self._text


_error_classes: dict = {}


def _learner_error(info) -> BaseException:
    if not (
        isinstance(info, tuple)
        and len(info) == 6
        and isinstance(info[1], tuple)
        and all(isinstance(x, str) for x in (info[0], *info[1], *info[2:5]))
    ):
        return NotDataError("your code's process sent an error the grader cannot read")
    name, bases, text, where, tb, _ = info
    if name == "NotData":
        return NotDataError(
            f"your code returned something that is not data: {text} (the grader takes numbers, "
            "strings, lists, tuples, dicts, sets, tensors and your own objects)"
        )
    base = next(
        (wire._EXC_BASES[b] for b in bases if b in wire._EXC_BASES), RuntimeError
    )
    if not name.isidentifier():
        name = base.__name__
    key = (name, base)
    cls = _error_classes.get(key)
    if cls is None:
        try:
            cls = type(
                name,
                (base, LearnerError),
                {"__module__": "learner", "__str__": LearnerError.__str__},
            )
        except TypeError:
            cls = type(
                name,
                (RuntimeError, LearnerError),
                {"__module__": "learner", "__str__": LearnerError.__str__},
            )
        _error_classes[key] = cls
    try:
        exc = cls(text)
    except Exception:
        exc = type(name, (RuntimeError, LearnerError), {"__module__": "learner"})(text)
    exc._text, exc.where, exc.learner_traceback = text, where, tb
    return exc


def _how(code) -> str:
    if code is None:
        return "it did not say how"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# -- the static check -------------------------------------------------------------------------------


def imports_course_code(source: str) -> list[str]:
    """What the file imports of the course (memlab, the solutions, the tests, pytest, the grader),
    read from its source before it runs: ``import``, ``from ... import``, ``__import__("...")`` and
    ``importlib.import_module("...")`` with a literal name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the learner's process says so, in the learner's words
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ast.unparse(node.func)
            in ("__import__", "importlib.import_module", "import_module")
        ):
            names = [node.args[0].value]
        for n in names:
            if n.split(".")[0] in FORBIDDEN and f"imports {n}" not in found:
                found.append(f"imports {n}")
    return found


# -- the zygote -------------------------------------------------------------------------------------


def _user() -> tuple[int, int, str] | None:
    name = os.environ.get(USER_ENV)
    if not name:
        return None
    import pwd

    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid, name


def _limits() -> dict:
    """``MEMLAB_SANDBOX_LIMITS``: e.g. ``memory=6G,cpu=900,fsize=512M,nofile=1024``."""
    out = {}
    for part in filter(None, os.environ.get(LIMITS_ENV, "").split(",")):
        key, _, value = part.partition("=")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:].upper(), 1)
        out[key.strip()] = int(float(value.rstrip("KMGkmg")) * mult)
    return out


def _env(home: str, tmp: str | None = None) -> dict:
    """The learner's environment: ``home`` is the zygote's folder (Triton's cache there is shared by
    every learner process of one grading run: a GPU compiles its helpers once), ``tmp`` its own."""
    env = {k: v for k, v in os.environ.items() if PASS_ENV.match(k)}
    env.update(
        HOME=home,
        TMPDIR=tmp or home,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONIOENCODING="utf-8",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    env.setdefault("TRITON_CACHE_DIR", os.path.join(home, ".triton"))
    return env


def _own(path: Path, user) -> None:
    if user is not None:
        os.chown(path, user[0], user[1])


class Zygote:
    """The process that forks learner processes (Linux); elsewhere each is started afresh."""

    def __init__(self, preload=()):
        from memlab.common.env import ensure_kernel_mode

        ensure_kernel_mode()  # TRITON_INTERPRET, passed on to the learner's processes
        self.user = _user()
        self.dir = Path(tempfile.mkdtemp(prefix="memlab-sandbox-"))
        os.chmod(self.dir, 0o755 if self.user else 0o700)
        _own(self.dir, self.user)
        self.wire = (
            self.dir / "wire.py"
        )  # a copy: the learner's side reads nothing of the course
        shutil.copyfile(wire.__file__, self.wire)
        os.chmod(self.wire, 0o644)
        self.preload = list(preload)
        self.count = 0
        self.proc = None
        self.ctl = None
        self.ready = False
        self.fork_server = sys.platform.startswith("linux") and hasattr(
            socket, "send_fds"
        )
        if self.fork_server:
            self._start()

    def _popen(self, args, pass_fds):
        kw = {}
        if self.user is not None:
            kw = dict(user=self.user[0], group=self.user[1], extra_groups=[])
        log = open(self.dir / "zygote.log", "ab")
        try:
            python = os.environ.get(PYTHON_ENV) or sys.executable
            return subprocess.Popen(
                [python, "-I", str(self.wire), *args],
                pass_fds=pass_fds,
                env=_env(str(self.dir)),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **kw,
            )
        finally:
            log.close()

    def _start(self):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = self._popen(
            ["--zygote", str(b.fileno()), json.dumps(self.preload)], [b.fileno()]
        )
        b.close()
        self.ctl = a

    def alive(self) -> bool:
        return not self.fork_server or (
            self.proc is not None and self.proc.poll() is None
        )

    def _recv(self, timeout=None):
        self.ctl.settimeout(timeout)
        try:
            data = self.ctl.recv(1 << 16)
        except TimeoutError:
            return None
        finally:
            self.ctl.settimeout(None)
        if not data:
            raise LearnerCrashed(
                "the grader's sandbox stopped (its zygote process died): "
                + (self.dir / "zygote.log").read_text(errors="replace")[-1500:]
            )
        return json.loads(data)

    def _wait_ready(self):
        if not self.ready:
            msg = self._recv()
            assert msg and msg[0] == "ready", msg
            self.ready = True

    def work_dir(self) -> Path:
        self.count += 1
        d = self.dir / f"l{self.count}"
        d.mkdir()
        os.chmod(d, 0o755 if self.user else 0o700)
        _own(d, self.user)
        return d

    def spawn(self, config: dict, sock: socket.socket):
        """Start a learner process on ``sock`` (its end of a socket pair); returns (pid, popen or None)."""
        if not self.fork_server:
            proc = self._popen(
                [
                    "--learner",
                    str(sock.fileno()),
                    json.dumps(config),
                    json.dumps(self.preload),
                ],
                [sock.fileno()],
            )
            return proc.pid, proc
        self._wait_ready()
        socket.send_fds(
            self.ctl, [json.dumps(["fork", config]).encode()], [sock.fileno()]
        )
        msg = self._recv()
        return msg[1], None

    def wait(self, pid, proc, timeout=2.0):
        """The learner process's exit code (negative: the signal), None if it is still running."""
        if proc is not None:
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        self.ctl.send(json.dumps(["wait", pid, timeout]).encode())
        msg = self._recv()
        return msg[1]

    def close(self):
        if self.ctl is not None:
            self.ctl.close()
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


_zygote: Zygote | None = None


def needed_imports(paths) -> list[str]:
    """What of torch, NumPy and Triton these learner files import (the zygote imports it once)."""
    found = set()
    for p in paths:
        try:
            tree = ast.parse(Path(p).read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    if "torch" in found:
        found.add("numpy")  # tensors cross as NumPy views of their bytes
    return [m for m in PRELOAD if m.split(".")[0] in found]


def zygote(files=None) -> Zygote:
    """The zygote, started on first use; it preloads what ``files`` import (default: every exercise
    file of the folder of the first file loaded)."""
    global _zygote
    if _zygote is None or not _zygote.alive():
        _zygote = Zygote(needed_imports(files or ()))
    return _zygote


def warm(files) -> None:
    """Start the zygote now (it imports torch while the grader collects its tests)."""
    zygote(files)


def ready() -> None:
    """Wait until the zygote has imported what it preloads (no-op where there is no zygote)."""
    z = _zygote
    if z is not None and z.fork_server and z.alive():
        z._wait_ready()


def _shutdown():
    """At exit: stop every learner process and the zygote at once (nothing of theirs is kept)."""
    for s in list(_live):
        s.dead = s.dead or "the grader stopped"
        for kill in (os.killpg, os.kill):
            try:
                kill(s.pid, signal.SIGKILL)
                break
            except OSError:
                pass
        try:
            s.sock.close()
        except OSError:
            pass
    _live.clear()
    z = _zygote
    if z is not None:
        if z.ctl is not None:
            z.ctl.close()
        if z.proc is not None:
            try:
                os.killpg(z.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            z.proc.wait()
        shutil.rmtree(z.dir, ignore_errors=True)


import atexit  # noqa: E402

atexit.register(_shutdown)


# -- one learner process ------------------------------------------------------------------------------

_live: collections.OrderedDict = (
    collections.OrderedDict()
)  # Session -> None, least recently used first


def blocked_roots() -> list[str]:
    extra = [p for p in os.environ.get(BLOCK_ENV, "").split(os.pathsep) if p]
    return [str(ROOT), *extra]


def allowed_roots() -> list[str]:
    out = {sys.prefix, sys.exec_prefix, sys.base_prefix, *site.getsitepackages()}
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        try:
            out.add(sysconfig.get_path(key))
        except KeyError:
            pass
    return sorted(p for p in out if p)


class Session:
    """One learner file in one learner process."""

    def __init__(self, path: Path, name: str):
        self.path, self.name = path, name
        self.dead: str | None = None
        self.violations: list[str] = []
        self.proxies: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.grader_errors: dict[int, BaseException] = {}
        self.peer = wire.Peer("grader")
        self.peer.make_proxy = self._proxy
        self.peer.make_method = lambda obj, name: MethodProxy(obj, name)
        self.peer.special = self._special
        self.module: LearnerModule | None = None
        self.proc = None
        self.out_pos = 0
        self.out = None
        z = zygote(sorted(path.parent.glob("ch[0-9][0-9]_*.py")) or [path])
        self.zygote = z
        self.work = z.work_dir()
        self.file = self.work / f"{name}.py"
        shutil.copyfile(path, self.file)
        os.chmod(self.file, 0o644)
        _own(self.file, z.user)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = {
            "work": str(self.work),
            "file": str(self.file),
            "name": name,
            "env": _env(str(z.dir), str(self.work)),
            "limits": _limits(),
            "blocked": blocked_roots(),
            "allowed": allowed_roots() + [str(z.dir)],
            "cpu_only": os.environ.get("TRITON_INTERPRET") == "1" or not _has_cuda(),
        }
        self.pid, self.proc = z.spawn(config, theirs)
        theirs.close()
        self.sock = mine
        _live[self] = None
        while len(_live) > MAX_LIVE:
            oldest = next(iter(_live))
            oldest.stop("stopped to make room for another exercise's process")

    # -- the protocol --------------------------------------------------------------------------------
    def _special(self, x, ctx, depth):
        if isinstance(x, Proxy):
            if object.__getattribute__(x, "_s") is not self:
                raise wire.NotData("an object of another exercise's process")
            return ["h", object.__getattribute__(x, "_h")]
        if isinstance(x, MethodProxy):
            return ["m", self.peer.enc(x._obj, ctx, depth + 1), x._name]
        if isinstance(x, LearnerModule):
            if x._session is not self:
                raise wire.NotData("another exercise's module")
            return ["h", wire.MODULE]
        return None

    def _proxy(self, hid, info):
        p = self.proxies.get(hid)
        if p is None:
            if hid == wire.MODULE:
                return self.module
            if not (
                isinstance(info, list) and len(info) >= 3 and isinstance(info[1], str)
            ):
                raise wire.WireError("a handle of the wrong shape")
            p = Proxy.__new__(Proxy)
            object.__setattr__(p, "_s", self)
            object.__setattr__(p, "_h", hid)
            object.__setattr__(p, "_info", info)
            self.proxies[hid] = p
            while hid in self.peer.released:
                self.peer.released.remove(hid)
        return p

    def wait_ready(self):
        """Wait for the learner's file to import; raise what it raised."""
        got = self._await(deadline=time.monotonic() + IMPORT_TIMEOUT, importing=True)
        if not (isinstance(got, tuple) and got[:1] == ("ready",)):
            raise NotDataError("your code's process did not start as it should")

    def request(self, op, *args):
        if self.dead:
            raise LearnerGone(f"your code's process is gone: {self.dead}")
        _live.move_to_end(self)
        header, blobs = self.peer.encode_message("q", [op, *args])
        try:
            wire.send_msg(self.sock, header, blobs)
        except OSError:
            self._crashed()
        except (
            BaseException
        ):  # the alarm while a big message was going out: the protocol is broken
            self._abort("interrupted")
            raise
        return self._await()

    def _await(self, deadline=None, importing=False):
        try:
            while True:
                if deadline is not None:
                    self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    header, blobs = wire.recv_msg(self.sock, READ_LIMIT)
                except TimeoutError:
                    self._abort("timed out")
                    raise LearnerCrashed(
                        f"your file did not finish importing in {IMPORT_TIMEOUT:g} s "
                        "(an endless loop at import time?)"
                    ) from None
                finally:
                    if deadline is not None:
                        self.sock.settimeout(None)
                if (
                    isinstance(header, list)
                    and header[:1] == ["v"]
                    and len(header) == 3
                ):
                    self.violations += [str(v)[:500] for v in header[1]][:1]
                    continue
                kind, body = self.peer.decode_message(header, blobs)
                if kind == "a" and len(body) == 1:
                    self._after()
                    return body[0]
                if kind == "e" and len(body) == 1:
                    self._after()
                    info = body[0]
                    if (
                        isinstance(info, tuple)
                        and len(info) == 6
                        and info[5] in self.grader_errors
                    ):
                        failed = self.grader_errors.pop(
                            info[5]
                        )  # a callback of the test's raised it
                    else:
                        failed = _learner_error(info)
                    break
                if kind == "q" and body and body[0] == "call" and len(body) == 4:
                    self._serve_callback(*body[1:])
                    continue
                raise wire.WireError(f"a message of the wrong shape ({kind!r})")
        except wire.Closed:
            self._crashed(importing)
        except (
            wire.WireError,
            wire.NotData,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            OverflowError,
            RecursionError,
            RuntimeError,
            MemoryError,
        ) as exc:
            self._abort("sent something that is not data")
            raise NotDataError(
                f"your code's process sent something the grader cannot read as data ({exc}); the "
                "grader takes numbers, strings, lists, tuples, dicts, sets, tensors and your own "
                "objects"
            ) from None
        except SandboxFailure:
            raise
        except (
            BaseException
        ) as exc:  # the test's alarm (or Ctrl-C) while the learner's code runs
            where = self._abort("interrupted")
            if where:
                try:
                    exc.where = where
                except AttributeError:
                    pass
            raise
        # Raised outside the try: an error the learner's code (or a callback) raised leaves the
        # protocol intact, so the process stays usable for the next call.
        raise failed

    def _after(self):
        self._relay()
        if self.violations:
            what = self.violations
            self.module._flag(what)
            self.stop("it used the course's own files")
            raise CourseCodeUsed(self.path.name, what)

    def _serve_callback(self, fn, args, kwargs):
        if (
            not callable(fn)
            or not isinstance(args, tuple)
            or not isinstance(kwargs, tuple)
        ):
            raise wire.WireError("a callback request of the wrong shape")
        try:
            value = fn(*args, **dict(kwargs))
        except Exception as exc:
            key = id(exc)
            self.grader_errors[key] = exc
            header, blobs = self.peer.encode_message(
                "e", [wire.exception_info(exc, None, key)]
            )
        else:
            try:
                header, blobs = self.peer.encode_message("a", [value])
            except wire.NotData as exc:
                header, blobs = self.peer.encode_message(
                    "e", [wire.exception_info(exc, None, None)]
                )
        wire.send_msg(self.sock, header, blobs)

    # -- the learner's output ---------------------------------------------------------------------------
    def _read_output(self) -> str:
        path = self.work / "output.txt"
        try:
            if self.out is None:
                self.out = open(path, "rb")
            self.out.seek(self.out_pos)
            data = self.out.read(1 << 22)
            self.out_pos += len(data)
            rest = os.fstat(self.out.fileno()).st_size - self.out_pos
            if rest > 0:
                self.out_pos += rest  # more than 4 MiB at once: the head is enough
                data += f"\n... [{rest} bytes more]\n".encode()
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")

    def _relay(self, text: str | None = None) -> str:
        """Pass the learner's output on to this process's (pytest captures it per test); a
        traceback dump of the learner's process (faulthandler's) is the grader's, not theirs."""
        text = self._read_output() if text is None else text
        shown = _DUMP.sub("", text)
        if shown:
            sys.stdout.write(
                shown
                if len(shown) <= 200_000
                else shown[:100_000] + "\n... [cut] ...\n" + shown[-100_000:]
            )
        return text

    def _where(self, text: str) -> str:
        """The learner's line in a faulthandler dump (the innermost frame comes first)."""
        for m in re.finditer(r'File "([^"]+)", line (\d+)(?: in (\w+))?', text):
            if os.path.basename(m.group(1)) == self.file.name:
                return f"{self.file.name}:{m.group(2)}" + (
                    f" in {m.group(3)}" if m.group(3) else ""
                )
        return ""

    # -- the end of a learner process -------------------------------------------------------------------
    def _crashed(self, importing=False):
        code = self.zygote.wait(self.pid, self.proc, 3.0)
        text = self._relay()
        where = self._where(text)
        self._close(f"it died ({_how(code)})")
        if importing:
            raise LearnerCrashed(
                f"your code's process died ({_how(code)}) while importing {self.path.name}"
                f"{', last seen at ' + where if where else ''}: os._exit, a segfault or another "
                "crash at import time"
            )
        raise LearnerCrashed(
            f"your code's process died ({_how(code)}) during this test"
            f"{', last seen at ' + where if where else ''}: os._exit, a segfault or another crash "
            "in your code (in a kernel: a load or store past a tensor's end)"
        )

    def _abort(self, why) -> str:
        """Stop a learner process in the middle of a call; where it was (its traceback), if it says."""
        where = ""
        if self.dead is None and hasattr(signal, "SIGUSR1"):
            try:
                os.kill(self.pid, signal.SIGUSR1)  # faulthandler prints where it is
            except OSError:
                pass
            end = time.monotonic() + 0.5
            text = ""
            while time.monotonic() < end:
                time.sleep(0.02)
                text += self._read_output()
                if (
                    "File " in text
                    and "\n\n" in text[text.find("File ") :]
                    or self._where(text)
                ):
                    break
            where = self._where(text)
            self._relay(text)
        self.stop(f"it was stopped ({why})")
        return where

    def _close(self, why):
        self.dead = why
        try:
            self.sock.close()
        except OSError:
            pass
        if self.out is not None:
            self.out.close()
            self.out = None
        _live.pop(self, None)

    def stop(self, why="stopped"):
        if self.dead is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
            self.zygote.wait(self.pid, self.proc, 2.0)
            self._close(why)
        shutil.rmtree(self.work, ignore_errors=True)


# A faulthandler dump: from its first line to the blank line (or the end) after its last frame.
_DUMP = re.compile(
    r"^(?:Fatal Python error: .*\n(?:.*\n)*?)?(?:(?:Current thread|Thread) 0x[0-9a-f]+ .*\n"
    r"(?:  File .*\n|  <no Python frame>\n)*\n?)+(?:\s*Extension modules: .*\n)?"
    r"(?:.*\(total: \d+\)\n)?",
    re.M,
)


def _has_cuda() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


# -- the proxies ----------------------------------------------------------------------------------------


def _req(p, op, *args):
    return object.__getattribute__(p, "_s").request(op, *args)


# Dunder attributes worth asking the learner's side for; any other ``__x__`` is not there.
_FORWARD = {
    "__name__",
    "__qualname__",
    "__module__",
    "__doc__",
    "__dict__",
    "__annotations__",
    "__defaults__",
    "__kwdefaults__",
    "__slots__",
    "__wrapped__",
    "__self__",
    "__func__",
    "__dataclass_fields__",
    "__match_args__",
    "__fields__",
    "_fields",
    "__mro__",
    "__bases__",
}


class Proxy:
    """An object living in the learner's process (an instance, a function, a class)."""

    __slots__ = ("_s", "_h", "_info", "__weakref__")
    _memlab_proxy = True

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in _FORWARD:
            raise AttributeError(name)
        return _req(self, "getattr", self, name)

    def __setattr__(self, name, value):
        _req(self, "setattr", self, name, value)

    def __delattr__(self, name):
        _req(self, "delattr", self, name)

    def __call__(self, *args, **kwargs):
        return _req(self, "call", self, args, tuple(kwargs.items()))

    def __repr__(self):
        return _req(self, "repr", self)

    def __str__(self):
        return _req(self, "str", self)

    def __format__(self, spec):
        return _req(self, "format", self, spec)

    def __dir__(self):
        return list(_req(self, "dir", self))

    def __hash__(self):
        h = object.__getattribute__(self, "_info")[0]
        if h is None:
            raise TypeError(f"unhashable type: '{_type_name(self)}'")
        return h

    def __bool__(self):
        return _req(self, "bool", self)

    def __len__(self):
        return _req(self, "len", self)

    def __iter__(self):
        return _req(self, "iter", self)

    def __next__(self):
        return _req(self, "next", self)

    def __contains__(self, item):
        return _req(self, "contains", self, item)

    def __getitem__(self, key):
        return _req(self, "getitem", self, key)

    def __setitem__(self, key, value):
        _req(self, "setitem", self, key, value)

    def __delitem__(self, key):
        _req(self, "delitem", self, key)

    def __eq__(self, other):
        return _req(self, "eq", self, other)

    def __ne__(self, other):
        return _req(self, "ne", self, other)

    def __lt__(self, other):
        return _req(self, "lt", self, other)

    def __le__(self, other):
        return _req(self, "le", self, other)

    def __gt__(self, other):
        return _req(self, "gt", self, other)

    def __ge__(self, other):
        return _req(self, "ge", self, other)

    def __int__(self):
        return _req(self, "int", self)

    def __float__(self):
        return _req(self, "float", self)

    def __index__(self):
        return _req(self, "index", self)

    def __enter__(self):
        return _req(self, "enter", self)

    def __exit__(self, *exc):
        return _req(self, "exit", self, None, None, None)

    def __instancecheck__(self, instance):
        return _req(self, "isinstance", instance, self)

    def __subclasscheck__(self, sub):
        return _req(self, "issubclass", sub, self)

    def __deepcopy__(self, memo):
        return _req(self, "deepcopy", self)

    def __copy__(self):
        return _req(self, "copy", self)

    def __reduce_ex__(self, protocol):
        raise TypeError(
            f"an object of your code ({_type_name(self)}) cannot be pickled by the grader"
        )

    def __del__(self):
        try:
            s, h = (
                object.__getattribute__(self, "_s"),
                object.__getattribute__(self, "_h"),
            )
        except AttributeError:
            return
        if s.dead is None:
            s.peer.released.append(h)


def _type_name(p) -> str:
    """A proxy's type in the learner's words ('ch11_radix_match.TreeNode'), for messages."""
    info = object.__getattribute__(p, "_info")
    return info[1]


def is_proxy(x) -> bool:
    return isinstance(x, (Proxy, MethodProxy))


class MethodProxy:
    """A learner object's bound method (``a.alloc_extend``): one round trip per call."""

    __slots__ = ("_obj", "_name")

    def __init__(self, obj, name):
        self._obj, self._name = obj, name

    def __call__(self, *args, **kwargs):
        return _req(
            self._obj, "callmethod", self._obj, self._name, args, tuple(kwargs.items())
        )

    @property
    def __name__(self):
        return self._name

    def __repr__(self):
        return f"<method {self._name} of {_type_name(self._obj)}>"


class LearnerModule(types.ModuleType):
    """The learner's module, living in its learner process; started again after a crash."""

    _LOCAL = {
        "_path",
        "_session",
        "_flagged",
        "_stamp",
        "__file__",
        "__name__",
        "__doc__",
        "__spec__",
        "__loader__",
        "__package__",
        "__path__",
        "__dict__",
        "__class__",
    }

    def __init__(self, path: Path, modname: str):
        super().__init__(modname)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_session", None)
        object.__setattr__(self, "_stamp", None)
        object.__setattr__(
            self, "_flagged", imports_course_code(path.read_text(errors="replace"))
        )
        object.__setattr__(self, "__file__", str(path))

    def _flag(self, what):
        object.__setattr__(
            self,
            "_flagged",
            list(self._flagged) + [w for w in what if w not in self._flagged],
        )

    def _live(self) -> Session:
        if self._flagged:
            raise CourseCodeUsed(self._path.name, self._flagged)
        s = self._session
        if s is None or s.dead is not None:
            s = Session(self._path, self._path.stem)
            s.module = self
            object.__setattr__(self, "_session", s)
            try:
                s.wait_ready()
            except BaseException:
                s.stop("its file did not import")
                object.__setattr__(self, "_session", None)
                raise
        return s

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in _FORWARD:
            raise AttributeError(name)
        return self._live().request("getattr", self, name)

    def __setattr__(self, name, value):
        if name in self._LOCAL:
            object.__setattr__(self, name, value)
        else:
            self._live().request("setattr", self, name, value)

    def __delattr__(self, name):
        self._live().request("delattr", self, name)

    def __dir__(self):
        return list(self._live().request("dir", self))

    def __repr__(self):
        return f"<your module {self._path.name}, in a process of its own>"


def open_module(path: Path, modname: str) -> LearnerModule:
    """The learner's file ``path`` as a module whose code runs in a learner process; its file is
    imported now (so a syntax error, or a crash at import time, raises here)."""
    m = LearnerModule(path, modname)
    m._live()
    return m
