"""Bad calls at every public entry point of memlab.vllm, generated apart from
tests/tools/bad_input.py (issue 32): wrong types and values for each argument, and wrong orders.

Each call runs on fresh small objects, once with debug mode on and once with it off, and ends in
one class:

    clean    memlab's own error (a ``raise`` or ``assert`` line of memlab), nothing changed
    raw      an error raised inside Python or torch, nothing changed
    changed  an error, raised after the objects changed
    silent   accepted, the books still balance
    corrupt  accepted, the books broken afterwards (check_invariants, a cycle, a count)

With debug mode on, no call ends raw, changed or corrupt. With it off, only the calls vLLM itself
trusts its caller with may (``TRUSTED``: the blocks handed to the pool and its queue, each kind
with the docstring that says so). A property test draws further wrong values of each kind.

Entry points: what the chapters and a learner call, the pool's and queue's public methods,
KVCacheManager's, Request, the hash functions, the block table and the cache layout. The hash map
(BlockHashToBlockMap), the single-type managers and the coordinator are the manager's insides and
trusted as vLLM's are; the plain-Python and torch references (``*_python``, ``*_torch``) are
definitions, not entry points.
"""

from __future__ import annotations

import linecache
import math
import os
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from memlab.vllm import block_table as bt
from memlab.vllm import kv_layout
from memlab.vllm.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from memlab.vllm.hashing import (
    fast_hash,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    sha256,
)
from memlab.vllm.kv_cache_manager import KVCacheManager
from memlab.vllm.request import Request

MEMLAB = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", "memlab"))
CLASSES = ("clean", "raw", "changed", "silent", "corrupt")
HUGE = 2**62


# ---- the classifier ------------------------------------------------------------------------


def snap(x, memo=None):
    """Everything reachable from ``x``, by value (tensors by their bytes, shared objects once)."""
    memo = {} if memo is None else memo
    if x is None or isinstance(x, (bool, int, float, str, bytes, torch.dtype)):
        return x
    if id(x) in memo:
        return ("ref", memo[id(x)])
    memo[id(x)] = len(memo)
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return ("T", str(x.dtype), tuple(x.shape))
        return ("T", str(x.dtype), tuple(x.shape), x.detach().cpu().flatten().tolist())
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(snap(v, memo) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((repr(k), snap(v, memo)) for k, v in x.items()))
    if callable(x) and not hasattr(type(x), "__slots__"):
        return ("fn", getattr(x, "__name__", ""))
    fields = {}
    for klass in type(x).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(x, name):
                fields[name] = getattr(x, name)
    fields.update(getattr(x, "__dict__", {}))
    return (
        type(x).__name__,
        tuple((k, snap(v, memo)) for k, v in sorted(fields.items())),
    )


