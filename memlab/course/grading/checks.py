"""Checks that teach: a failing check names the invariant that broke and the values that broke it.

A graded test says ``expect_no_sharing({...}, "page")`` rather than ``assert len(set(x)) ==
len(x)``, so the learner reads "page 7 was handed to requests 2 and 5", not a bare assertion.

The comparisons are strict about types: ``expect_equal(got, want)`` with an int64 tensor as
``want`` fails for a Python list, a float32 tensor or a tensor of another shape, and with an int
``want`` fails for a float, a bool or a 0-d tensor. Nothing is converted before it is compared:
a docstring that promises an int64 tensor is checked for one. And nothing the learner's code
could answer for is compared: a value is decoded first (``plain``), and an object of the
learner's code (``loader.is_learner_object``: its ``==``, ``<`` and truth would be the learner's)
where a value is expected fails the check; an input's own objects are compared by identity.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memlab.course.grading.loader import is_learner_object


class CheckFailed(AssertionError):
    """A graded check failed; the message is meant for the learner, as is."""


def is_tensor(x: Any) -> bool:
    """A torch tensor (of the grader's process: what the learner's process sent, decoded)."""
    import torch

    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def _learner_object_in(x: Any, depth: int = 0) -> Any:
    """The first object of the learner's code inside ``x`` (lists, tuples, dicts), or None."""
    if is_learner_object(x):
        return x
    if depth < 8 and type(x) is dict:
        x = [*x.keys(), *x.values()]
    if depth < 8 and type(x) in (list, tuple):
        for v in x:
            found = _learner_object_in(v, depth + 1)
            if found is not None:
                return found
    return None


def plain(got: Any, what: str) -> Any:
    """``got``, once sure it holds no object of the learner's code (only numbers, strings,
    bytes, None, tensors, and lists, tuples and dicts of them); a failed check otherwise."""
    obj = _learner_object_in(got)
    if obj is not None:
        raise CheckFailed(
            f"{what}: expected a plain value, got {kind(obj)}, an object of your code (the "
            "grader compares numbers, strings, lists, tuples, dicts and tensors, never an "
            "object whose == your code answers)"
        )
    return got


def as_list(x: Any) -> Any:
    """Tensors and tuples as plain lists (None stays None), for printing (never for comparing)."""
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [as_list(v) for v in x]
    return x


def _show(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)) and len(v) > 8:
        return f"<hash {bytes(v[:4]).hex()}...>"  # a digest: its first bytes tell two apart
    if isinstance(v, list):
        return "[" + ", ".join(map(_show, v)) + "]"
    return repr(v)


def short(x: Any, limit: int = 16) -> str:
    """A compact repr: long lists show their head and length; digests their first bytes."""
    x = as_list(x)
    if isinstance(x, list) and len(x) > limit:
        return "[" + ", ".join(map(_show, x[:limit])) + f", ... ({len(x)} items)]"
    return _show(x)


def kind(x: Any) -> str:
    """What ``x`` is, in words: 'an int64 tensor of shape (3,)', 'a Python list', 'an int', ..."""
    if x is None:
        return "None"
    if is_tensor(x):
        shape = tuple(x.shape)
        dtype = str(x.dtype).removeprefix("torch.")
        return (
            f"a 0-d {dtype} tensor"
            if not shape
            else f"{_a_tensor(x.dtype)} of shape {shape}"
        )
    names = {
        bool: "a bool",
        int: "an int",
        float: "a float",
        str: "a str",
        bytes: "bytes",
        list: "a Python list",
        tuple: "a tuple",
        dict: "a dict",
    }
    if type(x) in names:
        return names[type(x)]
    if is_learner_object(x):  # in the learner's process: its type's name only
        return f"an object of type {_learner_type(x)}"
    return f"a {type(x).__module__}.{type(x).__qualname__}".replace("a builtins.", "a ")


def _learner_type(x: Any) -> str:
    from memlab.course.grading import sandbox

    return sandbox._type_name(x).removeprefix("builtins.")


def _same_kind(got: Any, want: Any) -> bool:
    if is_tensor(want):
        return (
            is_tensor(got)
            and got.dtype == want.dtype
            and tuple(got.shape) == tuple(want.shape)
        )
    if want is None:
        return got is None
    if isinstance(want, (bool, int, float, str, bytes, list, tuple, dict)):
        return type(got) is type(want)
    return not is_learner_object(got)  # anything else: compared by == only


