"""Chapters 06, 07, 09 and 11's instruments without a browser: each driven through its Python API,
its books compared with the library's objects driven directly; a refused or raising call leaves
every object as it was (the library's own message shown); undo and reset; every cell of the
picture says what it is, every text escaped."""

import copy
import xml.etree.ElementTree as ET

import pytest

from memlab.course.viz import vllm_books
from memlab.course.viz.vllm_books import (
    STORY_STEPS,
    VllmScene,
    block_pool_instrument,
    prompt_ids,
)
from memlab.vllm.request import Request

SVG = "{http://www.w3.org/2000/svg}"


def cells(svg: str) -> dict:
    """gid -> tooltip of every cell of an instrument's SVG (parsed as XML: it must be
    well-formed)."""
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
    return dict(
        queue=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        ref=[b.ref_cnt for b in pool.blocks],
        hashes=[b.block_hash for b in pool.blocks],
        evictions=pool.num_evictions,
        reqs={
            r: (
                sc.manager.get_block_ids(r),
                list(q.all_token_ids),
                q.num_computed_tokens,
            )
            for r, q in sc.requests.items()
        },
    )


def vllm_direct(enable_caching=True, extra=()):
    """The story's steps and then ``extra`` on a KVCacheManager driven directly (no instrument)."""
    sc = VllmScene(12, 4, enable_caching)
    vocab = {}
    for op, args in (*STORY_STEPS, *extra):
        if op == "submit":
            ids = []
            for w in args["prompt"].split():
                ids.append(
                    int(w)
                    if w.lstrip("-").isdigit()
                    else vocab.setdefault(w, 1000 + len(vocab))
                )
            req = Request(
                args["request"], ids, block_hasher=sc.manager.request_block_hasher
            )
            hits, n = sc.manager.get_computed_blocks(req)
            assert (
                sc.manager.allocate_slots(req, req.num_tokens - n, n, hits) is not None
            )
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
    assert (
        inst.books()["free queue (head -> tail)"]
        == list(story.frames[-1].queue)
        == [4, 2, 1]
    )
    assert (
        "the story&#x27;s last step" in inst.call_box.value
        or "the story's last step" in inst.call_box.value
    )
    # the hash labels are the story's (A's blocks 1 and 2 carry h1 and h2)
    assert inst.books()["hashed blocks"] == story.frames[-1].hashes


@pytest.mark.parametrize(
    "caching, extra",
    [
        (
            True,
            [("submit", dict(request="E", prompt="0 1 2 3 4 5 6 7 60 61"))],
        ),  # hits 2 (middle) and 1 (tail)
        (
            True,
            [
                ("finish", dict(request="C")),
                ("submit", dict(request="E", prompt="the cat sat on the mat ok")),
            ],
        ),
        (
            True,
            [
                ("finish", dict(request="D")),
                ("submit", dict(request="E", prompt="300 301 302 303 9 9")),
                ("decode", dict(request="E", tokens="7 7 7")),
            ],
        ),
        (
            False,
            [
                ("submit", dict(request="E", prompt="0 1 2 3 4 5 6 7 60 61")),
                ("finish", dict(request="C")),
            ],
        ),
    ],
)
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
    assert books["free queue (head -> tail)"] == [
        b.block_id for b in pool.free_block_queue.get_all_free_blocks()
    ]
    assert books["ref_cnt"] == {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt}
    for rid in sc.requests:
        assert books[f"request {rid}"]["blocks"] == sc.manager.get_block_ids(rid)


def test_06_a_hit_comes_out_of_the_middle_and_the_call_is_the_managers():
    inst = block_pool_instrument()
    step = inst.do("submit", request="E", prompt="0 1 2 3 4 5 6 7 60 61")
    assert step.ok
    assert (
        "hits, num_hit_tokens = manager.get_computed_blocks(req)  # blocks [1, 2], 8 tokens"
        in step.call
    )
    assert (
        "manager.allocate_slots(req, 2, 8, hits)" in step.call
        and step.result == "blocks [4]"
    )
    assert step.marks["hit"] == {1, 2} and inst.books()["request E"]["blocks"] == [
        1,
        2,
        4,
    ]
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
    # three blocks: 4, 2, 1
    step = inst.do("submit", request="E", prompt="70 71 72 73 74 75 76 77 78")
    assert step.ok and step.result == "blocks [4, 2, 1]"
    assert step.marks["evicted"] == {1, 2}
    assert inst.books()["num_evictions"] == 3 and 1 not in inst.books()["hashed blocks"]
    pool = inst.world.manager.block_pool
    assert pool.num_evictions == 3  # D evicted block 3 in the story, now 2 and 1
    assert 'data-gid="block:1"' in inst.picture


