"""The grader's sandbox (memlab.course.grading.sandbox, .wire): learner code runs in a process of
its own, reached only with data, its own objects and callbacks.

The codec first (two peers in this process): what crosses and what may not, identity kept,
changes in place seen on both sides, and every malformed message refused rather than trusted.
Then a toy learner file in a real learner process: objects reached through handles that refuse
to be compared, tensors on either side changed in place, fenced tensors still fenced,
callbacks, errors, crashes and hangs, and a learner process that sees none of the grader's
environment. (The learner's process as another user: tests/course/grading/test_gradescope.py.)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from memlab.course.grading import loader, sandbox, wire
from memlab.course.grading.sandbox import CourseCodeUsed, LearnerCrashed, NotDataError
from memlab_tests.exercises.exercise_refs import fenced

ROOT = Path(__file__).resolve().parents[3]


# -- the codec, in this process ------------------------------------------------------------


class Learner(wire.Peer):
    """The learner's side without a process: its objects cross as ("h", id) handles."""

    def __init__(self):
        super().__init__(-1)
        self.tuple_class = wire.Learner.tuple_class.__get__(self)

    def opaque(self, x, m):
        return ["h", id(x) % 1000, type(x).__qualname__]


class Grader(wire.Peer):
    def __init__(self):
        super().__init__(+1)
        self.named = sandbox.Session.named.__get__(self)

    def opaque(self, x, m):
        return ["c", 1]

    def special(self, tag, a):
        return (tag, *a) if tag in ("h", "c") else super().special(tag, a)


def cross(src, dst, value):
    """``value`` encoded on one side and decoded on the other, through JSON as on the wire."""
    header, blobs = src.message("a", value)
    header = json.loads(json.dumps(header))
    blobs = [bytearray(bytes(memoryview(b))) for b in blobs]
    return dst.receive(header, blobs)[1]


def test_data_crosses_exactly():
    g, learner = Grader(), Learner()
    values = (
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
    )
    values += (
        b"\x00\xff",
        (1, (2, "x")),
        frozenset({1, 2}),
        range(1, 9, 3),
        slice(1, None, 2),
    )
    values += (Ellipsis, torch.int64, torch.device("cpu"), torch.Size([2, 3]))
    for back in (cross(learner, g, values), cross(g, learner, values)):
        for a, b in zip(back, values, strict=True):
            assert type(a) is type(b) and (a == b or a != a), (a, b)
    Item = namedtuple("Item", "identifier offset length")
    # the tests' named tuple: one of its own there
    mirror = cross(g, learner, Item("img", 2, 5))
    assert mirror._fields == Item._fields and type(mirror) is not Item
    assert (
        type(cross(learner, g, mirror)) is Item and cross(learner, g, mirror) == mirror
    )
    for dtype in (
        torch.bool,
        torch.int32,
        torch.bfloat16,
        torch.float64,
        torch.complex64,
    ):
        t = torch.arange(6).reshape(2, 3).to(dtype)
        got = cross(learner, g, t)
        assert got.dtype == dtype and torch.equal(got, t)


def test_identity_within_a_message_is_kept_so_pickled_hashes_agree():
    """A hash of pickled data (vLLM's block hashes) changes when two equal strings or tuples are
    one object or two: what is one object on one side is one object on the other."""
    g, learner = Grader(), Learner()
    key, mm = ("lora", "L", None), "mm"
    value = (b"parent", (1, 2, 3), (key, (mm, "b", 0), (mm, "c", 3), key))
    got = cross(g, learner, value)
    assert pickle.dumps(got, protocol=5) == pickle.dumps(value, protocol=5)
    assert got[2][0] is got[2][3] and got[2][1][0] is got[2][2][0]


def test_lists_dicts_sets_and_tensors_are_shared_both_ways():
    g, learner = Grader(), Learner()
    xs, d = [1, 2], {"a": [3]}
    got_xs, got_d, again = cross(g, learner, (xs, d, xs))
    assert got_xs == xs and got_xs is again and got_d == d
    got_xs.append(9)  # the learner changes it in place: the grader's list follows
    got_d["a"].append(4)
    cross(learner, g, None)
    assert xs == [1, 2, 9] and d == {"a": [3, 4]}
    xs[:] = [7]  # and the other way round
    cross(g, learner, None)
    assert got_xs == [7]
    base = torch.arange(12)
    # the whole storage: a store past the view lands there
    t = cross(g, learner, base[2:8:2])
    assert t.tolist() == [2, 4, 6] and t.stride() == (2,) and t.storage_offset() == 2
    torch.as_strided(t, (1,), (1,), 11).fill_(-1)
    t[0] = 100
    cross(learner, g, None)
    assert base[2] == 100 and base[11] == -1
    state = torch.zeros(3)  # the learner's own tensor, changed in place by the grader
    mine = cross(learner, g, state)
    mine[1:] = 5.0
    cross(g, learner, None)
    assert state.tolist() == [0.0, 5.0, 5.0]
    assert (
        cross(learner, g, state) is not mine and cross(learner, g, [state])[0][1] == 5.0
    )


