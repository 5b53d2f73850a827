"""Learner code in a process of its own: the grader's side (memlab.course.grading.wire is the
learner's, and the codec both share).

``LearnerModule(path, name)`` stands for the learner's file; the graded tests reach it only
through ``loader.load``. Its first use asks a zygote (a process that imported torch once and
runs no learner code) to fork a learner process for the file. Attribute access and calls cross
as requests; what comes back is decoded strictly into plain data (ints, floats, str, lists,
dicts, tensors whose bytes are copied into this process's own memory, the tests' named tuples)
or into a ``Handle``: an object of the learner's code that a test may call but never compare,
test for truth, measure, iterate or hash (``loader.is_learner_object``). Nothing that decides a
grade runs in the learner's process, and nothing it sends is unpickled, mapped or fenced here.

On Gradescope (``MEMLAB_SANDBOX_USER``) the learner process drops to that unprivileged user
before it reads its file, with limits (``MEMLAB_SANDBOX_LIMITS``) and a folder of its own, made
in the root-owned ``MEMLAB_SANDBOX_DIR``, as its home and tmp. A learner process that dies,
hangs past the test's alarm (it is killed; a new one serves the next test) or sends what is not
data fails that test, never the grader.
"""

from __future__ import annotations

import ast
import atexit
import collections
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import types
import weakref
from pathlib import Path

from memlab.course.grading import wire

ROOT = Path(__file__).resolve().parents[3]
MAX_LIVE = 4  # learner processes kept at once; the least recently used is stopped
READ_LIMIT = 1 << 30  # bytes one message from the learner may hold
OUTPUT_LIMIT = 200_000  # characters of a learner's output kept per call (head and tail)
IMPORT_TIMEOUT = 120.0  # seconds for the learner's file to import
PRELOAD = ("torch", "numpy", "triton", "triton.language")
PASS_ENV = re.compile(
    r"(PATH|LD_LIBRARY_PATH|LANG|LC_\w+|TZ|CUDA_\w+|NVIDIA_\w+|TRITON_\w+)$"
)
FORWARD = {"__name__", "__qualname__", "__doc__", "__dict__", "__wrapped__", "_fields"}


# -- what goes wrong, in plain words ---------------------------------------------------------


class SandboxFailure(BaseException):
    """The learner's process itself went wrong; the test fails with the message. A
    BaseException, so that no ``except Exception`` in a test's helper swallows it."""

    kind = "SandboxFailure"


class LearnerCrashed(SandboxFailure):
    kind = "Crash"


class NotDataError(SandboxFailure):
    kind = "NotData"


class LearnerGone(SandboxFailure):
    kind = "Gone"


class CourseCodeUsed(SandboxFailure):
    """The learner's file imports or reads the course's own implementation."""

    kind = "CourseCodeUsed"

    def __init__(self, file: str, what: list[str]):
        super().__init__(
            f"write it yourself: your file {file} {'; '.join(what)}. The grader gives no "
            "points to an exercise file that uses the course's own implementation or reads "
            "the course's files (the tests, the solutions, the grader)"
        )


class LearnerError(Exception):
    """Mixed into an exception the learner's code raised, rebuilt here with the same builtin
    kind (ValueError, NotImplementedError, ...): ``where`` is the learner's line."""

    where = learner_traceback = _text = ""

    def __str__(self):
        return self._text


class NotPlainValue(TypeError):
    """A check met an object of the learner's code where it needs a plain value."""


_error_classes: dict = {}


