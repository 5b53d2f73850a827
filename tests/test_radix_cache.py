"""RadixCache: hand-worked cases (a split, LRU eviction, locks, page alignment, a finished request),
the books it keeps, and a property test over random request streams: every page is free, held by
the tree, or held by one running request, never two of these (with a buggy variant that breaks it).
"""

import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memlab.sglang.allocator import make_allocator
from memlab.capstone.prefix_compare import RadixDriver
from memlab.sglang.radix_cache import RadixCache


def tree_of(size=32, page_size=1, **kw):
    alloc = make_allocator(size, page_size, debug_mode=True)
    return RadixCache(alloc, debug_mode=True, **kw), alloc


def shape(tree):
    """The tree as nested {key: (slots, lock_ref, children)}."""
    def walk(node):
        return {c.key: (c.value.tolist(), c.lock_ref, walk(c)) for c in node.children.values()}
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
    assert r2.prefix_len == 3  # (1, 2, 3) was there: the caller's slots 6, 7, 8 were duplicates, freed
    assert shape(tree) == {(1, 2, 3): ([1, 2, 3], 0, {(4, 5): ([4, 5], 0, {}), (9, 9): ([9, 10], 0, {})})}
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
    assert tree.evict(1).num_tokens_evicted == 3  # (2, 2, 2) goes whole: a node is the unit
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
    assert tree.dec_lock_ref(m.last_device_node).delta == 2  # (3, 4) free again, (1, 2) still locked
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
    with pytest.raises(AssertionError, match="released twice"):
        tree.dec_lock_ref(node)


def test_page_aligned_keys():
    tree, alloc = tree_of(64, page_size=4)
    key = list(range(10))  # 2 whole pages and 2 tokens
    assert tree.page_aligned(key) == tuple(range(8))
    value, r = insert_fresh(tree, alloc, key)
    assert len(value) == 8 and tree.total_size() == 8
    assert list(tree.root_node.children) == [(0, 1, 2, 3)]  # children are found by their first page
    # A match counts whole pages only: tokens 4 and 5 agree but page (4, 5, 6, 7) does not.
    m = tree.match_prefix([0, 1, 2, 3, 4, 5, 99, 99, 8])
    assert m.device_prefix_len == 4
    assert shape(tree) == {(0, 1, 2, 3): (value[:4].tolist(), 0, {(4, 5, 6, 7): (value[4:].tolist(), 0, {})})}
    assert tree.match_prefix([0, 1, 2]).device_prefix_len == 0  # less than a page matches nothing
    tree.check_idle(64)


def test_finished_request_frees_duplicates_and_its_partial_page():
    tree, alloc = tree_of(64, page_size=4)
    drv = RadixDriver(tree)
    a = drv.admit(list(range(10)))
    assert a.hit_tokens == 0 and len(a.kv_indices) == 10
    b = drv.admit(list(range(9)) + [50, 51])  # computes all 11 too: a is not in the tree yet
    drv.finish(a)  # 8 tokens (two pages) kept; the page of tokens 8, 9 freed
    assert tree.total_size() == 8 and alloc.available_size() == 64 - 8 - 12
    drv.finish(b)  # b's first two pages duplicate a's: freed; its third page (8, 50, 51) is new... partial: freed
    assert tree.total_size() == 8 and alloc.available_size() == 64 - 8
    c = drv.admit(list(range(10)))  # hits two pages
    assert c.hit_tokens == 8 and c.kv_indices[:8].tolist() == tree.path_device_indices(c.last_node).tolist()
    assert tree.protected_size() == 8
    drv.finish(c)
    tree.check_idle(64)


def test_a_request_never_hits_its_last_prompt_token():
    tree, alloc = tree_of()
    drv = RadixDriver(tree)
    drv.finish(drv.admit([1, 2, 3, 4]))
    assert drv.admit([1, 2, 3, 4]).hit_tokens == 3  # the last token's logits must be computed


def test_disabled_cache_holds_nothing():
    tree, alloc = tree_of(disable=True)
    assert tree.insert([1, 2], alloc.alloc(2)).prefix_len == 0
    assert tree.match_prefix([1, 2]).device_prefix_len == 0 and tree.total_size() == 0


def test_bad_arguments_are_named():
    tree, alloc = tree_of()
    with pytest.raises(ValueError, match="insert of 3 tokens .* with only 2 slots"):
        tree.insert([1, 2, 3], alloc.alloc(2))
    with pytest.raises(ValueError, match="page_size 4 differs from the allocator's 1"):
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
    with pytest.raises(AssertionError, match="counters say evictable 3"):
        tree.match_prefix([1])


# -- property: no page has two owners ------------------------------------------------------------


def check_owners(tree, alloc, running):
    """Every page 1..num_pages is exactly one of: free, in a tree node, owned by one running request."""
    ps = tree.page_size
    owners = {}

    def own(pages, who):
        for p in pages:
            assert p not in owners, f"page {p} is held by {owners[p]} and by {who}"
            owners[p] = who

    own(torch.cat((alloc.free_pages, alloc.release_pages)).tolist(), "the free list")
    stack = list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        own((node.value[::ps] // ps).tolist(), f"tree node {node.id}")
    for i, r in enumerate(running):
        own(torch.unique(r.kv_indices[r.cache_protected_len:] // ps).tolist(), f"request {i}")
    assert sorted(owners) == list(range(1, alloc.num_pages + 1)), "a page has no owner: it leaked"


class LeakyPrefixCache(RadixCache):
    """A classic bug: the finished request frees the prefix it borrowed from the tree too."""

    def cache_finished_req(self, token_ids, kv_indices, cache_protected_len, last_node):
        return super().cache_finished_req(token_ids, kv_indices, 0, last_node)


ops = st.lists(st.tuples(st.sampled_from(["admit", "admit", "finish", "evict"]), st.integers(0, 10 ** 6)),
               min_size=1, max_size=40)


def run_stream(cls, page_size, steps):
    alloc = make_allocator(40, page_size, debug_mode=True)
    tree = cls(alloc, debug_mode=True)
    drv, running, seqs = RadixDriver(tree), [], [[1, 2, 3, 4, 5, 6], [1, 2, 7, 7], [9] * 8]
    for op, x in steps:
        rng = random.Random(x)
        if op == "admit" and len(running) < 3:
            base = rng.choice(seqs)
            tokens = base[: rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
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
    @settings(max_examples=200, deadline=None, phases=[Phase.generate], derandomize=True, database=None)
    @given(steps=ops)
    def prop(steps):
        run_stream(LeakyPrefixCache, 4, steps)

    with pytest.raises(AssertionError, match="is held by|double free|is already free"):
        prop()
