"""memlab.sglang.sizing's per-step rules against SGLang 0.5.23's own functions.

KV per decode step, the reserve (always twice that), the request-table headroom, the next
decode step's demand, and the retraction order, over a grid of speculative configurations,
page sizes and random running batches.
"""

import itertools
import random
from types import SimpleNamespace

import pytest

from memlab.sglang.sizing import (
    RunningReq,
    SpeculativeConfig,
    alloc_len_per_decode,
    alloc_reserve_per_decode,
    new_tokens_required_next_decode,
    req_to_token_extra_len,
    retract_decode,
    retract_order,
)
from memlab_tests.tools.engines.sglang_loader import load

ALGOS = [None, "EAGLE", "NGRAM", "UNO"]
GRID = list(itertools.product(ALGOS, [1, 2, 4], [1, 2, 4], [1, 4, 9], [1, 4, 16, 64]))


@pytest.fixture
def sg():
    sg = load()
    saved = (vars(sg.serving.spec).copy(), sg.serving.schedule.page_size)
    yield sg
    vars(sg.serving.spec).update(saved[0])
    sg.serving.schedule.page_size = saved[1]


def configure(sg, algo, steps, topk, tokens, ps):
    spec = sg.serving.spec
    spec.speculative_algorithm = algo
    (
        spec.speculative_num_steps,
        spec.speculative_eagle_topk,
        spec.speculative_num_draft_tokens,
    ) = (steps, topk, tokens) if algo else (None, None, None)
    sg.serving.schedule.page_size = ps
    return SpeculativeConfig(
        algorithm=algo,
        num_steps=steps,
        eagle_topk=topk,
        num_draft_tokens=tokens,
        has_draft_kv=algo != "NGRAM",
    )


def test_decode_step_rules_match_sglang(sg, tally):
    for algo, steps, topk, tokens, ps in GRID:
        spec = configure(sg, algo, steps, topk, tokens, ps)
        case = f"{algo} steps {steps} topk {topk} draft {tokens} page {ps}"
        assert alloc_len_per_decode(spec, ps) == sg.sizing.get_alloc_len_per_decode(), (
            case
        )
        assert (
            alloc_reserve_per_decode(spec, ps)
            == sg.sizing.get_alloc_reserve_per_decode()
        ), case
        assert (
            req_to_token_extra_len(spec, ps)
            == sg.sizing.get_req_to_token_extra_context_len()
        ), case
    tally("sizing: KV per decode step, reserve, row headroom", len(GRID), 3 * len(GRID))


def sglang_batch(sg, reqs, ps, speculative):
    """The slice of a ScheduleBatch those methods read."""
    their = [
        SimpleNamespace(
            rid=r.rid,
            output_ids=[0] * r.output_len,
            origin_input_ids=[0] * r.input_len,
            kv=SimpleNamespace(
                kv_committed_len=r.seq_len, kv_allocated_len=r.allocated
            ),
        )
        for r in reqs
    ]
    batch = SimpleNamespace(
        reqs=their,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=ps),
        spec_algorithm=SimpleNamespace(is_none=lambda: not speculative),
    )
    batch._new_tokens_required_next_decode_spec_v2 = lambda rs, p: (
        sg.schedule_batch._new_tokens_required_next_decode_spec_v2(batch, rs, p)
    )
    return batch


def test_decode_demand_and_retraction_order_match_sglang(sg, tally):
    rng = random.Random(3)
    cases = 200
    for case in range(cases):
        ps = rng.choice([1, 4, 16])
        speculative = rng.random() < 0.5
        spec = configure(
            sg, "EAGLE" if speculative else None, 3, rng.choice([1, 2]), 4, ps
        )
        reqs = []
        for i in range(rng.randint(1, 6)):
            inp, out = rng.randint(1, 50), rng.randint(0, 30)
            reqs.append(
                RunningReq(
                    i,
                    inp,
                    out,
                    inp + out + rng.randint(0, 2 * ps) if speculative else None,
                )
            )
        batch = sglang_batch(sg, reqs, ps, speculative)
        reserve = alloc_reserve_per_decode(spec, ps) if speculative else None
        assert new_tokens_required_next_decode(
            reqs, ps, reserve
        ) == sg.schedule_batch.new_tokens_required_next_decode(batch), f"case {case}"
        theirs = sg.schedule_batch._get_decode_retraction_order(batch.reqs)
        assert retract_order(reqs) == theirs[::-1], (
            f"case {case}: SGLang retracts from the end of {theirs}"
        )
    tally("sizing: next decode demand, retraction order", cases, 2 * cases)


def test_retraction_follows_sglangs_loop(sg):
    """The scheduler calls retract_decode after check_decode_mem failed: one request goes without a
    second check, then more until the rest fit; the last one always stays."""
    reqs = [RunningReq("A", 100, 5), RunningReq("B", 50, 1), RunningReq("C", 200, 1)]
    kept, gone, fits = retract_decode(reqs, 0, 1)
    order = sg.schedule_batch._get_decode_retraction_order(
        sglang_batch(sg, reqs, 1, False).reqs
    )
    assert [r.rid for r in gone] == [reqs[order[-1]].rid] and fits
