"""memlab.sglang.schedule_policy: SGLang 0.5.23's admission (managers/schedule_policy.py).

- Worked examples traced by hand from SGLang's source, each step citing the lines it follows
  (``PrefillAdder`` in managers/schedule_policy.py, ``PrefillBudget`` in
  mem_cache/prefill_budget.py, ``NewTokenRatioTracker`` in
  managers/scheduler_components/new_token_ratio_tracker.py, all at v0.5.23).
- memlab's ``PrefillAdder`` against SGLang's own, loaded from the wheel
  (``tests/tools/engines/schedule_policy_loader.py``): random rounds over identical stand-in books
  (hypothesis), and step by step inside the engine, both adders reading the engine's real books.
- The ratio's defaults, decay, raise and reset against the wheel's tracker.
"""

from __future__ import annotations

import copy
import random
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.capstone import engine as engine_module
from memlab.capstone.engine import Engine, TinyConfig, TinyLlama, generate_reference
from memlab.sglang import schedule_policy as sp
from memlab.sglang.schedule_policy import (
    AddReqResult,
    NewTokenRatioTracker,
    PrefillAdder,
    SamplingParams,
    SchedulePolicy,
)
from memlab_tests.tools.engines import schedule_policy_loader

SGLANG = "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/"


# -- stand-in books: what both adders read of an allocator, a prefix cache and a request -----------


class Node:
    """A matched prefix: its first holder's lock takes its tokens out of the evictable count."""

    def __init__(self, tokens: int):
        self.tokens, self.locks = tokens, 0


class Tree:
    """A prefix cache as the adders see it: evictable tokens, locks on matched prefixes."""

    buffer_pipeline = None

    def __init__(self, evictable: int, disable: bool = False):
        self.evictable, self.disable = evictable, disable

    def evictable_size(self) -> int:
        return self.evictable

    def full_evictable_size(self) -> int:
        return self.evictable

    def lock(self, node: Node):
        if node.locks == 0:
            self.evictable -= node.tokens
        node.locks += 1
        return ("lock", node)

    def unlock(self, lock) -> None:
        if lock is not None:
            node = lock[1]
            node.locks -= 1
            if node.locks == 0:
                self.evictable += node.tokens

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def finish_storage_prefetch_admission(self, *args, **kwargs) -> None:
        pass

    def discard_storage_prefetch_accounting(self, *args) -> None:
        pass


class Allocator:
    """A single pool of ``available`` free slots (SGLang's base allocator's hooks)."""

    def __init__(self, sg, page_size: int, available: int):
        self.sg, self.page_size, self.available = sg, page_size, available

    def available_size(self) -> int:
        return self.available

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0):
        return 0

    def create_prefill_budget(self, tree_cache, *, num_mixed_decode_tokens=0):
        return self.sg.PrefillBudget(
            self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens
        )

    def prealloc_fits(self, tree_cache, full_tokens, swa_tokens, *, full_budget_tokens):
        return full_tokens <= full_budget_tokens


class Rq:
    """A request with the fields both adders read (SGLang's ``Req``; the storage and host-tier
    fields of SGLang's say "none")."""

    def __init__(self, rid, prompt, output, max_new, ignore_eos, prefix_len, node, row):
        self.rid = rid
        self.origin_input_ids, self.output_ids = list(prompt), list(output)
        self.sampling_params = SamplingParams(max_new, ignore_eos)
        self.prefix_len, self.last_node, self.last_host_node = prefix_len, node, node
        self.best_match_node = node
        self.kv = types.SimpleNamespace(
            req_pool_idx=row, holds_mamba=False, cache_protected_len=prefix_len
        )
        self.host_hit_length = self.host_loaded_length = 0
        self.swa_host_hit_length = self.auxiliary_swa_host_hit_length = 0
        self.mamba_host_hit_length = self.storage_hit_length = 0
        self.storage_hit_start = self.cache_request_handle = None
        self.retracted_stain = self.host_hit_is_storage = False
        self.extend_end = self.lock = None

    @property
    def full_untruncated_fill_ids(self):
        return self.origin_input_ids + self.output_ids

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    def needs_host_load_back(self) -> bool:
        return False

    def materialized_host_hit_len(self) -> int:
        return 0

    def fulfilled_storage_hit_len(self, prefix_len: int) -> int:
        return 0


@pytest.fixture(scope="module")
def sg():
    return schedule_policy_loader.load()


