"""RadixCache: hand-worked cases (a split, LRU eviction, locks, page alignment), a
request's lifecycle (checkpoints between chunks, the finished request split at its
prompt, a disabled tree, a retraction), the books it keeps, and a property test over
random request streams: every page is free, held by the tree, or held by one running
request, never two of these (with a buggy variant that breaks it)."""

import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memlab.capstone.prefix_compare import RadixDriver
from memlab.sglang.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    release_kv_cache,
)
from memlab.sglang.allocator import make_allocator
from memlab.sglang.radix_cache import RadixCache
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.schedule_policy import match_and_lock


def tree_of(size=32, page_size=1, **kw):
    alloc = make_allocator(size, page_size, debug_mode=True)
    return RadixCache(alloc, debug_mode=True, **kw), alloc


def shape(tree):
    """The tree as nested {key: (slots, lock_ref, children)}."""

    def walk(node):
        return {
            c.key: (c.value.tolist(), c.lock_ref, walk(c))
            for c in node.children.values()
        }

    return walk(tree.root_node)


def insert_fresh(tree, alloc, key):
    """Insert with new slots and free the duplicates, as a finished request does."""
    n = len(tree.page_aligned(key))
    value = alloc.alloc(n)
    r = tree.insert(key, value)
    alloc.free(value[: r.prefix_len])
    return value, r


def test_insert_then_split_on_a_partial_match():
    tree, alloc = tree_of()
    v1, r1 = insert_fresh(tree, alloc, [1, 2, 3, 4, 5])
    assert r1.prefix_len == 0 and v1.tolist() == [1, 2, 3, 4, 5]
    v2, r2 = insert_fresh(tree, alloc, [1, 2, 3, 9, 9])
    # (1, 2, 3) was there: the caller's slots 6, 7, 8 were duplicates, freed
    assert r2.prefix_len == 3
    assert shape(tree) == {
        (1, 2, 3): ([1, 2, 3], 0, {(4, 5): ([4, 5], 0, {}), (9, 9): ([9, 10], 0, {})})
    }
    m = tree.match_prefix([1, 2, 3, 4, 7])  # ends inside (4, 5): splits it after 4
    assert m.device_prefix_len == 4 and m.last_device_node.key == (4,)
    assert tree.path_device_indices(m.last_device_node).tolist() == [1, 2, 3, 4]
    assert shape(tree)[(1, 2, 3)][2][(4,)] == ([4], 0, {(5,): ([5], 0, {})})
    assert tree.total_size() == tree.evictable_size() == 7
    assert alloc.available_size() == 32 - 7
    tree.check_idle(32)


def test_match_of_nothing_and_of_everything():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [5, 6, 7])
    assert tree.match_prefix([]).last_device_node is tree.root_node
    assert tree.match_prefix([8]).device_prefix_len == 0
    m = tree.match_prefix([5, 6, 7, 8, 9])
    assert m.device_prefix_len == 3 and m.last_device_node.key == (5, 6, 7)
    assert m.last_host_node is m.last_device_node and m.host_hit_length == 0


def test_lru_eviction_order_and_parents_becoming_leaves():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 1])  # oldest
    insert_fresh(tree, alloc, [2, 2, 2])
    insert_fresh(tree, alloc, [3])
    tree.match_prefix([1, 1])  # refreshed: now the most recent
    # (2, 2, 2) goes whole: a node is the unit
    assert tree.evict(1).num_tokens_evicted == 3
    assert sorted(shape(tree)) == [(1, 1), (3,)]
    assert tree.evict(1).num_tokens_evicted == 1 and sorted(shape(tree)) == [(1, 1)]
    # A parent whose last child goes becomes a leaf and may go in the same call.
    insert_fresh(tree, alloc, [1, 1, 4])
    assert tree.evict(3).num_tokens_evicted == 3 and shape(tree) == {}
    assert alloc.available_size() == 32 and tree.num_evicted_tokens == 7
    tree.check_idle(32)


