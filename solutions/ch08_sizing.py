"""Chapter 08 exercise: the numbers the scheduler plans with.

Write ``pool_size_tokens``, ``max_new_tokens_for_memory``, ``alloc_len_per_decode`` and
``alloc_reserve_per_decode``. Grade with ``./course grade 08``.
"""


def pool_size_tokens(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """How many tokens of KV a budget holds, floored to whole pages.

    ``budget_bytes // bytes_per_token`` tokens, rounded DOWN to a multiple of ``page_size``.
    See chapter 08 (from memory to tokens).
    """
    # BEGIN SOLUTION
    return budget_bytes // bytes_per_token // page_size * page_size
    # END SOLUTION


def max_new_tokens_for_memory(
    input_tokens: int, max_new_tokens: int, token_capacity: int, page_size: int
) -> int:
    """Clip a request's generation to what an empty pool could hold next to its prompt.

    ``max(0, min(max_new_tokens, token_capacity - ceil_ps(input_tokens) - page_size - 1))``
    where ``ceil_ps`` rounds UP to a multiple of ``page_size``: the prompt in whole pages, one
    page more for the page a decode step may open, and one slot more. Chapter 08,
    "max_new_tokens_for_memory".
    """
    # BEGIN SOLUTION
    paged_input = -(-input_tokens // page_size) * page_size
    return max(0, min(max_new_tokens, token_capacity - paged_input - page_size - 1))
    # END SOLUTION


def alloc_len_per_decode(
    page_size: int,
    num_steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
) -> int:
    """KV slots one request may take in one decode step.

    - No speculative decoding (``num_steps`` is None): 1.
    - Otherwise (``topk`` None means 1, ``num_draft_tokens`` None means 0): with page_size 1 or
      topk 1, ``max(num_steps * topk, num_draft_tokens)``; else (a draft tree on pages) each of
      the topk branches may need ``ceil((page_size - 1 + num_steps) / page_size)`` whole pages
      of its own: ``max(pages_per_branch * page_size * topk, num_draft_tokens)``.
    See chapter 08 (KV per decode step).
    """
    # BEGIN SOLUTION
    if num_steps is None:
        return 1
    topk = topk or 1
    tokens = num_draft_tokens or 0
    if page_size == 1 or topk == 1:
        return max(num_steps * topk, tokens)
    pages_per_branch = -(-(page_size - 1 + num_steps) // page_size)
    return max(pages_per_branch * page_size * topk, tokens)
    # END SOLUTION


def alloc_reserve_per_decode(
    page_size: int,
    num_steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
) -> int:
    """KV slots the scheduler reserves per running request per decode step.

    Twice ``alloc_len_per_decode(...)``, whatever the scheduler mode (SGLang 0.5.23's
    ``get_alloc_reserve_per_decode``): a double buffer for the lag of the overlap scheduler (the
    host's committed length trails the GPU by one step). SGLang reads it only when decoding
    speculatively (its decode-fit estimate and EAGLE's allocation); without speculative decoding
    a step takes one slot per request, and its fit check counts a page only for a request whose
    committed length sits on a page boundary (chapter 10). See chapter 08 (the doubled reserve).
    """
    # BEGIN SOLUTION
    n = alloc_len_per_decode(page_size, num_steps, topk, num_draft_tokens)
    return 2 * n
    # END SOLUTION