@pytest.mark.parametrize(
    "op, args, says",
    [
        (
            "submit",
            dict(request="E", prompt="-1 2"),
            "ValueError: request 'E': prompt_token_ids (token ids) must hold ints >= 0, got -1",
        ),
        (
            "submit",
            dict(request="E", prompt=" ".join(map(str, range(500, 520)))),
            "allocate_slots returns None",
        ),
        ("submit", dict(request="C", prompt="1 2"), "is running"),
        (
            "decode",
            dict(running="C", tokens="1 2 3 4 5 6 7 8 9 10 11 12 13 14"),
            "allocate_slots returns None",
        ),
    ],
)
def test_06_bad_input_gets_the_librarys_message_and_changes_nothing(op, args, says):
    inst = block_pool_instrument()
    before, picture, books = vllm_state(inst.world), inst.picture, inst.books()
    step = inst.do(op, **args)
    assert not step.ok and says in step.error, step.error
    assert (
        vllm_state(inst.world) == before
        and inst.books() == books
        and inst.picture == picture
    )
    assert (
        "memlab-error" in inst.call_box.value
        and "nothing changed" in inst.call_box.value
    )


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
    assert inst.books()["get_num_free_blocks()"] == 11 and inst.books()[
        "free queue (head -> tail)"
    ] == list(range(1, 12))
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
    assert {g for g in tips if g.startswith("table:E:")} == {
        "table:E:0",
        "table:E:1",
        "table:E:2",
    }
    inst.do("finish", finishing="C")
    tips = cells(inst.picture)
    head = next(t for g, t in tips.items() if g.startswith("queue:0:"))
    assert "free queue #0 (head: reused first; prev fake head, next " in head
    assert all(t for t in tips.values()), "a cell without a tooltip"


# -- chapter 11: the radix tree and HiCache ----------------------------------------------------

from memlab.course.viz import radix_books
from memlab.course.viz.radix_books import RadixScene, encode, radix_instrument


def radix_state(sc: RadixScene) -> dict:
    """Everything a call could change in the tree and its two allocators, as plain values."""
    tree = sc.tree
    al, host = tree.token_to_kv_pool_allocator, tree.token_to_kv_pool_host.allocator
    nodes = {
        n.id: (
            n.key,
            None if n.value is None else n.value.tolist(),
            None if n.host_value is None else n.host_value.tolist(),
            n.lock_ref,
            n.parent.id if n.parent is not tree.root_node else None,
        )
        for n in tree._all_nodes()
    }
    return dict(
        nodes=nodes,
        free=sorted(al.get_all_free_pages().tolist()),
        host_free=sorted(host.get_all_free_pages().tolist()),
        sizes=(tree.evictable_size(), tree.protected_size()),
        running=sorted(sc.running),
    )


def radix_story_scene(page_size=1) -> RadixScene:
    """story()'s steps on a RadixScene driven directly."""
    sc = RadixScene(24, 32, page_size)
    a, b, c = (
        "<s> You are brief . What is KV ?",
        "<s> You are brief . What is HiCache ?",
        "<s> You are terse . Why a radix tree ?",
    )
    sc.arrive("A", a, "")
    sc.finish("A", "")
    sc.arrive("B", b, "")
    sc.finish("B", "")
    sc.arrive("C", c, "")
    sc.evict(16, "")
    sc.finish("C", "")
    sc.arrive("D", a + " a", "")
    sc.finish("D", "")
    sc.evict(100, "")
    sc.evict_host(8, "")
    return sc


@pytest.mark.parametrize("page_size", [1, 2])
def test_11_opens_on_the_storys_last_state(page_size):
    inst = radix_instrument(page_size=page_size)
    assert radix_state(inst.world) == radix_state(radix_story_scene(page_size))
    last = radix_books.story(page_size)[-1]
    assert {n.id for n in last.nodes} == {
        int(k.split()[1]) for k in inst.books() if k.startswith("node ")
    }


