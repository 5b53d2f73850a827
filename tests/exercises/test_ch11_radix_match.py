"""Graded: chapter 11, the radix tree's match with its split, and LRU eviction
(exercises/ch11_radix_match.py)."""

import pytest

from memlab.course.grading.checks import call_keeping_inputs, expect, expect_equal
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch11.radix_match", requires=requires)


def slots(rng):
    """S(100, 101) is the list of slots 100 and 101 moved by this test's random offset (a case
    whose answer no table of recorded ones holds)."""
    base = rng.randint(0, 10**9)
    return lambda *xs: [base + x for x in xs]


def chain(m, page_size, S, *keys):
    """A tree holding one path root -> keys[0] -> keys[1] ..., slots S(100), S(101), ..."""
    tree = m.RadixTree(page_size)
    node, slot = tree.root, 100
    for key in keys:
        node = tree.add_child(node, key, S(*range(slot, slot + len(key))))
        slot += len(key)
    return tree, node


def shape(node):
    return {k: (c.key, c.value, c.lock_ref, shape(c)) for k, c in node.children.items()}


@points(2)
def test_split_by_hand(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 1, S, (1, 2, 3, 4))
    before = tree.clock
    new = m.split_node(tree, leaf, 2)
    expect_equal(
        (new.key, new.value),
        ((1, 2), S(100, 101)),
        "the new node holds the first 2 tokens and slots",
    )
    expect_equal(
        (leaf.key, leaf.value), ((3, 4), S(102, 103)), "the old node keeps the rest"
    )
    expect(
        tree.root.children.get(1) is new,
        "the root's entry for token 1 must now point at the new node",
    )
    expect(
        new.children == {3: leaf} and leaf.parent is new and new.parent is tree.root,
        f"the old node hangs below the new one under child key 3; got children {new.children}",
    )
    expect(
        new.last_access_time == tree.clock == before + 1,
        f"the new node is created now: its time is one fresh tree.tick() ({before + 1}), got "
        f"{new.last_access_time} (clock {tree.clock})",
    )


@points(1)
def test_split_keeps_locks(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 1, S, (5, 6, 7))
    tree.lock(leaf)
    new = m.split_node(tree, leaf, 1)
    expect_equal(
        new.lock_ref,
        1,
        "a request locking the old node runs through both parts: the new node "
        "inherits lock_ref, or eviction could take a prefix in use",
    )
    expect_equal(
        leaf.lock_ref,
        1,
        "the old node keeps its own lock_ref: the split copies it, it does not move it",
    )
    # Deeper in the tree: the nodes above the split keep their locks (one each per request).
    tree, leaf = chain(m, 1, S, (1, 2), (3, 4, 5))
    tree.lock(leaf)
    top = leaf.parent
    new = m.split_node(tree, leaf, 1)
    expect_equal(
        (top.lock_ref, new.lock_ref, leaf.lock_ref),
        (1, 1, 1),
        "after splitting (3, 4, 5) below (1, 2) "
        "with one request locking the path: (1, 2), the new (3,) and (4, 5) each hold that one "
        "lock "
        "(copy lock_ref; taking a lock through tree.lock would lock the ancestors again)",
    )


@points(2)
def test_match_full_and_partial(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 1, S, (1, 2), (3, 4, 5))
    n, node = m.match_prefix(tree, [1, 2, 3, 4, 5, 6])
    expect_equal(n, 5, "[1, 2, 3, 4, 5, 6] matches the whole path (5 tokens)")
    expect(node is leaf, "a full match ends on the last node")
    n, node = call_keeping_inputs(
        m.match_prefix, "match_prefix(tree, [1, 2, 3, 9])", tree, [1, 2, 3, 9]
    )
    expect_equal(n, 3, "[1, 2, 3, 9] matches 3 tokens")
    expect_equal(
        (node.key, tree.path_value(node)),
        ((3,), S(100, 101, 102)),
        "the match ends inside (3, 4, 5): split it so the match ends exactly on a node",
    )
    expect_equal(
        shape(node),
        {4: ((4, 5), S(103, 104), 0, {})},
        "the rest (4, 5) hangs below the split",
    )
    n, node = m.match_prefix(tree, [7, 1])
    expect(
        n == 0 and node is tree.root,
        f"no child for token 7: match 0 at the root, got {n}, {node}",
    )
    n, node = m.match_prefix(tree, [])
    expect(n == 0 and node is tree.root, "an empty key matches nothing")