def test_forgotten_objects_still_send_their_last_change():
    g, learner = Grader(), Learner()
    xs = [1]
    theirs = cross(g, learner, xs)
    xs.append(2)
    sid = g.sid_of[id(xs)]
    # dropped: its change goes first
    header, blobs = g.message("a", None, dropping=[sid])
    learner.receive(json.loads(json.dumps(header)), blobs)
    assert theirs == [1, 2] and sid not in learner.entries and sid not in g.entries


def test_a_new_empty_tensor_never_takes_the_id_of_one_being_forgotten():
    """Every empty storage sits at address 0. Keyed by address, the grader sent a new empty
    tensor under the id of a dead one that the same message told the learner to forget: the
    learner's process died ("a tensor on a storage that is not there") under a solution."""
    g, learner = Grader(), Learner()
    cross(g, learner, torch.tensor([], dtype=torch.int64))  # then nothing here holds it
    dropping = sandbox.Session._collect(g)
    assert len(dropping) == 1
    again = torch.tensor([], dtype=torch.int64)
    header, blobs = g.message("a", again, dropping=dropping)
    got = learner.receive(json.loads(json.dumps(header)), blobs)[1]
    assert got.tolist() == [] and got.dtype == torch.int64
    assert g.entries.keys() == learner.entries.keys() and dropping[0] not in g.entries


def test_a_message_never_forgets_an_id_it_names():
    """Whatever ``dropping`` says, an id the message itself names stays known on both sides."""
    g, learner = Grader(), Learner()
    xs, t = [1], torch.arange(3)
    cross(g, learner, (xs, t))
    named = list(g.entries)  # the list's id and the storage's
    assert len(named) == 2
    header, blobs = g.message("a", (xs, t[1:]), dropping=named)
    got = learner.receive(json.loads(json.dumps(header)), blobs)[1]
    assert got[0] == [1] and got[1].tolist() == [1, 2]
    assert set(named) <= g.entries.keys() and set(named) <= learner.entries.keys()


def test_a_resized_storage_leaves_no_stale_key_behind():
    """A storage's address changes when it is resized (the learner's code may resize its copy
    of a grader's storage; one this side has sent may not be): the table must still forget it
    by its identity, else a later storage at its old address would be sent under a forgotten
    id."""
    g, learner = Grader(), Learner()
    t = torch.arange(4)
    theirs = cross(g, learner, t)
    theirs.untyped_storage().resize_(1 << 16)
    del t, theirs
    cross(g, learner, None)  # no dropping: the resize alone changes nothing shared
    header, blobs = g.message("a", None, dropping=sandbox.Session._collect(g))
    learner.receive(json.loads(json.dumps(header)), blobs)
    assert g.entries == {} == learner.entries
    assert g.sid_of == {} == learner.sid_of


def test_a_change_in_a_message_that_was_not_sent_is_sent_with_the_next():
    """A message whose encoding fails is not sent: the changes it saw are still to be told."""
    g, learner = Grader(), Learner()
    xs, ys = [1], [2]
    theirs = cross(g, learner, (xs, ys))
    xs.append(3)  # a change, seen first by a message that fails on ys
    ys.append(torch.zeros(2).to_sparse())
    with pytest.raises(wire.NotData):
        g.message("a", None)
    ys.pop()
    cross(g, learner, None)
    assert theirs[0] == [1, 3] and theirs[1] == [2]


def test_what_is_not_data_stays_out():
    learner = Learner()
    deep = 1
    for _ in range(80):
        deep = (deep,)  # tuples cross inline (lists are shared, each on its own)
    for bad in (torch.eye(2).to_sparse(), deep):
        with pytest.raises(wire.NotData):
            learner.message("a", bad)
        assert not learner.entries, "a refused value registers nothing"
    session = sandbox.Session.__new__(sandbox.Session)
    with pytest.raises(wire.NotData, match="cannot hand"):
        sandbox.Session.opaque(session, object(), None)


