"""Chapter 11 exercise: SGLang's radix tree, its match with the split, and its LRU eviction.

Write ``split_node``, ``match_prefix`` and ``evict``. Grade with ``./course grade 11``.
"""

# BEGIN SOLUTION (stub: import heapq  # you may want it for evict)
import heapq

# END SOLUTION


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time")

    def __init__(self, key=(), value=(), parent=None, last_access_time=0):
        self.children = {}  # child key (first token, or first page as a tuple) -> TreeNode
        self.parent = parent
        self.key = tuple(key)  # the tokens of the edge into this node
        self.value = list(value)  # one KV slot per token of key
        self.lock_ref = 0  # running requests whose prefix runs through this node
        self.last_access_time = last_access_time

    def __repr__(self):
        return (
            f"TreeNode(key={self.key}, value={self.value}, lock_ref={self.lock_ref}, "
            f"t={self.last_access_time})"
        )


class RadixTree:
    """Given: the tree's state and its small helpers (memlab.sglang.radix_cache.RadixCache has
    them all)."""

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.clock = 0

    def tick(self) -> int:
        """The LRU clock: a new, later time on every call."""
        self.clock += 1
        return self.clock

    def child_key(self, key, offset: int = 0):
        """How a parent finds the child for ``key[offset:]``: its first token, or first page as a
        tuple."""
        return (
            key[offset]
            if self.page_size == 1
            else tuple(key[offset : offset + self.page_size])
        )

    def key_match(self, node_key, key, offset: int) -> int:
        """How many tokens ``node_key`` shares with ``key[offset:]``, counted in whole pages."""
        n = min(len(node_key), len(key) - offset)
        i = 0
        while i < n and node_key[i] == key[offset + i]:
            i += 1
        return i // self.page_size * self.page_size

    def add_child(self, parent: TreeNode, key, value) -> TreeNode:
        """Hang a new node below ``parent`` (what insert does with a new suffix)."""
        node = TreeNode(key, value, parent, self.tick())
        parent.children[self.child_key(node.key)] = node
        return node

    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            node = node.parent

    def path_value(self, node: TreeNode) -> list:
        """The slots on the path root -> node."""
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent
        return [s for part in reversed(parts) for s in part]

    def evictable_leaves(self) -> list:
        """Nodes without children that nobody locks (never the root)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.lock_ref == 0:
                out.append(node)
        return out


def split_node(tree: RadixTree, child: TreeNode, split_len: int) -> TreeNode:
    """Cut ``child`` after ``split_len`` tokens; return the new node that holds the first part.

    - The new node gets ``child``'s first ``split_len`` tokens and slots, ``child``'s parent,
      a copy of ``child``'s ``lock_ref`` (the same requests run through both parts: ``child``
      keeps its own, and no other node's changes), and a fresh ``last_access_time`` from
      ``tree.tick()`` (it is created now).
    - ``child`` keeps the rest of its tokens and slots and becomes the new node's only child,
      registered under ``tree.child_key`` of its new key.
    - The parent's entry that pointed at ``child`` now points at the new node (same child key).
    """
    # BEGIN SOLUTION
    new_node = TreeNode(
        child.key[:split_len], child.value[:split_len], child.parent, tree.tick()
    )
    new_node.lock_ref = child.lock_ref
    new_node.children = {tree.child_key(child.key, split_len): child}
    child.parent.children[tree.child_key(child.key)] = new_node
    child.parent = new_node
    child.key, child.value = child.key[split_len:], child.value[split_len:]
    return new_node
    # END SOLUTION


def match_prefix(tree: RadixTree, key) -> tuple:
    """The longest cached prefix of ``key``: return ``(matched_len, last_node)``.

    - First cut ``key`` to whole pages (``len(key) // page_size * page_size`` tokens).
    - ``now = tree.tick()``, once. Walk down from ``tree.root``: the next child is
      ``node.children.get(tree.child_key(key, matched))``; stop when there is none or the key
      is used up. Set each visited child's ``last_access_time = now``.
    - ``n = tree.key_match(child.key, key, matched)``. When ``n`` is the child's whole key,
      descend into it. Otherwise the match ends inside it: split it (``split_node``) after ``n``
      tokens, add ``n``, and stop at the new node, so the match always ends exactly on a node.
    See chapter 11 (The radix tree).
    """
    # BEGIN SOLUTION
    key = list(key)[: len(key) // tree.page_size * tree.page_size]
    now = tree.tick()
    node, matched = tree.root, 0
    while matched < len(key):
        child = node.children.get(tree.child_key(key, matched))
        if child is None:
            break
        child.last_access_time = now
        n = tree.key_match(child.key, key, matched)
        if n < len(child.key):
            node = split_node(tree, child, n)
            matched += n
            break
        node, matched = child, matched + n
    return matched, node
    # END SOLUTION


def evict(tree: RadixTree, num_tokens: int, free) -> int:
    """Evict until at least ``num_tokens`` tokens are freed or nothing is left to evict; return
    how many tokens were freed.

    - Candidates: ``tree.evictable_leaves()``, least recently used first (smallest
      ``last_access_time``; a heap of ``(last_access_time, id(node), node)`` works: two leaves
      can have the same time, and nodes themselves do not compare).
    - For each evicted leaf: ``free(node.value)`` (the allocator takes the slots back), remove it
      from its parent's children, count its tokens.
    - A parent left without children and unlocked (and not the root) is now a leaf: it becomes a
      candidate in the same call, at once (pushed onto the heap), with its own
      ``last_access_time``.
    See chapter 11 (The radix tree).
    """
    # BEGIN SOLUTION
    heap = [(n.last_access_time, id(n), n) for n in tree.evictable_leaves()]
    heapq.heapify(heap)
    evicted = 0
    while evicted < num_tokens and heap:
        _, _, node = heapq.heappop(heap)
        free(node.value)
        evicted += len(node.key)
        parent = node.parent
        del parent.children[tree.child_key(node.key)]
        if parent is not tree.root and not parent.children and parent.lock_ref == 0:
            heapq.heappush(heap, (parent.last_access_time, id(parent), parent))
    return evicted
    # END SOLUTION