def raised_by_memlab(exc: BaseException) -> bool:
    """The innermost frame is a ``raise`` or ``assert`` line of memlab's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = os.path.realpath(tb.tb_frame.f_code.co_filename)
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return path.startswith(MEMLAB) and line.startswith(("raise ", "assert "))


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("timed out")


def classify(case: Case, debug: bool) -> tuple[str, str]:
    env = case.make(debug)
    before = snap(env)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        try:
            case.call(env)
        except Hang:
            return "corrupt", "the call never returned"
        except Exception as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            what = f"{type(exc).__name__}: {str(exc)[:100]}"
            if snap(env) != before:
                return "changed", what
            return ("clean" if raised_by_memlab(exc) else "raw"), what
        try:
            env.books(env)
        except Exception as exc:
            return "corrupt", f"accepted; then {type(exc).__name__}: {str(exc)[:80]}"
        return "silent", "accepted"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---- the cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    entry: str
    label: str
    make: Callable  # debug -> env (with env.books)
    call: Callable  # env -> result
    kind: str = ""  # the argument's kind, for the property test
    arg: str = ""
    trusted: str = ""  # with debug off: why this may end other than clean (TRUSTED)
    extra: dict = field(default_factory=dict)


# Bad values of each kind, by type and by value; a property test draws more of the same.
KINDS = {
    "count": [None, "2", 2.5, 2.0, True, [2], object(), -1],
    "pos": [None, "2", 2.5, True, [2], -1, 0],
    "blocks": [None, 3, "ab", {0: 1}, {3}, [None], [1], ["x"]],
    "block": [None, 3, "b", 2.5],
    "request": [None, 3, "r", object(), SimpleNamespace(request_id="r")],
    "unhashable": [[1], {1: 2}, {3}],
    "req_id": [None, 3, b"r", ["r"]],
    "group_ids": ["0", [1], [0, 1], 0, [None], [True], (1,)],
    "group_id": [None, "0", 1, -1, 0.0, True],
    "flag": ["yes", None, 1, 0.0],
    "fraction": [None, "0.1", -0.1, 1.0, 1.5, float("nan"), True],
    "tokens": [None, 3, "ab", [1, None], [1, 2.5], [1, -2], [True], {1: 2}],
    "hash_fn": [None, 3, "sha256"],
    "hash_name": [None, 3, "md5"],
    "opt_str": [3, b"x", ["x"], 2.5],
    "mm": [
        3,
        [("img",)],
        [("img", "0", 2)],
        [("img", 0, 0)],
        [("img", -1, 2)],
        [(3, 0, 2)],
    ],
    "row": [None, "0", 0.0, True, -1, 99],
    "ids": [None, "ab", [1.5], [-1], [None], [True], (2**31,)],
    "index_tensor": [
        None,
        [0, 1, 2],
        torch.ones(3),
        torch.ones(3, dtype=torch.bool),
        torch.ones((1, 3), dtype=torch.int64),
        torch.full((3,), -1),
        torch.full((3,), 99),
    ],
    "kv_tensor": [None, [[1.0]], torch.ones(2, 4), torch.ones(2, 2, 2).double()],
    "layout": [None, 3, "XYZ", "lbnhc"],
    "shape": [None, (1, 2), "abcde", (1, 2, 3, 4, -1), (1, 2, 3, 4, 2.5)],
    "dtype": [None, "float16", 3],
    "picklable": [lambda: 0, (x for x in ())],
    "fast_hashable": [object(), 2.5, {1: 2}],
    "backend": [None, "cuda", 3],
}


def book_pool(pool: BlockPool) -> None:
    pool.check_invariants()


def pool_env(debug: bool) -> SimpleNamespace:
    """8 blocks: 2 held, 2 cached and freed (in the queue with hashes "a" and "b"), the rest
    free; a request with two block hashes."""
    pool = BlockPool(8, debug_mode=debug)
    cached = pool.get_new_blocks(2)
    pool.cache_full_blocks(SimpleNamespace(block_hashes=["a", "b"]), cached, 0, 2)
    pool.free_blocks(cached[::-1])
    held = pool.get_new_blocks(2)
    req = SimpleNamespace(request_id="r", block_hashes=["x", "y"])
    return SimpleNamespace(
        pool=pool,
        held=held,
        cached=cached,
        req=req,
        other=BlockPool(8).get_new_blocks(2),
        books=lambda env: book_pool(env.pool),
    )


def queue_books(env) -> None:
    q = env.q
    chain = [q.fake_free_list_head]
    while chain[-1] is not q.fake_free_list_tail:
        assert len(chain) < 64, "the queue has a cycle"
        nxt = chain[-1].next_free_block
        assert nxt is not None and nxt.prev_free_block is chain[-1], "links disagree"
        chain.append(nxt)
    assert len(chain) - 2 == q.num_free_blocks, "count disagrees with the links"
    assert len({id(b) for b in chain}) == len(chain), "a block is linked twice"


def queue_env(debug: bool) -> SimpleNamespace:
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks[:4], debug_mode=debug)
    other = FreeKVCacheBlockQueue([KVCacheBlock(9)], debug_mode=debug)
    return SimpleNamespace(q=q, blocks=blocks, other=other, books=queue_books)


def manager_books(env) -> None:
    m = env.m
    m.block_pool.check_invariants()
    for rid, blocks in m.coordinator.single_type_managers[0].req_to_blocks.items():
        assert isinstance(rid, str), f"a request id {rid!r} in the books"
        assert all(b.ref_cnt > 0 or b.is_null for b in blocks), f"{rid}: a free block"
    for req in env.reqs:
        hashes = [h for h in req.block_hashes]
        for block, h in zip(m.get_blocks(req.request_id), hashes):
            assert block.block_hash in (None, h), (
                f"{req.request_id}: a block of other content"
            )


def manager_env(debug: bool, sliding_window=None) -> SimpleNamespace:
    """12 blocks of 4: request "done" ran and finished (its 2 full blocks cached and free),
    "run" is running (2 blocks), "new" shares done's prompt and has not been admitted."""
    m = KVCacheManager(12, 4, sliding_window=sliding_window)
    m.block_pool.debug_mode = debug
    done = Request("done", list(range(9)), block_hasher=m.request_block_hasher)
    m.allocate_slots(done, 9)
    m.free(done)
    run = Request("run", [7] * 6, block_hasher=m.request_block_hasher)
    m.allocate_slots(run, 6)
    new = Request("new", list(range(9)), block_hasher=m.request_block_hasher)
    other = Request("other", [3] * 9, block_hasher=m.request_block_hasher)
    hits, n = m.get_computed_blocks(new)
    return SimpleNamespace(
        m=m,
        new=new,
        run=run,
        other=other,
        hits=hits,
        n=n,
        reqs=[done, run, new, other],
        books=manager_books,
    )