def adder_of(side, sg, ps, tree, alloc, running, ratio, rem_input, rem_chunk, mixed=0):
    """The side's adder; ``mixed``: decode tokens mixed into the prefill (--enable-mixed-chunk)."""
    args = (ps, tree, alloc, running, ratio, rem_input, rem_chunk, mixed)
    if side == "memlab":
        return PrefillAdder(*args)
    batch = types.SimpleNamespace(reqs=running, batch_size=lambda: len(running))
    return sg.PrefillAdder(*args[:3], batch, *args[4:])


def books(adder, nodes) -> tuple:
    """What an adder's round has decided so far."""
    chunked = adder.new_chunked_req
    return (
        adder.rem_total_tokens,
        adder.cur_rem_tokens,
        adder.rem_chunk_tokens,
        adder.rem_input_tokens,
        [(r.rid, r.extend_end) for r in adder.can_run_list],
        None if chunked is None else chunked.rid,
        [n.locks for n in nodes],
    )


def play_round(side, sg, spec) -> list:
    """One prefill round on fresh copies of ``spec``'s books, the way the scheduler drives the
    adder (scheduler.py, ``_get_new_batch_prefill_raw``): the continuing chunk first, then the
    waiting requests in order until one comes back other than CONTINUE. Returns the books after
    each call."""
    # nodes and requests shared by the round's objects stay shared
    spec = copy.deepcopy(spec)
    tree, nodes = spec["tree"], spec["nodes"]
    alloc = Allocator(sg, spec["ps"], spec["available"])
    adder = adder_of(
        side,
        sg,
        spec["ps"],
        tree,
        alloc,
        spec["running"],
        spec["ratio"],
        spec["rem_input"],
        spec["rem_chunk"],
        spec.get("mixed", 0),
    )
    other = AddReqResult.OTHER if side == "memlab" else sg.AddReqResult.OTHER
    out = []
    chunked = spec["chunked"]
    if chunked is not None:
        left = adder.add_chunked_req(chunked)
        out.append(("chunked", left is not None, books(adder, nodes)))
    for r in spec["waiting"]:
        if adder.budget_state() == other:
            out.append(("budget", "OTHER"))
            break
        if side == "memlab":
            res = adder.add_one_req(r, has_chunked_req=chunked is not None)
        else:
            res = adder.add_one_req(
                r, has_chunked_req=chunked is not None, truncation_align_size=None
            )
        out.append((r.rid, res.name, books(adder, nodes)))
        if res.name != "CONTINUE":
            break
    return out


# -- worked examples, traced by hand from SGLang's source ------------------------------------------


def issue_round(ps=16, available=112, evictable=0, running=(), ratio=0.7, waiting=()):
    """Issue 32's case: pages of 16, a pool of 7 pages (112 slots), chunks of 64, 16 new tokens."""
    root = Node(0)  # where an unmatched request's prefix ends
    nodes = [root] + [n for *_, n in waiting if n is not None]
    reqs = [
        Rq(rid, range(p), [], 16, False, 0 if n is None else n.tokens, n or root, None)
        for rid, p, n in waiting
    ]
    run = [
        Rq(f"run{i}", range(p), [0] * out, 16, False, 0, None, 1)
        for i, (p, out) in enumerate(running)
    ]
    return dict(
        ps=ps,
        available=available,
        tree=Tree(evictable + sum(n.tokens for n in nodes)),
        nodes=nodes,
        running=run,
        ratio=ratio,
        rem_input=16384,
        rem_chunk=64,
        chunked=None,
        waiting=reqs,
    )


def test_worked_example_round_1_admits_two_of_four():
    """Nothing runs; 112 free slots; A, B, C, D of 23, 11, 29 and 60 tokens wait.

    A: max_new = min(16 - 0, 4096) = 16 (schedule_policy.py L1407-1410); total_tokens = 23 + 16
    + 16 (the page of per_req_token_overhead) = 55 (L1411-1412); 55 < 112 - 0 admits
    (prefill_budget.py L128); 32 (23 in whole pages) <= the 64-token chunk: not chunked
    (L1655); the commit reserves (prefill_budget.py L156-168) immediate = 32 + 16 = 48,
    total_offset = 48 + 16 = 64, current_offset = 48; the chunk budget is 64 - 32 = 32
    (L941-945); 112 - 64 > 0: CONTINUE (L874-892).
    B: 11 + 16 + 16 = 43 < 112 - 64 = 48 admits; immediate 16 + 16 = 32, total_offset 112,
    current_offset 80, chunk budget 16; remaining_total 0: NO_TOKEN. C and D wait."""
    spec = issue_round(
        waiting=[("A", 23, None), ("B", 11, None), ("C", 29, None), ("D", 60, None)]
    )
    got = play_round("memlab", None, spec)
    assert got == [
        ("A", "CONTINUE", (48, 64, 32, 16384 - 32, [("A", 23)], None, [1])),
        ("B", "NO_TOKEN", (0, 32, 16, 16384 - 48, [("A", 23), ("B", 11)], None, [2])),
    ]


