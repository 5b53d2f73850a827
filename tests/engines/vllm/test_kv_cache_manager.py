"""memlab's KVCacheManager (its UnitaryKVCacheCoordinator, FullAttentionManager or
SlidingWindowManager) against vLLM 0.33's KVCacheManager (the same three layers, and BlockPool), in
lockstep.

Random streams of scheduler calls on both managers: admissions (get_computed_blocks, the
longest-hit rule, then allocate_slots, refused with None when the pool is short; with and
without a watermark), chunked prefill, decode growth by one token, twins admitted together,
preempted requests readmitted, frees, reset_prefix_cache. Both sides hash with their own code
(memlab's hashes must equal vLLM's). Before each allocate_slots the single-type manager's steps
run on both sides one by one (remove_skipped_blocks, then get_num_blocks_to_allocate, whose
counts must agree), and after it their books (num_cached_block, req_to_blocks, empty entries
included). After every step: the hit blocks and hit length, the new block ids or the refusal,
each request's blocks, and the pool's books must be equal.
"""

from __future__ import annotations

import random

import pytest
import torch

from memlab.vllm.kv_cache_manager import KVCacheManager
from memlab.vllm.request import Request
from memlab_tests.tools.engines.vllm_loader import (
    EngineRequest,
    assert_same_books,
    load,
    pool_books,
)

STREAMS = 64
SWA_STREAMS = 40
STEPS = 200
MAX_MODEL_LEN = 4096


def engine_manager(
    V, num_blocks: int, block_size: int, watermark: float, sliding_window: int | None
):
    I = V.kv_cache_interface
    layer = dict(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    spec = (
        I.FullAttentionSpec(**layer)
        if sliding_window is None
        else I.SlidingWindowSpec(**layer, sliding_window=sliding_window)
    )
    config = I.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[I.KVCacheGroupSpec(["layer.0"], spec)],
    )
    return V.kv_cache_manager.KVCacheManager(
        config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
        watermark=watermark,
    )