def stale_env(debug: bool) -> SimpleNamespace:
    """manager_env after the lookup: request "x" takes every free block (evicting done's cached
    ones, the hits) and finishes, so the hits now hold x's content."""
    env = manager_env(debug)
    x = Request("x", [5] * 36, block_hasher=env.m.request_block_hasher)
    env.m.allocate_slots(x, 36)
    env.m.free(x)
    env.reqs.append(x)
    return env


def each(entry, arg, kind, make, call, trusted="", values=None):
    """One case per bad value of the kind; ``call(env, v)``."""
    for v in values if values is not None else KINDS[kind]:
        CASES.append(
            Case(
                entry,
                f"{arg} {v!r}"[:60],
                make,
                (lambda v: lambda env: call(env, v))(v),
                kind,
                arg,
                trusted,
                {"call_with": call, "none_ok": _none_ok(kind, values)},
            )
        )


def _none_ok(kind, values) -> bool:
    """None left out of the kind's values: it is the argument's default, a good value."""
    return values is not None and None in KINDS.get(kind, ()) and None not in values


def order(entry, label, make, call, trusted=""):
    CASES.append(Case(entry, label, make, call, trusted=trusted))


CASES: list[Case] = []
GOOD = object()  # an argument a case leaves at its good value
NOTHING = lambda debug: SimpleNamespace(books=lambda env: None)  # noqa: E731

# Why memlab, as vLLM, trusts its caller with these when debug mode is off (docstrings).
TRUST_BLOCKS = (
    "block_pool.py: with debug mode off the blocks are trusted as vLLM trusts them"
)
TRUST_QUEUE = (
    "FreeKVCacheBlockQueue.prepend_n/append_n: a queued block is scanned for in debug"
)
TRUST_HITS = (
    "KVCacheManager.allocate_slots: the hits are trusted as vLLM trusts its scheduler"
)


def _queue_cases():
    e = "FreeKVCacheBlockQueue"
    each(f"{e}()", "blocks", "blocks", NOTHING, lambda env, v: FreeKVCacheBlockQueue(v))
    each(f"{e}.popleft_n", "n", "count", queue_env, lambda env, v: env.q.popleft_n(v))
    order(
        f"{e}.popleft_n",
        "more than are free",
        queue_env,
        lambda env: env.q.popleft_n(5),
    )
    for name in ("remove", "append"):
        each(
            f"{e}.{name}",
            "block",
            "block",
            queue_env,
            (lambda n: lambda env, v: getattr(env.q, n)(v))(name),
            TRUST_QUEUE if name == "remove" else "",
        )
    order(
        f"{e}.remove",
        "a block out of the queue",
        queue_env,
        lambda env: env.q.remove(env.blocks[4]),
    )
    order(
        f"{e}.remove",
        "a block of another queue",
        queue_env,
        lambda env: env.q.remove(env.other.fake_free_list_head.next_free_block),
        TRUST_QUEUE,
    )
    order(
        f"{e}.append",
        "a queued block",
        queue_env,
        lambda env: env.q.append(env.blocks[1]),
    )
    for name in ("prepend_n", "append_n"):
        call = (lambda n: lambda env, v: getattr(env.q, n)(v))(name)
        each(f"{e}.{name}", "blocks", "blocks", queue_env, call, TRUST_QUEUE)
        order(
            f"{e}.{name}",
            "a queued block (a cycle)",
            queue_env,
            (lambda c: lambda env: c(env, [env.blocks[4], env.blocks[2]]))(call),
            TRUST_QUEUE,
        )
        order(
            f"{e}.{name}",
            "one block twice",
            queue_env,
            (lambda c: lambda env: c(env, [env.blocks[4], env.blocks[4]]))(call),
            TRUST_QUEUE,
        )