def test_worked_example_round_2_reserves_what_the_running_ones_will_write():
    """A and B run with one output token each (2 pages and 1 page held: 64 free); C matched 16
    tokens of A's locked prompt (nothing evictable).

    __init__ (L673-679): total_offset = 2 x min(16 - 1, 4096) x 0.7 = 21.0 (L785-795, each
    request's remaining output, clipped, times new_token_ratio). C: total_tokens = (29 - 16) +
    16 + 16 = 45, and 45 < 64 - 21 = 43 is false: NO_TOKEN (L1604-1614). The old engine charged
    C only its pages (16) and admitted it."""
    a_page = Node(16)
    spec = issue_round(
        available=64, running=[(23, 1), (11, 1)], waiting=[("C", 29, a_page)]
    )
    spec["tree"].lock(a_page)  # A holds it
    got = play_round("memlab", None, spec)
    assert got == [("C", "NO_TOKEN", (43.0, 64, 64, 16384, [], None, [0, 1]))]


def test_worked_example_round_4_admits_once_the_ratio_and_outputs_have_shrunk():
    """Two decode steps later (3 output tokens each, still 64 free), the ratio decayed twice by
    (0.7 - 0.7 x 0.14) / 600 (new_token_ratio_tracker.py L21-37): total_offset = 2 x 13 x
    0.69799333... = 18.148, so 45 < 45.852 admits C: 13 tokens, one page: immediate 32, total
    offset 66.148, current 32, chunk budget 48; remaining_total < 0: NO_TOKEN for D."""
    t = NewTokenRatioTracker()
    t.decay_step()
    t.decay_step()
    a_page = Node(16)
    spec = issue_round(
        available=64,
        running=[(23, 3), (11, 3)],
        ratio=t.current,
        waiting=[("C", 29, a_page), ("D", 60, None)],
    )
    spec["tree"].lock(a_page)
    [(rid, res, state)] = play_round("memlab", None, spec)
    offset = 2 * 13 * t.current
    assert (rid, res) == ("C", "NO_TOKEN") and state[2:] == (
        48,
        16384 - 16,
        [("C", 29)],
        None,
        [0, 2],
    )
    assert state[0] == pytest.approx(64 - offset - 48) and state[1] == 32
    assert 45 < 64 - offset  # what admitted it


def test_worked_example_a_long_prompt_is_cut_to_whole_pages_and_reserves_no_output():
    """100 tokens, chunks of 40, pages of 16, nothing cached (L1647-1675): 112 > 40, so
    extend_len = 40 // 16 x 16 = 32, is_chunked, max_new_tokens 0: the reserve is immediate 32 +
    16, no output (it is reserved with the last chunk, L1208-1214)."""
    spec = issue_round(available=1000, waiting=[("L", 100, None), ("S", 5, None)])
    spec["rem_chunk"] = 40
    got = play_round("memlab", None, spec)
    assert got[0] == (
        "L",
        "CONTINUE",
        (1000 - 48, 1000 - 48, 8, 16384 - 32, [("L", 32)], "L", [1]),
    )
    # S: 5 + 16 + 16 = 37 < 952: its 16 tokens of pages exceed the 8 left of the chunk, so it is cut
    # to 8 // 16 x 16 = 0 tokens: OTHER (L1676-1677)
    assert got[1][:2] == ("S", "OTHER")


def test_worked_example_the_clip_and_ignore_eos():
    """A running request asking for 10,000 tokens is counted as 4,096 (CLIP_MAX_NEW_TOKENS,
    L89-91), times the ratio; with ignore_eos it cannot stop early: ratio 1 (L787)."""
    for ignore_eos, want in ((False, 4096 * 0.5), (True, 4096.0)):
        r = Rq("r", range(10), [0] * 4, 10_000, ignore_eos, 0, None, 1)
        adder = PrefillAdder(
            16, Tree(0), Allocator(None, 16, 10**6), [r], 0.5, 16384, 64
        )
        assert adder.memory_budget.total_offset == want


