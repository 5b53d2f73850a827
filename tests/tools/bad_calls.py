#!/usr/bin/env python
"""Bad calls at memlab's SGLang side and common layer, generated apart from the course's own list.

    python tests/tools/bad_calls.py          # per entry point, debug mode on and off, then totals
    python tests/tools/bad_calls.py --list   # also every call that is not clean, with what it got
    python tests/tools/bad_calls.py --entry alloc_extend

``tests/tools/bad_input.py`` holds the 950 bad calls the course thought of, one by one. This harness
writes none by hand: each entry point is described once by a good call (its objects, built small,
and its arguments), and the calls are generated from it:

- every argument in turn replaced by values of the wrong kind for what it is (a count: None, a
  float, a bool, a str, a list, a 0-d and a 2-element tensor, a negative, a huge one; ids: a list, a
  float, bool or int8 tensor, 2-D, 0-d, on the meta device, shorter, longer, negative, past the
  end; a sequence of token ids: None or a float inside, a str, a tensor, a nested list; an object:
  another type, or one that belongs to other books);
- misuse in time (scenarios): frees twice, after ``clear``, inside and outside free groups, a lock
  released twice, a request released twice or released without its lock, state freed twice, ids
  of another allocator.

Each generated call runs on fresh objects, once with ``debug_mode`` on and once with it off, and
lands in one class:

    clean    memlab's own error (a ``raise`` or ``assert`` line of memlab's), nothing changed;
             or the refusal an allocation promises (None), nothing changed
    raw      an error raised inside Python or torch (a TypeError from ``<``, an IndexError of
             torch's, an AttributeError of None ...), nothing changed
    changed  an error, but the objects changed before it was raised
    silent   accepted, and the books still balance (the value was harmless, or meant)
    corrupt  accepted, and the books are broken afterwards: a page free twice or lost, a row
             free and held, a tree whose counters disagree with its nodes, a lock nobody holds

The books are read with the harness's own knowledge of what the requests hold, and with the
objects' debug checks forced on after the call, whatever mode the call ran in. A call that
launches a Triton kernel runs in a child process (bad ids could crash the interpreter).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # run as a script: reach the tests' package by path
    import runpy

    _here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(_here, "loading.py"))["register"]()

from memlab.common.env import ensure_kernel_mode

ensure_kernel_mode()

import torch

from memlab_tests.tools.bad_input import Hang, raised_by_memlab, snap

CLASSES = ("clean", "raw", "changed", "silent", "corrupt")
MODES = ("debug on", "debug off")
T64 = torch.int64


def T(*xs, dtype=T64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


@dataclass
class Entry:
    """One public entry point: how to build its objects (``build(debug)`` -> env), its good
    arguments (``args(env)`` -> dict) and how to call it (``call(env, **args)``). ``books(env)``
    raises when the objects' books are broken; ``kinds`` names what an argument is when its
    good value alone does not say (``"ids"``, ``"tokens"``, ``"data"``...); ``also`` adds
    hand-shaped wrong values per argument (``args(env)`` -> ``[(argument, label, value)]``)."""

    name: str
    build: Callable[[bool], SimpleNamespace]
    call: Callable[..., Any]
    args: Callable[[SimpleNamespace], dict]
    books: Callable[[SimpleNamespace], None] | None = None
    kinds: dict = field(default_factory=dict)
    also: Callable[[SimpleNamespace], list] | None = None
    kernel: bool = False
    skip: tuple = ()  # arguments not mutated (a callback, a flag whose every value is meant)
    refuses: bool = (
        False  # None is its answer to a demand it cannot meet (an allocation)
    )


@dataclass
class Call:
    """One generated bad call."""

    entry: Entry
    label: str
    run: Callable[[SimpleNamespace], Any]  # env -> result
    prepare: Callable[[SimpleNamespace], None] | None = (
        None  # steps before the snapshot
    )


ENTRIES: list[Entry] = []
SCENARIOS: list[tuple[Entry, str, Callable, Callable]] = []


def entry(name, build, call, args, books=None, **kw) -> Entry:
    """Describe an entry point (``build`` None: the objects do not have it, nothing is added)."""
    e = Entry(name, build, call, args, books, **kw)
    if build is not None:
        ENTRIES.append(e)
    return e


def scenario(e: Entry, label: str, prepare, run) -> None:
    """Misuse in time: ``prepare(env)`` runs first (and is not judged), then ``run(env)`` is."""
    SCENARIOS.append((e, label, prepare, run))


# ---- wrong values, by what the good value is ---------------------------------------------------


def wrong_values(good, kind: str | None = None) -> list[tuple[str, Any]]:
    """Values of the wrong kind, or out of range, for an argument whose good value is ``good``."""
    out = [("None", None), ("an object()", object()), ("a dict", {"k": 1})]
    if kind == "skip":
        return []
    if isinstance(good, bool):
        return out + [("str 'yes'", "yes"), ("int 2", 2), ("float 0.5", 0.5)]
    if isinstance(good, int):
        return out + [
            ("str", str(good)),
            ("float", good + 0.5),
            ("integral float", float(good)),
            ("bool", True),
            ("nan", math.nan),
            ("negative", -1 - abs(good)),
            ("huge", 2**62),
            ("a list", [good]),
            ("2-element tensor", torch.tensor([good, good])),
            ("float 0-d tensor", torch.tensor(float(good))),
        ]
    if isinstance(good, float):
        return out + [
            ("str", str(good)),
            ("nan", math.nan),
            ("inf", math.inf),
            ("negative", -abs(good) - 1.0),
            ("a list", [good]),
        ]
    if isinstance(good, str):
        return out + [("int", 3), ("unknown str", "nope"), ("empty str", "")]
    if isinstance(good, torch.dtype):
        return out + [
            ("str", "float16"),
            ("int dtype", torch.int32),
            ("bool", torch.bool),
        ]
    if isinstance(good, torch.Tensor):
        return out + _wrong_tensors(good, kind)
    if isinstance(good, (list, tuple, range)) and kind == "tokens":
        g = list(good)
        return out + [
            ("str", "abc"),
            ("None inside", g[:-1] + [None]),
            ("float inside", g[:-1] + [1.5]),
            ("bool inside", g[:-1] + [True]),
            ("huge id", g[:-1] + [2**64]),
            ("nested", [g]),
            ("a set", set(g)),
            ("float tensor", torch.tensor(g, dtype=torch.float32)),
            ("2-D tensor", torch.tensor([g])),
        ]
    if isinstance(good, (list, tuple)):
        g = list(good)
        wrong = [("str", "abc"), ("None inside", g[:-1] + [None] if g else [None])]
        wrong += [("an int", 3), ("nested", [g]), ("a generator", iter(g))]
        if g and all(type(x) is int for x in g):
            wrong += [
                ("float inside", g[:-1] + [1.5]),
                ("negative inside", g[:-1] + [-5]),
                ("huge inside", g[:-1] + [2**62]),
                ("shorter", g[:-1]),
                ("longer", g + g[-1:]),
                ("a tensor", torch.tensor(g)),
            ]
        return out + wrong
    return out + [("an int", 3), ("a str", "x")]


def _wrong_tensors(t: torch.Tensor, kind) -> list:
    n = t.numel()
    out = [("a list", t.tolist()), ("meta device", t.to("meta"))]
    if t.dtype == torch.bool:  # a mask
        return out + [("int tensor", t.long()), ("one shorter", t.reshape(-1)[:-1])]
    if not t.dtype.is_floating_point:
        out += [
            ("float tensor", t.float()),
            ("bool tensor", t.bool()),
            ("int8 tensor", t.to(torch.int8)),
            ("2-D", t.reshape(1, -1)),
            ("negative ids", -t - 1),
            ("ids past the end", t + 2**40),
        ]
        if n:
            out += [("0-d", t.reshape(-1)[0]), ("one shorter", t.reshape(-1)[:-1])]
            out += [("one longer", torch.cat((t.reshape(-1), t.reshape(-1)[-1:])))]
        if n > 1:
            out += [("repeated", t.reshape(-1)[:1].repeat(n))]
        return out
    out += [("int tensor", t.long()), ("extra dim", t.unsqueeze(0))]
    if t.dim():
        out += [("last dim one short", t[..., :-1])]
        out += [("one row short", t[:-1])] if t.shape[0] else []
    return out


# ---- the calls ---------------------------------------------------------------------------------


def calls(entries=None, scenarios=None) -> list[Call]:
    """Every generated call: each argument of each entry point replaced in turn by each wrong value
    (and the entry's own ``also`` values), then the scenarios."""
    entries = ENTRIES if entries is None else entries
    scenarios = SCENARIOS if scenarios is None else scenarios
    out = []
    for e in entries:
        env = e.build(True)
        good = e.args(env)
        for name, value in good.items():
            if name in e.skip:
                continue
            for label, _ in wrong_values(value, e.kinds.get(name)):
                out.append(Call(e, f"{name}: {label}", _mutated(e, name, label)))
        for name, label, _ in e.also(env) if e.also else ():
            out.append(Call(e, f"{name}: {label}", _also(e, name, label)))
    for e, label, prepare, run in scenarios:
        out.append(Call(e, label, run, prepare))
    return out


def _mutated(e: Entry, name: str, label: str):
    """A call with argument ``name`` wrong: the value is drawn again from fresh objects, so a
    value tied to the objects (another tensor of theirs) matches the objects it is used on."""

    def run(env):
        good = e.args(env)
        value = dict(wrong_values(good[name], e.kinds.get(name)))[label]
        return e.call(env, **{**good, name: value})

    return run


def _also(e: Entry, name: str, label: str):
    def run(env):
        value = next(v for n, lbl, v in e.also(env) if (n, lbl) == (name, label))
        return e.call(env, **{**e.args(env), name: value})

    return run


# ---- classification ----------------------------------------------------------------------------


class _Timer:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        def alarm(signum, frame):
            raise Hang("timed out")

        self.old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)