def _pool_cases():
    e = "BlockPool"
    each(f"{e}()", "num_gpu_blocks", "count", NOTHING, lambda env, v: BlockPool(v))
    each(
        f"{e}()",
        "num_gpu_blocks",
        "",
        NOTHING,
        lambda env, v: BlockPool(v),
        values=[0, 1, HUGE],
    )
    each(f"{e}()", "enable_caching", "flag", NOTHING, lambda env, v: BlockPool(8, v))
    each(
        f"{e}()",
        "hash_block_size",
        "pos",
        NOTHING,
        lambda env, v: (
            BlockPool(8, True, v) if v is not None else BlockPool(8, True, "x")
        ),
    )
    each(
        f"{e}.get_cached_block",
        "block_hash",
        "unhashable",
        pool_env,
        lambda env, v: env.pool.get_cached_block(v),
    )
    each(
        f"{e}.get_cached_block",
        "kv_cache_group_ids",
        "group_ids",
        pool_env,
        lambda env, v: env.pool.get_cached_block("a", v),
    )
    each(
        f"{e}.get_new_blocks",
        "num_blocks",
        "count",
        pool_env,
        lambda env, v: env.pool.get_new_blocks(v),
    )
    order(
        f"{e}.get_new_blocks",
        "more than are free",
        pool_env,
        lambda env: env.pool.get_new_blocks(6),
    )

    def cache(env, request=GOOD, blocks=GOOD, c=0, f=2, **kw):
        req = env.req if request is GOOD else request
        blk = env.held if blocks is GOOD else blocks
        return env.pool.cache_full_blocks(req, blk, c, f, **kw)

    c = f"{e}.cache_full_blocks"
    each(c, "request", "request", pool_env, lambda env, v: cache(env, request=v))
    each(
        c,
        "blocks",
        "blocks",
        pool_env,
        lambda env, v: cache(env, blocks=v),
        TRUST_BLOCKS,
    )
    each(c, "num_cached_blocks", "count", pool_env, lambda env, v: cache(env, c=v))
    each(c, "num_full_blocks", "count", pool_env, lambda env, v: cache(env, f=v))
    each(
        c,
        "num_full_blocks",
        "",
        pool_env,
        lambda env, v: cache(env, f=v),
        values=[3, HUGE],
    )
    each(
        c,
        "block_size",
        "pos",
        pool_env,
        lambda env, v: (
            cache(env, block_size=v) if v is not None else cache(env, block_size="4")
        ),
    )

    def sized_env(debug):
        env = pool_env(debug)
        env.pool = BlockPool(8, True, 4, debug_mode=debug)
        env.held = env.pool.get_new_blocks(2)
        return env

    order(
        c,
        "block_size other than hash_block_size",
        sized_env,
        lambda env: cache(env, block_size=16),
    )
    each(
        c,
        "kv_cache_group_id",
        "group_id",
        pool_env,
        lambda env, v: cache(env, kv_cache_group_id=v),
    )
    order(
        c,
        "a block that has a hash",
        pool_env,
        lambda env: cache(env, blocks=[env.held[0], env.cached[1]]),
        TRUST_BLOCKS,
    )
    order(
        c,
        "one block twice",
        pool_env,
        lambda env: cache(env, blocks=[env.held[0], env.held[0]]),
        TRUST_BLOCKS,
    )
    order(
        c,
        "blocks of another pool",
        pool_env,
        lambda env: cache(env, blocks=[env.held[0], env.other[0]]),
        TRUST_BLOCKS,
    )
    order(
        c,
        "a non-block after a good one",
        pool_env,
        lambda env: cache(env, blocks=[env.held[0], "x"]),
        TRUST_BLOCKS,
    )
    t = f"{e}.touch"
    each(
        t, "blocks", "blocks", pool_env, lambda env, v: env.pool.touch(v), TRUST_BLOCKS
    )
    order(
        t,
        "a held block, then a non-block",
        pool_env,
        lambda env: env.pool.touch([env.held[0], None]),
        TRUST_BLOCKS,
    )
    order(
        t,
        "a held block, then another pool's",
        pool_env,
        lambda env: env.pool.touch([env.held[0], env.other[0]]),
        TRUST_BLOCKS,
    )

    def popped_env(debug):
        env = pool_env(debug)
        env.popped = env.pool.free_block_queue.popleft()  # out of the queue, ref_cnt 0
        env.books = lambda env: None  # the pool is off its books by the popleft itself
        return env

    order(
        t,
        "a held block, then a popped block not yet counted",
        popped_env,
        lambda env: env.pool.touch([env.held[0], env.popped]),
        TRUST_BLOCKS,
    )
    f = f"{e}.free_blocks"
    each(
        f,
        "ordered_blocks",
        "blocks",
        pool_env,
        lambda env, v: env.pool.free_blocks(v),
        TRUST_BLOCKS,
    )
    order(
        f,
        "a held block twice (double free)",
        pool_env,
        lambda env: env.pool.free_blocks([env.held[0], env.held[0]]),
        TRUST_BLOCKS,
    )
    order(
        f,
        "a block freed already",
        pool_env,
        lambda env: env.pool.free_blocks([env.cached[0]]),
        TRUST_BLOCKS,
    )
    order(
        f,
        "another pool's block",
        pool_env,
        lambda env: env.pool.free_blocks([env.other[0]]),
        TRUST_BLOCKS,
    )
    order(
        f,
        "a held block, then a non-block",
        pool_env,
        lambda env: env.pool.free_blocks(iter([env.held[0], 3])),
        TRUST_BLOCKS,
    )