# -- the new-token ratio ---------------------------------------------------------------------------


def test_the_ratio_keeps_sglangs_defaults_and_steps(sg):
    theirs, mine = sg.NewTokenRatioTracker.from_config(), NewTokenRatioTracker()
    assert (mine.init, mine.min, mine.decay, mine.current) == (
        theirs.init,
        theirs.min,
        theirs.decay,
        theirs.current,
    )
    assert (sg.CLIP_MAX_NEW_TOKENS, sg.IGNORE_EOS_RESERVE_TOKENS) == (
        sp.CLIP_MAX_NEW_TOKENS,
        sp.IGNORE_EOS_RESERVE_TOKENS,
    )
    envs = sg.envs
    assert (
        envs.SGLANG_INIT_NEW_TOKEN_RATIO.get(),
        envs.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR.get(),
        envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.get(),
        envs.SGLANG_RETRACT_DECODE_STEPS.get(),
    ) == (
        sp.SGLANG_INIT_NEW_TOKEN_RATIO,
        sp.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
        sp.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
        sp.SGLANG_RETRACT_DECODE_STEPS,
    )
    for _ in range(700):  # past the floor
        theirs.decay_step()
        mine.decay_step()
        assert mine.current == theirs.current
    assert mine.current == mine.min
    reqs = [
        Rq(i, range(5), [0] * out, new, False, 0, None, 1)
        for i, (out, new) in enumerate([(3, 40), (0, 8), (30, 31)])
    ]
    assert NewTokenRatioTracker.estimate_new_token_ratio_after_retract(
        reqs
    ) == sg.NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs)
    theirs.reset()
    mine.reset()
    assert mine.current == theirs.current == 0.7


# -- memlab's adder against SGLang's, on random rounds ---------------------------------------------