EMPTY = [[], [], [], []]
STORAGE = [-1, "B", ["cpu", 8, [[0, 8]], 0, [0]]]


@pytest.mark.parametrize(
    "header",
    [
        ["a", {"__class__": "os.system"}, EMPTY, []],  # a JSON object is no value
        ["a", ["pickle", "gASV"], EMPTY, []],  # an unknown tag
        ["a", ["R", -3], EMPTY, []],  # a shared id never defined
        [
            "a",
            ["T", -1, "int64", [4], [1], 0],
            [[STORAGE], [], [], []],
            [],
        ],  # 32 bytes of 8
        [
            "a",
            ["T", -1, "int64", [1], [1], 1],
            [[STORAGE], [], [], []],
            [],
        ],  # past the end
        ["a", ["R", -1], [[STORAGE], [], [], []], []],  # a storage is no value
        [
            "a",
            None,
            [[[-1, "B", ["cpu", 8, [[0, 8]], 0, [0]]]], [], [], []],
            [],
        ],  # 4 bytes
        [
            "a",
            None,
            [[[-1, "B", ["cpu", 1 << 40, [], 0, []]]], [], [], []],
            [],
        ],  # a terabyte
        ["a", None, [[[-1, "B", ["meta", 8, [[0, 8]], 0, [0]]]], [], [], []], []],
        ["a", ["dt", "object"], EMPTY, []],  # a dtype not in the list
        ["a", None, [[[1, "L", []]], [], [], []], []],  # an id in the grader's range
        ["a", ["@", 3], EMPTY, []],  # a back-reference to nothing
        ["a", ["d", ["t", [["t", [1]]]]], EMPTY, []],  # a dict item that is no pair
        ["a", None, [[], [[5, []]], [], []], []],  # a change to nothing shared
        ["a", ["r", [1, 2.5, 1]], EMPTY, []],  # a range of floats
        ["a", None],  # the wrong shape
    ],
)
def test_a_malformed_message_is_refused(header):
    g = Grader()
    with pytest.raises(
        (wire.NotData, wire.WireError, ValueError, LookupError, TypeError)
    ):
        g.receive(header, [bytearray(4)])


def test_a_view_of_a_fenced_tensor_may_not_reach_its_fence():
    """The grader rebuilds no fence: a view the learner sends must lie where the grader may
    read (a view of the unreadable page would crash the grader's process on demand)."""
    g, learner = Grader(), Learner()
    t = fenced([1, 2, 3], torch.int64)
    got = cross(g, learner, t)
    sid = g.sid_of[wire.storage_key(t.untyped_storage())]
    assert got.tolist() == [1, 2, 3] and g.entries[sid][1][0] != [
        [0, g.entries[sid][0].numel()]
    ]
    past = ["a", ["T", sid, "int64", [4], [1], t.storage_offset()], EMPTY, []]
    with pytest.raises(wire.NotData, match="past what its storage may read"):
        g.receive(past, [])


def test_the_wire_never_unpickles_and_the_learners_side_imports_no_memlab():
    import ast

    text = Path(wire.__file__).read_text() + Path(sandbox.__file__).read_text()
    assert "import pickle" not in text and "loads(" not in text.replace(
        "json.loads(", ""
    )
    tree = ast.parse(Path(wire.__file__).read_text())
    imported = [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m and m.startswith("memlab")], imported


# -- learner objects -----------------------------------------------------------------------

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

    def __eq__(self, other):
        return True  # a check that asked this object would always pass

class Rows:
    def __init__(self):
        self.state = torch.zeros(4, 2)
        self.kept = None

    def keep(self, t):
        self.kept = t  # keeps the caller's tensor (the classic bug a test must still see)

    def sums(self):
        return [float(self.state.sum()), int(self.kept.sum())]

def write_into(out, values):
    out[: len(values)] = torch.tensor(values, dtype=out.dtype)

def write_past(out):
    torch.as_strided(out, (1,), (1,), out.storage_offset() + out.numel()).fill_(-9)

def append(xs, v):
    xs.append(v)
    return xs

def call_back(fn, x):
    return fn(x) + 1

def read_past(t):
    return ctypes.c_int64.from_address(t.data_ptr() + t.numel() * t.element_size()).value