def _learner_error(info) -> BaseException:
    name, _, text, where, tb = (str(x)[:4000] for x in info[:5])
    if name == "NotData":
        return NotDataError(
            f"your code returned something that is not data: {text} (the grader takes "
            "numbers, strings, lists, tuples, dicts, sets, tensors and your own objects)"
        )
    bases = [b for b in info[1] if type(b) is str and b in wire.EXC_BASES]
    base = wire.EXC_BASES[bases[0]] if bases else RuntimeError
    name = name if name.isidentifier() else base.__name__
    cls = _error_classes.get((name, base))
    if cls is None:
        body = {"__module__": "learner", "__str__": LearnerError.__str__}
        try:
            cls = type(name, (base, LearnerError), body)
            cls("probe")
        except Exception:  # a base whose constructor wants more (UnicodeDecodeError)
            cls = type(name, (RuntimeError, LearnerError), body)
        _error_classes[(name, base)] = cls
    exc = cls(text)
    exc._text, exc.where, exc.learner_traceback = text, where, tb
    return exc


def _how(code) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def imports_course_code(source: str) -> list[str]:
    """What the file imports of the course (memlab, the solutions, the tests, pytest), read
    from its source before it runs: ``import``, ``from ... import``, and ``__import__`` or
    ``importlib.import_module`` of a literal name."""
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
            and ast.unparse(node.func).split(".")[-1] in ("__import__", "import_module")
        ):
            names = [node.args[0].value]
        found += [f"imports {n}" for n in names if n.split(".")[0] in wire.FORBIDDEN]
    return list(dict.fromkeys(found))


# -- the zygote ------------------------------------------------------------------------------


def _user() -> tuple[int, int, str] | None:
    name = os.environ.get("MEMLAB_SANDBOX_USER")
    if not name:
        return None
    import pwd

    if os.geteuid() != 0:
        raise RuntimeError(
            f"MEMLAB_SANDBOX_USER={name}: only root runs code as another user"
        )
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid, name


def _limits() -> dict:
    """``MEMLAB_SANDBOX_LIMITS``, e.g. ``as=4G,cpu=900,fsize=256M,nofile=1024,nproc=256``."""
    out = {}
    for part in filter(None, os.environ.get("MEMLAB_SANDBOX_LIMITS", "").split(",")):
        key, _, value = part.partition("=")
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:].upper(), 1)
        out[key.strip()] = int(float(value.rstrip("KMGkmg")) * scale)
    return out