class Lockstep:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float,
        rng: random.Random,
        monkeypatch,
        sliding_window: int | None = None,
    ):
        self.V = V = load()
        # vLLM's seed for sha256 is then fixed
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        V.kv_cache_utils.init_none_hash(V.hashing.sha256)
        self.engine_hasher = V.kv_cache_utils.get_request_block_hasher(
            block_size, V.hashing.sha256
        )
        kw = dict(
            block_size=block_size, watermark=watermark, max_model_len=MAX_MODEL_LEN
        )
        self.ours = KVCacheManager(num_blocks, sliding_window=sliding_window, **kw)
        self.theirs = engine_manager(
            V, num_blocks, block_size, watermark, sliding_window
        )
        self.block_size = block_size
        self.rng = rng
        self.running: list[tuple[Request, EngineRequest]] = []
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.step = 0

    def where(self, what: str) -> str:
        return f"step {self.step} ({what})"

    def check(self, what: str) -> None:
        strip = self.V.kv_cache_utils.get_block_hash
        assert_same_books(
            pool_books(self.ours.block_pool),
            pool_books(self.theirs.block_pool, strip),
            self.where(what),
        )
        for ours, theirs in self.running:
            mine = self.ours.get_block_ids(ours.request_id)
            assert mine == self.theirs.get_block_ids(theirs.request_id)[0], (
                f"{self.where(what)}: blocks of {ours.request_id} differ"
            )
            assert ours.block_hashes == theirs.block_hashes, (
                f"{self.where(what)}: block hashes differ"
            )

    def new_request(self, tokens: list[int], preempted: bool = False):
        self.next_id += 1
        rid = f"r{self.next_id}"
        status = (
            self.V.RequestStatus.PREEMPTED
            if preempted
            else self.V.RequestStatus.WAITING
        )
        return (
            Request(rid, tokens, block_hasher=self.ours.request_block_hasher),
            EngineRequest(rid, tokens, self.engine_hasher, status=status),
        )

    def pick_prompt(self) -> list[int]:
        n = self.rng.randint(1, 6 * self.block_size)
        # a shared prefix, sometimes the whole prompt
        if self.prompts and self.rng.random() < 0.6:
            base = self.rng.choice(self.prompts)
            keep = self.rng.randint(1, len(base))
            return base[:keep] + [
                self.rng.randrange(1000) for _ in range(max(0, n - keep))
            ]
        return [self.rng.randrange(1000) for _ in range(n)]

    # -- the scheduler's calls, on both sides ----------------------------------------------

    def lookup(self, pair):
        ours, theirs = pair
        hit_ours, n_ours = self.ours.get_computed_blocks(ours)
        hit_theirs, n_theirs, _ = self.theirs.get_computed_blocks(theirs)
        assert n_ours == n_theirs, (
            f"{self.where('lookup')}: {n_ours} vs {n_theirs} tokens hit"
        )
        assert [b.block_id for b in hit_ours] == hit_theirs.get_block_ids()[0], (
            f"{self.where('lookup')}: hit blocks"
        )
        return hit_ours, hit_theirs, n_ours

    def manager_steps(
        self, pair, num_new_tokens: int, hit_ours, hit_theirs, n: int
    ) -> None:
        """allocate_slots' first steps, one by one on both single-type managers: out-of-window
        blocks go back (a second call inside allocate_slots finds nothing more), then the count."""
        ours, theirs = pair
        (mo,), (mt,) = (
            self.ours.coordinator.single_type_managers,
            self.theirs.coordinator.single_type_managers,
        )
        total = min(ours.num_computed_tokens + n, MAX_MODEL_LEN)
        need = min(total + num_new_tokens, MAX_MODEL_LEN)
        mo.remove_skipped_blocks(ours.request_id, total)
        mt.remove_skipped_blocks(theirs.request_id, total)
        hits_t = hit_theirs.blocks[0] if hit_theirs is not None else []
        a = mo.get_num_blocks_to_allocate(
            ours.request_id, need, hit_ours, ours.num_computed_tokens + n
        )
        b = mt.get_num_blocks_to_allocate(
            theirs.request_id,
            need,
            hits_t,
            theirs.num_computed_tokens + n,
            theirs.num_computed_tokens + n,
            need,
        )
        assert a == b, f"{self.where('get_num_blocks_to_allocate')}: {a} vs {b}"

    def manager_books(self, what: str) -> None:
        (mo,), (mt,) = (
            self.ours.coordinator.single_type_managers,
            self.theirs.coordinator.single_type_managers,
        )
        assert mo.num_cached_block == mt.num_cached_block, (
            f"{self.where(what)}: num_cached_block"
        )

        def ids(m):
            return {
                rid: [b.block_id for b in bs] for rid, bs in m.req_to_blocks.items()
            }

        assert ids(mo) == ids(mt), f"{self.where(what)}: req_to_blocks"

    def allocate(self, pair, num_new_tokens: int, hit=None) -> bool:
        ours, theirs = pair
        hit_ours, hit_theirs, n = hit if hit is not None else ([], None, 0)
        self.manager_steps(pair, num_new_tokens, hit_ours, hit_theirs, n)
        new_ours = self.ours.allocate_slots(ours, num_new_tokens, n, hit_ours)
        new_theirs = self.theirs.allocate_slots(theirs, num_new_tokens, n, hit_theirs)
        assert (new_ours is None) == (new_theirs is None), (
            f"{self.where('allocate_slots')}: refused on one side only (memlab {new_ours is None})"
        )
        self.manager_books("allocate_slots")
        if new_ours is None:
            return False
        assert [b.block_id for b in new_ours] == new_theirs.get_block_ids()[0], (
            f"{self.where('allocate_slots')}"
        )
        for r in pair:  # what the scheduler records once the step is scheduled
            r.num_computed_tokens += n + num_new_tokens
        return True

    def admit(self, pair, hit=None, chunked: bool | None = None) -> None:
        ours = pair[0]
        hit = hit if hit is not None else self.lookup(pair)
        remaining = ours.num_tokens - hit[2]
        chunked = self.rng.random() < 0.3 if chunked is None else chunked
        chunk = self.rng.randint(1, remaining) if chunked else remaining
        if self.allocate(pair, chunk, hit):
            pair[
                1
                # the watermark spares it from now on
            ].status = self.V.RequestStatus.RUNNING
            self.running.append(pair)
            self.prompts.append(list(ours.all_token_ids))

    def step_running(self, pair) -> None:
        """One more prefill chunk, or one decode token."""
        ours, theirs = pair
        remaining = ours.num_tokens - ours.num_computed_tokens
        # decode: the sampled token joins the request, then gets a slot
        if remaining == 0:
            # twins may agree
            token = self.rng.randrange(1000) if self.rng.random() < 0.8 else 7
            ours.append_output_token_ids(token)
            theirs.append_output_token_ids([token])
            remaining = 1
        chunk = self.rng.randint(1, remaining)
        if not self.allocate(pair, chunk):
            self.preempt(pair)

    def free(self, pair) -> None:
        self.running.remove(pair)
        self.ours.free(pair[0])
        self.theirs.free(pair[1])
        self.manager_books("free")

    def preempt(self, pair) -> None:
        """Freed and later admitted again with its tokens so far."""
        self.free(pair)
        if self.rng.random() < 0.5:
            self.admit(self.new_request(list(pair[0].all_token_ids), preempted=True))

    def twins(self) -> None:
        prompt = self.pick_prompt()
        pairs = [self.new_request(prompt), self.new_request(prompt)]
        # both looked up before either is admitted
        hits = [self.lookup(p) for p in pairs]
        for p, h in zip(pairs, hits):
            self.admit(p, h)

    def reset(self) -> None:
        if self.running and self.rng.random() < 0.5:
            for pair in list(self.running):
                self.free(pair)
        ok_ours, ok_theirs = (
            self.ours.reset_prefix_cache(),
            self.theirs.reset_prefix_cache(),
        )
        assert ok_ours == ok_theirs, f"{self.where('reset')}: {ok_ours} vs {ok_theirs}"