def test_locks_protect_the_whole_path():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 2, 3, 4])
    insert_fresh(tree, alloc, [1, 2, 7])
    m = tree.match_prefix([1, 2, 3, 4])
    assert tree.inc_lock_ref(m.last_device_node).delta == -4  # (1, 2) and (3, 4)
    assert (tree.evictable_size(), tree.protected_size()) == (1, 4)
    assert tree.evict(100).num_tokens_evicted == 1  # only (7,) is unlocked
    assert sorted(shape(tree)[(1, 2)][2]) == [(3, 4)]
    m2 = tree.match_prefix([1, 2])
    assert tree.inc_lock_ref(m2.last_device_node).delta == 0  # already protected
    # (3, 4) free again, (1, 2) still locked
    assert tree.dec_lock_ref(m.last_device_node).delta == 2
    assert tree.evict(100).num_tokens_evicted == 2
    assert tree.dec_lock_ref(m2.last_device_node).delta == 2
    assert tree.evict(100).num_tokens_evicted == 2 and tree.total_size() == 0
    tree.check_idle(32)


def test_split_keeps_the_locks():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 2, 3, 4])
    m = tree.match_prefix([1, 2, 3, 4])
    tree.inc_lock_ref(m.last_device_node)
    mid = tree.match_prefix([1, 2]).last_device_node  # splits the locked node
    assert mid.lock_ref == 1 and m.last_device_node.lock_ref == 1
    assert tree.protected_size() == 4 and tree.evict(10).num_tokens_evicted == 0
    tree.dec_lock_ref(m.last_device_node)
    assert tree.evictable_size() == 4


def test_unlocking_twice_is_caught_in_debug_mode():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 2])
    node = tree.match_prefix([1, 2]).last_device_node
    tree.inc_lock_ref(node)
    tree.dec_lock_ref(node)
    with pytest.raises(ValueError, match="released twice"):
        tree.dec_lock_ref(node)


def test_page_aligned_keys():
    tree, alloc = tree_of(64, page_size=4)
    key = list(range(10))  # 2 whole pages and 2 tokens
    assert tree.page_aligned(key) == tuple(range(8))
    value, r = insert_fresh(tree, alloc, key)
    assert len(value) == 8 and tree.total_size() == 8
    # children are found by their first page
    assert list(tree.root_node.children) == [(0, 1, 2, 3)]
    # A match counts whole pages only: tokens 4 and 5 agree but page (4, 5, 6, 7) does not.
    m = tree.match_prefix([0, 1, 2, 3, 4, 5, 99, 99, 8])
    assert m.device_prefix_len == 4
    assert shape(tree) == {
        (0, 1, 2, 3): (
            value[:4].tolist(),
            0,
            {(4, 5, 6, 7): (value[4:].tolist(), 0, {})},
        )
    }
    # less than a page matches nothing
    assert tree.match_prefix([0, 1, 2]).device_prefix_len == 0
    tree.check_idle(64)


# -- a request's lifecycle: checkpoints, release, the split at the prompt ------------------------


def table_tree(size=64, page_size=1, **kw):
    alloc = make_allocator(size, page_size, debug_mode=True)
    pool = ReqToTokenPool(4, 64)
    return RadixCache(alloc, debug_mode=True, req_to_token_pool=pool, **kw), alloc, pool


def admit(tree, rid, prompt):
    """Matched and locked, as the scheduler admits it; returns the request and its matched slots."""
    r = Req(rid, prompt)
    prefix, _ = match_and_lock(tree, r)
    return r, prefix


def extend(tree, r, n, prefix=None):
    """One prefill chunk of ``n`` tokens, then its checkpoint (``checkpoint_kv_cache``)."""
    assert (
        alloc_for_extend(
            tree.req_to_token_pool, tree.token_to_kv_pool_allocator, [r], [n], [prefix]
        )
        is not None
    )
    r.extend_end = r.prefix_len + n
    checkpoint_kv_cache(r, tree)


def decode(tree, r, steps):
    for i in range(steps):
        assert (
            alloc_for_decode(
                tree.req_to_token_pool, tree.token_to_kv_pool_allocator, [r]
            )
            is not None
        )
        r.output_ids.append(900 + i)