@points(1)
def test_match_refreshes_access_time(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 1, S, (1, 2), (3, 4))
    other = tree.add_child(tree.root, (9,), S(50))
    m.match_prefix(tree, [1, 2, 3, 4])
    now = tree.clock
    expect(
        leaf.last_access_time == now and leaf.parent.last_access_time == now,
        "every node on the matched path gets the match's time (one tree.tick() per match)",
    )
    expect(other.last_access_time < now, "nodes off the path keep their time")


@points(1)
def test_match_whole_pages(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 2, S, (1, 2, 3, 4), (5, 6))
    rest = leaf.parent
    key = [1, 2, 3, 9, 9]
    n, node = call_keeping_inputs(
        m.match_prefix, "match_prefix(tree, [1, 2, 3, 9, 9])", tree, key
    )
    expect_equal(
        n,
        2,
        "with pages of 2, page (3, 9) differs from page (3, 4): only 2 tokens match",
    )
    expect_equal(
        (node.key, node.value),
        ((1, 2), S(100, 101)),
        "and the split falls on the page boundary",
    )
    expect(
        node.children == {(3, 4): rest} and rest.key == (3, 4),
        "with pages the rest (3, 4) hangs below the split under its first PAGE (3, 4); got "
        "children "
        f"{node.children}",
    )
    n, node = call_keeping_inputs(
        m.match_prefix, "match_prefix(tree, [1, 2, 3])", tree, [1, 2, 3]
    )
    expect_equal(n, 2, "a key of 3 tokens is cut to one whole page before matching")
    n, end = m.match_prefix(tree, (1, 2, 3, 4, 5, 6, 7))
    expect_equal(
        n,
        6,
        "(1, 2, 3, 4, 5, 6, 7) (a tuple works too) is cut to 3 whole pages and walks through the "
        "split down to (5, 6): 6 tokens",
    )
    expect(end is leaf, f"the match ends on the leaf (5, 6), got {end}")