def run_stream(seed: int, monkeypatch, sliding: bool = False) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    num_blocks = rng.choice([8, 24, 64]) if block_size < 16 else rng.choice([6, 12, 30])
    watermark = rng.choice([0.0, 0.0, 0.1, 0.25])
    window = rng.randint(2, 5 * block_size) if sliding else None
    ls = Lockstep(num_blocks, block_size, watermark, rng, monkeypatch, window)
    ls.check("start")
    ops = ["admit"] * 5 + ["step"] * 8 + ["free"] * 4 + ["twins"] * 2 + ["reset"]
    for ls.step in range(1, STEPS + 1):
        op = rng.choice(ops)
        if op == "admit":
            ls.admit(ls.new_request(ls.pick_prompt()))
        elif op == "step" and ls.running:
            ls.step_running(rng.choice(ls.running))
        elif op == "free" and ls.running:
            ls.free(rng.choice(ls.running))
        elif op == "twins":
            ls.twins()
        elif op == "reset":
            ls.reset()
        ls.check(op)
        ls.ours.block_pool.check_invariants()


@pytest.mark.parametrize("seed", range(STREAMS))
def test_kv_cache_manager_streams_match_vllm(seed, monkeypatch, tally):
    # ls.check raises at the first step where the books differ
    run_stream(seed, monkeypatch)
    tally("KVCacheManager, full attention (vLLM)", 1, STEPS)


@pytest.mark.parametrize("seed", range(SWA_STREAMS))
def test_sliding_window_manager_streams_match_vllm(seed, monkeypatch, tally):
    """Blocks that leave the window become null blocks and go back to the pool; a hit needs
    only the window's blocks (scanned from the right)."""
    run_stream(1000 + seed, monkeypatch, sliding=True)
    tally("KVCacheManager, sliding window (vLLM)", 1, STEPS)


def test_longest_hit_rule_matches_vllm(monkeypatch):
    """The rule itself, case by case: stop at the first miss, never the last token (a fully
    cached prompt of whole blocks recomputes its last block), hits on freed blocks."""
    ls = Lockstep(32, 4, 0.0, random.Random(0), monkeypatch)
    a = ls.new_request(list(range(12)))
    ls.admit(a, chunked=False)
    ls.free(a)
    for tokens, want in (
        (list(range(12)), 8),
        (list(range(13)), 12),
        (list(range(11)), 8),
        ([0, 1, 2, 3, 99, 5, 6, 7, 8], 4),
        (list(range(3)), 0),
    ):
        hit_ours, _, n = ls.lookup(ls.new_request(tokens))
        assert n == want, (tokens, n)
        ls.check(f"lookup of {len(tokens)} tokens")


def test_the_comparison_catches_a_forward_order_free(monkeypatch):
    """Bug zoo: a manager that frees a request's blocks first block first. The streams must
    notice (the free queue's order differs from vLLM's)."""
    monkeypatch.setattr(
        KVCacheManager,
        "free",
        lambda self, request: self.block_pool.free_blocks(
            self.coordinator.single_type_managers[0].pop_blocks_for_free(
                request.request_id
            )
        ),
    )
    with pytest.raises(AssertionError, match="free queue differs"):
        for seed in range(4):
            run_stream(seed, monkeypatch)


def test_an_empty_prompt_is_a_request_as_in_vllm(monkeypatch, tally):
    """vLLM's Request (its real class) accepts an empty prompt; memlab's does too, and both hash
    the blocks its output fills the same way (vLLM refuses an empty prompt in its input
    processor, not in Request). A missing prompt is refused with vLLM's message."""
    from types import SimpleNamespace

    V = load()
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    V.kv_cache_utils.init_none_hash(V.hashing.sha256)
    sampling = SimpleNamespace(
        max_tokens=8, extra_args=None, skip_reading_prefix_cache=None
    )
    mgr = KVCacheManager(8, block_size=2)
    ours = Request("e", [], block_hasher=mgr.request_block_hasher)
    theirs = V.request.Request(
        "e",
        [],
        sampling,
        None,
        block_hasher=V.kv_cache_utils.get_request_block_hasher(2, V.hashing.sha256),
    )
    steps = 0
    for token in (4, 5, 6, 7, 8):
        assert (ours.num_tokens, ours.block_hashes) == (
            theirs.num_tokens,
            theirs.block_hashes,
        )
        ours.append_output_token_ids(token)
        theirs.append_output_token_ids(token)
        steps += 1
    assert ours.block_hashes == theirs.block_hashes and len(ours.block_hashes) == 2
    for prompt in (None,):
        with pytest.raises(ValueError) as a:
            Request("x", prompt)
        with pytest.raises(ValueError) as b:
            V.request.Request("x", prompt, sampling, None)
        assert str(a.value) == str(b.value)
    tally("Request with an empty prompt (vLLM's Request)", 1, steps)