def serve(tree, prompt_len, decode_steps, rid="R"):
    """A request that matches nothing: its prompt prefilled and checkpointed, its first output
    sampled, ``decode_steps`` decode steps, then released as finished."""
    r, prefix = admit(tree, rid, range(100, 100 + prompt_len))
    extend(tree, r, prompt_len, prefix)
    r.output_ids.append(899)
    decode(tree, r, decode_steps)
    release_kv_cache(r, tree, checkpoint=True)
    return r


def nodes(tree):
    """(key length, slots, priority, lock_ref) of every node, parents first."""
    out, stack = [], list(tree.root_node.children.values())
    while stack:
        n = stack.pop(0)
        out.append((len(n.key), n.value.tolist(), n.priority, n.lock_ref))
        stack.extend(n.children.values())
    return out


def test_finished_request_keeps_its_prompt_under_its_output_page_1():
    # SGLang 0.5.23 on the same calls (engine_lifecycle notes 1.15 A): prompt 7, 6
    # outputs (5 decoded)
    tree, alloc, _ = table_tree(64, 1)
    r = serve(tree, 7, 5)
    assert nodes(tree) == [
        (7, [1, 2, 3, 4, 5, 6, 7], 1, 0),
        (5, [8, 9, 10, 11, 12], 0, 0),
    ]
    assert (
        r.kv.cache_protected_len,
        r.kv.cache_inserted_len,
        r.kv.kv_committed_len,
    ) == (12, 12, 12)
    assert r.lock is None and not r.kv.holds_kv
    assert (alloc.available_size(), tree.evictable_size(), tree.protected_size()) == (
        52,
        12,
        0,
    )
    # the output leaf goes; the prompt stays
    assert tree.evict(1).num_tokens_evicted == 5
    assert (
        nodes(tree) == [(7, [1, 2, 3, 4, 5, 6, 7], 1, 0)]
        and alloc.available_size() == 57
    )
    tree2, _, _ = table_tree(64, 1)
    serve(tree2, 7, 6)  # 7 outputs, 13 committed: the numbers
    assert tree2.evict(1).num_tokens_evicted == 6 and tree2.evictable_size() == 7


def test_finished_request_keeps_its_prompt_under_its_output_page_4():
    # notes 1.15 B: prompt 9, 8 outputs (7 decoded): prompt pages 1, 2; output pages 3, 4
    tree, alloc, _ = table_tree(64, 4)
    serve(tree, 9, 7)
    assert nodes(tree) == [
        (8, list(range(4, 12)), 1, 0),
        (8, list(range(12, 20)), 0, 0),
    ]
    assert (alloc.available_size(), tree.evictable_size()) == (48, 16)
    assert tree.evict(1).num_tokens_evicted == 8 and alloc.available_size() == 56
    tree, alloc, _ = table_tree(64, 4)
    # 17 committed: the key is still 16, the last page (position 16) goes back
    serve(tree, 9, 8)
    assert (alloc.available_size(), tree.evict(1).num_tokens_evicted) == (48, 8)


class OneInsertTree(RadixCache):
    """The older shape: the finished request goes in as one insert, no split at the prompt."""

    def _insert_cache(self, req, token_ids, *, key_limit=None, split_prompt=False):
        return super()._insert_cache(
            req, token_ids, key_limit=key_limit, split_prompt=False
        )


def test_without_the_prompt_split_eviction_takes_the_prompt_too():
    tree, alloc, _ = table_tree(64, 1)
    tree.__class__ = OneInsertTree
    r, prefix = admit(tree, "R", range(7))
    assert (
        alloc_for_extend(tree.req_to_token_pool, alloc, [r], [7], [prefix]) is not None
    )
    r.output_ids = [9] * 6  # decoded without a checkpoint after the prefill
    decode(tree, r, 5)
    r.output_ids = r.output_ids[:6]
    release_kv_cache(r, tree, checkpoint=True)
    assert [n[0] for n in nodes(tree)] == [12] and tree.evict(
        1
    ).num_tokens_evicted == 12


