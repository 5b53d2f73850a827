"""Chapter 01 exercise: the rows of the request table (SGLang's ``ReqToTokenPool``).

Write ``alloc_rows``, ``free`` and ``clear``. Grade with ``./course grade 01``.
"""

import torch


class RowTable:
    """Rows 1..size of a request table. Row 0 is the padding row: never handed out, never freed.

    Given: the state. ``free_slots`` is a plain list of the free rows; ``req_generation[row]``
    counts how many times ``row`` was handed out (index 0 is the padding row's, never bumped).
    """

    def __init__(self, size: int):
        self.size = size
        self.req_generation = torch.zeros(size + 1, dtype=torch.int64)
        self.free_slots = list(range(1, size + 1))

    def alloc_rows(self, need_size: int) -> list[int] | None:
        """Take ``need_size`` rows; return them as a list of ints, or None when too few are free.

        - All or nothing: when short, return None and change nothing.
        - Take the LAST ``need_size`` entries of ``free_slots`` (in list order) and delete them
          there: O(need_size), where taking from the head would shift the whole list.
        - ``need_size == 0`` returns ``[]``. Careful: ``free_slots[-0:]`` is the whole list.
        - Add 1 to ``req_generation[row]`` for every row taken.

        See chapter 01 (rows from the tail; the generation counter).
        """
        # BEGIN SOLUTION
        if need_size > len(self.free_slots):
            return None
        if need_size == 0:
            return []
        rows = self.free_slots[-need_size:]
        del self.free_slots[-need_size:]
        self.req_generation[rows] += 1
        return rows
        # END SOLUTION

    def free(self, row: int) -> None:
        """Give ``row`` back: append it to ``free_slots``.

        Raise ValueError (naming the row) when ``row`` is not in 1..size: row 0 is padding.
        """
        # BEGIN SOLUTION
        if not 1 <= row <= self.size:
            raise ValueError(
                f"cannot free row {row}: rows are 1..{self.size}, row 0 is padding"
            )
        self.free_slots.append(row)
        # END SOLUTION

    def clear(self) -> None:
        """Make every row free again: ``free_slots = [1, 2, ..., size]``.

        Never reset ``req_generation``: a reader that stored (row, generation) must see a changed
        generation when the row is handed out again, even across a clear.
        """
        # BEGIN SOLUTION
        self.free_slots = list(range(1, self.size + 1))
        # END SOLUTION