@st.composite
def rounds(draw):
    ps = draw(st.sampled_from([1, 4, 16]))
    root = Node(0)  # where an unmatched request's prefix ends
    nodes = [root]
    disable = draw(st.booleans())  # no prefix cache: nothing is ever matched

    def request(rid, *, running=False, chunked=False):
        prompt = draw(st.integers(1, 300))
        max_new = draw(st.sampled_from([1, draw(st.integers(1, 200)), 5000]))
        out = draw(st.integers(1, max_new)) if running else 0
        # a retracted one comes back with its output
        if not running and draw(st.booleans()):
            out = draw(st.integers(0, max_new - 1))
        ignore_eos = draw(st.booleans())
        fill = prompt + out
        prefix, node, row = None, root, None
        if chunked:
            prefix, row = draw(st.integers(1, max(1, fill - 1))), 1
        elif not running and not disable and draw(st.booleans()):
            prefix = draw(st.integers(0, (fill - 1) // ps)) * ps
            node = Node(prefix)
            nodes.append(node)
        return Rq(
            rid, range(prompt), [0] * out, max_new, ignore_eos, prefix or 0, node, row
        )

    running = [request(f"run{i}", running=True) for i in range(draw(st.integers(0, 6)))]
    chunked = request("chunked", chunked=True) if draw(st.booleans()) else None
    waiting = [request(f"w{i}") for i in range(draw(st.integers(0, 6)))]
    chunk = draw(st.sampled_from([None, 1, 2, 4, 8]))
    if chunked is not None and chunk is None:
        chunk = 2
    return dict(
        ps=ps,
        available=draw(st.integers(0, 3000)),
        tree=Tree(draw(st.integers(0, 400)) + sum(n.tokens for n in nodes), disable),
        nodes=nodes,
        running=running,
        ratio=draw(st.sampled_from([0.7, 0.098, 1.0, draw(st.floats(0.098, 1.0))])),
        rem_input=draw(st.sampled_from([16384, draw(st.integers(1, 600))])),
        rem_chunk=None if chunk is None else chunk * 16,
        # SGLang mixes the running batch in only with chunked prefill on
        mixed=len(running) if chunk is not None and draw(st.booleans()) else 0,
        chunked=chunked,
        waiting=waiting,
    )


@settings(max_examples=400, deadline=None)
@given(spec=rounds())
def test_random_rounds_match_sglangs_adder(sg, spec):
    assert play_round("memlab", sg, spec) == play_round("sglang", sg, spec)


def test_a_round_that_forgets_the_running_output_differs_from_sglang(sg, monkeypatch):
    """The comparison catches the old engine's mistake (issue 32): the running requests' future
    output left out of the budget."""
    spec = issue_round(
        available=64, running=[(23, 1), (11, 1)], waiting=[("C", 29, Node(16))]
    )
    spec["tree"].lock(spec["nodes"][0])
    assert play_round("memlab", sg, spec) == play_round("sglang", sg, spec)
    monkeypatch.setattr(
        PrefillAdder, "_get_running_request_total_token_offset", lambda self, r: 0
    )
    assert play_round("memlab", sg, spec) != play_round("sglang", sg, spec)


# -- step by step inside the engine: both adders on the engine's own books -------------------------


MODEL = TinyLlama(TinyConfig())


class SgTree:
    """SGLang's adder's view of the engine's prefix cache: the same locks, the same counts."""

    buffer_pipeline = None

    def __init__(self, tree):
        self.tree, self.disable = tree, tree.disable

    def evictable_size(self) -> int:
        return self.tree.evictable_size()

    def lock(self, node):
        return self.tree.lock(node)

    def unlock(self, lock) -> None:
        self.tree.unlock(lock)

    def supports_mamba(self) -> bool:
        return False

    def finish_storage_prefetch_admission(self, *args, **kwargs) -> None:
        pass


class SgAlloc:
    def __init__(self, sg, engine):
        self.sg, self.engine, self.page_size = sg, engine, engine.page_size

    def available_size(self) -> int:
        return self.engine.allocator.available_size()

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0):
        return 0

    def create_prefill_budget(self, tree_cache, *, num_mixed_decode_tokens=0):
        return self.sg.PrefillBudget(
            self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens
        )


def view(r) -> Rq:
    """SGLang's adder's copy of an engine request (its matched node is the engine's)."""
    v = Rq(
        r.rid,
        r.origin_input_ids,
        r.output_ids,
        r.max_new_tokens,
        r.sampling_params.ignore_eos,
        r.prefix_len,
        r.last_node,
        r.kv.req_pool_idx,
    )
    return v


class Recording(PrefillAdder):
    """memlab's adder, writing down what each call decided (the engine builds one per round)."""

    log: list = []

    def add_chunked_req(self, req):
        left = super().add_chunked_req(req)
        self.log.append(("chunked", req.rid, req.extend_end, self._budgets()))
        return left

    def add_one_req(self, req, has_chunked_req=False):
        res = super().add_one_req(req, has_chunked_req)
        end = req.extend_end if req in self.can_run_list else None
        self.log.append((req.rid, res.name, end, self._budgets()))
        return res

    def _budgets(self):
        return (self.rem_total_tokens, self.cur_rem_tokens, self.rem_chunk_tokens)


class Shadowed(Engine):
    """The engine, with SGLang's adder run first on the same books every round (its locks
    undone), then memlab's; ``trace`` holds both rounds' calls, step by step."""

    def __init__(self, sg, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sg, self.trace = sg, []

    def get_new_batch_prefill(self):
        theirs = self._sglang_round()
        Recording.log = []
        batch = super().get_new_batch_prefill()
        if theirs is not None or Recording.log:
            self.trace.append((Recording.log, theirs))
        return batch

    def _sglang_round(self):
        if not self.waiting and self.chunked_req is None:
            return None
        rows = self.req_to_token_pool.available_size()
        if rows <= 0 and self.chunked_req is None:
            return None
        self.policy.calc_priority(self.waiting)
        sg, tree = self.sg, SgTree(self.tree_cache)
        running = [view(r) for r in self.running]
        adder = sg.PrefillAdder(
            self.page_size,
            tree,
            SgAlloc(sg, self),
            types.SimpleNamespace(reqs=running, batch_size=lambda: len(running)),
            self.new_token_ratio_tracker.current,
            engine_module.MAX_PREFILL_TOKENS,
            self.chunk_size,
            len(running) if self.enable_mixed_chunk else 0,
        )
        log = []

        def budgets():
            return (
                adder.rem_total_tokens,
                adder.cur_rem_tokens,
                adder.rem_chunk_tokens,
            )

        if self.chunked_req is not None:
            v = view(self.chunked_req)
            adder.add_chunked_req(v)
            log.append(("chunked", v.rid, v.extend_end, budgets()))
        for req in self.waiting:
            if adder.budget_state() == sg.AddReqResult.OTHER:
                break
            held = sum(v.kv.req_pool_idx is not None for v in adder.can_run_list)
            if len(adder.can_run_list) >= rows + held:
                break
            sp.match_kv_cache(req, self.tree_cache)
            v = view(req)
            res = adder.add_one_req(
                v,
                has_chunked_req=self.chunked_req is not None,
                truncation_align_size=None,
            )
            log.append(
                (
                    v.rid,
                    res.name,
                    v.extend_end if v in adder.can_run_list else None,
                    budgets(),
                )
            )
            if res.name != "CONTINUE":
                break
        for v in adder.can_run_list:
            tree.unlock(v.lock)
        return log


def serve_shadowed(sg, monkeypatch, prompts, new, **kw):
    monkeypatch.setattr(engine_module, "PrefillAdder", Recording)
    e = Shadowed(sg, MODEL, attention="torch", debug_mode=True, **kw)
    reqs = [e.add_request(p, n) for p, n in zip(prompts, new)]
    while e.step():
        pass
    assert [r.output for r in reqs] == [
        generate_reference(MODEL, [p], n)[0] for p, n in zip(prompts, new)
    ]
    return e


def issue_prompts():
    rng = random.Random(0)
    shared = [rng.randrange(1, 128) for _ in range(20)]

    def tail(n):
        return [rng.randrange(1, 128) for _ in range(n)]

    return [shared + tail(3), tail(11), shared + tail(9), tail(60)]


def test_the_issue_case_step_by_step_matches_sglangs_adder(sg, monkeypatch):
    """Issue 32: 23, 11, 29 and 60 prompt tokens (the first and third share 20), 16 new tokens
    each, a radix cache, pages of 16, 7 pages. Every round both adders decide the same, and the
    engine queues: two at first, the third at step 4 with a page cached, the fourth alone."""
    e = serve_shadowed(
        sg,
        monkeypatch,
        issue_prompts(),
        [16] * 4,
        page_size=16,
        num_tokens=112,
        prefix_cache="radix",
    )
    for mine, theirs in e.trace:
        assert mine == theirs
    admitted = [
        [c[0] for c in mine if c[1] == "CONTINUE" or c[2] is not None]
        for mine, _ in e.trace
    ]
    assert admitted[:4] == [[0, 1], [], [], [2]]
    assert e.stats["retracted"] == 0 and e.stats["cached_tokens"] == 16


@pytest.mark.parametrize(
    "cache,ps,tokens,chunk,ignore_eos,mixed",
    [
        (None, 1, 64, 16, False, False),
        ("radix", 4, 96, 16, False, False),
        ("hash", 16, 128, 32, False, False),
        (
            None,
            16,
            160,
            32,
            True,
            False,
        ),  # the fixed-length walk (add_one_req_ignore_eos)
        ("radix", 1, 80, 8, True, False),
        ("radix", 4, 96, 16, False, True),  # --enable-mixed-chunk
        (None, 16, 160, 32, True, True),
    ],
)
def test_random_streams_step_by_step_match_sglangs_adder(
    sg, monkeypatch, cache, ps, tokens, chunk, ignore_eos, mixed
):
    rng = random.Random(ps * 1000 + tokens)
    shared = [rng.randrange(1, 128) for _ in range(24)]
    prompts = [
        (shared[: rng.randint(0, 24)] if rng.random() < 0.5 else [])
        + [rng.randrange(1, 128) for _ in range(rng.randint(1, 40))]
        for _ in range(10)
    ]
    new = [rng.randint(1, 20) for _ in prompts]
    e = serve_shadowed(
        sg,
        monkeypatch,
        prompts,
        new,
        page_size=ps,
        num_tokens=tokens,
        chunk_size=chunk,
        prefix_cache=cache,
        ignore_eos=ignore_eos,
        enable_mixed_chunk=mixed,
    )
    assert len(e.trace) > 5
    for step, (mine, theirs) in enumerate(e.trace):
        assert mine == theirs, step


# -- SchedulePolicy --------------------------------------------------------------------------------


def test_lpm_without_a_prefix_cache_becomes_fcfs():
    assert SchedulePolicy("lpm", Tree(0, disable=True)).policy == "fcfs"
    assert SchedulePolicy("lpm", Tree(0)).policy == "lpm"
    with pytest.raises(ValueError, match="schedule_policy must be one of"):
        SchedulePolicy("sjf", Tree(0))


def test_the_adder_names_a_bad_argument():
    with pytest.raises(ValueError, match="new_token_ratio"):
        PrefillAdder(16, Tree(0), Allocator(None, 16, 100), [], 1.5, 100, 64)
    with pytest.raises(TypeError, match="page_size"):
        PrefillAdder(16.0, Tree(0), Allocator(None, 16, 100), [], 0.7, 100, 64)
