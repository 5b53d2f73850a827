#!/usr/bin/env python
"""Drive deliberately bad calls at the public entry points of memlab's core and classify each
outcome.

    python tests/tools/bad_input.py            # a table per entry point, then the totals per class
    python tests/tools/bad_input.py --totals   # the totals only
    python tests/tools/bad_input.py --list     # every case with its class and the error it got

Each case builds fresh, small objects (``debug_mode=True`` wherever the class has it), snapshots
everything reachable from them (tensors by their bytes, linked blocks and tree nodes by
identity), makes ONE bad call and sorts what happened into one class:

    clean       an error raised by memlab itself (a ``raise`` line of memlab's), TypeError for a
                wrong type and ValueError for a wrong value, whose message names the argument,
                with nothing changed; or a refusal the API promises (``None``), nothing changed
    wrong_kind  memlab's own error, nothing changed, but of the other kind (a ValueError for a
                type, an IndexError for a range, an AssertionError)
    unnamed     memlab's own error of the right kind, nothing changed, not naming the argument
    raw         an error raised inside Python or torch (AttributeError on None, a comparison
                before validation, torch's IndexError, ZeroDivisionError, ...), nothing changed
    changed     any error, but the objects changed before it was raised
    silent      accepted: no error, the books still balance
    corrupt     accepted and the books are broken (the debug checks fail afterwards, a free
                list has a cycle, a request never finishes, slots outside the pool)

The cases are data (``CASES``); ``tests/repo/test_bad_input.py`` draws from the same
builders. Object sizes are tiny, so the whole run takes a few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import linecache
import os
import signal
import sys
from collections import Counter, defaultdict, deque
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memlab.common.env import ensure_kernel_mode

ensure_kernel_mode()

import torch

# What torch imports lazily on the first meta-device or shape-symbolic call (sympy among it) is
# imported here, before any case runs under a timer: an alarm inside an import would leave a
# half-initialised module behind for the rest of the process.
try:
    import sympy  # noqa: F401

    torch.ones(2, dtype=torch.int64, device="meta") + 1
    torch.ones(2, dtype=torch.int64, device="meta").nonzero()
except Exception:
    pass

MEMLAB_DIRS = tuple(
    os.path.realpath(os.path.join(ROOT, d)) + os.sep for d in ("memlab", "kernels")
)
CLASSES = ("clean", "wrong_kind", "unnamed", "raw", "changed", "silent", "corrupt")
HUGE = 2**62
DEFAULT = object()  # an argument a case leaves at its good value


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("timed out")


# ---- the snapshot: everything reachable from the objects, compared by value ----------------------


def snap(x, memo=None):
    memo = {} if memo is None else memo
    if x is None or isinstance(
        x, (bool, int, float, str, bytes, complex, torch.dtype, torch.device)
    ):
        return x
    if id(x) in memo:
        return ("ref", memo[id(x)])
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type == "meta":
            return ("T", str(t.dtype), tuple(t.shape))
        return (
            "T",
            str(t.dtype),
            tuple(t.shape),
            bytes(t.cpu().contiguous().view(-1).view(torch.uint8).tolist()),
        )
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if callable(x) and not hasattr(x, "__dict__") and not hasattr(type(x), "__slots__"):
        return ("fn",)
    if type(x).__module__ in ("builtins",) and isinstance(x, type):
        return ("type", x.__name__)
    memo[id(x)] = len(memo)
    if isinstance(x, (list, tuple, deque)):
        return (type(x).__name__, tuple(snap(v, memo) for v in x))
    if isinstance(x, (set, frozenset)):
        return ("set", tuple(sorted(repr(snap(v, memo)) for v in x)))
    if isinstance(x, dict):
        return ("dict", tuple((repr(k), snap(v, memo)) for k, v in x.items()))
    mod = type(x).__module__ or ""
    if not (
        mod.startswith("memlab")
        or mod.startswith("kernels")
        or mod == "types"
        or mod.startswith("collections")
    ):
        return ("opaque", type(x).__name__)
    fields = {}
    for klass in type(x).__mro__:
        for s in getattr(klass, "__slots__", ()):
            if hasattr(x, s):
                fields[s] = getattr(x, s)
    fields.update(getattr(x, "__dict__", {}))
    return (
        type(x).__name__,
        tuple(
            (k, snap(v, memo))
            for k, v in sorted(fields.items())
            if not callable(v) or hasattr(v, "__dict__")
        ),
    )


# ---- where an error came from -------------------------------------------------------------------


def raised_by_memlab(exc: BaseException) -> bool:
    """Whether the innermost frame is a ``raise`` (or ``assert``) line in memlab's own code."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.realpath(tb.tb_frame.f_code.co_filename)
    if not path.startswith(MEMLAB_DIRS):
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return line.startswith("raise ") or line.startswith("assert ")