@points(1)
def test_evict_lru_order(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree = m.RadixTree()
    a = tree.add_child(tree.root, (1, 1), S(11, 12))
    tree.add_child(tree.root, (2, 2, 2), S(21, 22, 23))
    tree.add_child(tree.root, (3,), S(31))
    m.match_prefix(tree, [1, 1])  # (1, 1) is now the most recently used
    freed = []
    n = m.evict(tree, 1, freed.append)
    expect_equal(
        freed,
        [S(21, 22, 23)],
        "the least recently used leaf is (2, 2, 2); a node goes whole",
    )
    expect_equal(
        n, 3, "evict returns the tokens it freed (3 here, more than the 1 asked)"
    )
    n = m.evict(tree, 2, freed.append)
    expect_equal(
        freed[1:],
        [S(31), S(11, 12)],
        "then (3,), then (1, 1), until at least 2 tokens are freed",
    )
    expect(
        tree.root.children == {} and a.key == (1, 1),
        "evicted leaves leave their parent's children",
    )
    expect_equal(m.evict(tree, 5, freed.append), 0, "nothing left: 0 freed")


@points(1)
def test_evict_skips_locked_and_climbs(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree, leaf = chain(m, 1, S, (1, 2), (3,))
    locked = tree.add_child(tree.root, (7, 7), S(70, 71))
    tree.lock(locked)
    freed = []
    n = m.evict(tree, 3, freed.append)
    expect_equal(
        freed,
        [S(102), S(100, 101)],
        "(3,) goes; its parent (1, 2) has just become a leaf (no children, "
        "unlocked): push it onto the heap in the same call, so it goes next",
    )
    expect_equal(n, 3, "3 tokens freed")
    expect(list(tree.root.children) == [7], "the locked node stays")

    # A parent goes only after its LAST child (pages of 2: children are keyed by their first page).
    tree = m.RadixTree(2)
    p = tree.add_child(tree.root, (1, 2), S(100, 101))
    tree.add_child(p, (3, 4), S(102, 103))
    tree.add_child(p, (5, 6), S(104, 105))
    freed = []
    expect_equal(
        m.evict(tree, 100, freed.append), 6, "everything unlocked goes: 6 tokens"
    )
    expect_equal(
        freed,
        [S(102, 103), S(104, 105), S(100, 101)],
        "(1, 2) is older than its children, but while (5, 6) hangs below it, it is no leaf: it "
        "goes last",
    )
    expect(
        tree.root.children == {},
        "every node left its parent's children (the root stays: it is never evicted)",
    )

    # A locked parent stays when its only child goes.
    tree, leaf = chain(m, 1, S, (1, 2), (3, 4))
    tree.lock(leaf.parent)
    freed = []
    expect_equal(
        m.evict(tree, 100, freed.append),
        2,
        "only the unlocked leaf (3, 4) can go: 2 tokens",
    )
    expect_equal(
        freed,
        [S(102, 103)],
        "(1, 2), now childless, is locked by a running request: it stays",
    )

    # A parent that has just become a leaf competes on its OWN time: here (1, 2) was matched alone
    # after its child (3,) was last used, and after the leaf (7,) was added.
    tree = m.RadixTree()
    p = tree.add_child(tree.root, (1, 2), S(100, 101))
    c = tree.add_child(p, (3,), S(102))
    x = tree.add_child(tree.root, (7,), S(70))
    y = tree.add_child(tree.root, (8,), S(80))
    c.last_access_time, x.last_access_time, p.last_access_time, y.last_access_time = (
        2,
        3,
        4,
        5,
    )
    freed = []
    n = m.evict(tree, 4, freed.append)
    expect_equal(
        freed,
        [S(102), S(70), S(100, 101)],
        "(3,) (time 2) goes first; its parent (1, 2) then becomes a leaf "
        "and competes at once, with its own time 4 (not its child's 2), so (7,) (time 3) goes "
        "before it "
        "and (8,) (time 5) stays: push the parent with (parent.last_access_time, id(parent), "
        "parent)",
    )
    expect_equal(n, 4, "4 tokens asked, 4 freed")


@points(1, requires="test_evict_lru_order")
def test_evict_exact_fit_and_ties(rng):
    m = load("ch11_radix_match")
    S = slots(rng)
    tree = m.RadixTree()
    tree.add_child(tree.root, (1, 1), S(11, 12))
    b = tree.add_child(tree.root, (2, 2, 2), S(21, 22, 23))
    freed = []
    expect_equal(m.evict(tree, 0, freed.append), 0, "evict(0) frees nothing")
    expect_equal(freed, [], "evict(0) must not call free")
    expect_equal(
        m.evict(tree, 2, freed.append),
        2,
        "the oldest leaf (1, 1) holds exactly the 2 tokens asked",
    )
    expect_equal(
        freed,
        [S(11, 12)],
        "2 tokens freed are enough: evict stops there (it evicts while FEWER than "
        "num_tokens are freed), and (2, 2, 2) stays",
    )
    expect(list(tree.root.children.values()) == [b], "(2, 2, 2) stays in the tree")

    # Leaves last used at the same time (SGLang stamps time.monotonic(), which can repeat):
    # the heap must still order them, which (time, node) alone cannot (nodes do not compare).
    tree = m.RadixTree()
    low = tree.add_child(tree.root, (2,), S(20))
    p = tree.add_child(tree.root, (1,), S(10))
    q = tree.add_child(tree.root, (3,), S(30))
    r = tree.add_child(tree.root, (4,), S(40))
    low.last_access_time, p.last_access_time, q.last_access_time, r.last_access_time = (
        1,
        5,
        5,
        5,
    )
    freed = []
    n = m.evict(tree, 10, freed.append)
    expect(
        freed[:1] == [S(20)] and sorted(freed[1:]) == [S(10), S(30), S(40)],
        f"(2,) (time 1) first, then (1,), (3,), (4,) (time 5, in any order); freed {freed}",
    )
    expect_equal(n, 4, "every unlocked leaf went: 4 tokens")
    # A parent that has just become a leaf ties with other leaves too: it is pushed the same way.
    tree = m.RadixTree()
    p = tree.add_child(tree.root, (1,), S(10))
    low = tree.add_child(p, (2,), S(20))
    q = tree.add_child(tree.root, (3,), S(30))
    r = tree.add_child(tree.root, (4,), S(40))
    low.last_access_time, p.last_access_time, q.last_access_time, r.last_access_time = (
        1,
        5,
        5,
        5,
    )
    freed = []
    m.evict(tree, 10, freed.append)
    expect(
        freed[:1] == [S(20)] and sorted(freed[1:]) == [S(10), S(30), S(40)],
        "(2,) (time 1) first, then its parent (1,), now a leaf, and (3,), (4,): all three at "
        "time 5, in any "
        f"order (the parent is pushed as (time, id(node), node) like the others); freed {freed}",
    )


# -- the learner's tree against the engine's rules, over random inserts, matches, locks, evicts ----


class Node:
    __slots__ = ("key", "value", "children", "parent", "lock_ref", "time")

    def __init__(self, key, value, parent, time):
        self.key, self.value, self.children, self.parent = (
            tuple(key),
            list(value),
            {},
            parent,
        )
        self.lock_ref, self.time = 0, time


class Engine:
    """SGLang 0.5.23's RadixCache as the docstrings state it (a tick counter for time.monotonic()):
    match with its split, LRU eviction that climbs to parents left without children."""

    def __init__(self, page_size):
        self.ps, self.clock = page_size, 0
        self.root = Node((), (), None, 0)
        self.root.lock_ref = 1

    def tick(self):
        self.clock += 1
        return self.clock

    def child_key(self, key, offset=0):
        return key[offset] if self.ps == 1 else tuple(key[offset : offset + self.ps])

    def add_child(self, parent, key, value):
        node = Node(key, value, parent, self.tick())
        parent.children[self.child_key(node.key)] = node
        return node

    def lock(self, node, by):
        while node is not self.root:
            node.lock_ref += by
            node = node.parent

    def split(self, child, n):
        new = Node(child.key[:n], child.value[:n], child.parent, self.tick())
        new.lock_ref, new.children = (
            child.lock_ref,
            {self.child_key(child.key, n): child},
        )
        child.parent.children[self.child_key(child.key)] = new
        child.parent, child.key, child.value = new, child.key[n:], child.value[n:]
        return new

    def match(self, key):
        key = list(key)[: len(key) // self.ps * self.ps]
        now, node, matched = self.tick(), self.root, 0
        while matched < len(key):
            child = node.children.get(self.child_key(key, matched))
            if child is None:
                break
            child.time = now
            n = 0
            while (
                n < min(len(child.key), len(key) - matched)
                and child.key[n] == key[matched + n]
            ):
                n += 1
            n = n // self.ps * self.ps
            if n < len(child.key):
                return matched + n, self.split(child, n)
            node, matched = child, matched + n
        return matched, node

    def evict(self, num_tokens, free):
        import heapq

        stack, heap = list(self.root.children.values()), []
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.lock_ref == 0:
                heap.append((node.time, id(node), node))
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            free(node.value)
            evicted += len(node.key)
            parent = node.parent
            del parent.children[self.child_key(node.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.time, id(parent), parent))
        return evicted


def engine_shape(node):
    return {
        k: (c.key, c.value, c.lock_ref, c.time, engine_shape(c))
        for k, c in sorted(node.children.items())
    }


def learner_shape(node):
    return {
        k: (c.key, c.value, c.lock_ref, c.last_access_time, learner_shape(c))
        for k, c in sorted(node.children.items())
    }


def random_case(d):
    m = load("ch11_radix_match")
    ps = d.pick((1, 2, 3, 4))
    tree, engine = m.RadixTree(ps), Engine(ps)
    d.given(page_size=ps)
    d.code(f"tree = ex.RadixTree({ps})")
    slots = iter(range(100, 10_000))
    locks = []  # (learner node, engine node, code name) of running requests' prefixes
    keys = []  # what was inserted: a later match of its first pages ends inside the tree
    for step in d.count(3, 20, 0.92):
        op = d.pick(("insert", "match", "evict", "prefix", "unlock"))
        key = [
            d.int(0, 2)
            for _ in range(
                d.int(0, 4) * ps + (d.int(0, ps - 1) if d.chance(0.2) else 0)
            )
        ]
        # a request sharing only the first pages of an earlier one
        if op == "prefix" and keys:
            old = keys[d.int(0, len(keys) - 1)]
            key, op = old[: d.int(0, len(old) // ps) * ps], "match"
        keys += [key] if op == "insert" else []
        what = "match_prefix"
        if op in ("insert", "match"):
            d.step(
                f"match_prefix({key})"
                + (" and add_child of the rest (an insert)" if op == "insert" else "")
            )
            d.code(
                f"n{step}, node{step} = ex.match_prefix(tree, {key}); print(n{step}, node{step})"
            )
            got = d.call("match_prefix", m.match_prefix, tree, key)
            n, node = engine.match(key)
            if isinstance(got, tuple) and len(got) == 2:
                d.returns("match_prefix", got[0], n, "the matched length")
                path, up = [], node
                while up is not engine.root:
                    path[:0], up = up.value, up.parent
                d.same(
                    "the node match_prefix ends on (its key, the slots from the root to it)",
                    (got[1].key, tree.path_value(got[1])),
                    (node.key, path),
                    "the match ends exactly on a node",
                )
            else:
                d.returns("match_prefix", got, (n, "a node"))
            # SGLang's insert: the match, then a new leaf
            if op == "insert" and n < len(key) // ps * ps:
                rest = key[n : len(key) // ps * ps]
                value = [next(slots) for _ in rest]
                d.code(f"node{step} = tree.add_child(node{step}, {rest}, {value})")
                got, node = (
                    (n, tree.add_child(got[1], rest, value)),
                    engine.add_child(node, rest, value),
                )
            # a running request locks its prefix
            if node is not engine.root and d.chance(0.6):
                d.step("tree.lock(that node)")
                d.code(f"tree.lock(node{step})")
                tree.lock(got[1])
                engine.lock(node, 1)
                locks.append((got[1], node, f"node{step}"))
        elif op == "evict":
            num = d.int(0, 8)
            d.step(f"evict({num})")
            d.code(f"freed = []; print(ex.evict(tree, {num}, freed.append), freed)")
            freed, want_freed = [], []
            got = d.call(
                "evict", m.evict, tree, num, lambda v: freed.append(list(v)), keep=False
            )
            want = engine.evict(num, lambda v: want_freed.append(list(v)))
            d.same(
                "what evict freed (free's arguments, in order)",
                freed,
                want_freed,
                "least recently used first",
            )
            d.returns("evict", got, want, "the tokens it freed")
            what = "evict"
        elif op == "unlock" and locks:
            mine, eng, name = locks.pop(d.int(0, len(locks) - 1))
            d.step("tree.unlock(a node locked before)")
            d.code(f"tree.unlock({name})")
            tree.unlock(mine)
            engine.lock(eng, -1)
        else:
            continue
        d.code("print(tree.clock, tree.root.children)")
        d.books(
            what,
            "the tree (child key: key, value, lock_ref, last_access_time, children)",
            learner_shape(tree.root),
            engine_shape(engine.root),
        )
        d.books(
            what,
            "tree.clock",
            tree.clock,
            engine.clock,
            "one tree.tick() per match and per new node",
        )


@points(2)
def test_random_sequences_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=100, name="ch11_radix_match")