def classify(c: Call, debug: bool, timeout: float = 3.0) -> tuple[str, str]:
    """(class, what happened) of one call in one mode."""
    env = c.entry.build(debug)
    if c.prepare is not None:
        c.prepare(env)
    _warm(env)
    before = snap(env)
    try:
        with _Timer(timeout):
            try:
                result = c.run(env)
            except Hang:
                return "corrupt", "the call never returned"
            except Exception as exc:
                what = f"{type(exc).__name__}: {str(exc)[:120]}"
                if snap(env) != before:
                    return "changed", what
                return ("clean" if raised_by_memlab(exc) else "raw"), what
            unchanged = snap(env) == before
            try:
                env.result = (
                    result  # what an accepted allocation handed out is held now
                )
                if c.entry.books is not None:
                    c.entry.books(env)
            except Hang:
                return "corrupt", "accepted; the books check never returned (a cycle?)"
            except Exception as exc:
                return (
                    "corrupt",
                    f"accepted; then {type(exc).__name__}: {str(exc)[:110]}",
                )
    except Hang:
        return "corrupt", "timed out"
    if c.entry.refuses and result is None and unchanged:
        return "clean", "refused (None), nothing changed"
    return "silent", "accepted" + ("" if unchanged else ", objects changed")


def _warm(env) -> None:
    """Build the debug ledgers now: an allocator builds its ledger of held pages on first use, a
    cache and no change of its books."""
    seen, todo = set(), [env]
    while todo:
        x = todo.pop()
        if id(x) in seen or isinstance(x, (torch.Tensor, type)):
            continue
        seen.add(id(x))
        if isinstance(x, (list, tuple)):
            todo += list(x)
            continue
        if callable(getattr(x, "_ledger", None)) and getattr(x, "debug_mode", False):
            try:
                x._ledger()
            except Exception:
                pass  # a composite without a page ledger of its own
        fields = dict(getattr(x, "__dict__", {}))
        for klass in type(x).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if hasattr(x, name):
                    fields[name] = getattr(x, name)
        todo += [v for v in fields.values() if type(v).__module__.startswith("memlab")]
        todo += [v for v in fields.values() if isinstance(v, (list, tuple))]


