"""Graded: chapter 11, the radix tree's match with its split, and LRU eviction
(exercises/ch11_radix_match.py)."""

import pytest

from memlab.course.grading.checks import call_keeping_inputs, expect, expect_equal
from memlab.course.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch11.radix_match")


def chain(m, page_size=1, *keys):
    """A tree holding one path root -> keys[0] -> keys[1] ..., slots numbered from 100."""
    tree = m.RadixTree(page_size)
    node, slot = tree.root, 100
    for key in keys:
        node = tree.add_child(node, key, range(slot, slot + len(key)))
        slot += len(key)
    return tree, node


def shape(node):
    return {k: (c.key, c.value, c.lock_ref, shape(c)) for k, c in node.children.items()}


@points(2)
def test_split_by_hand():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 1, (1, 2, 3, 4))
    before = tree.clock
    new = m.split_node(tree, leaf, 2)
    expect_equal((new.key, new.value), ((1, 2), [100, 101]), "the new node holds the first 2 tokens and slots")
    expect_equal((leaf.key, leaf.value), ((3, 4), [102, 103]), "the old node keeps the rest")
    expect(tree.root.children.get(1) is new, "the root's entry for token 1 must now point at the new node")
    expect(new.children == {3: leaf} and leaf.parent is new and new.parent is tree.root,
           f"the old node hangs below the new one under child key 3; got children {new.children}")
    expect(new.last_access_time == tree.clock == before + 1,
           f"the new node is created now: its time is one fresh tree.tick() ({before + 1}), got "
           f"{new.last_access_time} (clock {tree.clock})")


@points(1)
def test_split_keeps_locks():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 1, (5, 6, 7))
    tree.lock(leaf)
    new = m.split_node(tree, leaf, 1)
    expect_equal(new.lock_ref, 1, "a request locking the old node runs through both parts: the new node "
                 "inherits lock_ref, or eviction could take a prefix in use")


@points(2)
def test_match_full_and_partial():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 1, (1, 2), (3, 4, 5))
    n, node = m.match_prefix(tree, [1, 2, 3, 4, 5, 6])
    expect_equal(n, 5, "[1, 2, 3, 4, 5, 6] matches the whole path (5 tokens)")
    expect(node is leaf, "a full match ends on the last node")
    n, node = call_keeping_inputs(m.match_prefix, "match_prefix(tree, [1, 2, 3, 9])", tree, [1, 2, 3, 9])
    expect_equal(n, 3, "[1, 2, 3, 9] matches 3 tokens")
    expect_equal((node.key, tree.path_value(node)), ((3,), [100, 101, 102]),
                 "the match ends inside (3, 4, 5): split it so the match ends exactly on a node")
    expect_equal(shape(node), {4: ((4, 5), [103, 104], 0, {})}, "the rest (4, 5) hangs below the split")
    n, node = m.match_prefix(tree, [7, 1])
    expect(n == 0 and node is tree.root, f"no child for token 7: match 0 at the root, got {n}, {node}")
    n, node = m.match_prefix(tree, [])
    expect(n == 0 and node is tree.root, "an empty key matches nothing")


@points(1)
def test_match_refreshes_access_time():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 1, (1, 2), (3, 4))
    other = tree.add_child(tree.root, (9,), [50])
    m.match_prefix(tree, [1, 2, 3, 4])
    now = tree.clock
    expect(leaf.last_access_time == now and leaf.parent.last_access_time == now,
           "every node on the matched path gets the match's time (one tree.tick() per match)")
    expect(other.last_access_time < now, "nodes off the path keep their time")


@points(1)
def test_match_whole_pages():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 2, (1, 2, 3, 4), (5, 6))
    rest = leaf.parent
    key = [1, 2, 3, 9, 9]
    n, node = call_keeping_inputs(m.match_prefix, "match_prefix(tree, [1, 2, 3, 9, 9])", tree, key)
    expect_equal(n, 2, "with pages of 2, page (3, 9) differs from page (3, 4): only 2 tokens match")
    expect_equal((node.key, node.value), ((1, 2), [100, 101]), "and the split falls on the page boundary")
    expect(node.children == {(3, 4): rest} and rest.key == (3, 4),
           f"with pages the rest (3, 4) hangs below the split under its first PAGE (3, 4); got children "
           f"{node.children}")
    n, node = call_keeping_inputs(m.match_prefix, "match_prefix(tree, [1, 2, 3])", tree, [1, 2, 3])
    expect_equal(n, 2, "a key of 3 tokens is cut to one whole page before matching")
    n, end = m.match_prefix(tree, (1, 2, 3, 4, 5, 6, 7))
    expect_equal(n, 6, "(1, 2, 3, 4, 5, 6, 7) (a tuple works too) is cut to 3 whole pages and walks through the "
                 "split down to (5, 6): 6 tokens")
    expect(end is leaf, f"the match ends on the leaf (5, 6), got {end}")