def env():
    return sorted(os.environ), os.getcwd(), os.getuid()

def read(path):
    with open(path) as f:
        return f.read()

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


def test_learner_objects_keep_their_identity_and_refuse_comparisons(toy):
    root = toy.Node(0)
    leaf = root.add(3)
    assert root.children[3] is leaf and leaf.parent is root and repr(leaf) == "Node(3)"
    leaf.key = 4  # set on the learner's object
    assert leaf.key == 4 and toy.call_back(lambda n: n.key, leaf) == 5
    assert loader.is_learner_object(leaf) and loader.is_learner_object(toy.Node)
    # itself, decided here
    assert not loader.is_learner_object(leaf.key) and leaf == leaf
    for refused in (
        lambda: leaf == root,
        lambda: leaf != root,
        lambda: leaf < root,
        lambda: bool(leaf),
        lambda: len(leaf),
        lambda: list(leaf),
        lambda: hash(leaf),
        lambda: [1, 2][leaf],
        lambda: pickle.dumps(leaf),
    ):
        with pytest.raises(
            sandbox.NotPlainValue, match=r"object of its own \(toy.Node\)"
        ):
            refused()
    with pytest.raises(AttributeError):
        leaf.missing  # noqa: B018 (the attribute access is the test)


def test_data_changed_in_place_is_seen_on_both_sides(toy):
    xs = [1]
    # the learner's change, the same list
    assert toy.append(xs, 2) is xs and xs == [1, 2]
    guard = torch.full((8,), -1)
    toy.write_into(guard[2:5], [7, 8, 9])  # a kernel writing into an output buffer
    assert guard.tolist() == [-1, -1, 7, 8, 9, -1, -1, -1]
    toy.write_past(guard[2:5])  # a store past the end lands in the guard band, as here
    assert guard[5] == -9
    rows, mine = toy.Rows(), torch.tensor([1, 2, 3])
    rows.keep(mine)
    mine[:] = 0  # the caller reuses its buffer: the learner's kept copy sees it
    rows.state[1:3] = 5.0  # a test writes into the learner's own tensor
    assert rows.sums() == [20.0, 0]


def test_callbacks_run_here_and_may_call_the_learner_again(toy):
    calls = []

    def free(x):
        calls.append(x)
        # re-entrant: a call into the learner during its call
        return toy.append([x], 0)[0]

    assert toy.call_back(free, 41) == 42 and calls == [41]
    with pytest.raises(LookupError, match="from the test"):  # a callback's own error
        toy.call_back(lambda x: (_ for _ in ()).throw(LookupError("from the test")), 1)
    assert toy.call_back(lambda x: x, 1) == 2


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
    assert toy.append([], 1) == [1], "the process is still there for the next call"


def test_a_fenced_tensor_stays_fenced(toy):
    t = fenced([1, 2, 3], torch.int64)
    assert toy.append([t], 0)[0].tolist() == [1, 2, 3]
    with pytest.raises(
        LearnerCrashed, match=r"SIGSEGV\).*last seen at toy.py:\d+ in read_past"
    ):
        toy.read_past(t)  # one element past the end: a segfault there, not a value here
    assert toy.append([], 1) == [1], "the next call gets a new learner process"


