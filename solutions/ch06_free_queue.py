"""Chapter 06 exercise: where vLLM puts a finished request's blocks in the free queue.

Write ``free_request_blocks``. Grade with ``./course grade 06``.
"""


class Block:
    """A KV block's metadata (vLLM's ``KVCacheBlock``, without the queue links)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "is_null")

    def __init__(
        self, block_id: int, ref_cnt: int = 0, block_hash=None, is_null: bool = False
    ):
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self.block_hash = block_hash
        self.is_null = is_null

    def __repr__(self):
        return (
            f"Block({self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash!r})"
        )


class FreeQueue:
    """The free queue, head first: ``popleft`` reuses (and so evicts) the head block first.

    Given. vLLM links the blocks into a doubly linked list; a Python list shows the same order.
    """

    def __init__(self, blocks=()):
        self.blocks = list(blocks)

    def popleft(self) -> Block:
        return self.blocks.pop(0)

    def append_n(self, blocks) -> None:
        """Put ``blocks`` at the tail, in the given order."""
        self.blocks.extend(blocks)

    def prepend_n(self, blocks) -> None:
        """Put ``blocks`` at the head, in the given order (``blocks[0]`` becomes the new head)."""
        self.blocks[:0] = list(blocks)

    def ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


def free_request_blocks(queue: FreeQueue, blocks: list[Block]) -> None:
    """Free a finished request's blocks (``blocks`` in block-table order: its first block first).

    - Walk the blocks in REVERSE order (the request's last block first) and skip null blocks
      (``is_null``: placeholders, never queued, their ref_cnt left alone).
    - Decrement each block's ``ref_cnt``. A block still used by another request (ref_cnt > 0)
      stays out of the queue.
    - A block whose ref_cnt reached 0 WITH a hash (a prefix hit may still revive it) goes to the
      tail; one WITHOUT a hash (nothing to hit) goes to the head, to be reused first.
    - Keep the walk's order within each group: make one list of the head-bound blocks and one of
      the tail-bound blocks as you walk, then ``queue.prepend_n(head_bound)`` and
      ``queue.append_n(tail_bound)``.
    The tail of a prefix is then evicted before its start. See chapter 06 (freeing in reverse).
    """
    # BEGIN SOLUTION
    to_head, to_tail = [], []
    for block in reversed(blocks):
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            (to_tail if block.block_hash is not None else to_head).append(block)
    queue.prepend_n(to_head)
    queue.append_n(to_tail)
    # END SOLUTION