def test_11_operations_match_the_tree_driven_directly():
    inst = radix_instrument()
    key = "<s> You are brief . What is KV ?"
    steps = [
        ("match", dict(match_text=key)),
        ("load_back", dict(load_text=key)),
        ("lock", dict(lock_text="<s> You are")),
        ("insert", dict(insert_text="<s> You are brief . Why ?")),
        ("evict", dict(num_tokens="5")),
        ("unlock", dict(unlock_node="4")),
        ("arrive", dict(request="E", text="<s> You are kind")),
        ("evict_host", dict(host_tokens="2")),
    ]
    for op, args in steps:
        step = inst.do(op, **args)
        assert step.ok, (op, step.error)
    sc = radix_story_scene()
    tree = sc.tree
    ids = encode(key)
    r = tree.match_prefix(ids)
    assert r.host_hit_length == 9 and r.device_prefix_len == 0
    tree.load_back(tree.match_prefix(ids).last_host_node)
    node = tree.match_prefix(encode("<s> You are")).last_device_node
    tree.inc_lock_ref(node)
    k = tree.page_aligned(encode("<s> You are brief . Why ?"))
    value = tree.token_to_kv_pool_allocator.alloc(len(k))
    sc._compute(value, list(k), 0)
    res = tree.insert(k, value)
    tree.token_to_kv_pool_allocator.free_segment(value[: res.prefix_len], start_pos=0)
    tree.evict(5)
    tree.dec_lock_ref(node)
    sc.words = list(radix_books.WORDS) + ["kind"]
    sc.running["E"] = sc.driver.admit([0, 1, 2, len(radix_books.WORDS)])
    tree.evict_host(2)
    assert radix_state(inst.world) == radix_state(sc)
    books = inst.books()
    assert (
        books["evictable_size()"] == tree.evictable_size()
        and books["protected_size()"] == tree.protected_size()
    )
    assert (
        books["device available_size()"]
        == tree.token_to_kv_pool_allocator.available_size()
    )
    assert books["host available_size()"] == tree.token_to_kv_pool_host.available_size()


def test_11_a_match_that_ends_inside_a_node_splits_it_and_says_so():
    inst = radix_instrument()
    before = set(k for k in inst.books() if k.startswith("node "))
    step = inst.do("match", match_text="<s> You")
    assert step.ok and "host_hit_length=2" in step.result
    after = set(k for k in inst.books() if k.startswith("node "))
    assert len(after) == len(before) + 1 and step.marks["changed"]
    keys = sorted(inst.books()[k]["key"] for k in after)
    assert "<s> You" in keys and "are" in keys and "<s> You are" not in keys


@pytest.mark.parametrize(
    "op, args, says",
    [
        (
            "unlock",
            dict(unlock_node="1"),
            "ValueError: TreeNode(id=1, key=(7, 9), len=2, lock_ref=0, host): its KV is "
            "on the host only",
        ),  # the node check before any lock is touched
        (
            "insert",
            dict(insert_text=" ".join(f"w{i}" for i in range(30))),
            "allocator.alloc returns None",
        ),
        ("evict", dict(num_tokens="-3"), "num_tokens -3"),
        ("lock", dict(lock_text="<s> You are"), "no node to lock"),
        (
            "arrive",
            dict(request="E", text=" ".join(f"w{i}" for i in range(30))),
            "admit returns None",
        ),
        ("backup", dict(backup_node="1"), "not on the device"),
        ("match", dict(match_text="   "), "type some words"),
    ],
)
def test_11_bad_input_gets_the_librarys_message_and_changes_nothing(op, args, says):
    inst = radix_instrument()
    before, picture, books = radix_state(inst.world), inst.picture, inst.books()
    step = inst.do(op, **args)
    assert not step.ok and says in step.error, step.error
    assert (
        radix_state(inst.world) == before
        and inst.books() == books
        and inst.picture == picture
    )


def test_11_write_back_backup_undo_and_reset():
    inst = radix_instrument()
    opening = radix_state(inst.world)
    inst.reset(empty=True)
    assert inst.books()["device available_size()"] == 24 and not [
        k for k in inst.books() if k.startswith("node ")
    ]
    step = inst.do("insert", insert_text="a radix tree")
    assert step.ok and "InsertResult(prefix_len=0" in step.result
    nid = next(k for k in inst.books() if k.startswith("node ")).split()[1]
    # write-through backed it up on insert
    assert inst.books()[f"node {nid}"]["host"] is not None
    step = inst.do("backup", backup_node=nid)
    assert not step.ok and "has a host copy already" in step.error
    assert inst.undo() and not [k for k in inst.books() if k.startswith("node ")]
    inst.reset()
    assert radix_state(inst.world) == opening
    inst.set(page_size=2)
    assert radix_state(inst.world) == radix_state(radix_story_scene(2))