def test_a_disabled_tree_checkpoints_nothing_and_release_frees_the_whole_row():
    tree, alloc, pool = table_tree(64, 1, disable=True)
    r, prefix = admit(tree, "R", range(7))
    assert len(prefix) == 0 and r.lock is not None
    extend(tree, r, 7, prefix)
    assert (
        r.kv.cache_protected_len == 0 and r.prefix_len == 7 and tree.total_size() == 0
    )
    release_kv_cache(r, tree, checkpoint=True)
    assert (
        alloc.available_size() == 64
        and pool.available_size() == 4
        and tree.evictable_size() == 0
    )


def test_chunks_enter_the_tree_between_chunks_and_duplicates_go_back():
    # notes 1.12: A and B admitted with the same 12-token prompt before anything was cached
    tree, alloc, pool = table_tree(64, 4)
    a, pa = admit(tree, "A", range(10, 22))
    b, pb = admit(tree, "B", range(10, 22))
    extend(tree, a, 12, pa)
    assert (
        nodes(tree) == [(12, list(range(4, 16)), 0, 1)]
        and a.kv.cache_protected_len == 12
    )
    extend(tree, b, 4, pb)  # B's first chunk: the tree has it already
    # the row points at the tree
    assert pool.req_to_token[b.kv.req_pool_idx, :4].tolist() == [4, 5, 6, 7]
    # its own page 4 went back
    assert alloc.free_pages[0].item() == 4 and alloc.available_size() == 64 - 12
    assert (b.kv.cache_protected_len, b.kv.cache_inserted_len, b.prefix_len) == (
        4,
        4,
        4,
    )
    assert b.lock.node.key == tuple(range(10, 14)) and b.last_node is b.lock.node
    extend(tree, b, 4)  # second chunk: the same again, the lock moves down
    assert pool.req_to_token[b.kv.req_pool_idx, :8].tolist() == list(range(4, 12))
    assert [(k, lock) for k, _, _, lock in nodes(tree)] == [(4, 2), (4, 2), (4, 1)]
    assert [n.hit_count for n in (b.lock.node.parent, b.lock.node)] == [2, 2]
    assert alloc.available_size() == 64 - 12
    extend(tree, b, 4)
    release_kv_cache(a, tree, checkpoint=True)
    release_kv_cache(b, tree, checkpoint=True)
    tree.check_idle(64)


def test_a_node_counts_one_hit_per_request():
    tree, alloc, _ = table_tree(64, 1)
    r, prefix = admit(tree, "R", range(8))
    extend(tree, r, 4, prefix)
    extend(tree, r, 4)  # a second checkpoint of the same request
    (top,) = tree.root_node.children.values()
    assert top.hit_count == 1 and next(iter(top.children.values())).hit_count == 1
    release_kv_cache(r, tree, checkpoint=True)
    assert top.hit_count == 1
    # another request: hits 7, computes 1, inserts all 8
    s_, prefix = admit(tree, "S", range(8))
    extend(tree, s_, 1, prefix)
    assert top.hit_count == 2  # it counts again
    release_kv_cache(s_, tree, checkpoint=True)


def test_a_retracted_request_leaves_its_prompt_in_the_tree():
    tree, alloc, pool = table_tree(64, 1)
    r, prefix = admit(tree, "R", range(7))
    extend(tree, r, 7, prefix)
    r.output_ids.append(1)
    decode(tree, r, 3)
    release_kv_cache(r, tree, checkpoint=False)
    r.reset_for_retract()
    # its decode KV went back
    assert tree.total_size() == 7 and alloc.available_size() == 64 - 7
    assert r.kv.cache_protected_len == 0 and r.lock is None and not r.kv.holds_kv
    again, prefix = admit(tree, "R", r.full_untruncated_fill_ids)
    assert len(prefix) == 7  # the prompt hits
    tree.unlock(again.lock)
    tree.check_idle(64)


