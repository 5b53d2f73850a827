"""The grader's sandbox (memlab.course.grading.sandbox, .wire): learner code runs in a process of
its own, reached only with data, its own objects and callbacks.

The codec first (two peers in this process, no learner process): what crosses, what may not,
and that a malformed message is refused rather than trusted. Then a toy learner file in a real
learner process: objects driven through proxies with their identity kept, data changed in place
on either side seen on the other, fenced tensors still fenced, callbacks, errors, crashes and
hangs, and a learner process that can neither see the grader's environment nor read or import
the course.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import textwrap
from pathlib import Path

import pytest
import torch

from memlab.course.grading import sandbox, wire
from memlab.course.grading.sandbox import CourseCodeUsed, LearnerCrashed, NotDataError
from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[3]


# -- the codec, in this process ------------------------------------------------------------------


def pair():
    """A grader peer and a learner peer, as the sandbox wires them (proxies stand in as tuples)."""
    g, l = wire.Peer("grader"), wire.Peer("learner")
    g.make_proxy = lambda hid, info: ("proxy", hid)
    g.make_method = lambda obj, name: ("method", obj, name)
    l.make_callback = lambda fid: ("callback", fid)
    return g, l


def cross(src, dst, *values):
    """Encode ``values`` on one side, decode them on the other (through JSON, as on the wire)."""
    header, blobs = src.encode_message("a", list(values))
    header = json.loads(json.dumps(header))
    blobs = [bytearray(bytes(memoryview(b))) for b in blobs]
    return dst.decode_message(header, blobs)[1]


def test_data_crosses_exactly():
    g, l = pair()
    values = [
        None,
        True,
        0,
        -5,
        2**62 + 1,
        1.5,
        float("inf"),
        -0.0,
        1 + 2j,
        "naïve \udce9",
        b"\x00\xff",
        (1, (2, "x")),
        frozenset({1, 2}),
        range(1, 9, 3),
        slice(1, None, 2),
        Ellipsis,
        torch.int64,
        torch.device("cpu"),
        torch.Size([2, 3]),
    ]
    got = cross(l, g, *values)
    for a, b in zip(got, values):
        assert type(a) is type(b) and (a == b or a != a), (a, b)
    assert (
        str(got[7]) == "-0.0"
        and cross(g, l, float("nan"))[0] != cross(g, l, float("nan"))[0]
    )
    # A named tuple the grader builds crosses as a named tuple and comes back as the grader's class.
    from collections import namedtuple

    Item = namedtuple("Item", "identifier offset length")
    (mirror,) = cross(g, l, Item("img", 2, 5))
    assert (
        mirror.identifier == "img"
        and mirror._fields == Item._fields
        and type(mirror) is not Item
    )
    assert (
        cross(l, g, mirror)[0] == Item("img", 2, 5)
        and type(cross(l, g, mirror)[0]) is Item
    )


def test_identity_within_a_message_is_kept_so_pickled_hashes_agree():
    """A hash of pickled data (vLLM's block hashes) changes when two equal strings or tuples are
    one object or two: what is one object on one side is one object on the other."""
    g, l = pair()
    key = ("lora", "L", None)
    mm = "mm"
    value = (b"parent", (1, 2, 3), (key, (mm, "b", 0), (mm, "c", 3), key))
    (got,) = cross(g, l, value)
    assert pickle.dumps(got, protocol=5) == pickle.dumps(value, protocol=5)
    assert got[2][0] is got[2][3] and got[2][1][0] is got[2][2][0]


def test_lists_dicts_sets_and_tensors_are_mirrored_by_identity():
    g, l = pair()
    xs, d = [1, 2], {"a": [3]}
    got_xs, got_d, again = cross(g, l, xs, d, xs)
    assert got_xs == xs and got_xs is again and got_d == d
    got_xs.append(9)  # the learner changes it in place: the grader's list follows
    got_d["a"].append(4)
    cross(l, g, None)
    assert xs == [1, 2, 9] and d == {"a": [3, 4]}
    xs[:] = [7]  # and the other way round
    cross(g, l, None)
    assert got_xs == [7]
    base = torch.arange(12)
    view = base[2:8:2]
    (t,) = cross(g, l, view)
    assert t.tolist() == [2, 4, 6] and t.stride() == (2,) and t.storage_offset() == 2
    t.untyped_storage()  # the whole storage came along: a write past the view lands in the base
    torch.as_strided(t, (1,), (1,), 11).fill_(-1)
    t[0] = 100
    cross(l, g, None)
    assert base[2] == 100 and base[11] == -1
    assert cross(g, l, torch.empty(0, dtype=torch.int64))[0].dtype == torch.int64


def test_garbage_is_forgotten_after_its_changes_are_sent():
    g, l = pair()
    state = torch.zeros(3)
    (mirror,) = cross(l, g, state)  # the learner's tensor, as the grader sees it
    mirror[1:] = 5.0  # changed in place, then dropped: the change still arrives
    del mirror
    cross(g, l, None)
    assert state.tolist() == [0.0, 5.0, 5.0]
    assert not any(e.kind == "T" for e in g.shared.values()), (
        "the dropped tensor is forgotten"
    )


def test_what_is_not_data_stays_out():
    g, l = pair()
    deep = 1
    for _ in range(80):
        deep = [deep]
    for bad in (2**5000, torch.eye(2).to_sparse(), deep):
        with pytest.raises(wire.NotData):
            l.encode_message("a", [bad])
        assert not l.shared, "a refused value registers nothing"
    with pytest.raises(wire.NotData, match="only data"):
        g.encode_message(
            "a", [object()]
        )  # the grader hands over data, learner objects and functions only
    assert (
        cross(g, l, len)[0][0] == "callback"
    )  # a function of the grader becomes a callback


@pytest.mark.parametrize(
    "header",
    [
        [
            "a",
            [{"__class__": "os.system"}],
            [[], [], [], []],
        ],  # a JSON object is no value
        ["a", [["pickle", "gASV"]], [[], [], [], []]],  # an unknown tag
        ["a", [["l", 5]], [[], [], [], []]],  # a shared id that was never defined
        [
            "a",
            [["T", -2]],
            [
                [
                    [-1, "S", ["cpu", 8, [[0, 8]], 0, [0]]],
                    [-2, "T", [-1, "int64", [4], [1], 0, False, "cpu"]],
                ],
                [],
                [],
                [],
            ],
        ],  # 32 bytes from 8
        [
            "a",
            [None],
            [[[-1, "S", ["cpu", 8, [[0, 8]], 0, [0]]]], [], [], []],
        ],  # a blob of the wrong size
        ["a", [["dt", "object"]], [[], [], [], []]],  # a dtype not in the list
        [
            "a",
            [None],
            [[[1, "l", []]], [], [], []],
        ],  # a shared id in the grader's range
        ["a", [["@", 3]], [[], [], [], []]],  # a back-reference to nothing
    ],
)
def test_a_malformed_message_is_refused(header):
    g, _ = pair()
    blobs = [bytearray(4)]
    with pytest.raises((wire.WireError, wire.NotData)):
        g.decode_message(header, blobs)


def test_the_wire_never_unpickles():
    text = Path(wire.__file__).read_text() + Path(sandbox.__file__).read_text()
    assert "pickle" not in text.replace("pickled", "").replace("(pickle,", ""), (
        "the codec is JSON and raw bytes only"
    )
    assert "import memlab" not in Path(wire.__file__).read_text(), (
        "the learner's side imports nothing of memlab"
    )


# -- a learner process -------------------------------------------------------------------------------

TOY = """
import ctypes, os, sys, time
import torch

class Node:
    def __init__(self, key):
        self.key, self.children, self.parent = key, {}, None

    def add(self, key):
        child = Node(key)
        child.parent = self
        self.children[key] = child
        return child

    def __repr__(self):
        return f"Node({self.key})"

class Group:
    def __init__(self):
        self.queued = []

    def free(self, t):
        self.queued.append(t)  # keeps the caller's tensor (the classic bug a test must still see)

    def total(self):
        return [int(t.sum()) for t in self.queued]

def write_into(out, values):
    out[: len(values)] = torch.tensor(values, dtype=out.dtype)

def write_past(out):
    torch.as_strided(out, (1,), (1,), out.storage_offset() + out.numel()).fill_(-9)

def append(xs, v):
    xs.append(v)
    return xs

def call_back(fn, x):
    return fn(x) + 1

def twice(fn, node):
    return fn(node) * 2

def read_past(t):
    return ctypes.c_int64.from_address(t.data_ptr() + t.numel() * t.element_size()).value

def env():
    return sorted(k for k in os.environ if any(w in k for w in ("MEMLAB", "GRADE", "PYTEST", "PYTHONPATH"))), os.getcwd()

def read(path):
    with open(path) as f:
        return f.read()

def try_import(name):
    try:
        __import__(name)
    except ImportError as exc:
        return str(exc)
    return "imported"

def boom():
    ctypes.string_at(0)

def spin():
    while True:
        try:
            time.sleep(0.01)
        except BaseException:
            pass

def sparse():
    return torch.eye(2).to_sparse()

def raises():
    raise ValueError("bad row 7")

def todo():
    raise NotImplementedError

def alloc(nbytes):
    return len(bytearray(nbytes))
"""


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    mod = sandbox.open_module(path, "_memlab_learner_test_toy")
    yield mod
    if mod._session is not None:
        mod._session.stop()


def test_learner_objects_keep_their_identity(toy):
    root = toy.Node(0)
    leaf = root.add(3)
    assert (
        root.children == {3: leaf} and leaf.parent is root and root.children[3] is leaf
    )
    assert isinstance(leaf, toy.Node) and not isinstance(5, toy.Node)
    assert repr(leaf) == "Node(3)" and f"{leaf}" == "Node(3)"
    leaf.key = 4  # set on the learner's object
    assert (
        leaf.key == 4 and toy.twice(lambda n: n.key, leaf) == 8
    )  # a callback given a learner object
    with pytest.raises(AttributeError):
        leaf.missing  # noqa: B018 (the attribute access is the test)


def test_data_changed_in_place_is_seen_on_both_sides(toy):
    xs = [1]
    assert toy.append(xs, 2) is xs and xs == [
        1,
        2,
    ]  # the learner's change, and the same list back
    guard = torch.full((8,), -1)
    toy.write_into(guard[2:5], [7, 8, 9])  # a kernel writing into an output buffer
    assert guard.tolist() == [-1, -1, 7, 8, 9, -1, -1, -1]
    toy.write_past(
        guard[2:5]
    )  # a store past the end lands in the guard band, as in this process
    assert guard[5] == -9
    # The caller's buffer reused after the call: a learner object that kept it sees the change.
    g = toy.Group()
    mine = torch.tensor([1, 2, 3])
    g.free(mine)
    mine[:] = 0
    assert g.total() == [0], (
        "the learner kept the caller's tensor: the caller's change reaches it"
    )


def test_callbacks_run_here_and_may_call_the_learner_again(toy):
    calls = []

    def free(x):
        calls.append(x)
        return toy.append([x], 0)[
            0
        ]  # re-entrant: a call into the learner during its call

    assert toy.call_back(free, 41) == 42 and calls == [41]


def test_errors_keep_their_kind_and_the_learners_line(toy):
    with pytest.raises(ValueError, match="bad row 7") as err:
        toy.raises()
    assert isinstance(err.value, sandbox.LearnerError) and err.value.where.startswith(
        "toy.py:"
    )
    with pytest.raises(NotImplementedError) as err:
        toy.todo()
    assert "in todo" in err.value.where
    with pytest.raises(NotDataError, match="not data"):
        toy.sparse()


def test_an_error_of_any_kind_leaves_the_process_usable(toy):
    # AttributeError (hasattr on a learner object) is no kind the wire refuses: the learner's
    # error comes back and the next call still runs (it once stopped the process as "interrupted").
    leaf = toy.Node(0).add(3)
    assert not hasattr(leaf, "tolist") and leaf.key == 3
    with pytest.raises(
        LookupError, match="from the test"
    ):  # a callback's own error, raised here
        toy.call_back(lambda x: (_ for _ in ()).throw(LookupError("from the test")), 1)
    assert toy.call_back(lambda x: x, 1) == 2 and repr(leaf) == "Node(3)"


def test_a_fenced_tensor_stays_fenced(toy):
    fenced = load_file("tests/exercises/exercise_refs.py").fenced
    t = fenced([1, 2, 3], torch.int64)
    assert toy.append([t], 0)[0].tolist() == [1, 2, 3]
    with pytest.raises(
        LearnerCrashed,
        match=r"died \(signal SIGSEGV\).*last seen at toy.py:\d+ in read_past",
    ):
        toy.read_past(t)  # one element past the end: a segfault, not a value
    assert toy.append([], 1) == [1], "the next call gets a new learner process"


def test_a_crash_and_a_hang_cost_the_call_not_the_grader(toy):
    with pytest.raises(
        LearnerCrashed,
        match=r"died \(signal SIGSEGV\) during this test, last seen at toy.py:\d+ in boom",
    ):
        toy.boom()

    class Alarm(BaseException):
        pass

    def ring(*_):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Alarm) as err:
            toy.spin()  # it swallows every exception in its own process; the alarm goes off here
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert err.value.where.startswith("toy.py:") and "in spin" in err.value.where
    assert toy.append([], 2) == [2]


def test_the_learner_sees_no_grader_and_cannot_reach_the_course(toy, monkeypatch):
    names, cwd = toy.env()
    assert (
        names == []
        and not Path(cwd).resolve().is_relative_to(ROOT)
        and Path(cwd).name.startswith("l")
    )
    with pytest.raises(CourseCodeUsed, match="imports memlab"):
        toy.try_import(
            "memlab"
        )  # refused there (the learner's code may catch that), reported here
    with pytest.raises(CourseCodeUsed, match="imports memlab"):
        toy.env()  # and the file earns nothing from now on


@pytest.mark.parametrize(
    "target",
    [
        "solutions/ch08_sizing.py",
        "tests/exercises/test_ch08_sizing.py",
        "memlab/course/grading/plugin.py",
        "/proc/PPID/environ",
    ],
)
def test_reading_the_course_is_refused_and_reported(tmp_path, target):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    mod = sandbox.open_module(path, "_memlab_learner_test_reader")
    try:
        where = (
            target.replace("PPID", str(os.getpid()))
            if target.startswith("/")
            else str(ROOT / target)
        )
        with pytest.raises(CourseCodeUsed, match="reads"):
            mod.read(where)
        with pytest.raises(CourseCodeUsed):
            mod.env()
    finally:
        if mod._session is not None:
            mod._session.stop()


def test_the_static_check_reads_imports_before_anything_runs():
    found = sandbox.imports_course_code(
        textwrap.dedent("""
        import torch
        from memlab.sglang.allocator.reference import alloc_extend_python
        import importlib
        m = importlib.import_module("solutions.ch04_alloc_extend")
        def f():
            import _pytest.outcomes
    """)
    )
    assert found == [
        "imports memlab.sglang.allocator.reference",
        "imports solutions.ch04_alloc_extend",
        "imports _pytest.outcomes",
    ]
    assert sandbox.imports_course_code("import torch, triton\nimport heapq\n") == []
    assert (
        sandbox.imports_course_code("def broken(:\n") == []
    )  # the learner's process reports the syntax error


def test_a_memory_limit_is_a_memory_error(tmp_path, monkeypatch):
    monkeypatch.setenv(sandbox.LIMITS_ENV, "memory=2G")
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    mod = sandbox.open_module(path, "_memlab_learner_test_limits")
    try:
        assert mod.alloc(1 << 20) == 1 << 20
        with pytest.raises(MemoryError):
            mod.alloc(3 << 30)
    finally:
        mod._session.stop()


def _nobody_runs(python: str) -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not Path(python).exists():
        return False
    import pwd
    import subprocess

    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return False
    return (
        subprocess.run(
            [python, "-c", "pass"],
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=[],
            capture_output=True,
        ).returncode
        == 0
    )


@pytest.mark.skipif(
    not _nobody_runs("/usr/bin/python3"),
    reason="needs root, the user nobody and a system /usr/bin/python3 that user may run",
)
def test_the_learner_process_runs_as_another_user(tmp_path, monkeypatch):
    """The privilege drop Gradescope uses (MEMLAB_SANDBOX_USER), with the existing user nobody and
    the system's Python (this machine's Python with torch is not one nobody may run): the
    learner's process is nobody's, and a file only root may read stays closed to it even where
    the audit hook would let it through (outside the course)."""
    monkeypatch.setattr(sandbox, "_zygote", None)  # a zygote of its own, as nobody
    monkeypatch.setenv(sandbox.USER_ENV, "nobody")
    monkeypatch.setenv(sandbox.PYTHON_ENV, "/usr/bin/python3")
    secret = tmp_path / "secret.txt"
    secret.write_text("root only")
    secret.chmod(0o600)
    path = tmp_path / "plain.py"
    path.write_text(
        "import os\ndef who():\n    return os.getuid()\n"
        "def read(p):\n    try:\n        return open(p).read()\n    except PermissionError:\n"
        "        return 'refused'\n"
    )
    os.chmod(tmp_path, 0o755)
    mod = sandbox.open_module(path, "_memlab_learner_test_nobody")
    try:
        import pwd

        assert mod.who() == pwd.getpwnam("nobody").pw_uid
        assert mod.read(str(secret)) == "refused"
    finally:
        mod._session.stop()
        sandbox._zygote.close()