def test_11_node_labels_are_never_cut_and_every_cell_says_what_it_is():
    inst = radix_instrument()
    long = "<s> You are brief . What is KV ? and then a very long question about pages and trees"
    assert inst.do("arrive", request="E", text=long).ok
    svg = inst.picture
    tips = cells(svg)
    node = next(t for g, t in tips.items() if g.startswith("node:") and "question" in t)
    assert (
        "and then a very long question about pages and trees" in node
        and "lock_ref 1" in node
    )
    root = ET.fromstring(svg)
    shown = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    for word in long.split():
        assert word in shown, f"{word!r} is not in the picture: a label was cut"
    assert tips["dpage:0"].endswith("padding: never handed out")
    assert all(t for t in tips.values())
    assert "&lt;s&gt;" in svg and "<s>" not in svg.replace("<svg", "").replace(
        "<style", ""
    ).replace("<stop", "")


# -- chapter 07: the sliding window and the Mamba slots -------------------------------------------

from memlab.course.viz import hybrid_books
from memlab.course.viz.hybrid_books import (
    MAMBA_STORY,
    MambaWorld,
    SwaScene,
    mamba_instrument,
    swa_instrument,
)
from memlab.sglang.req_to_token import Req as SgReq
from memlab.sglang.req_to_token import ReqToTokenPool
from memlab.sglang.swa import SWATokenToKVPoolAllocator


def swa_state(sc: SwaScene) -> dict:
    al = sc.allocator
    return dict(
        full=al.full_attn_allocator.free_pages.tolist(),
        swa=al.swa_attn_allocator.free_pages.tolist(),
        map=al.full_to_swa_index_mapping.tolist(),
        table=sc.req_pool.req_to_token.tolist(),
        ev=dict(sc.swa_evicted_len),
        reqs={r: sc.slots(r) for r in sc.reqs},
    )


def swa_direct(window=4, extra=()):
    sc = SwaScene(
        ReqToTokenPool(4, 16),
        SWATokenToKVPoolAllocator(32, max(12, 3 * window), 2, debug_mode=True),
        window,
    )
    for op, args in (*hybrid_books.SWA_STORY, *extra):
        if op == "extend":
            rids = [r.strip() for r in args["requests"].split(",")]
            assert (
                sc.extend_batch(
                    dict(zip(rids, map(int, args["extend_lens"].split(","))))
                )
                is not None
            )
            for r in rids:
                sc.release(r)
        elif op == "decode":
            rids = [r.strip() for r in args["decoding"].split(",")]
            assert sc.decode(rids) is not None
            for r in rids:
                sc.release(r)
        else:
            sc.finish(args["finishing"])
    return sc


def test_07_swa_opens_on_the_storys_last_state():
    inst = swa_instrument()
    assert (
        swa_state(inst.world)
        == swa_state(hybrid_books.sliding_window())
        == swa_state(swa_direct())
    )


@pytest.mark.parametrize(
    "window, extra",
    [
        (
            4,
            [
                ("extend", dict(requests="C", extend_lens="3")),
                ("decode", dict(decoding="A, C")),
            ],
        ),
        (
            2,
            [
                ("decode", dict(decoding="A")),
                ("extend", dict(requests="A, C", extend_lens="2, 5")),
            ],
        ),
        (
            8,
            [
                ("finish", dict(finishing="A")),
                ("extend", dict(requests="D", extend_lens="9")),
            ],
        ),
    ],
)
def test_07_swa_books_are_the_allocators(window, extra):
    inst = swa_instrument(window=window)
    for op, args in extra:
        step = inst.do(op, **args)
        assert step.ok, step.error
        if op != "finish":
            assert "allocator.release_out_of_window(req_to_token, " in step.call
    sc = swa_direct(window, extra)
    assert swa_state(inst.world) == swa_state(sc)
    books = inst.books()
    al = sc.allocator
    assert books["SWA available_size()"] == al.swa_attn_allocator.available_size()
    assert books["full available_size()"] == al.full_attn_allocator.available_size()