def classify(case) -> tuple[str, str]:
    """(class, what happened) for one case."""
    try:
        env = case.make()
    except Exception as exc:  # a broken builder is the script's bug, not memlab's
        raise RuntimeError(
            f"{case.entry} [{case.label}]: the builder failed: {exc!r}"
        ) from exc
    before = snap(env)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout)
    try:
        try:
            result = case.call(env)
        except Hang:
            return "corrupt", "the call never returned"
        except Exception as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            what = f"{type(exc).__name__}: {str(exc)[:110]}"
            if snap(env) != before:
                return "changed", what
            if not raised_by_memlab(exc):
                return "raw", what
            if not isinstance(exc, case.want):
                return "wrong_kind", what
            msg = str(exc).lower()
            if case.names and not any(n.lower() in msg for n in case.names):
                return "unnamed", what
            return "clean", what
        # accepted
        try:
            if case.refuse and result is None and snap(env) == before:
                return "clean", "refused (None), nothing changed"
            problem = case.post(env, result) if case.post is not None else None
            if problem is None and case.books is not None:
                case.books(env)
        except Hang:
            return "corrupt", "the books check never returned (a cycle?)"
        except Exception as exc:
            return "corrupt", f"accepted; then {type(exc).__name__}: {str(exc)[:90]}"
        if problem:
            return "corrupt", f"accepted; {problem}"
        return "silent", "accepted" + (
            "" if snap(env) == before else " (and changed the objects)"
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- the cases ----------------------------------------------------------------------------------


class Case(SimpleNamespace):
    pass


CASES: list[Case] = []


def case(
    entry,
    label,
    want,
    names,
    make,
    call,
    books=None,
    refuse=False,
    post=None,
    timeout=3.0,
):
    # a call that launches a kernel runs in a child process (bad ids can crash the interpreter)
    isolate = entry.split(".")[0].split("(")[0] in ISOLATED
    CASES.append(
        Case(
            entry=entry,
            label=label,
            want=want,
            names=tuple(names),
            make=make,
            call=call,
            books=books,
            refuse=refuse,
            post=post,
            timeout=timeout,
            isolate=isolate,
        )
    )


ISOLATED = {
    "decode_attention_fwd",
    "paged_attention",
    "mla_decode_attention_fwd",
    "mla_paged_attention",
}


def bad_counts(zero_ok=True, huge=True, negative=True):
    """Values that are no count (TypeError) or a count out of range (ValueError)."""
    out = [
        ("None", None, TypeError),
        ("str", "2", TypeError),
        ("list", [2], TypeError),
        ("bool", True, TypeError),
        ("float", 2.5, TypeError),
        ("float 2.0", 2.0, TypeError),
    ]
    if negative:
        out.append(("negative", -1, ValueError))
    if not zero_ok:
        out.append(("zero", 0, ValueError))
    if huge:
        out.append(("huge", HUGE, ValueError))
    return out


def bad_id_tensors(dtype=torch.int64, n=2, oor=None, neg=True, foreign=None):
    """Values that are no 1-D id tensor (TypeError / ValueError) or hold ids out of range."""
    out = [
        ("None", None, TypeError),
        ("list", [1] * n, TypeError),
        ("float tensor", torch.ones(n), TypeError),
        ("bool tensor", torch.ones(n, dtype=torch.bool), TypeError),
        ("2-D", torch.ones((1, n), dtype=dtype), ValueError),
        ("meta device", torch.ones(n, dtype=dtype, device="meta"), ValueError),
    ]
    if neg:
        out.append(("negative id", torch.full((n,), -1, dtype=dtype), ValueError))
    if oor is not None:
        out.append(("id past the end", torch.full((n,), oor, dtype=dtype), ValueError))
    if foreign is not None:
        out.append(("foreign id", foreign, ValueError))
    return out


def each(entry, bads, names, make, call, **kw):
    """One case per bad value; each keeps ``value`` and ``call_with`` so the property test can
    draw other values of the same sort."""
    for label, value, want in bads:
        case(
            entry,
            label,
            want,
            names,
            make,
            (lambda v: lambda env: call(env, v))(value),
            **kw,
        )
        CASES[-1].value, CASES[-1].call_with = value, call


def dev_cuda(entry, names, build):
    """device "cuda" on a machine without one: a ValueError naming the device, not torch's own
    error."""
    if torch.cuda.is_available():
        return
    case(
        entry,
        "device cuda (none here)",
        ValueError,
        names,
        lambda: SimpleNamespace(),
        lambda env: build(),
    )


# -- the request table (chapter 01) ---------------------------------------------------------------


def _sglang_cases():
    from memlab.sglang.req_to_token import Req, ReqToTokenPool

    def rtp():
        return SimpleNamespace(pool=ReqToTokenPool(4, 8))

    each(
        "ReqToTokenPool()",
        bad_counts(zero_ok=False),
        ["size"],
        lambda: SimpleNamespace(),
        lambda env, v: ReqToTokenPool(v, 8),
    )
    each(
        "ReqToTokenPool()",
        [(f"max_context_len {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["max_context_len"],
        lambda: SimpleNamespace(),
        lambda env, v: ReqToTokenPool(4, v),
    )
    dev_cuda(
        "ReqToTokenPool()",
        ["cuda", "device"],
        lambda: ReqToTokenPool(4, 8, device="cuda"),
    )
    each(
        "ReqToTokenPool.alloc_rows",
        bad_counts(),
        ["n"],
        rtp,
        lambda env, v: env.pool.alloc_rows(v),
        refuse=True,
    )
    each(
        "ReqToTokenPool.free",
        [
            ("None", None, TypeError),
            ("str", "1", TypeError),
            ("bool", True, TypeError),
            ("float", 1.0, TypeError),
            ("row 0 (padding)", 0, ValueError),
            ("row past the end", 5, ValueError),
            ("negative", -1, ValueError),
            ("free row (double free)", 2, ValueError),
        ],
        ["row"],
        rtp,
        lambda env, v: env.pool.free(v),
    )

    def foreign_req():
        env = rtp()
        other = ReqToTokenPool(4, 8)
        env.req = Req(0, [1, 2, 3])
        other.alloc([env.req])
        env.req.kv.kv_allocated_len = 3
        return env

    case(
        "ReqToTokenPool.alloc",
        "a request claiming a free row",
        ValueError,
        ["row", "req"],
        foreign_req,
        lambda env: env.pool.alloc([env.req]),
        books=lambda env: _rtp_books(env.pool),
    )
    case(
        "ReqToTokenPool.alloc",
        "None in the list",
        TypeError,
        ["req"],
        rtp,
        lambda env: env.pool.alloc([None]),
    )
    case(
        "ReqToTokenPool.alloc",
        "an int",
        TypeError,
        ["req"],
        rtp,
        lambda env: env.pool.alloc(3),
    )
    case(
        "ReqToTokenPool.write",
        "indices None (every row)",
        TypeError,
        ["indices"],
        rtp,
        lambda env: env.pool.write(None, 7),
        books=lambda env: _rtp_books(env.pool),
    )
    case(
        "ReqToTokenPool.write",
        "row past the end",
        ValueError,
        ["row", "indices"],
        rtp,
        lambda env: env.pool.write(
            (9, slice(0, 2)), torch.tensor([1, 2], dtype=torch.int32)
        ),
    )
    case(
        "ReqToTokenPool.write",
        "values of another length",
        ValueError,
        ["values"],
        rtp,
        lambda env: env.pool.write(
            (1, slice(0, 2)), torch.tensor([1, 2, 3], dtype=torch.int32)
        ),
    )
    case(
        "ReqToTokenPool.write",
        "float values",
        TypeError,
        ["values"],
        rtp,
        lambda env: env.pool.write((1, slice(0, 2)), torch.tensor([1.5, 2.5])),
        books=lambda env: _rtp_books(env.pool),
    )

    # -- the KV pools (chapter 02) ----------------------------------------------------------------
    from memlab.sglang.kv_pool import MHATokenToKVPool, MLATokenToKVPool

    def mha(**kw):
        return MHATokenToKVPool(
            kw.pop("size", 16),
            kw.pop("page_size", 4),
            kw.pop("dtype", torch.float32),
            kw.pop("head_num", 2),
            kw.pop("head_dim", 4),
            kw.pop("layer_num", 2),
            **kw,
        )

    for arg in ("size", "page_size", "head_num", "head_dim", "layer_num"):
        each(
            "MHATokenToKVPool()",
            [(f"{arg} {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
            [arg],
            lambda: SimpleNamespace(),
            (lambda a: lambda env, v: mha(**{a: v}))(arg),
        )
    case(
        "MHATokenToKVPool()",
        "dtype int32",
        TypeError,
        ["dtype"],
        lambda: SimpleNamespace(),
        lambda env: mha(dtype=torch.int32),
    )
    case(
        "MHATokenToKVPool()",
        "dtype 'float16' (a str)",
        TypeError,
        ["dtype"],
        lambda: SimpleNamespace(),
        lambda env: mha(dtype="float16"),
    )
    dev_cuda("MHATokenToKVPool()", ["cuda", "device"], lambda: mha(device="cuda"))

    def pool_env():
        return SimpleNamespace(pool=mha())

    each(
        "MHATokenToKVPool.get_kv_buffer",
        [
            ("layer 2 (past the end)", 2, ValueError),
            ("layer -1", -1, ValueError),
            ("None", None, TypeError),
            ("str", "0", TypeError),
            ("float", 0.0, TypeError),
        ],
        ["layer"],
        pool_env,
        lambda env, v: env.pool.get_kv_buffer(v),
    )
    k = torch.ones(2, 2, 4)
    loc = torch.tensor([4, 5])
    each(
        "MHATokenToKVPool.set_kv_buffer",
        [("layer 5", 5, ValueError), ("layer None", None, TypeError)],
        ["layer"],
        pool_env,
        lambda env, v: env.pool.set_kv_buffer(v, loc, k, k),
    )
    each(
        "MHATokenToKVPool.set_kv_buffer",
        bad_id_tensors(oor=99),
        ["loc"],
        pool_env,
        lambda env, v: env.pool.set_kv_buffer(0, v, k, k),
    )
    case(
        "MHATokenToKVPool.set_kv_buffer",
        "k None",
        TypeError,
        ["cache_k"],
        pool_env,
        lambda env: env.pool.set_kv_buffer(0, loc, None, k),
    )
    case(
        "MHATokenToKVPool.set_kv_buffer",
        "k of 3 tokens for 2 slots",
        ValueError,
        ["slots", "tokens", "cache_k"],
        pool_env,
        lambda env: env.pool.set_kv_buffer(
            0, loc, torch.ones(3, 2, 4), torch.ones(3, 2, 4)
        ),
    )
    case(
        "MHATokenToKVPool.set_kv_buffer",
        "k of the wrong head_dim",
        ValueError,
        ["cache_k"],
        pool_env,
        lambda env: env.pool.set_kv_buffer(0, loc, torch.ones(2, 2, 5), k),
    )
    # (a float K of another precision is cast to the pool's dtype, as SGLang does: an
    # fp8 pool is written so)
    case(
        "MHATokenToKVPool.set_kv_buffer",
        "k int64",
        TypeError,
        ["cache_k", "dtype"],
        pool_env,
        lambda env: env.pool.set_kv_buffer(0, loc, k.long(), k),
    )
    case(
        "MLATokenToKVPool()",
        "kv_lora_rank None",
        TypeError,
        ["kv_lora_rank"],
        lambda: SimpleNamespace(),
        lambda env: MLATokenToKVPool(16, 4, torch.float32, None, 4, 2),
    )
    case(
        "MLATokenToKVPool()",
        "qk_rope_head_dim 0",
        ValueError,
        ["qk_rope_head_dim"],
        lambda: SimpleNamespace(),
        lambda env: MLATokenToKVPool(16, 4, torch.float32, 8, 0, 2),
    )

    # -- the allocators (chapters 03 to 05) -----------------------------------------------------
    from memlab.sglang.allocator import make_allocator

    def alloc_env(ps=4, size=32, backend="torch"):
        a = (
            make_allocator(size, ps, backend=backend, debug_mode=True)
            if ps > 1
            else make_allocator(size, 1, debug_mode=True)
        )
        return SimpleNamespace(alloc=a)

    def books(env):
        env.alloc.check_books()

    for ps in (1, 4):
        name = "TokenToKVPoolAllocator" if ps == 1 else "PagedTokenToKVPoolAllocator"
        each(
            f"{name}()",
            [(f"size {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
            ["size"],
            lambda: SimpleNamespace(),
            (lambda p: lambda env, v: make_allocator(v, p, debug_mode=True))(ps),
        )
        if ps > 1:
            each(
                f"{name}()",
                [(f"page_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
                ["page_size"],
                lambda: SimpleNamespace(),
                lambda env, v: make_allocator(32, v, debug_mode=True),
            )
            case(
                f"{name}()",
                "backend 'cuda'",
                ValueError,
                ["backend"],
                lambda: SimpleNamespace(),
                lambda env: make_allocator(32, 4, backend="cuda"),
            )
        dev_cuda(
            f"{name}()",
            ["cuda", "device"],
            (lambda p: lambda: make_allocator(32, p, device="cuda"))(ps),
        )
        mk = (lambda p: lambda: alloc_env(p))(ps)
        each(
            f"{name}.alloc",
            bad_counts(huge=False),
            ["need_size"],
            mk,
            lambda env, v: env.alloc.alloc(v),
            books=books,
            refuse=True,
        )
        case(
            f"{name}.alloc",
            "huge",
            ValueError,
            ["need_size"],
            mk,
            lambda env: env.alloc.alloc(HUGE),
            books=books,
            refuse=True,
        )
        if ps > 1:
            case(
                f"{name}.alloc",
                "not a whole page",
                ValueError,
                ["need_size"],
                mk,
                lambda env: env.alloc.alloc(3),
            )

        def held(p):
            def make():
                env = alloc_env(p)
                env.held = env.alloc.alloc(2 * p)
                return env

            return make

        each(
            f"{name}.free",
            bad_id_tensors(oor=32 + ps, foreign=None),
            ["free_index", "slot", "page"],
            held(ps),
            lambda env, v: env.alloc.free(v),
            books=books,
        )
        case(
            f"{name}.free",
            "a free slot (double free)",
            ValueError,
            ["free", "slot", "page"],
            held(ps),
            lambda env: env.alloc.free(torch.tensor([5 * ps])),
            books=books,
        )
        # SGLang's paged free takes the unique pages of its slots: a repeat there is harmless
        if ps == 1:
            case(
                f"{name}.free",
                "the same slots twice in one call",
                ValueError,
                ["free", "slot", "page"],
                held(ps),
                lambda env: env.alloc.free(torch.cat((env.held[:1], env.held[:1]))),
                books=books,
            )
        each(
            f"{name}.free_page_ids",
            bad_id_tensors(oor=32 // ps + 1),
            ["page_ids", "page", "slot"],
            held(ps),
            lambda env, v: env.alloc.free_page_ids(v),
            books=books,
        )
        case(
            f"{name}.free_page_ids",
            "a free page",
            ValueError,
            ["free", "page", "slot"],
            held(ps),
            lambda env: env.alloc.free_page_ids(torch.tensor([5])),
            books=books,
        )
        each(
            f"{name}.free_segment",
            [(f"start_pos {l}", v, w) for l, v, w in bad_counts(huge=False)]
            + ([("start_pos 1 (unaligned)", 1, ValueError)] if ps > 1 else []),
            ["start_pos", "position"],
            held(ps),
            lambda env, v: env.alloc.free_segment(env.held, v),
            books=books,
        )
        case(
            f"{name}.free_group_end",
            "without a begin",
            RuntimeError,
            ["free_group"],
            held(ps),
            lambda env: env.alloc.free_group_end(),
        )

        # alloc_extend / alloc_decode on a batch of one request holding one page
        def ext(p):
            def make():
                env = alloc_env(p)
                env.held = env.alloc.alloc(p)
                return env

            return make

        # DEFAULT, not None, marks an argument left at its good value: None is itself a bad value
        def extend(
            env,
            prefix=DEFAULT,
            seq=DEFAULT,
            last=DEFAULT,
            n=DEFAULT,
            pcpu=DEFAULT,
            scpu=DEFAULT,
        ):
            p = env.alloc.page_size
            prefix = torch.tensor([p - 1]) if prefix is DEFAULT else prefix
            seq = torch.tensor([p + 2]) if seq is DEFAULT else seq
            # where the prefix ends (page size 1: an empty prefix, last_loc -1)
            if last is DEFAULT:
                last = env.held[p - 2 : p - 1] if p > 1 else torch.tensor([-1])
            pcpu = prefix if pcpu is DEFAULT else pcpu
            scpu = seq if scpu is DEFAULT else scpu
            n = 3 if n is DEFAULT else n
            return env.alloc.alloc_extend(prefix, pcpu, seq, scpu, last, n)

        E = f"{name}.alloc_extend"
        mkx = ext(ps)
        each(
            E,
            bad_id_tensors(n=1, neg=False),
            ["prefix_lens"],
            mkx,
            lambda env, v: extend(env, prefix=v, pcpu=v),
            books=books,
        )
        each(
            E,
            bad_id_tensors(n=1, neg=False),
            ["seq_lens"],
            mkx,
            lambda env, v: extend(env, seq=v, scpu=v),
            books=books,
        )
        each(
            E,
            bad_id_tensors(n=1, neg=False),
            ["last_loc"],
            mkx,
            lambda env, v: extend(env, last=v),
            books=books,
        )
        each(
            E,
            [(f"extend_num_tokens {l}", v, w) for l, v, w in bad_counts(huge=False)]
            + [("extend_num_tokens 2 (lengths add to 3)", 2, ValueError)],
            ["extend_num_tokens"],
            mkx,
            lambda env, v: extend(env, n=v),
            books=books,
        )
        case(
            E,
            "seq_len < prefix_len",
            ValueError,
            ["seq_len", "prefix"],
            mkx,  # page size 1: prefix 2
            lambda env: extend(
                env, prefix=torch.tensor([max(ps - 1, 2)]), seq=torch.tensor([1]), n=0
            ),
            books=books,
        )
        case(
            E,
            "negative prefix_len",
            ValueError,
            ["prefix"],
            mkx,
            lambda env: extend(env, prefix=torch.tensor([-1]), n=ps + 3),
            books=books,
        )
        case(
            E,
            "prefix_lens of 2, seq_lens of 1",
            ValueError,
            ["prefix_lens", "seq_lens", "batch"],
            mkx,
            lambda env: extend(env, prefix=torch.tensor([ps - 1, 0])),
            books=books,
        )
        case(
            E,
            "device lengths disagree with the CPU copies",
            ValueError,
            ["seq_lens", "cpu"],
            mkx,
            lambda env: extend(
                env, seq=torch.tensor([ps + 30]), scpu=torch.tensor([ps + 2])
            ),
            books=books,
        )
        # (ps here would be the loop's last)
        case(
            E,
            "cpu lengths None",
            TypeError,
            ["prefix_lens_cpu", "seq_lens_cpu"],
            mkx,
            lambda env: extend(env, pcpu=None, scpu=None),
            books=books,
        )
        case(
            E,
            "last_loc past the pool",
            ValueError,
            ["last_loc"],
            mkx,
            lambda env: extend(env, last=torch.tensor([1000 * ps + ps - 2])),
            books=books,
        )
        case(
            E,
            "last_loc in a free page",
            ValueError,
            ["last_loc"],
            mkx,
            lambda env: extend(env, last=torch.tensor([6 * ps + ps - 2])),
            books=books,
        )
        case(
            E,
            "empty batch",
            ValueError,
            ["batch"],
            mkx,
            lambda env: extend(
                env,
                prefix=torch.zeros(0, dtype=torch.int64),
                seq=torch.zeros(0, dtype=torch.int64),
                last=torch.zeros(0, dtype=torch.int64),
                n=0,
            ),
            books=books,
        )
        D = f"{name}.alloc_decode"

        def decode(env, seq=DEFAULT, last=DEFAULT, scpu=DEFAULT):
            p = env.alloc.page_size
            seq = torch.tensor([p if p > 1 else 2]) if seq is DEFAULT else seq
            if last is DEFAULT:
                last = env.held[p - 2 : p - 1] if p > 1 else env.held[-1:]
            return env.alloc.alloc_decode(seq, seq if scpu is DEFAULT else scpu, last)

        each(
            D,
            bad_id_tensors(n=1, neg=False),
            ["seq_lens"],
            mkx,
            lambda env, v: decode(env, seq=v, scpu=v),
            books=books,
        )
        each(
            D,
            bad_id_tensors(n=1, neg=False),
            ["last_loc"],
            mkx,
            lambda env, v: decode(env, last=v),
            books=books,
        )
        case(
            D,
            "seq_len 0",
            ValueError,
            ["seq_lens"],
            mkx,
            lambda env: decode(env, seq=torch.tensor([0])),
            books=books,
        )
        case(
            D,
            "last_loc past the pool",
            ValueError,
            ["last_loc"],
            mkx,
            lambda env: decode(env, last=torch.tensor([999 * ps + ps - 2])),
            books=books,
        )
        case(
            D,
            "device lengths disagree with the CPU copies",
            ValueError,
            ["seq_lens", "cpu"],
            mkx,
            lambda env: decode(env, scpu=torch.tensor([ps + 9])),
            books=books,
        )

    # -- radix cache (chapter 11) ---------------------------------------------------------------
    from memlab.sglang.radix_cache import RadixCache

    def tree_env():
        env = alloc_env(1, 32)
        env.tree = RadixCache(env.alloc, debug_mode=True)
        env.slots = env.alloc.alloc(4)
        env.tree.insert([1, 2, 3, 4], env.slots)
        return env

    def tree_books(env):
        env.alloc.check_books()
        env.tree.check_idle(env.alloc.size) if hasattr(env.tree, "check_idle") else None

    case(
        "RadixCache()",
        "allocator None",
        TypeError,
        ["allocator"],
        lambda: SimpleNamespace(),
        lambda env: RadixCache(None),
    )
    case(
        "RadixCache()",
        "page_size 0",
        ValueError,
        ["page_size"],
        lambda: alloc_env(1),
        lambda env: RadixCache(env.alloc, page_size=0),
    )
    each(
        "RadixCache.match_prefix",
        [
            ("None", None, TypeError),
            ("int", 3, TypeError),
            ("2-D tensor", torch.ones((2, 2), dtype=torch.int64), ValueError),
        ],
        ["key"],
        tree_env,
        lambda env, v: env.tree.match_prefix(v),
    )
    each(
        "RadixCache.insert",
        [("key None", None, TypeError), ("key int", 3, TypeError)],
        ["key"],
        tree_env,
        lambda env, v: env.tree.insert(v, env.slots),
    )

    # Two more slots, taken before the call (a call that allocates changes the books itself).
    def tree_env_extra():
        env = tree_env()
        env.extra = env.alloc.alloc(2)
        return env

    case(
        "RadixCache.insert",
        "value shorter than the key",
        ValueError,
        ["value", "key"],
        tree_env_extra,
        lambda env: env.tree.insert([5, 6, 7], env.extra),
        books=tree_books,
    )
    case(
        "RadixCache.insert",
        "value a list",
        TypeError,
        ["value"],
        tree_env,
        lambda env: env.tree.insert([5, 6], [9, 10]),
        books=tree_books,
    )
    case(
        "RadixCache.insert",
        "value of free slots",
        ValueError,
        ["value", "slot"],
        tree_env,
        lambda env: env.tree.insert([5, 6], torch.tensor([20, 21])),
        books=tree_books,
    )
    each(
        "RadixCache.evict",
        bad_counts(huge=False),
        ["num_tokens"],
        tree_env,
        lambda env, v: env.tree.evict(v),
        books=tree_books,
    )
    case(
        "RadixCache.lock",
        "node None",
        TypeError,
        ["node"],
        tree_env,
        lambda env: env.tree.lock(None),
    )

    # A lock taken and released before the call (a match in the call would tick the clock).
    def released_env():
        env = tree_env()
        env.lock = env.tree.lock(env.tree.match_prefix([1, 2, 3, 4]).last_device_node)
        env.tree.unlock(env.lock)
        return env

    case(
        "RadixCache.unlock",
        "a lock twice",
        ValueError,
        ["lock"],
        released_env,
        lambda env: env.tree.unlock(env.lock),
    )

    # -- allocation (SGLang's alloc_for_extend / alloc_for_decode) --------------------------------
    from memlab.sglang import allocation

    def batch_env():
        env = alloc_env(1, 32)
        env.pool = ReqToTokenPool(4, 16)
        env.reqs = [Req(0, [1, 2, 3]), Req(1, [4, 5])]
        return env

    def batch_books(env):
        env.alloc.check_books()
        _rtp_books(env.pool)

    case(
        "alloc_for_extend",
        "extend_lens of another length",
        ValueError,
        ["extend_lens"],
        batch_env,
        lambda env: allocation.alloc_for_extend(env.pool, env.alloc, env.reqs, [3]),
        books=batch_books,
    )
    case(
        "alloc_for_extend",
        "extend_lens None",
        TypeError,
        ["extend_lens"],
        batch_env,
        lambda env: allocation.alloc_for_extend(env.pool, env.alloc, env.reqs, None),
        books=batch_books,
    )
    case(
        "alloc_for_extend",
        "a float extend_len",
        TypeError,
        ["extend_lens"],
        batch_env,
        lambda env: allocation.alloc_for_extend(
            env.pool, env.alloc, env.reqs, [3, 2.0]
        ),
        books=batch_books,
    )
    case(
        "alloc_for_extend",
        "negative extend_len",
        ValueError,
        ["extend_lens"],
        batch_env,
        lambda env: allocation.alloc_for_extend(env.pool, env.alloc, env.reqs, [3, -2]),
        books=batch_books,
    )
    case(
        "alloc_for_extend",
        "a request twice",
        ValueError,
        ["req", "twice"],
        batch_env,
        lambda env: allocation.alloc_for_extend(
            env.pool, env.alloc, [env.reqs[0]] * 2, [3, 3]
        ),
        books=batch_books,
    )
    case(
        "alloc_for_extend",
        "an extend past the request-table row",
        ValueError,
        ["seq_len", "16"],
        batch_env,
        lambda env: allocation.alloc_for_extend(env.pool, env.alloc, env.reqs, [3, 17]),
        books=batch_books,
    )

    def full_row_env():
        env = batch_env()
        allocation.alloc_for_extend(env.pool, env.alloc, env.reqs[:1], [16])
        return env

    case(
        "alloc_for_decode",
        "a decode past the request-table row",
        ValueError,
        ["seq_len", "16"],
        full_row_env,
        lambda env: allocation.alloc_for_decode(env.pool, env.alloc, env.reqs[:1]),
        books=batch_books,
    )
    case(
        "alloc_for_decode",
        "requests without rows",
        ValueError,
        ["req", "row"],
        batch_env,
        lambda env: allocation.alloc_for_decode(env.pool, env.alloc, env.reqs),
        books=batch_books,
    )

    # -- Mamba state (chapter 07) -----------------------------------------------------------------
    from memlab.sglang.mamba import MambaPool, MambaSlotAllocator

    each(
        "MambaSlotAllocator()",
        [(f"size {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["size"],
        lambda: SimpleNamespace(),
        lambda env, v: MambaSlotAllocator(v, debug_mode=True),
    )

    def mamba_env():
        env = SimpleNamespace(alloc=MambaSlotAllocator(4, debug_mode=True))
        env.held = env.alloc.alloc(2)
        return env

    each(
        "MambaSlotAllocator.alloc",
        bad_counts(huge=False),
        ["need_size"],
        mamba_env,
        lambda env, v: env.alloc.alloc(v),
        refuse=True,
    )
    each(
        "MambaSlotAllocator.free",
        bad_id_tensors(oor=9),
        ["slots", "slot"],
        mamba_env,
        lambda env, v: env.alloc.free(v),
    )
    each(
        "MambaPool()",
        [
            (f"num_mamba_layers {l}", v, w)
            for l, v, w in bad_counts(zero_ok=False, huge=False)
        ],
        ["num_mamba_layers"],
        lambda: SimpleNamespace(),
        lambda env, v: MambaPool(2, v, [(4, 3)], (2, 4, 4)),
    )

    # -- sliding window (chapter 07) ------------------------------------------------------------
    from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator

    def swa_env():
        pool = SWAKVPool(32, 16, 4, torch.float32, 2, 4, [0], [1])
        a = SWATokenToKVPoolAllocator(32, 16, 4, kvcache=pool, debug_mode=True)
        env = SimpleNamespace(pool=pool, alloc=a)
        env.held = a.alloc(8)
        return env

    def swa_books(env):
        env.alloc.check_books()

    case(
        "SWAKVPool()",
        "a layer both full and SWA",
        ValueError,
        ["layer"],
        lambda: SimpleNamespace(),
        lambda env: SWAKVPool(32, 16, 4, torch.float32, 2, 4, [0, 1], [1]),
    )
    case(
        "SWAKVPool()",
        "size_swa None",
        ValueError,
        ["size_swa"],
        lambda: SimpleNamespace(),
        lambda env: SWAKVPool(32, None, 4, torch.float32, 2, 4, [0], [1]),
    )
    each(
        "SWATokenToKVPoolAllocator.alloc",
        bad_counts(huge=False),
        ["need_size"],
        swa_env,
        lambda env, v: env.alloc.alloc(v),
        books=swa_books,
        refuse=True,
    )
    each(
        "SWATokenToKVPoolAllocator.free",
        bad_id_tensors(oor=99),
        ["free_index", "slot"],
        swa_env,
        lambda env, v: env.alloc.free(v),
        books=swa_books,
    )
    case(
        "SWATokenToKVPoolAllocator.free",
        "a free slot (double free)",
        ValueError,
        ["free", "slot"],
        swa_env,
        lambda env: env.alloc.free(torch.tensor([28])),
        books=swa_books,
    )
    each(
        "SWAKVPool.get_kv_buffer",
        [("layer 7", 7, ValueError), ("None", None, TypeError)],
        ["layer"],
        swa_env,
        lambda env, v: env.pool.get_kv_buffer(v),
    )

    # -- write locations (chapter 07) ----------------------------------------------------------
    from memlab.sglang.write_loc import KVWriteLoc

    each(
        "KVWriteLoc()",
        [
            ("loc None", None, TypeError),
            ("loc a list", [1, 2], TypeError),
            ("loc float", torch.ones(2), TypeError),
            ("loc 2-D", torch.ones((1, 2), dtype=torch.int64), ValueError),
        ],  # a shape: as bad_id_tensors
        ["loc"],
        lambda: SimpleNamespace(),
        lambda env, v: KVWriteLoc(v),
    )
    case(
        "KVWriteLoc()",
        "swa_loc shorter than loc",
        ValueError,
        ["swa_loc"],
        lambda: SimpleNamespace(),
        lambda env: KVWriteLoc(torch.tensor([1, 2]), swa_loc=torch.tensor([1])),
    )
    case(
        "KVWriteLoc()",
        "physical 1 (not a bool)",
        TypeError,
        ["physical"],
        lambda: SimpleNamespace(),
        lambda env: KVWriteLoc(torch.tensor([1, 2]), physical=1),
    )

    # -- page copies (chapter 11) -------------------------------------------------------------
    from memlab.sglang.page_copy import copy_pages

    def copy_env():
        return SimpleNamespace(
            src=torch.arange(32.0).view(16, 2), dst=torch.zeros(16, 2)
        )

    each(
        "copy_pages",
        bad_id_tensors(oor=9),
        ["src_pages", "page"],
        copy_env,
        lambda env, v: copy_pages(
            env.src, env.dst, v, torch.tensor([1, 2]), 2, backend="torch"
        ),
    )
    case(
        "copy_pages",
        "page_size 0",
        ValueError,
        ["page_size"],
        copy_env,
        lambda env: copy_pages(
            env.src, env.dst, torch.tensor([1]), torch.tensor([2]), 0, backend="torch"
        ),
    )
    case(
        "copy_pages",
        "pages of another length",
        ValueError,
        ["pages"],
        copy_env,
        lambda env: copy_pages(
            env.src,
            env.dst,
            torch.tensor([1, 2]),
            torch.tensor([2]),
            2,
            backend="torch",
        ),
    )
    case(
        "copy_pages",
        "backend 'cuda'",
        ValueError,
        ["backend"],
        copy_env,
        lambda env: copy_pages(
            env.src, env.dst, torch.tensor([1]), torch.tensor([2]), 2, backend="cuda"
        ),
    )


def _rtp_books(pool) -> None:
    free = pool.free_slots
    assert len(set(free)) == len(free), "a row is free twice"
    assert all(1 <= r <= pool.size for r in free), (
        "padding row 0 or a foreign row is free"
    )
    assert sorted(free) == [r for r in range(1, pool.size + 1) if pool._row_free[r]], (
        "row flags disagree"
    )
    assert not bool((pool.req_to_token[0] != 0).any()), "padding row 0 was written"


# -- the vLLM side (chapter 06) --------------------------------------------------------------------


def _vllm_cases():
    from memlab.vllm.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
    from memlab.vllm.block_table import BlockTable, compute_slot_mapping, store_kv
    from memlab.vllm.hashing import get_request_block_hasher, hash_block_tokens, sha256
    from memlab.vllm.kv_cache_manager import KVCacheManager
    from memlab.vllm.request import Request

    def bp_env():
        env = SimpleNamespace(bp=BlockPool(8, debug_mode=True))
        env.held = env.bp.get_new_blocks(2)
        return env

    def bp_books(env):
        env.bp.check_invariants()

    each(
        "BlockPool()",
        [(f"num_gpu_blocks {l}", v, w) for l, v, w in bad_counts(zero_ok=False)]
        + [("num_gpu_blocks 1 (only the null block)", 1, ValueError)],
        ["num_gpu_blocks"],
        lambda: SimpleNamespace(),
        lambda env, v: BlockPool(v),
    )
    each(
        "BlockPool.get_new_blocks",
        bad_counts(),
        ["num_blocks", "free blocks"],
        bp_env,  # vLLM's refusal words
        lambda env, v: env.bp.get_new_blocks(v),
        books=bp_books,
    )
    each(
        "BlockPool.touch",
        [
            ("None", None, TypeError),
            ("a block id, not a block", [1], TypeError),
            ("blocks None in a list", [None], TypeError),
        ],
        ["blocks", "block"],
        bp_env,
        lambda env, v: env.bp.touch(v),
        books=bp_books,
    )
    case(
        "BlockPool.touch",
        "a held block then a block of another pool",
        ValueError,
        ["block"],
        bp_env,
        lambda env: env.bp.touch([env.held[0], BlockPool(4).blocks[3]]),
        books=bp_books,
    )
    case(
        "BlockPool.touch",
        "a held block then a broken one",
        ValueError,
        ["block"],
        bp_env,
        lambda env: env.bp.touch([env.held[0], KVCacheBlock(5)]),
        books=bp_books,
    )
    each(
        "BlockPool.free_blocks",
        [("None", None, TypeError), ("ids, not blocks", [1, 2], TypeError)],
        ["blocks", "block"],
        bp_env,
        lambda env, v: env.bp.free_blocks(v),
        books=bp_books,
    )
    case(
        "BlockPool.free_blocks",
        "a free block",
        ValueError,
        ["block"],
        bp_env,
        lambda env: env.bp.free_blocks([env.bp.blocks[6]]),
        books=bp_books,
    )
    case(
        "BlockPool.free_blocks",
        "a block of another pool",
        ValueError,
        ["block", "pool"],
        bp_env,
        lambda env: env.bp.free_blocks([BlockPool(8).get_new_blocks(1)[0]]),
        books=bp_books,
    )
    case(
        "BlockPool.free_blocks",
        "a held block twice",
        ValueError,
        ["block"],
        bp_env,
        lambda env: env.bp.free_blocks([env.held[0], env.held[0]]),
        books=bp_books,
    )

    def cache_env():
        env = bp_env()
        env.req = Request(
            "r", list(range(8)), block_hasher=get_request_block_hasher(4, sha256)
        )
        return env

    each(
        "BlockPool.cache_full_blocks",
        [(f"num_full_blocks {l}", v, w) for l, v, w in bad_counts(huge=False)]
        + [("num_full_blocks 3 (2 blocks)", 3, ValueError)],
        ["num_full_blocks", "full blocks"],
        cache_env,
        lambda env, v: env.bp.cache_full_blocks(env.req, env.held, 0, v),
        books=bp_books,
    )
    case(
        "BlockPool.cache_full_blocks",
        "num_cached_blocks None",
        TypeError,
        ["num_cached_blocks"],
        cache_env,
        lambda env: env.bp.cache_full_blocks(env.req, env.held, None, 2),
        books=bp_books,
    )
    case(
        "BlockPool.cache_full_blocks",
        "blocks None",
        TypeError,
        ["blocks"],
        cache_env,
        lambda env: env.bp.cache_full_blocks(env.req, None, 0, 2),
        books=bp_books,
    )

    def q_env():
        blocks = [KVCacheBlock(i) for i in range(4)]
        return SimpleNamespace(
            blocks=blocks, q=FreeKVCacheBlockQueue(blocks[:3], debug_mode=True)
        )

    def q_books(env):
        q = env.q
        fwd = q.get_all_free_blocks()
        assert len(fwd) == q.num_free_blocks == len({id(b) for b in fwd}), (
            "queue count or links broken"
        )

    each(
        "FreeKVCacheBlockQueue.popleft_n",
        bad_counts(huge=False),
        ["n"],
        q_env,
        lambda env, v: env.q.popleft_n(v),
        books=q_books,
    )
    # vLLM's own check is a bare assert (its callers count first): memlab keeps it, word
    # for word (none)
    case(
        "FreeKVCacheBlockQueue.popleft_n",
        "more than are free",
        (ValueError, AssertionError),
        [],
        q_env,
        lambda env: env.q.popleft_n(5),
        books=q_books,
    )
    case(
        "FreeKVCacheBlockQueue.prepend_n",
        "a block already queued (a cycle)",
        ValueError,
        ["block"],
        q_env,
        lambda env: env.q.prepend_n([env.blocks[1]]),
        books=q_books,
    )
    case(
        "FreeKVCacheBlockQueue.append_n",
        "a block already queued",
        ValueError,
        ["block"],
        q_env,
        lambda env: env.q.append_n([env.blocks[2]]),
        books=q_books,
    )
    case(
        "FreeKVCacheBlockQueue.append_n",
        "None",
        TypeError,
        ["blocks"],
        q_env,
        lambda env: env.q.append_n(None),
    )
    case(
        "FreeKVCacheBlockQueue.append",
        "a block already queued",
        ValueError,
        ["block"],
        q_env,
        lambda env: env.q.append(env.blocks[0]),
        books=q_books,
    )
    case(
        "FreeKVCacheBlockQueue.remove",
        "a block not queued",
        ValueError,
        ["block"],
        q_env,
        lambda env: env.q.remove(env.blocks[3]),
        books=q_books,
    )
    case(
        "FreeKVCacheBlockQueue.remove",
        "None",
        TypeError,
        ["block"],
        q_env,
        lambda env: env.q.remove(None),
    )

    def mgr_env(**kw):
        env = SimpleNamespace(m=KVCacheManager(8, 4, **kw))
        env.m.block_pool.debug_mode = (
            True  # the manager's scans ride on its pool's debug mode
        )
        env.req = Request("r", list(range(6)), block_hasher=env.m.request_block_hasher)
        return env

    def mgr_books(env):
        env.m.block_pool.check_invariants()

    for arg, bads in (
        ("num_gpu_blocks", bad_counts(zero_ok=False)),
        ("block_size", bad_counts(zero_ok=False)),
        (
            "sliding_window",
            [b for b in bad_counts(zero_ok=False, huge=False) if b[1] is not None],
        ),
        (
            "max_model_len",
            [b for b in bad_counts(zero_ok=False, huge=False) if b[1] is not None],
        ),
    ):
        each(
            "KVCacheManager()",
            [(f"{arg} {l}", v, w) for l, v, w in bads],
            [arg],
            lambda: SimpleNamespace(),
            (
                lambda a: (
                    lambda env, v: KVCacheManager(
                        **{"num_gpu_blocks": 8, "block_size": 4, a: v}
                    )
                )
            )(arg),
        )
    each(
        "KVCacheManager()",
        [
            ("watermark None", None, TypeError),
            ("watermark 1.5", 1.5, ValueError),
            ("watermark '0.1'", "0.1", TypeError),
        ],
        ["watermark"],
        lambda: SimpleNamespace(),
        lambda env, v: KVCacheManager(8, 4, watermark=v),
    )
    case(
        "KVCacheManager()",
        "hash_fn 'md5'",
        ValueError,
        ["hash"],
        lambda: SimpleNamespace(),
        lambda env: KVCacheManager(8, 4, hash_fn="md5"),
    )
    each(
        "KVCacheManager.allocate_slots",
        [(f"num_new_tokens {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["num_new_tokens"],
        mgr_env,
        lambda env, v: env.m.allocate_slots(env.req, v),
        books=mgr_books,
        refuse=True,
    )
    each(
        "KVCacheManager.allocate_slots",
        [(f"num_lookahead_tokens {l}", v, w) for l, v, w in bad_counts(huge=False)],
        ["num_lookahead_tokens"],
        mgr_env,
        lambda env, v: env.m.allocate_slots(env.req, 6, num_lookahead_tokens=v),
        books=mgr_books,
    )
    each(
        "KVCacheManager.allocate_slots",
        [(f"num_new_computed_tokens {l}", v, w) for l, v, w in bad_counts(huge=False)],
        ["num_new_computed_tokens"],
        mgr_env,
        lambda env, v: env.m.allocate_slots(env.req, 6, v, []),
        books=mgr_books,
    )
    case(
        "KVCacheManager.allocate_slots",
        "request None",
        TypeError,
        ["request"],
        mgr_env,
        lambda env: env.m.allocate_slots(None, 4),
        books=mgr_books,
    )
    case(
        "KVCacheManager.allocate_slots",
        "computed blocks of another pool",
        ValueError,
        ["block"],
        mgr_env,
        lambda env: env.m.allocate_slots(env.req, 2, 4, BlockPool(8).get_new_blocks(1)),
        books=mgr_books,
    )
    case(
        "KVCacheManager.get_computed_blocks",
        "request None",
        TypeError,
        ["request"],
        mgr_env,
        lambda env: env.m.get_computed_blocks(None),
    )
    case(
        "KVCacheManager.free",
        "request None",
        TypeError,
        ["request"],
        mgr_env,
        lambda env: env.m.free(None),
    )

    each(
        "Request()",
        [
            ("prompt None", None, ValueError),
            ("prompt an int", 3, TypeError),
            ("token None", [1, None], TypeError),
            ("token a float", [1, 2.5], TypeError),
            ("token a bool", [1, True], TypeError),
            ("token negative", [1, -2], ValueError),
        ],
        ["prompt", "token"],
        lambda: SimpleNamespace(),
        lambda env, v: Request("r", v),
    )
    case(
        "Request()",
        "cache_salt 3",
        TypeError,
        ["cache_salt"],
        lambda: SimpleNamespace(),
        lambda env: Request("r", [1, 2], cache_salt=3),
    )
    case(
        "Request()",
        "mm item past the prompt",
        ValueError,
        ["multimodal", "mm"],
        lambda: SimpleNamespace(),
        lambda env: Request("r", [1, 2], mm_features=[("img", 1, 5)]),
    )
    case(
        "Request.append_output_token_ids",
        "None",
        TypeError,
        ["token"],
        lambda: SimpleNamespace(r=Request("r", [1, 2])),
        lambda env: env.r.append_output_token_ids(None),
    )
    case(
        "Request.append_output_token_ids",
        "a float",
        TypeError,
        ["token"],
        lambda: SimpleNamespace(r=Request("r", [1, 2])),
        lambda env: env.r.append_output_token_ids(2.5),
    )
    each(
        "get_request_block_hasher",
        [(f"block_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["block_size"],
        lambda: SimpleNamespace(),
        lambda env, v: get_request_block_hasher(v, sha256),
    )
    case(
        "hash_block_tokens",
        "token ids None",
        TypeError,
        ["token"],
        lambda: SimpleNamespace(),
        lambda env: hash_block_tokens(sha256, None, None),
    )

    # -- the block table and slot_mapping ---------------------------------------------------------
    def bt_env():
        env = SimpleNamespace(t=BlockTable(4, 2, 3, 8))
        env.t.add_row([1, 2], 0)
        return env

    for arg in (
        "block_size",
        "max_num_reqs",
        "max_num_blocks_per_req",
        "max_num_batched_tokens",
    ):
        each(
            "BlockTable()",
            [(f"{arg} {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
            [arg],
            lambda: SimpleNamespace(),
            (
                lambda a: (
                    lambda env, v: BlockTable(
                        **{
                            **dict(
                                block_size=4,
                                max_num_reqs=2,
                                max_num_blocks_per_req=3,
                                max_num_batched_tokens=8,
                            ),
                            a: v,
                        }
                    )
                )
            )(arg),
        )
    dev_cuda(
        "BlockTable()",
        ["cuda", "device"],
        lambda: BlockTable(4, 2, 3, 8, device="cuda"),
    )
    row_bads = [
        ("None", None, TypeError),
        ("bool", True, TypeError),
        ("float", 0.0, TypeError),
        ("row 2 (past the end)", 2, ValueError),
        ("negative", -1, ValueError),
    ]
    each(
        "BlockTable.append_row",
        [(f"row_idx {l}", v, w) for l, v, w in row_bads],
        ["row_idx"],
        bt_env,
        lambda env, v: env.t.append_row([3], v),
    )
    each(
        "BlockTable.append_row",
        [
            ("block_ids None", None, TypeError),
            ("a float id", [1.5], TypeError),
            ("a negative id", [-1], ValueError),
            ("2 more than fit", [3, 4], ValueError),
            ("a str", "ab", TypeError),
        ],
        ["block_ids", "block"],
        bt_env,
        lambda env, v: env.t.append_row(v, 0),
    )
    each(
        "BlockTable.move_row",
        [(f"src {l}", v, w) for l, v, w in row_bads],
        ["row_idx", "src"],
        bt_env,
        lambda env, v: env.t.move_row(v, 1),
    )
    each(
        "BlockTable.get_row",
        [(f"row_idx {l}", v, w) for l, v, w in row_bads],
        ["row_idx"],
        bt_env,
        lambda env, v: env.t.get_row(v),
    )
    pos = torch.tensor([0, 1, 5])
    req = torch.tensor([0, 0, 0])
    each(
        "BlockTable.compute_slot_mapping",
        bad_id_tensors(n=3, oor=99, dtype=torch.int64),
        ["positions", "position"],
        bt_env,
        lambda env, v: env.t.compute_slot_mapping(req, v, backend="torch"),
    )
    each(
        "BlockTable.compute_slot_mapping",
        bad_id_tensors(n=3, oor=5, dtype=torch.int64),
        ["req_indices", "request row"],
        bt_env,
        lambda env, v: env.t.compute_slot_mapping(v, pos, backend="torch"),
    )
    each(
        "BlockTable.compute_slot_mapping",
        [(f"num_padded {l}", v, w) for l, v, w in bad_counts() if v is not None],
        ["num_padded"],
        bt_env,
        lambda env, v: env.t.compute_slot_mapping(req, pos, v, backend="torch"),
    )
    case(
        "BlockTable.compute_slot_mapping",
        "backend 'cuda'",
        ValueError,
        ["backend"],
        bt_env,
        lambda env: env.t.compute_slot_mapping(req, pos, backend="cuda"),
    )

    def sm_env():
        return SimpleNamespace(bt=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32))

    each(
        "compute_slot_mapping",
        [(f"block_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["block_size"],
        sm_env,
        lambda env, v: compute_slot_mapping(env.bt, req, pos, v, backend="torch"),
    )
    each(
        "compute_slot_mapping",
        [
            ("block_table None", None, TypeError),
            ("block_table a list", [[1, 2]], TypeError),
            ("block_table 1-D", torch.tensor([1, 2], dtype=torch.int32), ValueError),
            ("block_table float", torch.ones(2, 2), TypeError),
        ],
        ["block_table"],
        sm_env,
        lambda env, v: compute_slot_mapping(v, req, pos, 4, backend="torch"),
    )
    each(
        "compute_slot_mapping",
        [(f"num_tokens {l}", v, w) for l, v, w in bad_counts() if v is not None],
        ["num_tokens"],
        sm_env,
        lambda env, v: compute_slot_mapping(env.bt, req, pos, 4, v, backend="torch"),
    )
    case(
        "compute_slot_mapping",
        "positions None",
        TypeError,
        ["positions"],
        sm_env,
        lambda env: compute_slot_mapping(env.bt, req, None, 4, backend="torch"),
    )
    case(
        "compute_slot_mapping",
        "req_indices of another length",
        ValueError,
        ["req_indices"],
        sm_env,
        lambda env: compute_slot_mapping(env.bt, req[:2], pos, 4, backend="torch"),
    )

    def kv_env():
        return SimpleNamespace(kc=torch.zeros(3, 4, 2, 2), vc=torch.zeros(3, 4, 2, 2))

    key = torch.ones(2, 2, 2)
    slots = torch.tensor([1, 5])
    each(
        "store_kv",
        bad_id_tensors(n=2, oor=12, neg=False)
        + [("slot -2", torch.tensor([-2, 1]), ValueError)],
        ["slot_mapping", "slot"],
        kv_env,
        lambda env, v: store_kv(key, key, env.kc, env.vc, v, backend="torch"),
    )
    each(
        "store_kv",
        [
            ("key None", None, TypeError),
            ("key a list", [[1.0]], TypeError),
            ("key 2-D", torch.ones(2, 4), ValueError),
            ("key float64", key.double(), TypeError),
        ],
        ["key"],
        kv_env,
        lambda env, v: store_kv(v, key, env.kc, env.vc, slots, backend="torch"),
    )
    case(
        "store_kv",
        "value of 3 tokens for 2 keys",
        ValueError,
        ["value", "key"],
        kv_env,
        lambda env: store_kv(
            key, torch.ones(3, 2, 2), env.kc, env.vc, slots, backend="torch"
        ),
    )
    case(
        "store_kv",
        "backend 'cuda'",
        ValueError,
        ["backend"],
        kv_env,
        lambda env: store_kv(key, key, env.kc, env.vc, slots, backend="cuda"),
    )


# -- what both share: sizing, models, attention ----------------------------------------------------


def _common_cases():
    from dataclasses import replace

    from memlab.common.models import LLAMA_3_1_8B
    from memlab.sglang import sizing

    for cls, args in (
        (sizing.GPUConfig, ("total_bytes", "in_use_bytes")),
        (sizing.ScheduleConfig, ("page_size", "kv_dtype_bytes", "context_len")),
        (sizing.SpeculativeConfig, ("num_steps", "eagle_topk", "num_draft_tokens")),
        (sizing.ParallelConfig, ("tp_size", "dcp_size")),
    ):
        for arg in args:
            zero_ok = arg == "in_use_bytes"
            bads = bad_counts(zero_ok=zero_ok, huge=False)
            if arg == "context_len":
                bads = [b for b in bads if b[1] is not None]
            each(
                f"{cls.__name__}()",
                [(f"{arg} {l}", v, w) for l, v, w in bads],
                [arg],
                lambda: SimpleNamespace(),
                (
                    lambda c, a: (
                        lambda env, v: (
                            c(**{"total_bytes": 1 << 30, a: v})
                            if c is sizing.GPUConfig
                            else c(**{a: v})
                        )
                    )
                )(cls, arg),
            )
    each(
        "ScheduleConfig()",
        [
            ("mem_fraction_static None", None, TypeError),
            ("mem_fraction_static 0", 0.0, ValueError),
            ("mem_fraction_static 1.5", 1.5, ValueError),
            ("mem_fraction_static '0.8'", "0.8", TypeError),
        ],
        ["mem_fraction_static"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.ScheduleConfig(mem_fraction_static=v),
    )
    each(
        "ScheduleConfig()",
        [
            ("swa_full_tokens_ratio None", None, TypeError),
            ("swa_full_tokens_ratio -1", -1.0, ValueError),
        ],
        ["swa_full_tokens_ratio"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.ScheduleConfig(swa_full_tokens_ratio=v),
    )
    case(
        "ServingConfig()",
        "model None",
        TypeError,
        ["model"],
        lambda: SimpleNamespace(),
        lambda env: sizing.pool_sizes(
            sizing.ServingConfig(None, sizing.GPUConfig.gib(80))
        ),
    )
    case(
        "ServingConfig()",
        "gpu a number",
        TypeError,
        ["gpu"],
        lambda: SimpleNamespace(),
        lambda env: sizing.pool_sizes(sizing.ServingConfig(LLAMA_3_1_8B, 80)),
    )
    each(
        "report",
        [
            ("gpu_mem None", None, TypeError),
            ("gpu_mem -1", -1, ValueError),
            ("gpu_mem {}", {}, TypeError),
        ],
        ["gpu_mem", "total_bytes"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.report(LLAMA_3_1_8B, v),
    )
    each(
        "report",
        [(f"seq_len {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
        ["seq_len"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.report(LLAMA_3_1_8B, 80, seq_len=v),
    )
    case(
        "report",
        "model None",
        TypeError,
        ["model"],
        lambda: SimpleNamespace(),
        lambda env: sizing.report(None, 80),
    )
    each(
        "alloc_len_per_decode",
        [(f"page_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
        ["page_size"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.alloc_len_per_decode(sizing.SpeculativeConfig(), v),
    )
    each(
        "max_new_tokens_for_memory",
        [(f"input_tokens {l}", v, w) for l, v, w in bad_counts(huge=False)],
        ["input_tokens"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.max_new_tokens_for_memory(v, 8, 100, 4),
    )
    each(
        "max_new_tokens_for_memory",
        [(f"token_capacity {l}", v, w) for l, v, w in bad_counts(huge=False)],
        ["token_capacity"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.max_new_tokens_for_memory(4, 8, v, 4),
    )
    each(
        "new_tokens_required_next_decode",
        [(f"page_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
        ["page_size"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.new_tokens_required_next_decode(
            [sizing.RunningReq(0, 4, 1)], v
        ),
    )
    case(
        "new_tokens_required_next_decode",
        "reqs None",
        TypeError,
        ["reqs"],
        lambda: SimpleNamespace(),
        lambda env: sizing.new_tokens_required_next_decode(None, 4),
    )
    each(
        "check_decode_mem",
        [
            ("available_tokens None", None, TypeError),
            ("available_tokens '9'", "9", TypeError),
        ],
        ["available_tokens"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.check_decode_mem([sizing.RunningReq(0, 4, 0)], v, 4),
    )
    each(
        "retract_decode",
        [(f"page_size {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
        ["page_size"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.retract_decode(
            [sizing.RunningReq(0, 4, 0), sizing.RunningReq(1, 4, 1)], 0, v
        ),
    )
    each(
        "request_footprint",
        [(f"seq_len {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
        ["seq_len"],
        lambda: SimpleNamespace(),
        lambda env, v: sizing.request_footprint(
            sizing.ServingConfig(LLAMA_3_1_8B, sizing.GPUConfig.gib(80)), v
        ),
    )

    for arg in (
        "num_hidden_layers",
        "num_key_value_heads",
        "head_dim",
        "num_params",
        "max_position_embeddings",
    ):
        each(
            "ModelConfig()",
            [(f"{arg} {l}", v, w) for l, v, w in bad_counts(zero_ok=False, huge=False)],
            [arg],
            lambda: SimpleNamespace(),
            (lambda a: lambda env, v: replace(LLAMA_3_1_8B, **{a: v}))(arg),
        )
    case(
        "ModelConfig()",
        "attention 'gqa'",
        ValueError,
        ["attention"],
        lambda: SimpleNamespace(),
        lambda env: replace(LLAMA_3_1_8B, attention="gqa"),
    )
    case(
        "ModelConfig()",
        "layer_types of another length",
        ValueError,
        ["layer_types"],
        lambda: SimpleNamespace(),
        lambda env: replace(LLAMA_3_1_8B, layer_types=("full_attention",)),
    )
    case(
        "ModelConfig()",
        "sliding_window -1",
        ValueError,
        ["sliding_window"],
        lambda: SimpleNamespace(),
        lambda env: replace(
            LLAMA_3_1_8B, layer_types=("sliding_attention",) * 32, sliding_window=-1
        ),
    )
    each(
        "ModelConfig.kv_bytes_per_token",
        [
            ("dtype_bytes None", None, TypeError),
            ("dtype_bytes 0", 0, ValueError),
            ("dtype_bytes 1.5", 1.5, TypeError),
        ],
        ["dtype_bytes"],
        lambda: SimpleNamespace(),
        lambda env, v: LLAMA_3_1_8B.kv_bytes_per_token(None, v),
    )
    each(
        "ModelConfig.kv_bytes_per_token",
        [
            ("tp_size 0", 0, ValueError),
            ("tp_size None", None, TypeError),
            ("tp_size True", True, TypeError),
        ],
        ["tp_size"],
        lambda: SimpleNamespace(),
        lambda env, v: LLAMA_3_1_8B.kv_bytes_per_token(None, 2, v),
    )
    each(
        "ModelConfig.layer_ids",
        [("kind 'full'", "full", ValueError), ("kind None", None, TypeError)],
        ["kind"],
        lambda: SimpleNamespace(),
        lambda env, v: LLAMA_3_1_8B.layer_ids(v),
    )
    case(
        "ModelConfig.weight_bytes",
        "dtype_bytes 0",
        ValueError,
        ["dtype_bytes"],
        lambda: SimpleNamespace(),
        lambda env: LLAMA_3_1_8B.weight_bytes(0, 1),
    )
    case(
        "ModelConfig.weight_bytes",
        "tp_size 0",
        ValueError,
        ["tp_size"],
        lambda: SimpleNamespace(),
        lambda env: LLAMA_3_1_8B.weight_bytes(None, 0),
    )

    from memlab.common import attention

    q = torch.ones(1, 2, 4)
    kb = torch.ones(8, 1, 4)
    r2t = torch.tensor([[0, 1, 2, 0]], dtype=torch.int32)
    rows = torch.tensor([0])
    sl = torch.tensor([3], dtype=torch.int32)

    def att_env():
        return SimpleNamespace()

    def dec(q=q, k=kb, v=kb, t=r2t, rows=rows, sl=sl, o=None):
        return attention.decode_attention_fwd(q, k, v, t, rows, sl, o=o)

    each(
        "decode_attention_fwd",
        [
            ("q None", None, TypeError),
            ("q int", q.int(), TypeError),
            ("q 2-D", torch.ones(2, 4), ValueError),
        ],
        ["q"],
        att_env,
        lambda env, v: dec(q=v),
    )
    each(
        "decode_attention_fwd",
        [
            ("k_buffer None", None, TypeError),
            ("k_buffer float64", kb.double(), TypeError),
            ("k_buffer head_dim 5", torch.ones(8, 1, 5), ValueError),
        ],
        ["k_buffer"],
        att_env,
        lambda env, v: dec(k=v),
    )
    each(
        "decode_attention_fwd",
        [
            ("req_to_token None", None, TypeError),
            ("req_to_token int64", r2t.long(), TypeError),
            ("req_to_token 1-D", r2t[0], ValueError),
        ],
        ["req_to_token"],
        att_env,
        lambda env, v: dec(t=v),
    )
    each(
        "decode_attention_fwd",
        [
            ("seq_lens None", None, TypeError),
            ("seq_lens float", sl.float(), TypeError),
            (
                "seq_lens of 2 for 1 query",
                torch.tensor([3, 3], dtype=torch.int32),
                ValueError,
            ),
            ("seq_len past the row", torch.tensor([9], dtype=torch.int32), ValueError),
        ],
        ["seq_lens", "seq_len"],
        att_env,
        lambda env, v: dec(sl=v),
    )
    each(
        "decode_attention_fwd",
        [
            ("req_pool_indices None", None, TypeError),
            ("req_pool_indices past the table", torch.tensor([5]), ValueError),
        ],
        ["req_pool_indices"],
        att_env,
        lambda env, v: dec(rows=v),
    )
    case(
        "decode_attention_fwd",
        "o of the wrong shape",
        ValueError,
        ["o"],
        att_env,
        lambda env: dec(o=torch.empty(1, 2, 3)),
    )
    kc = torch.ones(2, 4, 1, 4)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    each(
        "paged_attention",
        [
            ("key_cache None", None, TypeError),
            ("key_cache 3-D", torch.ones(8, 1, 4), ValueError),
        ],
        ["key_cache"],
        att_env,
        lambda env, v: attention.paged_attention(q, v, kc, bt, sl),
    )
    each(
        "paged_attention",
        [
            ("block_table None", None, TypeError),
            ("block_table 1-D", bt[0], ValueError),
            (
                "block id past the cache",
                torch.tensor([[0, 7]], dtype=torch.int32),
                ValueError,
            ),
        ],
        ["block_table", "block"],
        att_env,
        lambda env, v: attention.paged_attention(
            q, kc, kc, v, torch.tensor([6], dtype=torch.int32)
        ),
    )
    each(
        "mla_decode_attention_fwd",
        [
            ("q_rope None", None, TypeError),
            ("q_rope of other heads", torch.ones(1, 3, 2), ValueError),
        ],
        ["q_rope"],
        att_env,
        lambda env, v: attention.mla_decode_attention_fwd(
            q, v, torch.ones(8, 1, 6), r2t, rows, sl, 0.5
        ),
    )
    case(
        "mla_decode_attention_fwd",
        "sm_scale None",
        TypeError,
        ["sm_scale"],
        att_env,
        lambda env: attention.mla_decode_attention_fwd(
            q, torch.ones(1, 2, 2), torch.ones(8, 1, 6), r2t, rows, sl, None
        ),
    )
    case(
        "mla_paged_attention",
        "scale '0.5'",
        TypeError,
        ["scale"],
        att_env,
        lambda env: attention.mla_paged_attention(
            q, torch.ones(1, 2, 2), torch.ones(2, 4, 6), bt, sl, "0.5"
        ),
    )


# -- the capstone engine ---------------------------------------------------------------------------


def _engine_cases():
    from memlab.capstone.engine import Engine, TinyConfig, TinyLlama

    model = TinyLlama(TinyConfig())

    def eng():
        return SimpleNamespace(
            e=Engine(
                model,
                page_size=4,
                num_tokens=128,
                max_context=64,
                chunk_size=16,
                attention="torch",
                prefix_cache="radix",
                debug_mode=True,
            )
        )

    def finishes(env, result):
        for _ in range(200):
            if not env.e.step():
                break
        else:
            return "the engine is still stepping after 200 steps"
        env.e.check_books()
        stuck = [r.rid for r in env.e.finished if len(r.output) == 0]
        return f"requests {stuck} finished without output" if stuck else None

    each(
        "Engine.add_request",
        [(f"max_new_tokens {l}", v, w) for l, v, w in bad_counts(zero_ok=False)],
        ["max_new_tokens"],
        eng,
        lambda env, v: env.e.add_request([1, 2, 3], v),
        post=finishes,
    )
    each(
        "Engine.add_request",
        [
            ("prompt None", None, TypeError),
            ("prompt an int", 5, TypeError),
            ("prompt empty", [], ValueError),
            ("a token None", [1, None], TypeError),
            ("a token 2.5", [1, 2.5], TypeError),
            ("a token past the vocabulary", [1, 500], ValueError),
            ("a token -1", [1, -1], ValueError),
            ("a token True", [1, True], TypeError),
            ("prompt a 2-D tensor", torch.ones((2, 2), dtype=torch.int64), ValueError),
            ("prompt longer than max_context", list(range(100)), ValueError),
        ],
        ["prompt", "token", "max_context"],
        eng,
        lambda env, v: env.e.add_request(v, 4),
        post=finishes,
    )
    each(
        "Engine.generate",
        [
            ("second prompt empty", [[1, 2], []], ValueError),
            ("second prompt None", [[1, 2], None], TypeError),
            ("prompts None", None, TypeError),
        ],
        ["prompt"],
        eng,
        lambda env, v: env.e.generate(v, 4),
    )
    case(
        "Engine.generate",
        "max_new_tokens 2.5",
        TypeError,
        ["max_new_tokens"],
        eng,
        lambda env: env.e.generate([[1, 2]], 2.5),
    )
    for arg, bads in (
        ("page_size", bad_counts(zero_ok=False, huge=False)),
        ("chunk_size", bad_counts(zero_ok=False, huge=False)),
        ("num_tokens", bad_counts(zero_ok=False)),
        ("max_running", bad_counts(zero_ok=False)),
        ("max_context", bad_counts(zero_ok=False)),
    ):
        each(
            "Engine()",
            [(f"{arg} {l}", v, w) for l, v, w in bads],
            [arg],
            lambda: SimpleNamespace(),
            (
                lambda a: (
                    lambda env, v: Engine(
                        model,
                        **{
                            **dict(
                                page_size=4,
                                num_tokens=128,
                                max_context=64,
                                attention="torch",
                            ),
                            a: v,
                        },
                    )
                )
            )(arg),
        )
    case(
        "Engine()",
        "attention 'cuda'",
        ValueError,
        ["attention"],
        lambda: SimpleNamespace(),
        lambda env: Engine(model, attention="cuda"),
    )
    case(
        "Engine()",
        "prefix_cache 'lru'",
        ValueError,
        ["prefix_cache"],
        lambda: SimpleNamespace(),
        lambda env: Engine(model, prefix_cache="lru"),
    )
    case(
        "Engine()",
        "model None",
        TypeError,
        ["model"],
        lambda: SimpleNamespace(),
        lambda env: Engine(None),
    )


def build_cases() -> list[Case]:
    if not CASES:
        for part in (_sglang_cases, _vllm_cases, _common_cases, _engine_cases):
            part()
    return CASES


def classify_safe(case) -> tuple[str, str]:
    # a kernel fed bad ids may crash the process: run it in a child
    if getattr(case, "isolate", False):
        return _classify_in_child(case)
    try:
        return classify(case)
    except Hang:  # the alarm fired between the call and the books check
        return "corrupt", "timed out"


def _classify_in_child(case) -> tuple[str, str]:
    import pickle

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: classify, send the answer, leave without cleanup
        os.close(read)
        try:
            case.isolate = False
            out = classify_safe(case)
        except BaseException as exc:
            out = ("corrupt", f"the classifier failed: {exc!r}")
        os.write(write, pickle.dumps(out))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return (
            "corrupt",
            f"the process crashed (signal {os.WTERMSIG(status)}): "
            "the kernel read outside its buffers",
        )
    return pickle.loads(data)


def run(cases=None):
    cases = build_cases() if cases is None else cases
    return [(c, *classify_safe(c)) for c in cases]


def table(results, show_totals_only=False, listing=False) -> str:
    by_entry = defaultdict(Counter)
    for c, cls, _ in results:
        by_entry[c.entry][cls] += 1
    lines = []
    head = (
        f"{'entry point':<44}" + "".join(f"{k:>11}" for k in CLASSES) + f"{'cases':>7}"
    )
    if not show_totals_only:
        lines += [head, "-" * len(head)]
        for entry, cnt in by_entry.items():
            lines.append(
                f"{entry:<44}"
                + "".join(f"{cnt[k] or '':>11}" for k in CLASSES)
                + f"{sum(cnt.values()):>7}"
            )
        lines.append("-" * len(head))
    total = Counter(cls for _, cls, _ in results)
    lines.append(
        f"{'TOTAL (' + str(len(by_entry)) + ' entry points)':<44}"
        + "".join(f"{total[k]:>11}" for k in CLASSES)
        + f"{len(results):>7}"
    )
    if listing:
        lines.append("")
        for c, cls, what in results:
            if cls != "clean":
                lines.append(f"{cls:<10} {c.entry} [{c.label}]: {what}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--totals", action="store_true", help="print the totals only")
    ap.add_argument(
        "--list", action="store_true", help="also list every case that is not clean"
    )
    ap.add_argument("--entry", help="only entry points containing this text")
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    cases = [c for c in build_cases() if args.entry is None or args.entry in c.entry]
    print(table(run(cases), args.totals, args.list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