def env(home: Path, cache: Path | None = None) -> dict:
    """The learner's environment: locale, library paths, the GPU's and Triton's settings, a
    home of its own; never the grader's variables."""
    out = {k: v for k, v in os.environ.items() if PASS_ENV.match(k)}
    out.update(HOME=str(home), TMPDIR=str(home), OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    out.update(PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    if cache is not None:  # the learners' own: the zygote never opens it
        out["TRITON_CACHE_DIR"] = str(cache)
    return out


class Zygote:
    """The trusted process that forks learner processes (Linux; elsewhere each is started
    afresh). Only it reaps them, and only when asked: a learner's process id stays its own
    until the grader is done signalling it."""

    def __init__(self):
        from memlab.common.env import ensure_kernel_mode

        ensure_kernel_mode()  # TRITON_INTERPRET, passed on to the learner processes
        self.user, self.count, self.ready = _user(), 0, False
        base = os.environ.get("MEMLAB_SANDBOX_DIR")
        self.dir = Path(tempfile.mkdtemp(prefix="memlab-sandbox-", dir=base))
        # each learner finds its own folder
        os.chmod(self.dir, 0o711 if self.user else 0o700)
        # one Triton cache: a GPU builds its helpers once
        self.cache = self.folder("triton")
        self.fork = sys.platform.startswith("linux")
        self.proc = self.ctl = None
        if self.fork:
            self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            args = ["zygote", str(theirs.fileno()), json.dumps(PRELOAD)]
            self.proc = self._popen(args, [theirs.fileno()])
            theirs.close()

    def folder(self, name) -> Path:
        """A new folder for the learner's user, made here, where that user cannot write."""
        d = self.dir / name
        d.mkdir(mode=0o700)
        if self.user:
            os.chown(d, self.user[0], self.user[1])
        return d

    def _popen(self, args, fds):
        with open(self.dir / "zygote.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-I", wire.__file__, *args],
                pass_fds=fds,
                env=env(self.dir),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return not self.fork or self.proc.poll() is None

    def wait_ready(self):
        if self.fork and not self.ready:
            self.ready = self.ctl.recv(64) == b'["ready"]'
            if not self.ready:
                raise LearnerCrashed("the grader's zygote process did not start")

    def _ask(self, msg, fds=()):
        self.wait_ready()
        socket.send_fds(self.ctl, [json.dumps(msg).encode()], list(fds))
        reply = self.ctl.recv(1 << 16)
        if not reply:
            log = (self.dir / "zygote.log").read_text(errors="replace")[-1500:]
            raise LearnerCrashed(f"the grader's zygote process died: {log}")
        return json.loads(reply)[1]

    def spawn(self, config: dict, sock: socket.socket, out: int):
        """A learner process on ``sock`` (its end) writing to ``out``: (pid, Popen or None)."""
        if self.fork:
            return self._ask(["fork", config], [sock.fileno(), out]), None
        proc = self._popen(
            ["learner", str(sock.fileno()), str(out)], [sock.fileno(), out]
        )
        return proc.pid, proc

    def reap(self, pid, proc) -> int | None:
        """The exit code of a learner process that was killed (negative: the signal)."""
        return proc.wait() if proc is not None else self._ask(["reap", pid])

    def close(self):
        for s in list(_live):
            s.stop("the grader stopped")
        if self.ctl is not None:
            self.ctl.close()
            self.proc.wait()
        if self.user:  # what the learner's code started outside its process group too
            end_processes_of(self.user)
        # the learner's user owns its folders: they stay (Gradescope's go)
        if not self.user:
            shutil.rmtree(self.dir, ignore_errors=True)


def running_as(uid: int) -> list[int]:
    """The processes of ``uid`` still running (a zombie has stopped: it only waits to be
    reaped by its parent)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # gone meanwhile
            continue
        uids = {int(u) for u in fields.get("Uid", "").split()}
        if uid in uids and fields.get("State", "Z").split()[0] not in ("Z", "X"):
            out.append(int(pid))
    return out


def end_processes_of(user, timeout: float = 30.0) -> list[int]:
    """Kill every process of ``user`` (uid, gid, ...) and wait until none runs: what is still
    running at the deadline. The kill is sent as that user (``kill(-1)``: every process it may
    signal at once, so none forks away meanwhile), and a killed process goes on until the
    kernel has torn it down, longer on a loaded machine: the grader waits for that, else a
    process of the student's outlives grading."""
    uid, gid = user[0], user[1]
    deadline = time.monotonic() + timeout
    while True:
        # The shell's kill (any user may run /bin/sh, not every Python): all of its own, not
        # itself.
        subprocess.run(
            ["/bin/sh", "-c", "kill -KILL -1"],
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            env={},
            timeout=60,
            check=False,
        )
        again = min(deadline, time.monotonic() + 1.0)  # then kill again (a root fork)
        while (left := running_as(uid)) and time.monotonic() < again:
            time.sleep(0.005)
        if not left or time.monotonic() >= deadline:
            return left


_zygote: Zygote | None = None
# Session -> None, oldest first
_live: collections.OrderedDict = collections.OrderedDict()


def zygote() -> Zygote:
    """The zygote, started on first use and again after it died (its learner processes died
    with it, so their sessions end without a signal)."""
    global _zygote
    if _zygote is None or not _zygote.alive():
        for s in list(_live):
            s.close("the grader's zygote stopped")
        _zygote = Zygote()
    return _zygote


warm = zygote  # the plugin starts it while pytest collects the tests


def ready() -> None:
    """Wait until the zygote has imported torch, before the first test's clock starts."""
    zygote().wait_ready()


@atexit.register
def _shutdown():
    if _zygote is not None:
        _zygote.close()


# -- one learner process ---------------------------------------------------------------------


class Session(wire.Peer):
    """One learner file in one learner process, and this side of the codec."""

    def __init__(self, module: LearnerModule):
        super().__init__(+1)
        self.module, self.path, self.dead = module, module._path, None
        self.handles = weakref.WeakValueDictionary()
        self.callbacks, self.fid_of, self.errors = {}, {}, {}
        self.out_text, self.isolation = "", []
        z = self.zygote = zygote()
        z.count += 1
        self.work = z.folder(f"l{z.count}")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.out, out_w = os.pipe()
        os.set_blocking(self.out, False)
        python = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
        config = {
            "work": str(self.work),
            "name": self.path.stem,
            "source": module._source,
            "env": env(self.work, z.cache),
            "limits": _limits(),
            "user": z.user,
            "roots": sorted({str(ROOT), os.path.realpath(ROOT)}),
            "python": sorted(os.path.realpath(p) for p in python),
        }
        try:
            self.pid, self.proc = z.spawn(config, theirs, out_w)
            if self.proc is not None:  # no zygote: the config goes over the socket
                wire.send_msg(mine, config)
        finally:
            theirs.close()
            os.close(out_w)
        self.sock = mine
        _live[self] = None
        while len(_live) > MAX_LIVE:
            next(iter(_live)).stop(
                "stopped to make room for another exercise's process"
            )

    def wait_ready(self):
        got = self._await(deadline=time.monotonic() + IMPORT_TIMEOUT, importing=True)
        if not (type(got) is tuple and len(got) == 2 and got[0] == "ready"):
            raise NotDataError("your code's process did not start as it should")
        self.isolation = [str(x) for x in got[1]] if type(got[1]) is tuple else []

    def request(self, op, *args):
        if self.dead:
            raise LearnerGone(f"your code's process is gone: {self.dead}")
        _live.move_to_end(self)
        self._send("q", (op, *args))
        return self._await()

    def _send(self, kind, value, raw=False):
        header, blobs = self.message(kind, value, raw, self._collect())
        try:
            wire.send_msg(self.sock, header, blobs)
        except OSError:
            self._crashed()
        # the alarm while a message went out: the stream is broken
        except BaseException:
            self._abort("interrupted")
            raise

    def _collect(self) -> list[int]:
        """The shared objects nothing else here refers to any more: the learner's side forgets
        them once the next message (which still carries their last changes) is sent."""
        torch = sys.modules.get("torch")
        count = getattr(torch._C, "_storage_Use_Count", None) if torch else None
        out = []
        for sid, e in self.entries.items():
            if type(e[0]) in (list, dict, set):
                if sys.getrefcount(e[0]) <= 2:  # this table's and the call's
                    out.append(sid)
            # its view, the ask
            elif count and count(e[0].untyped_storage()._cdata) <= 2:
                out.append(sid)
        return out

    # -- the tests' own objects: named tuples cross as data, functions as callbacks
    def named(self, t):
        if issubclass(t, tuple) and hasattr(t, "_fields") and t is not tuple:
            key = [t.__module__, t.__qualname__, list(t._fields)]
            self.tuples[(key[0], key[1], *key[2])], self.tuple_key[t] = t, key
            return key
        return None

    def opaque(self, x, m):
        t = type(x)
        if t in (Handle, Method, LearnerModule):
            h = x._obj if t is Method else x
            if (h._session if t is LearnerModule else h._s) is not self:
                raise wire.NotData("an object of another exercise file's process")
            hid = 0 if t is LearnerModule else h._h
            return ["m", hid, x._name] if t is Method else ["h", hid]
        if callable(x) and not isinstance(x, type):
            fid = self.fid_of.get(id(x))
            if fid is None:
                fid = self.fid_of[id(x)] = len(self.callbacks) + 1
                self.callbacks[fid] = x  # kept: its id names it while this session runs
            return ["c", fid]
        name = f"{t.__module__}.{t.__qualname__}"
        raise wire.NotData(f"the grader cannot hand a {name} to your code")

    def special(self, tag, a):
        if tag == "h":
            return self._handle(wire._int(a[0]), str(a[1])[:200])
        if tag == "m":
            name = a[1] if type(a[1]) is str else "?"
            return Method(self._handle(wire._int(a[0]), "?"), name[:200])
        if tag == "c":
            return self.callbacks[a[0]]
        return super().special(tag, a)

    def _handle(self, hid, type_name):
        if hid == 0:
            return self.module
        h = self.handles.get(hid)
        if h is None:
            h = Handle.__new__(Handle)
            for k, v in (("_s", self), ("_h", hid), ("_type", type_name)):
                object.__setattr__(h, k, v)
            self.handles[hid] = h
            self.release = [r for r in self.release if r != hid]
        return h

    # -- the conversation
    def _await(self, deadline=None, importing=False):
        result = error = None
        try:
            while True:
                header, blobs = self._receive(deadline)
                kind, body = self.receive(header, blobs)
                if header[3]:
                    self._flag([str(s)[:300] for s in wire._list(header[3])][:3])
                if kind == "c":
                    self._callback(*body)
                    continue
                if kind == "a":
                    result = body
                elif kind == "e":
                    error = self._error(body)
                else:
                    raise wire.NotData(f"a message of kind {str(kind)[:20]!r}")
                break
        except wire.Closed:
            self._crashed(importing)
        except SandboxFailure:
            raise
        except (wire.WireError, ValueError, LookupError, ArithmeticError, TypeError,
                RuntimeError, MemoryError, AttributeError) as exc:  # fmt: skip
            self._abort("sent something that is not data")
            raise NotDataError(
                "your code's process sent something the grader cannot read as data "
                f"({str(exc)[:200]}); the grader takes numbers, strings, lists, tuples, dicts, "
                "sets, tensors and your own objects"
            ) from None
        except BaseException as exc:  # the test's alarm (or Ctrl-C) while the code runs
            where = self._abort("interrupted")
            if where:
                exc.where = where
            raise
        finally:
            self._relay()
        if error is not None:
            raise error
        return result

    def _error(self, info):
        if not (type(info) is list and len(info) == 6 and type(info[1]) is list):
            raise wire.NotData("an error of the wrong shape")
        mine = self.errors.pop(info[5], None) if type(info[5]) is int else None
        return mine if mine is not None else _learner_error(info)

    def _callback(self, fid, args, kwargs):
        """The learner's code calls a function of the test: run it here, answer there."""
        fn = self.callbacks[fid]
        try:
            value = fn(*args, **dict(kwargs))
        # the learner's code may catch it; if not, it comes back
        except Exception as exc:
            self.errors[id(exc)] = exc
            return self._send("e", wire.error_info(exc)[:5] + [id(exc)], raw=True)
        self._send("a", value)

    def _flag(self, what):
        self.module._flagged = list(dict.fromkeys(self.module._flagged + what))
        self.stop("it used the course's own files")
        raise CourseCodeUsed(self.path.name, self.module._flagged)

    def _receive(self, deadline):
        """The next message, reading the learner's output meanwhile."""
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock, self.out], [], [], wait)
            if not ready:
                self._abort("timed out")
                raise LearnerCrashed(
                    f"your file did not finish importing in {IMPORT_TIMEOUT:g} s (an "
                    "endless loop at import time?)"
                )
            if self.out in ready:
                self._read_output()
            if self.sock in ready:
                return wire.recv_msg(self.sock, READ_LIMIT)

    def _read_output(self) -> None:
        while self.dead is None:
            try:
                data = os.read(self.out, 1 << 16)
            except OSError:
                return
            if not data:
                return
            text = self.out_text + data.decode("utf-8", errors="replace")
            if len(text) > 2 * OUTPUT_LIMIT:  # keep the head and the tail
                half = OUTPUT_LIMIT // 2
                text = f"{text[:half]}\n... [output cut] ...\n{text[-half:]}"
            self.out_text = text

    def _relay(self) -> str:
        """Pass the learner's output on to this process's (pytest captures it per test); a
        traceback dump of the learner's process (faulthandler's) is the grader's, not theirs."""
        self._read_output()
        text, self.out_text = self.out_text, ""
        shown = _DUMP.sub("", text)
        if shown:
            sys.stdout.write(shown)
        return text

    def _where(self, text: str) -> str:
        """The learner's line in a faulthandler dump (the innermost frame comes first)."""
        name = self.path.stem + ".py"
        for m in re.finditer(r'File "([^"]+)", line (\d+)(?: in (\w+))?', text):
            if os.path.basename(m.group(1)) == name:
                return f"{name}:{m.group(2)}" + (
                    f" in {m.group(3)}" if m.group(3) else ""
                )
        return ""

    # -- the end of a learner process
    def _crashed(self, importing=False):
        where = self._where(self._relay())
        code = self.stop("it died")
        seen = f", last seen at {where}" if where else ""
        if importing:
            raise LearnerCrashed(
                f"your code's process died ({_how(code)}) while importing "
                f"{self.path.name}{seen}: os._exit, a segfault or another crash at import time"
            )
        raise LearnerCrashed(
            f"your code's process died ({_how(code)}) during this test{seen}: os._exit, a "
            "segfault or another crash in your code (in a kernel: a load or store past a "
            "tensor's end)"
        )

    def _abort(self, why) -> str:
        """Stop a learner process in the middle of a call; where it was, from its traceback."""
        text = ""
        if self.dead is None and self.zygote.alive():
            # not reaped yet: the pid is still its own
            os.kill(self.pid, signal.SIGUSR1)
            end = time.monotonic() + 0.5
            while time.monotonic() < end and not self._where(self.out_text):
                select.select([self.out], [], [], 0.05)
                self._read_output()
            text = self.out_text
            # The dump is the grader's, and the kill may cut it anywhere, even mid-line, so the
            # learner's output is what came before its first line.
            self.out_text = _before_dump(text)
        self.stop(f"it was stopped ({why})")
        return self._where(text)

    def stop(self, why="stopped") -> int | None:
        """Kill the learner process and all it started in its process group; its exit code.
        Its process id is signalled before the zygote reaps it, never after."""
        code = None
        if self.dead is None and self.zygote.alive():
            # its group, and itself if it made none yet
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            code = self.zygote.reap(self.pid, self.proc)
        self.close(why)
        return code

    def close(self, why):
        if self.dead is None:
            self.dead = why
            self.sock.close()
            os.close(self.out)
        _live.pop(self, None)