@pytest.mark.parametrize(
    "op, args, says",
    [
        (
            "extend",
            dict(requests="E", extend_lens="-2"),
            "ValueError: request 0: seq_len -2 is shorter than its prefix 0 (extend_lens[0] = -2)",
        ),
        (
            "extend",
            dict(requests="E", extend_lens="16"),
            "alloc_for_extend returns None",
        ),
        ("decode", dict(decoding="Z"), "not running"),
    ],
)
def test_07_swa_bad_input_changes_nothing(op, args, says):
    inst = swa_instrument()
    before, picture = swa_state(inst.world), inst.picture
    step = inst.do(op, **args)
    assert not step.ok and says in step.error, step.error
    assert swa_state(inst.world) == before and inst.picture == picture


def test_07_swa_undo_window_and_tooltips():
    inst = swa_instrument()
    opening = swa_state(inst.world)
    inst.do("decode", decoding="A")
    tips = cells(inst.picture)
    assert tips["swa:A:0"].startswith(
        "A, position 0 · full slot 2 (page 1) · SWA slot none: released"
    )
    assert "in the window of the next token" in tips["full:A:9"]
    assert inst.undo() and swa_state(inst.world) == opening
    inst.set(window=2)
    assert swa_state(inst.world) == swa_state(swa_direct(2))
    # 9 tokens, window 2: positions < 7, whole pages of 2
    assert inst.books()["request A"]["swa_evicted_len"] == 6


def mamba_state(w: MambaWorld) -> dict:
    p = w.pool
    return dict(
        free=p.mamba_allocator.free_slots.tolist(),
        state=p.req_index_to_mamba_index_mapping.tolist(),
        pp=p.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist(),
        nxt=p.mamba_next_track_idx.tolist(),
        last=p.mamba_last_track_seqlen.tolist(),
        rows=p.available_size(),
        reqs={r: q.kv.req_pool_idx for r, q in w.reqs.items()},
    )


def mamba_direct(overlap=True, extra=()):
    w = MambaWorld(overlap)
    for op, args in (*MAMBA_STORY, *extra):
        if op == "arrive":
            r = SgReq(args["request"])
            assert w.pool.alloc([r]) is not None
            w.pool.execute_deferred_mamba_cow_and_clear([r])
            w.reqs[args["request"]] = r
        elif op == "track":
            w.pool.track_state(
                [w.reqs[args["tracking"]].kv.req_pool_idx], [int(args["seq_len"])]
            )
        else:
            r = w.reqs.pop(args["freeing"])
            w.pool.free_mamba_cache(r)
            w.pool.free(r)
    return w


@pytest.mark.parametrize("overlap", [True, False])
def test_07_mamba_opens_on_the_story_and_follows_the_pool(overlap):
    inst = mamba_instrument(overlap=overlap)
    assert mamba_state(inst.world) == mamba_state(mamba_direct(overlap))
    last = hybrid_books.mamba_slots(True, overlap)[-1]
    assert tuple(inst.books()["free state slots"]) == last.free_slots
    extra = [
        ("track", dict(tracking="C", seq_len="16")),
        ("track", dict(tracking="C", seq_len="32")),
        ("free", dict(freeing="B")),
        ("arrive", dict(request="D")),
    ]
    for op, args in extra:
        assert inst.do(op, **args).ok
    assert mamba_state(inst.world) == mamba_state(mamba_direct(overlap, extra))
    assert inst.books()["ping-pong slots per request"] == (2 if overlap else 1)


def test_07_mamba_refusal_undo_and_overlap_switch():
    inst = mamba_instrument()
    inst.do("arrive", request="D")
    before, picture = mamba_state(inst.world), inst.picture
    step = inst.do("arrive", request="E")
    assert not step.ok and "alloc returns None" in step.error
    assert mamba_state(inst.world) == before and inst.picture == picture
    step = inst.do("track", tracking="C", seq_len="x")
    assert not step.ok and "is not a whole number" in step.error
    assert inst.undo() and mamba_state(inst.world) == mamba_state(mamba_direct(True))
    inst.set(overlap="off")
    assert mamba_state(inst.world) == mamba_state(mamba_direct(False))
    tips = cells(inst.picture)
    assert tips["mslot:0"] == "slot 0: padding, never handed out" and all(tips.values())


# -- chapter 09: attention through the pages -------------------------------------------------------

import math

import torch

from memlab.course.viz.draw_attention import (
    AttnWorld,
    attention_instrument,
    dense_attention,
)


def attn_state(w: AttnWorld) -> dict:
    sc, kv = w.scene, w.scene.kvcache
    return dict(
        free=sc.allocator.free_pages.tolist(),
        table=sc.req_pool.req_to_token.tolist(),
        reqs={r: sc.slots(r) for r in sc.reqs},
        k=[kv.get_key_buffer(i).clone() for i in range(kv.layer_num)],
    )