def _manager_cases():
    e = "KVCacheManager"
    base = dict(num_gpu_blocks=8, block_size=4)
    for arg, kind in (
        ("num_gpu_blocks", "count"),
        ("block_size", "pos"),
        ("enable_caching", "flag"),
        ("watermark", "fraction"),
        ("hash_fn", "hash_name"),
        ("max_model_len", "pos"),
        ("sliding_window", "pos"),
    ):
        values = [
            v
            for v in KINDS[kind]
            if not (v is None and arg in ("max_model_len", "sliding_window"))
        ]
        each(
            f"{e}()",
            arg,
            kind,
            NOTHING,
            (lambda a: lambda env, v: KVCacheManager(**{**base, a: v}))(arg),
            values=values,
        )
    for name in ("get_computed_blocks", "free"):
        each(
            f"{e}.{name}",
            "request",
            "request",
            manager_env,
            (lambda n: lambda env, v: getattr(env.m, n)(v))(name),
        )
    a = f"{e}.allocate_slots"

    def alloc(env, request=GOOD, n=9, c=GOOD, blocks=GOOD, look=0):
        req = env.new if request is GOOD else request
        hits = env.hits if blocks is GOOD else blocks
        return env.m.allocate_slots(req, n, env.n if c is GOOD else c, hits, look)

    each(a, "request", "request", manager_env, lambda env, v: alloc(env, request=v))
    each(a, "num_new_tokens", "pos", manager_env, lambda env, v: alloc(env, n=v))
    each(
        a,
        "num_new_computed_tokens",
        "count",
        manager_env,
        lambda env, v: alloc(env, c=v),
    )
    each(
        a,
        "num_lookahead_tokens",
        "count",
        manager_env,
        lambda env, v: alloc(env, look=v),
    )
    each(
        a,
        "new_computed_blocks",
        "blocks",
        manager_env,
        lambda env, v: alloc(env, blocks=v),
        TRUST_HITS,
        values=[v for v in KINDS["blocks"] if v is not None],  # None: no hits
    )
    order(
        a,
        "num_new_computed_tokens past the hits",
        manager_env,
        lambda env: alloc(env, c=12),
    )
    order(
        a,
        "stale hits (evicted and reused since the lookup)",
        stale_env,
        lambda env: alloc(env),
        TRUST_HITS,
    )
    order(
        a,
        "hits for a running request",
        manager_env,
        lambda env: env.m.allocate_slots(env.run, 4, env.n, env.hits),
        TRUST_HITS,
    )
    order(
        a,
        "hits of another pool",
        manager_env,
        lambda env: alloc(env, blocks=BlockPool(12).get_new_blocks(2)),
        TRUST_HITS,
    )
    order(
        a,
        "hits of another request's prompt",
        manager_env,
        lambda env: env.m.allocate_slots(env.other, 9, env.n, env.hits),
        TRUST_HITS,
    )
    each(
        f"{e}.remove_skipped_blocks",
        "request_id",
        "req_id",
        lambda d: manager_env(d, sliding_window=4),
        lambda env, v: env.m.remove_skipped_blocks(v, 8),
    )
    each(
        f"{e}.remove_skipped_blocks",
        "processed_computed_tokens",
        "count",
        lambda d: manager_env(d, sliding_window=4),
        lambda env, v: env.m.remove_skipped_blocks("run", v),
    )
    for name in ("get_blocks", "get_block_ids"):
        each(
            f"{e}.{name}",
            "request_id",
            "req_id",
            manager_env,
            (lambda n: lambda env, v: getattr(env.m, n)(v))(name),
        )


def _request_cases():
    e = "Request()"
    hasher = get_request_block_hasher(4, sha256)
    each(e, "request_id", "req_id", NOTHING, lambda env, v: Request(v, [1, 2]))
    each(e, "prompt_token_ids", "tokens", NOTHING, lambda env, v: Request("r", v))
    each(
        e,
        "block_hasher",
        "hash_fn",
        NOTHING,
        lambda env, v: (
            Request("r", [1] * 8, block_hasher=v)
            if v is not None
            else Request("r", [1], block_hasher=print)
        ),
    )
    for arg in ("lora_name", "lora_path", "cache_salt"):
        each(
            e,
            arg,
            "opt_str",
            NOTHING,
            (
                lambda a: (
                    lambda env, v: Request("r", [1] * 8, block_hasher=hasher, **{a: v})
                )
            )(arg),
        )
    each(
        e,
        "mm_features",
        "mm",
        NOTHING,
        lambda env, v: Request("r", [1] * 8, block_hasher=hasher, mm_features=v),
    )

    def req_env(debug):
        r = Request("r", [1, 2, 3], block_hasher=hasher)
        return SimpleNamespace(r=r, books=lambda env: None)

    each(
        "Request.append_output_token_ids",
        "token_ids",
        "tokens",
        req_env,
        lambda env, v: env.r.append_output_token_ids(v),
        values=[v for v in KINDS["tokens"] if v != 3],  # one token id is a call too
    )