def _tensors_equal(g, w) -> bool:
    """Same values, NaN equal to NaN (a poisoned buffer must compare equal to its copy)."""
    import torch

    if g.is_floating_point():
        return bool(
            torch.equal(g.isnan(), w.isnan())
            and torch.equal(g.nan_to_num(0.0), w.nan_to_num(0.0))
        )
    return torch.equal(g, w)


def _at(step: str, where: str) -> str:
    """The path to a difference: ``[0][2]``; a sub-value's length or keys are told by their
    values, so the path stops there."""
    return step + (where if where.startswith("[") else "")


def _where(path: str) -> str:
    """A path in words: ``index 3`` (a flat list's), ``flat index 7`` (a tensor's), ``[0][2]``."""
    if path.startswith("flat "):
        return f"flat index {path[6:-1]}"
    if path.count("[") == 1 and path[1:-1].lstrip("-").isdigit():
        return f"index {path[1:-1]}"
    return path


def _mismatch(got: Any, want: Any) -> tuple[str, Any, Any] | None:
    """None when equal in kind and value; else (where, got part, want part) of the first
    difference."""
    if is_learner_object(want):  # an input's object, after the call: the same one
        return None if got is want else ("", got, want)
    if not _same_kind(got, want):
        return "", got, want
    if is_tensor(want):
        g, w = got.detach().cpu(), want.detach().cpu()
        if _tensors_equal(g, w):
            return None
        gl, wl = g.reshape(-1).tolist(), w.reshape(-1).tolist()
        i = next(
            i
            for i, (a, b) in enumerate(zip(gl, wl))
            if a != b and not (a != a and b != b)
        )
        return (f"[{i}]" if want.dim() == 1 else f"flat [{i}]"), gl[i], wl[i]
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return "length", len(got), len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            sub = _mismatch(a, b)
            if sub is not None:
                where, ga, wa = sub
                # show the sub-values, not their lengths
                if where in ("length", "keys"):
                    ga, wa = a, b
                return _at(f"[{i}]", where), ga, wa
        return None
    if isinstance(want, dict):
        if set(got) != set(want):
            return "keys", sorted(got, key=repr), sorted(want, key=repr)
        for k in want:
            sub = _mismatch(got[k], want[k])
            if sub is not None:
                where, ga, wa = sub
                if where in ("length", "keys"):
                    ga, wa = got[k], want[k]
                return _at(f"[{k!r}]", where), ga, wa
        return None
    return None if got == want else ("", got, want)


def expect(cond: bool, message: str) -> None:
    """``cond`` must hold (it is the test's own condition: a learner's object is refused, its
    truth would be the learner's to answer)."""
    plain(cond, message.split(":")[0])
    if not cond:
        raise CheckFailed(message)


def expect_equal(got: Any, want: Any, what: str) -> None:
    """Equal in kind (type, dtype, shape) and in value; the message points at the first
    difference. ``got`` is decoded first: an object of the learner's code is refused, never
    compared (its == would be the learner's)."""
    plain(got, what)
    bad = _mismatch(got, want)
    if bad is None:
        return
    where, g, w = bad
    if not _same_kind(g, w):
        at = f" at {_where(where)}" if where else ""
        raise CheckFailed(
            f"{what}: expected {kind(w)}{at}, got {kind(g)}: {short(got)}"
            + (
                f" (expected {short(want)})"
                if not is_tensor(want) or want.numel() <= 64
                else ""
            )
        )
    if where == "length":
        raise CheckFailed(
            f"{what}: expected {plural(w, 'value')}, got {plural(g, 'value')}: got "
            f"{short(got)}, expected {short(want)}"
        )
    if where == "keys":
        raise CheckFailed(f"{what}: expected the keys {short(w)}, got {short(g)}")
    if where:
        raise CheckFailed(
            f"{what}: at {_where(where)} got {_show(g)}, expected {_show(w)} (got "
            f"{short(got)}, "
            f"expected {short(want)})"
        )
    raise CheckFailed(f"{what}: got {short(got)}, expected {short(want)}")