def same_attn(a, b) -> bool:
    return {k: v for k, v in a.items() if k != "k"} == {
        k: v for k, v in b.items() if k != "k"
    } and all(torch.equal(x, y) for x, y in zip(a["k"], b["k"]))


@pytest.fixture(scope="module")
def attn():
    return attention_instrument()


def test_09_opens_on_the_storys_books_reading_a_with_the_kernel(attn):
    from memlab.course.viz import sglang_books
    from memlab.course.viz.draw_attention import fill_kv

    sc = sglang_books.orientation(dtype=torch.float32, head_dim=16)
    sc.extend_batch({"A": 6, "D": 3})
    fill_kv(sc)
    w = AttnWorld()
    assert attn.history[0].op == "read" and attn.history[0].args["request"] == "A"
    assert (
        sc.req_pool.req_to_token.tolist()
        == attn.world.scene.req_pool.req_to_token.tolist()
    )
    assert torch.equal(
        sc.kvcache.get_key_buffer(0), attn.world.scene.kvcache.get_key_buffer(0)
    )
    assert same_attn(attn_state(w), attn_state(attn.world))
    assert (
        "paged and dense agree" in attn.details.value
        and "reads pages [1, 2, 7]" in attn.history[0].result
    )


@pytest.mark.parametrize(
    "request_, layer, head", [("A", 0, 0), ("D", 1, 3), ("C", 0, 2)]
)
def test_09_read_is_the_kernels_and_the_dense_references(attn, request_, layer, head):
    from memlab.common import attention

    attn.reset(empty=True)
    step = attn.do("read", request=request_, layer=layer, head=head)
    assert step.ok, step.error
    sc = attn.world.scene
    kv = sc.kvcache
    slots = sc.slots(request_)
    assert (
        step.marks["slots"] == slots
        and f"pages {list(dict.fromkeys(s // 4 for s in slots))}" in step.result
    )
    rids = list(sc.reqs)
    q = torch.stack([attn.world.q[r] for r in rids])
    b = rids.index(request_)
    k = kv.get_key_buffer(layer)[slots, head // 2]
    scores = torch.softmax(k @ q[b, head] / math.sqrt(16), 0)
    assert torch.allclose(torch.tensor(step.marks["weights"]), scores, atol=1e-6)
    o = attention.attention_over_slots(
        q,
        kv.get_key_buffer(layer),
        kv.get_value_buffer(layer),
        torch.tensor([[*sc.slots(r), *[0] * (12 - len(sc.slots(r)))] for r in rids]),
        torch.tensor([[i < len(sc.slots(r)) for i in range(12)] for r in rids]),
        1 / math.sqrt(16),
    )
    _, dense = dense_attention(
        q[b, head], k, kv.get_value_buffer(layer)[slots, head // 2]
    )
    assert torch.allclose(o[b, head], dense, atol=1e-5)
    assert step.marks["diff"] < 1e-4 and "paged and dense agree" in step.details
    assert attn.picture.count("<svg") == 1  # one picture: the pool, then the weights
    tips = cells(attn.picture)
    assert tips["weight:0"].startswith(
        f"{request_} position 0 · slot {slots[0]} = page {slots[0] // 4} × 4 + offset"
    )


def test_09_extend_finish_refusal_and_undo(attn):
    attn.reset(empty=True)
    opening = attn_state(attn.world)
    picture = attn.picture
    step = attn.do("extend", requests="B", extend_lens="5")
    # the pool is full
    assert not step.ok and "alloc_for_extend returns None" in step.error
    step = attn.do("extend", requests="B", extend_lens="-1")
    assert (
        not step.ok
        and step.error
        == "ValueError: request 0: seq_len -1 is shorter than its prefix 0 (extend_lens[0] = -1)"
    )
    assert same_attn(attn_state(attn.world), opening) and attn.picture == picture
    assert attn.do("finish", finishing="C").ok
    step = attn.do("extend", requests="B, D", extend_lens="5, 2")
    assert step.ok and step.result == "tensor([16, 17, 18, 19, 20, 35, 24])"
    assert attn.books()["request B"]["pages"] == [4, 5]
    step = attn.do("read", request="B", layer=0, head=1)
    assert step.ok and step.marks["diff"] < 1e-4
    assert attn.undo() and attn.undo() and attn.undo()
    assert same_attn(attn_state(attn.world), opening)