def _hashing_cases():
    each("sha256", "obj", "picklable", NOTHING, lambda env, v: sha256(v))
    each("fast_hash", "obj", "fast_hashable", NOTHING, lambda env, v: fast_hash(v))
    each(
        "hash_block_tokens",
        "hash_fn",
        "hash_fn",
        NOTHING,
        lambda env, v: hash_block_tokens(v, None, [1, 2]),
    )
    each(
        "hash_block_tokens",
        "curr_block_token_ids",
        "tokens",
        NOTHING,
        lambda env, v: hash_block_tokens(sha256, None, v),
    )
    each(
        "hash_block_tokens",
        "extra_keys",
        "",
        NOTHING,
        lambda env, v: hash_block_tokens(sha256, None, [1], v),
        values=[3, "salt", [("lora", "a")]],
    )
    each(
        "init_none_hash",
        "hash_fn",
        "hash_fn",
        NOTHING,
        lambda env, v: init_none_hash(v),
    )
    each(
        "init_none_hash",
        "seed",
        "",
        NOTHING,
        lambda env, v: init_none_hash(sha256, v),
        values=[None, 3, b"x"],
    )
    each(
        "get_request_block_hasher",
        "block_size",
        "pos",
        NOTHING,
        lambda env, v: get_request_block_hasher(v, sha256),
    )
    each(
        "get_request_block_hasher",
        "hash_fn",
        "hash_fn",
        NOTHING,
        lambda env, v: get_request_block_hasher(4, v),
    )
    each(
        "get_hash_fn_by_name",
        "name",
        "hash_name",
        NOTHING,
        lambda env, v: get_hash_fn_by_name(v),
    )


