"""Chapters 06, 07, 09 and 11's instruments without a browser: each driven through its Python API,
its books compared with the library's objects driven directly; a refused or raising call leaves
every object as it was (the library's own message shown); undo and reset; every cell of the
picture says what it is, every text escaped."""

import copy
import xml.etree.ElementTree as ET

import pytest

from memlab.course.viz import vllm_books
from memlab.course.viz.vllm_books import STORY_STEPS, VllmScene, block_pool_instrument, prompt_ids
from memlab.vllm.request import Request

SVG = "{http://www.w3.org/2000/svg}"


def cells(svg: str) -> dict:
    """gid -> tooltip of every cell of an instrument's SVG (parsed as XML: it must be well-formed)."""
    root = ET.fromstring(svg)
    found = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("data-gid"):
            t = g.find(f"{SVG}title")
            found[g.get("data-gid")] = "" if t is None else t.text
    return found


# -- chapter 06: vLLM's block pool ----------------------------------------------------------------


def vllm_state(sc: VllmScene) -> dict:
    """Everything a call could change in the scene's KVCacheManager, as plain values."""
    pool = sc.manager.block_pool
    return dict(queue=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                ref=[b.ref_cnt for b in pool.blocks], hashes=[b.block_hash for b in pool.blocks],
                evictions=pool.num_evictions,
                reqs={r: (sc.manager.get_block_ids(r), list(q.all_token_ids), q.num_computed_tokens)
                      for r, q in sc.requests.items()})


def vllm_direct(enable_caching=True, extra=()):
    """The story's steps and then ``extra`` on a KVCacheManager driven directly (no instrument)."""
    sc = VllmScene(12, 4, enable_caching)
    vocab = {}
    for op, args in (*STORY_STEPS, *extra):
        if op == "submit":
            ids = []
            for w in args["prompt"].split():
                ids.append(int(w) if w.lstrip("-").isdigit() else vocab.setdefault(w, 1000 + len(vocab)))
            req = Request(args["request"], ids, block_hasher=sc.manager.request_block_hasher)
            hits, n = sc.manager.get_computed_blocks(req)
            assert sc.manager.allocate_slots(req, req.num_tokens - n, n, hits) is not None
            req.num_computed_tokens = req.num_tokens
            sc.requests[args["request"]] = req
        elif op == "decode":
            req = sc.requests[args["request"]]
            for t in args["tokens"].split():
                req.append_output_token_ids(int(t))
                assert sc.manager.allocate_slots(req, 1) is not None
                req.num_computed_tokens = req.num_tokens
        else:
            sc.manager.free(sc.requests.pop(args["request"]))
    return sc


def vllm_do(inst, op, args):
    key = {"decode": "running", "finish": "finishing"}.get(op)
    args = dict(args)
    if key:
        args[key] = args.pop("request")
    return inst.do(op, **args)


def test_06_opens_on_the_storys_last_state():
    inst = block_pool_instrument()
    story = vllm_books.prefix_cache(True)
    assert vllm_state(inst.world) == vllm_state(story)
    assert vllm_state(inst.world) == vllm_state(vllm_direct())
    assert inst.books()["free queue (head -> tail)"] == list(story.frames[-1].queue) == [4, 2, 1]
    assert "the story&#x27;s last step" in inst.call_box.value or "the story's last step" in inst.call_box.value
    # the hash labels are the story's (A's blocks 1 and 2 carry h1 and h2)
    assert inst.books()["hashed blocks"] == story.frames[-1].hashes


@pytest.mark.parametrize("caching, extra", [
    (True, [("submit", dict(request="E", prompt="0 1 2 3 4 5 6 7 60 61"))]),  # hits 2 (middle) and 1 (tail)
    (True, [("finish", dict(request="C")), ("submit", dict(request="E", prompt="the cat sat on the mat ok"))]),
    (True, [("finish", dict(request="D")), ("submit", dict(request="E", prompt="300 301 302 303 9 9")),
            ("decode", dict(request="E", tokens="7 7 7"))]),
    (False, [("submit", dict(request="E", prompt="0 1 2 3 4 5 6 7 60 61")), ("finish", dict(request="C"))]),
])
def test_06_books_are_the_managers(caching, extra):
    inst = block_pool_instrument(enable_caching=caching)
    for op, args in extra:
        step = vllm_do(inst, op, args)
        assert step.ok, step.error
    sc = vllm_direct(caching, extra)
    assert vllm_state(inst.world) == vllm_state(sc)
    books = inst.books()
    pool = sc.manager.block_pool
    assert books["get_num_free_blocks()"] == pool.get_num_free_blocks()
    assert books["free queue (head -> tail)"] == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert books["ref_cnt"] == {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt}
    for rid in sc.requests:
        assert books[f"request {rid}"]["blocks"] == sc.manager.get_block_ids(rid)