def test_lock_and_unlock_hold_exactly_one_holder():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 2, 3])
    node = tree.match_prefix([1, 2, 3]).last_device_node
    first, second = tree.lock(node), tree.lock(node)
    assert first.node is node and node.lock_ref == 2 and tree.protected_size() == 3
    tree.unlock(first)
    tree.unlock(None)  # nothing held: nothing to give back
    assert node.lock_ref == 1
    tree.unlock(second)
    assert tree.evictable_size() == 3


def test_touch_prefix_refreshes_without_returning():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 1])
    insert_fresh(tree, alloc, [2, 2])
    assert tree.touch_prefix([1, 1, 5]) is None  # (1, 1) is now the most recent
    assert tree.evict(1).num_tokens_evicted == 2 and sorted(shape(tree)) == [(1, 1)]
    tree.touch_prefix([1])  # a touch may split, as a match does
    assert sorted(shape(tree)) == [(1,)]
    tree_of(disable=True)[0].touch_prefix([1])


def test_a_request_never_hits_its_last_prompt_token():
    tree, alloc = tree_of()
    drv = RadixDriver(tree)
    drv.finish(drv.admit([1, 2, 3, 4]))
    # the last token's logits must be computed
    assert drv.admit([1, 2, 3, 4]).hit_tokens == 3


def test_disabled_cache_holds_nothing():
    tree, alloc = tree_of(disable=True)
    assert tree.insert([1, 2], alloc.alloc(2)).prefix_len == 0
    assert tree.match_prefix([1, 2]).device_prefix_len == 0 and tree.total_size() == 0


def test_bad_arguments_are_named():
    tree, alloc = tree_of()
    with pytest.raises(ValueError, match="insert of 3 key tokens with 2 slots"):
        tree.insert([1, 2, 3], alloc.alloc(2))
    with pytest.raises(ValueError, match="page_size 4 is not the allocator's 1"):
        RadixCache(alloc, page_size=4)


def test_idle_check_finds_a_leak():
    tree, alloc = tree_of()
    alloc.alloc(3)  # nobody's
    with pytest.raises(AssertionError, match="idle check failed: available 29"):
        tree.check_idle(32)


def test_debug_scan_finds_corrupt_counters():
    tree, alloc = tree_of()
    insert_fresh(tree, alloc, [1, 2])
    tree.evictable_size_ += 1
    with pytest.raises(AssertionError, match=r"counters \(3, 0\), tree \(2, 0\)"):
        tree.match_prefix([1])


# -- property: no page has two owners ------------------------------------------------------------


def check_owners(tree, alloc, running):
    """Every page 1..num_pages is exactly one of: free, in a tree node, owned by one running
    request."""
    ps = tree.page_size
    owners = {}

    def own(pages, who):
        for p in pages:
            assert p not in owners, f"page {p} is held by {owners[p]} and by {who}"
            owners[p] = who

    own(alloc.get_all_free_pages().tolist(), "the free list")
    stack = list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        own((node.value[::ps] // ps).tolist(), f"tree node {node.id}")
    for i, r in enumerate(running):
        own(
            torch.unique(r.kv_indices[r.kv.cache_protected_len :] // ps).tolist(),
            f"request {i}",
        )
    assert sorted(owners) == list(range(1, alloc.num_pages + 1)), (
        "a page has no owner: it leaked"
    )


class LeakyPrefixCache(RadixCache):
    """A classic bug: a released request frees the prefix it borrowed from the tree too."""

    def free_kv_row(self, kv, ranges):
        super().free_kv_row(kv, [(0, end) for _, end in ranges])


ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "finish", "evict"]), st.integers(0, 10**6)
    ),
    min_size=1,
    max_size=40,
)


def run_stream(cls, page_size, steps):
    alloc = make_allocator(40, page_size, debug_mode=True)
    tree = cls(alloc, debug_mode=True)
    drv, running, seqs = (
        RadixDriver(tree),
        [],
        [[1, 2, 3, 4, 5, 6], [1, 2, 7, 7], [9] * 8],
    )
    for op, x in steps:
        rng = random.Random(x)
        if op == "admit" and len(running) < 3:
            base = rng.choice(seqs)
            tokens = base[: rng.randrange(len(base) + 1)] + [
                rng.randrange(3) for _ in range(rng.randrange(1, 6))
            ]
            req = drv.admit(tokens)
            if req is not None:
                running.append(req)
                seqs.append(tokens)
        elif op == "finish" and running:
            drv.finish(running.pop(x % len(running)))
        elif op == "evict":
            tree.evict(x % 12)
        check_owners(tree, alloc, running)
    for r in running:
        drv.finish(r)
    check_owners(tree, alloc, [])
    tree.check_idle(alloc.num_pages * page_size)