def test_a_crash_and_a_hang_cost_the_call_not_the_grader(toy):
    with pytest.raises(
        LearnerCrashed, match=r"SIGSEGV\) during this test, last seen at toy"
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
            toy.spin()  # it swallows every exception there; the alarm goes off here
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert err.value.where.startswith("toy.py:") and "in spin" in err.value.where
    assert toy.append([], 2) == [2]


def test_the_learner_sees_none_of_the_grader_and_its_reads_of_the_course_are_told(toy):
    names, cwd, _ = toy.env()
    assert not [n for n in names if n.startswith(("MEMLAB", "PYTEST", "PYTHONPATH"))], (
        names
    )
    assert not Path(cwd).resolve().is_relative_to(ROOT)
    with pytest.raises(CourseCodeUsed, match="reads .*solutions/ch08_sizing.py"):
        toy.read(str(ROOT / "solutions" / "ch08_sizing.py"))
    with pytest.raises(CourseCodeUsed):
        toy.env()  # and the file earns nothing from now on


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
    assert sandbox.imports_course_code("def broken(:\n") == []  # its process says why


def test_a_link_is_no_file_of_ones_own(tmp_path):
    (tmp_path / "mine.py").symlink_to(ROOT / "kernels" / "alloc_extend.py")
    with pytest.raises(CourseCodeUsed, match="is a link, not a file of its own"):
        sandbox.open_module(tmp_path / "mine.py", "_memlab_learner_test_link")


def test_a_memory_limit_is_a_memory_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_SANDBOX_LIMITS", "as=6G")
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    mod = sandbox.open_module(path, "_memlab_learner_test_limits")
    try:
        assert mod.alloc(1 << 20) == 1 << 20
        with pytest.raises(MemoryError):
            mod.alloc(8 << 30)
    finally:
        mod._session.stop()


def test_without_fork_each_learner_process_starts_afresh(tmp_path, monkeypatch):
    """macOS has no zygote (its torch may not be forked): a process of its own per file."""
    monkeypatch.setattr(sandbox, "_zygote", None)
    monkeypatch.setattr(sandbox.sys, "platform", "darwin")
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    mod = sandbox.open_module(path, "_memlab_learner_test_nofork")
    try:
        assert mod._session.proc is not None and mod.append([1], 2) == [1, 2]
        with pytest.raises(LearnerCrashed, match="SIGSEGV"):
            mod.boom()
        assert mod.append([], 3) == [3]
    finally:
        mod._session.stop()
        sandbox._zygote.close()
        monkeypatch.setattr(sandbox, "_zygote", None)


# -- the end of grading: no process of the student's user outlives it -----------------------

LEAVER = """
import os, sys, time
if os.fork() == 0:  # a daemon in a session of its own (as dishonest/write_results/ leaves)
    os.setsid()
    for _ in range(3):
        if os.fork() == 0:
            break
    hold = bytearray(b"x" * (256 << 20))  # touched: its teardown after SIGKILL takes a while
    open(f"{sys.argv[1]}/{os.getpid()}", "w").close()
    while True:
        time.sleep(1)
os._exit(0)
"""


def test_no_process_of_the_students_user_runs_once_it_is_ended():
    """``end_processes_of`` returns once every process of the user is gone: a process killed
    goes on until the kernel has torn it down (a while for a large one, longer under load), and
    the grader used to return with the kill sent, leaving one to be seen running after grading
    (test_dishonest's "the student's processes outlived grading")."""
    from memlab_tests.course.grading import image

    name = "memlab-gs-end"  # a user of its own: every process of it is killed
    image.need(image.user(name) is not None, "needs root and useradd")
    python = image._runnable_python(name)
    image.need(python is not None, "needs a Python the user may run")
    ready = Path(tempfile.mkdtemp(prefix="memlab-end-"))  # where the user may write
    os.chmod(ready, 0o777)
    try:
        for _ in range(3):
            image.as_user(name, [python, "-I", "-c", LEAVER, str(ready)])
            deadline = time.monotonic() + 60
            while len(list(ready.iterdir())) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(list(ready.iterdir())) == 4
            assert sandbox.running_as(image.user(name)[0])  # the check sees them
            assert sandbox.end_processes_of((*image.user(name), name)) == []
            assert sandbox.running_as(image.user(name)[0]) == []
            for f in ready.iterdir():
                f.unlink()
    finally:
        image.clean_up_after(name)
        shutil.rmtree(ready, ignore_errors=True)


def test_a_dump_cut_short_by_the_stop_is_not_shown_as_the_learners_output():
    """A timed-out learner process is sent SIGUSR1 (faulthandler dumps its threads) and killed
    as soon as its own line is read, so the dump the grader holds may end anywhere, even mid-line.
    Whatever of it was read is the grader's: the learner's output is what came before it. Seen in
    a full run: a dump cut after '  File ".../wire.py"' reached a report as "your code printed"."""
    code = (
        "import faulthandler, os, signal, sys, threading\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
        "print('my own line', flush=True)\n"
        "threading.Thread(target=lambda: __import__('time').sleep(5), daemon=True).start()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    text = out.stdout + out.stderr
    mine = "my own line\n"
    assert text.startswith(mine) and "File " in text, text
    cuts = range(len(mine), len(text) + 1)
    for cut in cuts:
        assert sandbox._before_dump(text[:cut]) == mine, text[:cut]
    # the whole-dump pattern alone leaves a cut line behind: why the stop cuts at the header
    leaked = [c for c in cuts if "File" in sandbox._DUMP.sub("", text[:c])]
    assert leaked, "every cut dump was removed by _DUMP alone"
