"""Random cases for the graded tests, drawn from the run's seed, and the smallest one on which a
learner's answer differs.

Every graded test draws its randomness here, from one seed per run: ``MEMLAB_GRADE_SEED`` (the
grader draws it and prints it in its report; ``--seed N`` draws the same cases again), else one
drawn for this process (the plain test suite prints it in its header). ``rng(key)`` is a test's
own stream (its hand-written cases' random ids and sizes); ``check`` runs a *property* on random
cases. No case list is fixed: a file of recorded answers cannot pass. Under
``MEMLAB_GRADE_PROFILE=gradescope`` the properties run on more and larger cases (``hidden()``).

A property is a function of a ``Draw``: it draws its inputs (``d.int``, ``d.pick``, ``d.big``,
``d.sample`` ...), says them in words (``d.given``, ``d.step``) and as code (``d.code``), runs
the learner's code (``d.call``) and the engine's, and compares them (``d.returns``, ``d.books``).
At the first difference ``check`` shrinks the case to the smallest it can find that still
differs in the same way, and fails with a message naming that input in plain words, what each
side gave, and the lines to paste into a notebook cell to see it.

Every choice a draw makes is an int in [0, n], drawn uniformly, and a draw can be replayed from
a record of them; a record that runs out gives 0, the simplest choice. Shrinking edits the
record (drops runs of choices, lowers them towards 0) and keeps an edit when the replay still
fails in the same way: the inputs stay valid by construction, since the property builds them
from the choices (Hypothesis's design). So a generator puts its simplest option first:
``d.pick([1, 2, 3, 4, 16])`` shrinks towards page size 1, ``d.int(0, 40)`` towards 0. Why not
Hypothesis itself: measured on the bug zoo at the same number of cases, its generator (which
favours the simplest values: a bounded draw is at its minimum 4 times in 10) missed 21 of the
102 variant/test failures these uniform draws find, 11 still at four times the cases, and its
shrinking took a third longer for messages of the same size.

A learner's ``NotImplementedError`` is never a difference: it stops the check at once, so the
grader reports an untouched stub as "not written yet".
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable
from typing import Any

from memlab.course.grading.checks import (
    CheckFailed,
    as_list,
    expect_equal,
    is_tensor,
    plain,
    short,
    snapshot,
)

SEED_ENV = "MEMLAB_GRADE_SEED"
PROFILE_ENV = "MEMLAB_GRADE_PROFILE"
# Gradescope's runs: 3 times the public number of random cases, sizes (``d.size``, ``d.count``)
# up to twice as large: about 6 times the public run's time, within a test's time limit.
HIDDEN_TRIALS = 3
HIDDEN_SIZE = 2
SHOWN = 24  # list items shown in words before "..." (the code to paste is never cut)
SHRINK_CALLS = 1500  # replays a shrink may spend
SHRINK_SECONDS = 4.0  # ... and wall time (kernels in the interpreter are slow)


def grade_seed() -> int:
    """The run's seed: ``MEMLAB_GRADE_SEED``, else one drawn now and kept in the environment (so
    that every later call, and every process started from this one, draws the same cases)."""
    value = os.environ.get(SEED_ENV, "").strip()
    if not value:
        value = str(int.from_bytes(os.urandom(4), "big"))
        os.environ[SEED_ENV] = value
    return int(value)


def hidden() -> bool:
    """Whether this run adds the cases the public run does not show (Gradescope's)."""
    return os.environ.get(PROFILE_ENV) == "gradescope"


def _seed_for(key: str) -> int:
    digest = hashlib.sha256(f"{grade_seed()}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rng(key: str) -> random.Random:
    """A stream of its own for ``key`` (a test's name), from the run's seed: the same cases
    whatever else runs, in whatever order."""
    return random.Random(_seed_for(key))


class Differs(CheckFailed):
    """The learner's answer differs from the engine's. ``kind`` names what differed (a shrunk
    case must still differ in the same way)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Raised:
    """What a call raised, kept as a value so it can be compared and shown."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __repr__(self):
        return f"raised {type(self.exc).__name__}" + (
            f": {self.exc}" if str(self.exc) else ""
        )


def raised(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``, or a ``Raised`` when it raises (the engine's side of a check)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return Raised(exc)


def show(x: Any) -> str:
    if isinstance(x, Raised):
        return repr(x)
    return short(x, SHOWN)


def tensor_code(values, dtype: str = "int64") -> str:
    """Source for a tensor of these values: ``torch.tensor([3, 4])`` (an empty one keeps its
    dtype; a long run of consecutive ints is an ``arange``)."""
    values = list(values)
    if (
        dtype == "int64"
        and len(values) > 4
        and values == list(range(values[0], values[0] + len(values)))
    ):
        return f"torch.arange({values[0]}, {values[-1] + 1})"
    return (
        f"torch.tensor({values!r})"
        if values and dtype == "int64"
        else f"torch.tensor({values!r}, dtype=torch.{dtype})"
    )


def _differ(got: Any, want: Any) -> bool:
    if isinstance(want, Raised) or isinstance(got, Raised):
        if isinstance(want, Raised) and isinstance(got, Raised):
            return not isinstance(got.exc, type(want.exc))
        return True
    try:
        expect_equal(got, want, "")
    except CheckFailed:
        return True
    return False


class Draw:
    """One random case: its choices, its description in words, and its code."""

    def __init__(
        self,
        rng: random.Random | None = None,
        record: list[int] | None = None,
        name: str = "",
    ):
        self._rng, self._record = rng, record
        self.choices: list[int] = []
        self.large = HIDDEN_SIZE if hidden() else 1
        self.name = name  # the exercise file, for the code to paste
        self._given: list[str] = []
        self._steps: list[str] = []
        self._code: list[str] = []

    # -- choices --------------------------------------------------------------------------
    def _choose(self, n: int, rand: Callable[[], int] | None = None) -> int:
        """An int in [0, n]: random, or the next one of the record (clipped; 0 past its end)."""
        if n <= 0:
            return 0
        if self._record is None:
            v = rand() if rand else self._rng.randint(0, n)
        else:
            i = len(self.choices)
            v = min(self._record[i], n) if i < len(self._record) else 0
        self.choices.append(v)
        return v

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi]; shrinks towards lo."""
        return lo + self._choose(hi - lo)

    def size(self, lo: int, hi: int) -> int:
        """A count in [lo, hi], or up to ``hi`` times ``HIDDEN_SIZE`` on Gradescope's runs."""
        return self.int(lo, hi * self.large)

    def chance(self, p: float) -> bool:
        """True with probability p; shrinks towards False."""
        return bool(self._choose(1, lambda: int(self._rng.random() < p)))

    def pick(self, options):
        """One of ``options``; shrinks towards the first."""
        options = list(options)
        return options[self._choose(len(options) - 1)]

    def big(self, lo: int, hi: int) -> int:
        """In [lo, hi], spread over magnitudes (as many near 2**30 as near 10); shrinks towards
        lo."""
        bits = self.int(0, max(0, (hi - lo).bit_length()))
        return lo + self._choose(min(hi - lo, (1 << bits) - 1))

    def sample(self, population, k: int) -> list:
        """``k`` distinct items of ``population`` in random order; shrinks towards its first k in
        order."""
        pool = list(population)
        return [pool.pop(self._choose(len(pool) - 1)) for _ in range(k)]

    def count(self, lo: int, hi: int, p: float = 0.6):
        """Yield 0, 1, ... for ``lo`` to ``hi`` items (``hi`` times ``HIDDEN_SIZE`` on
        Gradescope's runs): a "one more?" choice before each item past ``lo``, drawn after the
        previous item's own choices, so that shrinking drops an item by dropping its run of
        choices. ``for i in d.count(1, 4): ...``"""
        n, hi = 0, hi * self.large
        while n < lo or (n < hi and self.chance(p)):
            yield n
            n += 1

    def shuffled(self, items) -> list:
        return self.sample(items, len(items))

    def ids(self, k: int, hi: int, lo: int = 1) -> list[int]:
        """``k`` distinct ids in [lo, hi] in random order, small and large (shrinks to lo,
        lo + 1, ...)."""
        out: list[int] = []
        seen = set()
        while len(out) < k:
            v = (
                self.big(lo, hi)
                if self.chance(0.5)
                else self.int(lo, min(hi, lo + 4 * k + 8))
            )
            while v in seen:  # the next free one: keeps the draw valid for any choices
                v = lo if v >= hi else v + 1
            seen.add(v)
            out.append(v)
        return out

    # -- words and code -------------------------------------------------------------------
    def given(self, **values) -> None:
        """Inputs in plain words: ``page_size=3, prefix_lens=[0]``."""
        self._given += [f"{k}={show(v)}" for k, v in values.items()]

    def step(self, text: str) -> None:
        """One step of a sequence of operations, in words (``free([8, 1])``)."""
        self._steps.append(text)

    def code(self, line: str) -> None:
        """A line of the code to paste (learner names prefixed with ``ex.``)."""
        self._code.append(line)

    def words(self) -> str:
        out = ", ".join(self._given)
        if self._steps:
            steps = "; ".join(f"{i + 1}. {s}" for i, s in enumerate(self._steps))
            out += (" and " if out else "") + f"the steps {steps}"
        return out or "the simplest input"

    # -- the learner's side ---------------------------------------------------------------
    def call(self, what: str, fn: Callable, *args, keep: bool = True, **kwargs):
        """The learner's ``fn(*args, **kwargs)``, or a ``Raised``. With ``keep``, the tensor, list
        and dict arguments must come back unchanged (the caller still uses them)."""
        kept = []
        if keep:
            named = [(f"argument {i + 1}", a) for i, a in enumerate(args)] + list(
                kwargs.items()
            )
            kept = [
                (n, a, _frozen(a))
                for n, a in named
                if isinstance(a, (list, tuple, dict)) or is_tensor(a)
            ]
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as exc:
            return Raised(exc)
        for name, a, before in kept:
            if _differ(_frozen(a), before):
                self.fail(
                    f"{what} changed its input",
                    f"your `{what}` changed its input {name} in place on "
                    f"{self.words()}: it was {show(before)}, it is now {show(a)} (the caller "
                    "still uses it: work on a copy)",
                )
        return out

    # -- comparisons ----------------------------------------------------------------------
    def fail(self, kind: str, message: str) -> None:
        raise Differs(kind, message)

    def _plain(self, what: str, got: Any) -> None:
        """``got`` holds no object of the learner's code (its == would be the learner's)."""
        try:
            plain(got, what)
        except CheckFailed as exc:
            self.fail("not a plain value", f"on {self.words()}, {exc}")

    def returns(self, what: str, got: Any, want: Any, note: str = "") -> None:
        """The learner's ``what`` returned ``got`` where the engine's returned ``want``."""
        self._plain(f"your `{what}` returned a value", got)
        if not _differ(got, want):
            return
        how = (
            "you" if isinstance(got, Raised) else "you returned"
        ) + f" {show(got)}, the engine {show(want)}"
        how += _first_difference(got, want)
        kind = f"{what} returns" + (
            f" {type(got.exc).__name__}" if isinstance(got, Raised) else ""
        )
        self.fail(
            kind,
            f"your `{what}` differs from the engine's on {self.words()}: {how}"
            + (f" ({note})" if note else ""),
        )

    def books(self, what: str, field: str, got: Any, want: Any, note: str = "") -> None:
        """After the learner's ``what``, its ``field`` is ``got`` where the engine's is ``want``."""
        self._plain(f"after your `{what}`, `{field}`", got)
        if not _differ(got, want):
            return
        self.fail(
            f"{what} books {field}",
            f"after your `{what}` on {self.words()}, `{field}` is {show(got)}, the "
            f"engine's {show(want)}{_first_difference(got, want)}"
            + (f" ({note})" if note else ""),
        )

    def same(self, what: str, got: Any, want: Any, note: str = "") -> None:
        """Any other value that must agree (``what`` in words)."""
        self._plain(what, got)
        if _differ(got, want):
            self.fail(
                what,
                f"on {self.words()}, {what} is {show(got)}, the engine's {show(want)}"
                + (f" ({note})" if note else ""),
            )


class _Same:
    """An object inside an argument: the same object must be there after the call (compared by
    identity; a learner's object is no data to copy)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __repr__(self):
        return repr(self.obj)


def _frozen(x: Any) -> Any:
    """A copy of an argument to compare with it after the call: data copied, objects by identity."""
    if is_tensor(x):
        return snapshot(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_frozen(v) for v in x) if type(x) in (list, tuple) else x
    if isinstance(x, dict):
        return {k: _frozen(v) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    return _Same(x)


def _first_difference(got: Any, want: Any) -> str:
    """Where two long lists (or tensors) of one length first differ, when a message cuts them."""
    g, w = as_list(got), as_list(want)
    if (
        not (isinstance(g, list) and isinstance(w, list))
        or len(g) != len(w)
        or len(w) <= SHOWN
    ):
        return ""
    i = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None)
    return (
        ""
        if i is None
        else f"; they first differ at index {i}: yours {show(g[i])}, the engine's {show(w[i])}"
    )


# -- running and shrinking --------------------------------------------------------------------


def _run(prop: Callable[[Draw], None], draw: Draw) -> Differs | None:
    try:
        prop(draw)
    except NotImplementedError:
        raise
    except Differs as exc:
        return exc
    except CheckFailed as exc:  # a check of the property's own (expect...) failed
        return Differs(str(exc).split(":")[0], str(exc))
    except Exception as exc:
        return Differs(
            f"crash {type(exc).__name__}",
            f"on {draw.words()}, reading your answer failed: "
            f"{type(exc).__name__}: {exc}",
        )
    return None


def _shrink(prop, name: str, choices: list[int], kind: str) -> list[int]:
    """The smallest record found that still fails with the same kind."""
    best, calls, t0 = list(choices), 0, time.monotonic()

    def fails(cand: list[int]) -> bool:
        nonlocal best, calls
        if calls >= SHRINK_CALLS or time.monotonic() - t0 > SHRINK_SECONDS:
            return False
        if (len(cand), cand) >= (len(best), best):
            return False
        calls += 1
        d = Draw(record=cand, name=name)
        err = _run(prop, d)
        if err is None or err.kind != kind:
            return False
        best = d.choices[: len(cand)]  # what the replay used (past the record: zeros)
        return True

    def lowered(i: int, v: int) -> bool:
        return i < len(best) and fails(best[:i] + [v] + best[i + 1 :])

    improved = True
    while improved and calls < SHRINK_CALLS:
        improved = False
        # Zero the whole tail from a point on (past a record's end, choices are 0).
        for cut in range(8):
            i = len(best) * cut // 8
            if any(best[i:]) and fails(best[:i]):
                improved = True
                break
        # Lower each choice, first to last: to 0, else halve it while that still fails.
        for i in range(len(best)):
            if i < len(best) and best[i] and lowered(i, 0):
                improved = True
            while i < len(best) and best[i] > 1 and lowered(i, best[i] // 2):
                improved = True
        # Drop a run of k choices (an item of a list, a step of a sequence).
        for k in (8, 6, 5, 4, 3, 2, 1):
            i = len(best) - k
            while i >= 0:
                if fails(best[:i] + best[i + k :]):
                    improved = True
                i = min(i, len(best)) - k
        # Zero a run of k choices.
        for k in (8, 2):
            for i in range(len(best) - k, -1, -k):
                if any(best[i : i + k]) and fails(best[:i] + [0] * k + best[i + k :]):
                    improved = True
    return best


def check(prop: Callable[[Draw], None], *, trials: int, name: str) -> None:
    """Run ``prop`` on ``trials`` random cases of the run's seed (``HIDDEN_TRIALS`` times more on
    Gradescope's runs); at the first difference, shrink it and raise ``CheckFailed`` with the
    smallest case found, in words and as the code to paste.

    ``name`` is the exercise file (``ch04_alloc_extend``): the code to paste loads it with
    ``with exercise(name) as ex:``.
    """
    master = rng(f"{name}.{prop.__name__}")
    for trial in range(trials * (HIDDEN_TRIALS if hidden() else 1)):
        draw = Draw(rng=random.Random(master.getrandbits(64)), name=name)
        err = _run(prop, draw)
        if err is None:
            continue
        record = _shrink(prop, name, draw.choices, err.kind)
        final = Draw(record=record, name=name)
        err = _run(prop, final) or err  # the smallest case's own message
        seed = grade_seed()
        raise CheckFailed(
            f"{err}{paste(final)}\n(the smallest of the differing cases found in "
            f"{trial + 1} random case{'s' if trial else ''} of seed {seed}: --seed {seed} "
            "draws them again)"
        ) from None


PASTE = "\nTo see it, paste into a cell:\n"  # the report keeps what follows whole


def paste(draw: Draw) -> str:
    """The lines to paste into a notebook cell to see the case, one block with its line breaks
    (never cut: a shrunk case is small)."""
    if not draw._code:
        return ""
    lines = [
        "import torch",
        "from memlab.course.notebook import exercise",
        f'with exercise("{draw.name}") as ex:',
    ]
    lines += [f"    {line}" for line in draw._code]
    return PASTE + "\n".join(f"    {line}" for line in lines)