def _block_table_cases():
    e = "BlockTable"

    def table_env(debug):
        t = bt.BlockTable(4, 2, 3, 8)
        t.add_row([1, 2], 0)
        return SimpleNamespace(t=t, books=lambda env: None)

    for arg in (
        "block_size",
        "max_num_reqs",
        "max_num_blocks_per_req",
        "max_num_batched_tokens",
    ):
        each(
            f"{e}()",
            arg,
            "pos",
            NOTHING,
            (
                lambda a: (
                    lambda env, v: bt.BlockTable(
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
    each(
        f"{e}()",
        "device",
        "",
        NOTHING,
        lambda env, v: bt.BlockTable(4, 2, 3, 8, device=v),
        values=[3, "tpu", "cuda:x"],
    )
    for name in ("append_row", "add_row"):
        each(
            f"{e}.{name}",
            "block_ids",
            "ids",
            table_env,
            (lambda n: lambda env, v: getattr(env.t, n)(v, 0))(name),
        )
        each(
            f"{e}.{name}",
            "row_idx",
            "row",
            table_env,
            (lambda n: lambda env, v: getattr(env.t, n)([3], v))(name),
        )
    order(
        f"{e}.append_row",
        "past max_num_blocks_per_req",
        table_env,
        lambda env: env.t.append_row([3, 4], 0),
    )
    each(f"{e}.move_row", "src", "row", table_env, lambda env, v: env.t.move_row(v, 1))
    each(f"{e}.move_row", "tgt", "row", table_env, lambda env, v: env.t.move_row(0, v))
    each(f"{e}.get_row", "row_idx", "row", table_env, lambda env, v: env.t.get_row(v))
    req, pos = torch.tensor([0, 0, 0]), torch.tensor([0, 1, 5])
    m = f"{e}.compute_slot_mapping"
    each(
        m,
        "req_indices",
        "index_tensor",
        table_env,
        lambda env, v: env.t.compute_slot_mapping(v, pos, backend="torch"),
    )
    each(
        m,
        "positions",
        "index_tensor",
        table_env,
        lambda env, v: env.t.compute_slot_mapping(req, v, backend="torch"),
    )
    each(
        m,
        "num_padded",
        "count",
        table_env,
        lambda env, v: (
            env.t.compute_slot_mapping(req, pos, v, backend="torch")
            if v is not None
            else env.t.compute_slot_mapping(req, pos, "4", backend="torch")
        ),
    )
    each(
        m,
        "backend",
        "backend",
        table_env,
        lambda env, v: env.t.compute_slot_mapping(req, pos, backend=v),
    )

    def cache_env(debug):
        return SimpleNamespace(
            kc=torch.zeros(3, 4, 2, 2),
            vc=torch.zeros(3, 4, 2, 2),
            books=lambda env: None,
        )

    key, slots = torch.ones(2, 2, 2), torch.tensor([1, 5])
    each(
        "store_kv",
        "key",
        "kv_tensor",
        cache_env,
        lambda env, v: bt.store_kv(v, key, env.kc, env.vc, slots, backend="torch"),
    )
    each(
        "store_kv",
        "slot_mapping",
        "index_tensor",
        cache_env,
        lambda env, v: bt.store_kv(key, key, env.kc, env.vc, v, backend="torch"),
    )
    each(
        "store_kv",
        "key_cache",
        "kv_tensor",
        cache_env,
        lambda env, v: bt.store_kv(key, key, v, env.vc, slots, backend="torch"),
    )
    each(
        "store_kv",
        "backend",
        "backend",
        cache_env,
        lambda env, v: bt.store_kv(key, key, env.kc, env.vc, slots, backend=v),
    )
    table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    each(
        "compute_slot_mapping",
        "block_table",
        "kv_tensor",
        NOTHING,
        lambda env, v: bt.compute_slot_mapping(v, req, pos, 4, backend="torch"),
    )
    each(
        "compute_slot_mapping",
        "block_size",
        "pos",
        NOTHING,
        lambda env, v: bt.compute_slot_mapping(table, req, pos, v, backend="torch"),
    )
    each(
        "compute_slot_mapping",
        "num_tokens",
        "count",
        NOTHING,
        lambda env, v: (
            bt.compute_slot_mapping(table, req, pos, 4, v, backend="torch")
            if v is not None
            else bt.compute_slot_mapping(table, req, pos, 4, "2", backend="torch")
        ),
    )


def _layout_cases():
    each(
        "stride_order",
        "layout",
        "layout",
        NOTHING,
        lambda env, v: kv_layout.stride_order(v),
    )
    each(
        "layout_strides",
        "shape",
        "shape",
        NOTHING,
        lambda env, v: kv_layout.layout_strides(v),
    )
    each(
        "layout_strides",
        "layout",
        "layout",
        NOTHING,
        lambda env, v: kv_layout.layout_strides((1, 2, 3, 4, 5), v),
    )
    names = ("num_layers", "num_blocks", "num_kv_heads", "block_size", "head_size")
    for i, arg in enumerate(names):
        each(
            "allocate_kv_cache",
            arg,
            "pos",
            NOTHING,
            (
                lambda i: (
                    lambda env, v: kv_layout.allocate_kv_cache(
                        *[2] * i, v, *[2] * (4 - i)
                    )
                )
            )(i),
        )
    each(
        "allocate_kv_cache",
        "head_size_v",
        "",
        NOTHING,
        lambda env, v: kv_layout.allocate_kv_cache(2, 2, 2, 2, 2, v),
        values=["2", 2.5, -1, 0],
    )
    each(
        "allocate_kv_cache",
        "dtype",
        "dtype",
        NOTHING,
        lambda env, v: kv_layout.allocate_kv_cache(2, 2, 2, 2, 2, dtype=v),
    )
    each(
        "allocate_kv_cache",
        "layout",
        "layout",
        NOTHING,
        lambda env, v: kv_layout.allocate_kv_cache(2, 2, 2, 2, 2, layout=v),
    )
    each(
        "allocate_kv_cache",
        "device",
        "",
        NOTHING,
        lambda env, v: kv_layout.allocate_kv_cache(2, 2, 2, 2, 2, device=v),
        values=[3, "tpu"],
    )
    layer = kv_layout.allocate_kv_cache(1, 2, 2, 2, 4)[0]
    each(
        "split_kv",
        "layer_cache",
        "kv_tensor",
        NOTHING,
        lambda env, v: kv_layout.split_kv(v, 4),
    )
    each(
        "split_kv",
        "head_size",
        "pos",
        NOTHING,
        lambda env, v: kv_layout.split_kv(layer, v),
    )
    each(
        "split_kv",
        "head_size",
        "",
        NOTHING,
        lambda env, v: kv_layout.split_kv(layer, v),
        values=[8, 9, 0],
    )


for _part in (
    _queue_cases,
    _pool_cases,
    _manager_cases,
    _request_cases,
    _hashing_cases,
    _block_table_cases,
    _layout_cases,
):
    _part()


def run_all() -> dict:
    """{debug: {case index: (class, what)}}."""
    return {d: {i: classify(c, d) for i, c in enumerate(CASES)} for d in (True, False)}


def counts(results) -> dict:
    return {d: Counter(cls for cls, _ in r.values()) for d, r in results.items()}


@pytest.fixture(scope="module")
def results():
    return run_all()


def _failures(results, debug: bool) -> list[str]:
    out = []
    for i, (cls, what) in results[debug].items():
        c = CASES[i]
        if cls in ("clean", "silent"):
            continue
        if not debug and c.trusted:
            continue
        out.append(f"{c.entry} [{c.label}]: {cls}: {what}")
    return out


def test_with_debug_mode_on_no_bad_call_is_raw_changed_or_corrupt(results):
    bad = _failures(results, True)
    assert not bad, f"{len(bad)} bad calls:\n" + "\n".join(bad)


def test_with_debug_mode_off_only_what_vllm_trusts_is_left_to_its_caller(results):
    bad = _failures(results, False)
    assert not bad, f"{len(bad)} bad calls:\n" + "\n".join(bad)


def test_no_silent_acceptance_of_a_wrong_type(results):
    """A wrong type is refused, never accepted and kept (it would fail later, elsewhere)."""
    silent = [
        f"{CASES[i].entry} [{CASES[i].label}]"
        for i, (cls, _) in results[True].items()
        if cls == "silent" and CASES[i].kind and CASES[i].kind not in SILENT_OK
    ]
    assert not silent, "accepted: " + "; ".join(silent)


# Kinds where a listed value may be legal (a tuple of blocks, group id [0] as a tuple ...).
SILENT_OK = {"blocks", "group_ids", "flag", "unhashable", "mm", "opt_str", "req_id"}


def test_counts(results, capsys):
    """The table for the report: every class, with debug mode on and off."""
    table = counts(results)
    with capsys.disabled():
        print(
            f"\nmemlab.vllm bad calls: {len(CASES)} cases, "
            f"{len({c.entry for c in CASES})} entry points"
        )
        for d in (True, False):
            row = "  ".join(f"{k} {table[d][k]}" for k in CLASSES)
            print(f"  debug {'on ' if d else 'off'}: {row}")
    assert sum(table[True].values()) == len(CASES)


# ---- random values of the same kinds -------------------------------------------------------

WRONG_TYPE = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.lists(st.integers(-2, 2), max_size=2),
    st.dictionaries(st.integers(0, 2), st.integers(0, 2), min_size=1, max_size=2),
    st.builds(object),
)
DRAWS = {
    "count": st.one_of(
        WRONG_TYPE.filter(lambda v: type(v) is not int), st.integers(max_value=-1)
    ),
    "pos": st.one_of(
        WRONG_TYPE.filter(lambda v: type(v) is not int), st.integers(max_value=0)
    ),
    "block": WRONG_TYPE,
    "request": WRONG_TYPE,
    "req_id": WRONG_TYPE.filter(lambda v: not isinstance(v, str)),
    "tokens": st.one_of(
        WRONG_TYPE.filter(lambda v: not isinstance(v, list)),
        st.lists(
            st.one_of(st.integers(max_value=-1), st.floats(), st.none()),
            min_size=1,
            max_size=3,
        ),
    ),
    "row": st.one_of(
        WRONG_TYPE.filter(lambda v: type(v) is not int),
        st.integers(max_value=-1),
        st.integers(min_value=2),
    ),
    "layout": st.text(max_size=6).filter(lambda v: v not in kv_layout.KV_CACHE_LAYOUTS),
}
DRAWABLE = [c for c in CASES if c.kind in DRAWS and "call_with" in c.extra]
DRAWABLE_ENTRIES = sorted({(c.entry, c.arg, c.kind) for c in DRAWABLE})


@pytest.mark.parametrize(
    "entry,arg,kind", DRAWABLE_ENTRIES, ids=[f"{e}:{a}" for e, a, _ in DRAWABLE_ENTRIES]
)
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_random_wrong_values_are_refused_cleanly(entry, arg, kind, data):
    case = next(c for c in DRAWABLE if (c.entry, c.arg, c.kind) == (entry, arg, kind))
    v = data.draw(DRAWS[kind], label=arg)
    assume(not (v is None and case.extra["none_ok"]))  # None is this argument's default
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = v + 0.5  # an integral float is a float all the same; keep it one
    drawn = Case(
        entry,
        f"{arg} {v!r}",
        case.make,
        lambda env: case.extra["call_with"](env, v),
        kind,
        arg,
        case.trusted,
    )
    for debug in (True, False):
        cls, what = classify(drawn, debug)
        ok = cls == "clean" or (not debug and drawn.trusted and cls != "silent")
        assert ok, f"{entry} [{drawn.label}] debug {debug}: {cls}: {what}"


def test_the_classifier_can_fail():
    """A raw error, a change before an error, an accepted call and corrupt books are told apart."""

    def make(debug):
        return SimpleNamespace(n=[0], books=lambda env: None)

    def grow_then_raise(env):
        env.n.append(1)
        raise ValueError("n")

    def corrupt_books(debug):
        env = make(debug)
        env.books = lambda env: (_ for _ in ()).throw(AssertionError("books"))
        return env

    assert classify(Case("x", "x", make, lambda env: None.x), True)[0] == "raw"
    assert classify(Case("x", "x", make, grow_then_raise), True)[0] == "changed"
    assert classify(Case("x", "x", make, lambda env: None), True)[0] == "silent"
    assert (
        classify(Case("x", "x", corrupt_books, lambda env: None), True)[0] == "corrupt"
    )
    assert (
        classify(Case("x", "x", make, lambda env: BlockPool(None)), True)[0] == "clean"
    )