# A faulthandler dump: from its first line to the blank line (or the end) after its last frame.
_DUMP = re.compile(
    r"^(?:Fatal Python error: .*\n(?:.*\n)*?)?(?:(?:Current thread|Thread) 0x[0-9a-f]+ .*\n"
    r"(?:  File .*\n|  <no Python frame>\n)*\n?)+(?:\s*Extension modules: .*\n)?"
    r"(?:.*\(total: \d+\)\n)?",
    re.M,
)


_DUMP_HEADS = ("Current thread 0x", "Thread 0x")  # a dump's first line begins so
_DUMP_START = re.compile(f"^(?:{'|'.join(_DUMP_HEADS)})[0-9a-f]", re.M)


def _before_dump(text: str) -> str:
    """The output before a faulthandler dump that a stop may have cut short (even in its first
    line: then the last line is the start of one)."""
    start = _DUMP_START.search(text)
    if start is not None:
        return text[: start.start()]
    last = text.rpartition("\n")[2]
    if last and any(h.startswith(last) for h in _DUMP_HEADS):
        return text[: len(text) - len(last)]
    return text


# -- what the tests hold -----------------------------------------------------------------------


class LearnerObject:
    """What stands for an object of the learner's code: a test may call it and read its
    attributes, never compare it (but with itself), test its truth, measure, iterate or hash
    it (the learner's code would answer): checks compare plain values. Copied, it is itself."""

    __slots__ = ()
    _memlab_proxy = True

    def _refuse(self, what, *_):
        raise NotPlainValue(
            f"your code gave the grader an object of its own ({_type_name(self)}) where it "
            f"needs a plain value: the grader does not {what} it. Return numbers, strings, "
            "lists, tuples, dicts or tensors there"
        )

    # the very same object, decided here: a deep copy is itself
    def __eq__(self, other):
        return other is self or self._refuse("compare (==)")

    def __ne__(self, other):
        return other is not self and self._refuse("compare (!=)")

    def __lt__(self, other):
        return self._refuse("order (<)")

    __le__ = __gt__ = __ge__ = __lt__

    def __bool__(self):
        return self._refuse("test the truth of")

    def __len__(self):
        return self._refuse("take the len() of")

    def __iter__(self):
        return self._refuse("iterate over")

    __contains__ = __iter__

    def __hash__(self):
        return self._refuse("hash")

    def __index__(self):
        return self._refuse("use as a number")

    __int__ = __float__ = __index__

    def __reduce_ex__(self, protocol):
        return self._refuse("pickle")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class Handle(LearnerObject):
    """An object of the learner's code (an instance, a function, a class) in its process."""

    __slots__ = ("_s", "_h", "_type", "__weakref__")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in FORWARD:
            raise AttributeError(name)
        return self._s.request("getattr", self, name)

    def __setattr__(self, name, value):
        self._s.request("setattr", self, name, value)

    def __delattr__(self, name):
        self._s.request("delattr", self, name)

    def __call__(self, *args, **kwargs):
        return self._s.request("call", self, args, tuple(kwargs.items()))

    def __getitem__(self, key):
        return self._s.request("getitem", self, key)

    def __setitem__(self, key, value):
        self._s.request("setitem", self, key, value)

    def __delitem__(self, key):
        self._s.request("delitem", self, key)

    def __repr__(self):
        try:
            return str(self._s.request("repr", self))
        except (SandboxFailure, Exception):
            return f"<your {self._type} object>"

    __str__ = __repr__

    def __dir__(self):
        return list(self._s.request("dir", self))

    def __del__(self):
        if self._s.dead is None:
            self._s.release.append(self._h)