@pytest.mark.parametrize("page_size", [1, 4])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops)
def test_no_page_has_two_owners(page_size, steps):
    run_stream(RadixCache, page_size, steps)


def test_the_ownership_property_catches_a_leaky_free():
    @settings(
        max_examples=200,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
    )
    @given(steps=ops)
    def prop(steps):
        run_stream(LeakyPrefixCache, 4, steps)

    # caught by the boundary now (the range is the tree's), or by the books if it slipped through
    with pytest.raises(
        (AssertionError, ValueError),
        match="is held by|double free|is already free|is not inside what",
    ):
        prop()


def test_sglangs_parameter_objects_and_memlabs_short_calls_agree():
    """SGLang's calls (``base_prefix_cache``'s parameter objects, a ``RadixKey``) and memlab's
    short calls build the same tree, match the same prefix and evict the same slots."""
    from memlab.sglang.radix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
        RadixKey,
    )

    (a, alloc_a), (b, alloc_b) = tree_of(page_size=2), tree_of(page_size=2)
    for key in ([1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9], [7, 7]):
        n = len(key) // 2 * 2
        va, vb = alloc_a.alloc(n), alloc_b.alloc(n)
        ra = a.insert(key, va, priority=1)
        rb = b.insert(InsertParams(key=RadixKey(key), value=vb, priority=1))
        assert ra.prefix_len == rb.prefix_len
        alloc_a.free(va[: ra.prefix_len])
        alloc_b.free(vb[: rb.prefix_len])
    assert shape(a) == shape(b)
    # limit: as if the ids were cut to it, without the copy
    ma = a.match_prefix([1, 2, 3, 9])
    mb = b.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 9, 9, 9], limit=4)))
    assert ma.device_prefix_len == mb.device_prefix_len == 4
    assert mb.best_match_node is mb.last_host_node is mb.last_device_node
    assert (
        a.evict(3).num_tokens_evicted
        == b.evict(EvictParams(num_tokens=3)).num_tokens_evicted
        == 4
    )
    assert shape(a) == shape(b)


@pytest.mark.parametrize(
    "key, match",
    [
        ("extra_key", "one namespace"),
        ("cache_salt", "one namespace"),
        ("is_bigram", "bigram"),
    ],
)
def test_a_key_the_tree_would_not_keep_apart_is_refused(key, match):
    from memlab.sglang.radix_cache import InsertParams, RadixKey

    tree, alloc = tree_of()
    v = alloc.alloc(2)
    kw = {"is_bigram": True} if key == "is_bigram" else {key: "user-7"}
    with pytest.raises(ValueError, match=match):
        tree.insert(InsertParams(key=RadixKey([1, 2], **kw), value=v))
    assert tree.total_size() == 0


def test_bad_keys_and_mixed_calls_are_refused_by_name():
    from memlab.sglang.radix_cache import InsertParams

    tree, alloc = tree_of()
    v = alloc.alloc(2)
    with pytest.raises(TypeError, match="token ids"):
        tree.insert([1, 2.5], v)
    with pytest.raises(TypeError, match="not both"):
        tree.insert(InsertParams(key=[1, 2], value=v), v)
    with pytest.raises(TypeError, match="inserted_len"):
        tree.insert([1, 2], v, inserted_len="2")
    with pytest.raises(TypeError, match="EvictParams.swa_num_tokens"):
        from memlab.sglang.radix_cache import EvictParams

        tree.evict(EvictParams(swa_num_tokens=None))
    assert tree.total_size() == 0 and alloc.available_size() == 30