def classify_safe(c: Call, debug: bool) -> tuple[str, str]:
    if not c.entry.kernel:
        return classify(c, debug)
    import pickle

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: classify, send the answer, leave without cleanup
        os.close(read)
        try:
            out = classify(c, debug)
        except BaseException as exc:
            out = ("corrupt", f"the harness failed: {exc!r}")
        os.write(write, pickle.dumps(out))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "corrupt", f"the process crashed (signal {os.WTERMSIG(status)})"
    return pickle.loads(data)


def run(cs: list[Call] | None = None, modes=MODES) -> list[tuple[Call, str, str, str]]:
    """(call, mode, class, what) for every call in every mode."""
    build_entries()
    cs = calls() if cs is None else cs
    return [
        (c, mode, *classify_safe(c, mode == "debug on")) for c in cs for mode in modes
    ]


def totals(results) -> dict[str, Counter]:
    out = {m: Counter() for m in MODES}
    for _, mode, cls, _ in results:
        out[mode][cls] += 1
    return out


def table(results, listing: bool = False) -> str:
    by = defaultdict(Counter)
    for c, mode, cls, _ in results:
        by[(c.entry.name, mode)][cls] += 1
    head = f"{'entry point':<50}{'mode':>10}" + "".join(f"{k:>9}" for k in CLASSES)
    lines = [head, "-" * len(head)]
    for (name, mode), cnt in by.items():
        lines.append(
            f"{name:<50}{mode:>10}" + "".join(f"{cnt[k] or '':>9}" for k in CLASSES)
        )
    lines.append("-" * len(head))
    entries = len({n for n, _ in by})
    for mode, cnt in totals(results).items():
        lines.append(
            f"{f'TOTAL ({entries} entry points)':<50}{mode:>10}"
            + "".join(f"{cnt[k]:>9}" for k in CLASSES)
            + f"{sum(cnt.values()):>8} calls"
        )
    if listing:
        lines.append("")
        for c, mode, cls, what in results:
            if cls != "clean":
                lines.append(f"{cls:<8} {mode:<9} {c.entry.name} [{c.label}]: {what}")
    return "\n".join(lines)


def build_entries() -> None:
    if not ENTRIES:
        from memlab_tests.tools import bad_calls_entries

        bad_calls_entries.register()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list every call not clean")
    ap.add_argument("--entry", help="only entry points whose name contains this")
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    build_entries()
    cs = [c for c in calls() if args.entry is None or args.entry in c.entry.name]
    print(table(run(cs), args.list))
    return 0


if __name__ == "__main__":  # the package's module: the one the entries register with
    from memlab_tests.tools import bad_calls

    sys.exit(bad_calls.main())