class Method(LearnerObject):
    """A learner object's bound method (``a.alloc_extend``): one round trip per call."""

    __slots__ = ("_obj", "_name")

    def __init__(self, obj, name):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        kw = tuple(kwargs.items())
        return self._obj._s.request("callmethod", self._obj, self._name, args, kw)

    @property
    def __name__(self):
        return self._name

    def __repr__(self):
        return f"<method {self._name} of your {_type_name(self._obj)} object>"


def _type_name(x) -> str:
    """The type of an object of the learner's code in its words ('ch11_radix_match.Node')."""
    if isinstance(x, Method):
        return f"method {x._name}"
    return x._type if isinstance(x, Handle) else "module"


class LearnerModule(types.ModuleType):
    """The learner's module, living in its learner process; started again after a crash."""

    _LOCAL = {"_path", "_session", "_flagged", "_stamp", "_source", "__file__"}

    def __init__(self, path: Path, modname: str):
        super().__init__(modname)
        source = read_own_file(path)
        for k, v in (("_path", path), ("_session", None), ("_stamp", None)):
            object.__setattr__(self, k, v)
        object.__setattr__(self, "__file__", str(path))
        flagged = ["is a link, not a file of its own"] if source is None else []
        flagged += imports_course_code(source or "")
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_flagged", flagged)

    def _live(self) -> Session:
        if self._flagged:
            raise CourseCodeUsed(self._path.name, self._flagged)
        s = self._session
        if s is None or s.dead is not None:
            s = Session(self)
            object.__setattr__(self, "_session", s)
            try:
                s.wait_ready()
            except BaseException:
                s.stop("its file did not import")
                raise
        return s

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in FORWARD:
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


def read_own_file(path: Path) -> str | None:
    """The learner's file, which must be a file of its own: None for a link (to the course's
    kernel, say) or anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read().decode("utf-8", errors="replace")


def open_module(path: Path, modname: str) -> LearnerModule:
    """The learner's file as a module whose code runs in a learner process, imported now."""
    m = LearnerModule(path, modname)
    m._live()
    return m
