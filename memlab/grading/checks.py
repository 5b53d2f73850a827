"""Checks that teach: a failing check names the invariant that broke and the values that broke it.

A graded test says ``expect_no_sharing({...}, "page")`` rather than ``assert len(set(x)) ==
len(x)``, so the learner reads "page 7 was handed to requests 2 and 5", not a bare assertion.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping


class CheckFailed(AssertionError):
    """A graded check failed; the message is meant for the learner, as is."""


def as_list(x: Any) -> Any:
    """Tensors and tuples as plain lists (None stays None), for comparing and printing."""
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


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def expect_equal(got: Any, want: Any, what: str) -> None:
    """Equal values; for sequences the message points at the first differing position."""
    g, w = as_list(got), as_list(want)
    if g == w:
        return
    if isinstance(g, list) and isinstance(w, list):
        if len(g) != len(w):
            raise CheckFailed(f"{what}: got {len(g)} values, expected {len(w)}: got {short(g)}, expected {short(w)}")
        i = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
        raise CheckFailed(f"{what}: position {i} is {_show(g[i])}, expected {_show(w[i])} "
                          f"(got {short(g)}, expected {short(w)})")
    raise CheckFailed(f"{what}: got {short(g)}, expected {short(w)}")


def expect_no_sharing(owners: Mapping[Any, Iterable[int]], unit: str = "slot", owner: str = "request") -> None:
    """No id may belong to two owners (nor twice to one): e.g. no page handed to two requests."""
    seen: dict[int, Any] = {}
    for who, ids in owners.items():
        for i in as_list(ids):
            if i in seen:
                first = seen[i]
                if first == who:
                    raise CheckFailed(f"{unit} {i} was handed to {owner} {who} twice")
                raise CheckFailed(f"{unit} {i} was handed to {owner}s {first} and {who}")
            seen[i] = who


def expect_raises(errors: type | tuple, fn: Callable[[], Any], what: str) -> None:
    """``fn()`` must raise one of ``errors`` (a clear error for bad input or a refused operation)."""
    names = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
    try:
        got = fn()
    except errors:
        return
    except NotImplementedError:
        raise
    except Exception as exc:  # the wrong kind of error is a failed check, not a crash
        raise CheckFailed(f"{what} should raise {names}, but raised {type(exc).__name__}: {exc}") from exc
    raise CheckFailed(f"{what} should raise {names}, but returned {short(got)}")