@points(1)
def test_evict_lru_order():
    m = load("ch11_radix_match")
    tree = m.RadixTree()
    a = tree.add_child(tree.root, (1, 1), [11, 12])
    tree.add_child(tree.root, (2, 2, 2), [21, 22, 23])
    tree.add_child(tree.root, (3,), [31])
    m.match_prefix(tree, [1, 1])  # (1, 1) is now the most recently used
    freed = []
    n = m.evict(tree, 1, freed.append)
    expect_equal(freed, [[21, 22, 23]], "the least recently used leaf is (2, 2, 2); a node goes whole")
    expect_equal(n, 3, "evict returns the tokens it freed (3 here, more than the 1 asked)")
    n = m.evict(tree, 2, freed.append)
    expect_equal(freed[1:], [[31], [11, 12]], "then (3,), then (1, 1), until at least 2 tokens are freed")
    expect(tree.root.children == {} and a.key == (1, 1), "evicted leaves leave their parent's children")
    expect_equal(m.evict(tree, 5, freed.append), 0, "nothing left: 0 freed")


@points(1)
def test_evict_exact_fit_and_ties():
    m = load("ch11_radix_match")
    tree = m.RadixTree()
    tree.add_child(tree.root, (1, 1), [11, 12])
    b = tree.add_child(tree.root, (2, 2, 2), [21, 22, 23])
    freed = []
    expect_equal(m.evict(tree, 0, freed.append), 0, "evict(0) frees nothing")
    expect_equal(freed, [], "evict(0) must not call free")
    expect_equal(m.evict(tree, 2, freed.append), 2, "the oldest leaf (1, 1) holds exactly the 2 tokens asked")
    expect_equal(freed, [[11, 12]], "2 tokens freed are enough: evict stops there (it evicts while FEWER than "
                 "num_tokens are freed), and (2, 2, 2) stays")
    expect(list(tree.root.children.values()) == [b], "(2, 2, 2) stays in the tree")

    # Leaves last used at the same time (SGLang stamps time.monotonic(), which can repeat):
    # the heap must still order them, which (time, node) alone cannot (nodes do not compare).
    tree = m.RadixTree()
    p = tree.add_child(tree.root, (1,), [10])
    low = tree.add_child(p, (2,), [20])
    q = tree.add_child(tree.root, (3,), [30])
    r = tree.add_child(tree.root, (4,), [40])
    low.last_access_time, p.last_access_time, q.last_access_time, r.last_access_time = 1, 5, 5, 5
    freed = []
    n = m.evict(tree, 10, freed.append)
    expect_equal(n, 4, "with equal times every unlocked node still goes: 4 tokens")
    expect(freed[:1] == [[20]] and sorted(freed[1:]) == [[10], [30], [40]],
           f"(2,) (time 1) first, then (1,), (3,), (4,) (time 5, in any order); freed {freed}")


@points(1)
def test_evict_skips_locked_and_climbs():
    m = load("ch11_radix_match")
    tree, leaf = chain(m, 1, (1, 2), (3,))
    locked = tree.add_child(tree.root, (7, 7), [70, 71])
    tree.lock(locked)
    freed = []
    n = m.evict(tree, 3, freed.append)
    expect_equal(freed, [[102], [100, 101]], "(3,) goes, then its parent (1, 2), now a leaf, in the same call")
    expect_equal(n, 3, "3 tokens freed")
    expect(list(tree.root.children) == [7], "the locked node stays")

    # A parent goes only after its LAST child (pages of 2: children are keyed by their first page).
    tree = m.RadixTree(2)
    p = tree.add_child(tree.root, (1, 2), [100, 101])
    tree.add_child(p, (3, 4), [102, 103])
    tree.add_child(p, (5, 6), [104, 105])
    freed = []
    expect_equal(m.evict(tree, 100, freed.append), 6, "everything unlocked goes: 6 tokens")
    expect_equal(freed, [[102, 103], [104, 105], [100, 101]],
                 "(1, 2) is older than its children, but while (5, 6) hangs below it, it is no leaf: it goes last")
    expect(tree.root.children == {}, "every node left its parent's children (the root stays: it is never evicted)")

    # A locked parent stays when its only child goes.
    tree, leaf = chain(m, 1, (1, 2), (3, 4))
    tree.lock(leaf.parent)
    freed = []
    expect_equal(m.evict(tree, 100, freed.append), 2, "only the unlocked leaf (3, 4) can go: 2 tokens")
    expect_equal(freed, [[102, 103]], "(1, 2), now childless, is locked by a running request: it stays")