def test_06_a_hit_comes_out_of_the_middle_and_the_call_is_the_managers():
    inst = block_pool_instrument()
    step = inst.do("submit", request="E", prompt="0 1 2 3 4 5 6 7 60 61")
    assert step.ok
    assert "hits, num_hit_tokens = manager.get_computed_blocks(req)  # blocks [1, 2], 8 tokens" in step.call
    assert "manager.allocate_slots(req, 2, 8, hits)" in step.call and step.result == "blocks [4]"
    assert step.marks["hit"] == {1, 2} and inst.books()["request E"]["blocks"] == [1, 2, 4]
    # pasted under a copy of the manager from before the call, the calls give the same blocks
    inst.undo()
    manager = copy.deepcopy(inst.world.manager)
    env = {"Request": Request, "manager": manager}
    lines = step.call.splitlines()
    exec("\n".join(lines[:2]), env)
    got = eval(lines[2], env)
    assert [b.block_id for b in got] == [4]


def test_06_a_reused_hashed_block_is_evicted():
    inst = block_pool_instrument()
    step = inst.do("submit", request="E", prompt="70 71 72 73 74 75 76 77 78")  # three blocks: 4, 2, 1
    assert step.ok and step.result == "blocks [4, 2, 1]"
    assert step.marks["evicted"] == {1, 2}
    assert inst.books()["num_evictions"] == 3 and 1 not in inst.books()["hashed blocks"]
    pool = inst.world.manager.block_pool
    assert pool.num_evictions == 3  # D evicted block 3 in the story, now 2 and 1
    assert 'data-gid="block:1"' in inst.picture


@pytest.mark.parametrize("op, args, says", [
    ("submit", dict(request="E", prompt="-1 2"), "ValueError: request 'E': token ids must be ints >= 0, got [-1]"),
    ("submit", dict(request="E", prompt=" ".join(map(str, range(500, 520)))), "allocate_slots returns None"),
    ("submit", dict(request="C", prompt="1 2"), "is running"),
    ("decode", dict(running="C", tokens="1 2 3 4 5 6 7 8 9 10 11 12 13 14"), "allocate_slots returns None"),
])
def test_06_bad_input_gets_the_librarys_message_and_changes_nothing(op, args, says):
    inst = block_pool_instrument()
    before, picture, books = vllm_state(inst.world), inst.picture, inst.books()
    step = inst.do(op, **args)
    assert not step.ok and says in step.error, step.error
    assert vllm_state(inst.world) == before and inst.books() == books and inst.picture == picture
    assert "memlab-error" in inst.call_box.value and "nothing changed" in inst.call_box.value


def test_06_undo_reset_and_caching_off():
    inst = block_pool_instrument()
    opening = vllm_state(inst.world)
    inst.do("submit", request="E", prompt="0 1 2 3 4 5 6 7 60 61")
    inst.do("finish", finishing="C")
    assert inst.undo() and inst.undo() and vllm_state(inst.world) == opening
    assert not inst.undo()
    inst.do("finish", finishing="D")
    inst.reset()
    assert vllm_state(inst.world) == opening
    inst.reset(empty=True)
    assert inst.books()["get_num_free_blocks()"] == 11 and inst.books()["free queue (head -> tail)"] == list(range(1, 12))
    inst.reset()
    inst.set(prefix_caching="off")
    assert vllm_state(inst.world) == vllm_state(vllm_direct(False))
    assert inst.books()["hashed blocks"] == {}
    stepper = inst.story()
    assert stepper is not None


def test_06_words_share_ids_and_every_block_says_what_it_is():
    inst = block_pool_instrument()
    assert prompt_ids(inst.world, "the <s> the") == [1000, 1001, 1000]
    inst.do("submit", request="E", prompt="0 1 2 3 4 5 6 7 60 61")
    tips = cells(inst.picture)
    assert tips["block:1"].startswith("block 1 · ref_cnt 1 · hash h1 = ")
    assert "E's block 0 (tokens 0-3)" in tips["block:1"]
    assert tips["block:0"] == "block 0: the null block (popped at start, never freed)"
    assert {g for g in tips if g.startswith("table:E:")} == {"table:E:0", "table:E:1", "table:E:2"}
    inst.do("finish", finishing="C")
    tips = cells(inst.picture)
    head = next(t for g, t in tips.items() if g.startswith("queue:0:"))
    assert "free queue #0 (head: reused first; prev fake head, next " in head
    assert all(t for t in tips.values()), "a cell without a tooltip"