def plural(n: int, noun: str) -> str:
    """``3 pages``, ``1 page``, ``2 hashes``: a count and its noun (never "1 values")."""
    if n == 1:
        return f"{n} {noun}"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return f"{n} {noun[:-1]}ies"
    return f"{n} {noun}{'es' if noun.endswith(('s', 'sh', 'ch')) else 's'}"


def _a_tensor(dtype) -> str:
    if dtype is None:
        return "a tensor"
    name = str(dtype).removeprefix("torch.")
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} tensor"


def expect_tensor(got: Any, what: str, dtype=None, length: int | None = None) -> list:
    """``got`` must be a tensor (of ``dtype``, 1-D of ``length`` when given); its values as a
    list."""
    if not is_tensor(got):
        raise CheckFailed(
            f"{what}: expected {_a_tensor(dtype)}, got {kind(got)}: {short(got)}"
        )
    if dtype is not None and got.dtype != dtype:
        raise CheckFailed(
            f"{what}: expected {_a_tensor(dtype)}, got {kind(got)}: {short(got)}"
        )
    if length is not None and (got.dim() != 1 or len(got) != length):
        raise CheckFailed(
            f"{what}: expected a 1-D tensor of {plural(length, 'value')}, got {kind(got)}: "
            f"{short(got)}"
        )
    return got.tolist()


def snapshot(x: Any) -> Any:
    """A copy to compare against later: tensors cloned, lists, tuples and dicts copied, an
    object of the learner's code kept as itself (compared by identity)."""
    if is_tensor(x):
        return x.detach().clone()
    if is_learner_object(x):
        return x
    if type(x) in (list, tuple):
        return type(x)(snapshot(v) for v in x)
    if type(x) is dict:
        return {k: snapshot(v) for k, v in x.items()}
    return copy.deepcopy(x)


def expect_unchanged(before: Any, after: Any, what: str) -> None:
    """An input the docstring does not allow to change is the same as before the call."""
    if _mismatch(after, before) is None:
        return
    raise CheckFailed(
        f"{what} was changed in place: it was {short(before)}, it is now {short(after)} (the "
        "caller "
        "still uses it: work on a copy, e.g. x = x - y rather than x -= y)"
    )


def call_keeping_inputs(
    fn: Callable, what: str, *args, mutable: Iterable[str] = (), **kwargs
) -> Any:
    """``fn(*args, **kwargs)``, then check that no tensor or list argument changed (except the
    keyword arguments named in ``mutable``). Positional arguments are named by position."""
    mutable = set(mutable)
    named = [(f"argument {i + 1}", a) for i, a in enumerate(args)] + list(
        kwargs.items()
    )
    kept = [
        (name, a, snapshot(a))
        for name, a in named
        if name not in mutable and (is_tensor(a) or isinstance(a, (list, tuple, dict)))
    ]
    out = fn(*args, **kwargs)
    for name, a, before in kept:
        expect_unchanged(before, a, f"{what}: its input {name}")
    return out


def expect_no_sharing(
    owners: Mapping[Any, Iterable[int]], unit: str = "slot", owner: str = "request"
) -> None:
    """No id may belong to two owners (nor twice to one): e.g. no page handed to two requests."""
    seen: dict[int, Any] = {}
    for who, ids in owners.items():
        for i in as_list(plain(ids, f"the {unit}s of {owner} {who}")):
            if i in seen:
                first = seen[i]
                if first == who:
                    raise CheckFailed(f"{unit} {i} was handed to {owner} {who} twice")
                raise CheckFailed(
                    f"{unit} {i} was handed to {owner}s {first} and {who}"
                )
            seen[i] = who


def expect_raises(
    errors: type | tuple, fn: Callable[[], Any], what: str, naming: str | None = None
) -> None:
    """``fn()`` must raise one of ``errors`` (a clear error for bad input or a refused operation);
    with ``naming``, the error's message must contain that text (the argument or value at fault)."""
    names = " or ".join(
        e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,))
    )
    try:
        got = fn()
    except errors as exc:
        if naming is not None and naming not in str(exc):
            raise CheckFailed(
                f"{what} raised {type(exc).__name__}({str(exc)!r}), whose message should name "
                f"{naming!r}"
            ) from exc
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # the wrong kind of error is a failed check, not a crash
        raise CheckFailed(
            f"{what} should raise {names}, but raised {type(exc).__name__}: {exc}"
        ) from exc
    raise CheckFailed(f"{what} should raise {names}, but returned {short(got)}")
