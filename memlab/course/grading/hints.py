"""Hints for a learner who is stuck: two or three per exercise, from the chapter's ideas to the
detail the graded tests check, never the solution's code.

``./course hint ch04_alloc_extend`` (``python -m memlab.course.grading.hints``) shows
the first hint; each time again, the next one; ``--all`` shows every hint of the
exercise and ``--reset`` starts it over. In a notebook: ``from memlab.course.notebook
import hint; hint("ch04_alloc_extend")``. Which hint was shown last is remembered per
exercise in a small state file of the user's cache (``~/.cache/memlab/hints.json``;
``MEMLAB_HINTS_STATE`` names another), never in the course."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from memlab.course.grading import catalog

HINTS: dict[str, tuple[str, ...]] = {
    "ch01_alloc_rows": (
        "Chapter 01's table hands rows out from the END of free_slots: a Python list pops and "
        "trims at its tail in O(1) per row, while taking from the head shifts every other entry. "
        "The rows you return are the list's last need_size entries, in list order (not reversed).",
        "Two edge cases decide the first points: asking for more rows than are free returns None "
        "BEFORE anything changes (check first, then take), and asking for 0 rows returns []. Try "
        "free_slots[-0:] in a cell to see why 0 needs its own line.",
        "req_generation counts how many times each row was handed out: bump it once per row taken, "
        "and never reset it (not in clear either). A reader that stored (row, generation) must see "
        "a new generation when the row comes back. free checks its row is in 1..size: row 0 is the "
        "padding row.",
    ),
    "ch02_bytes_per_token": (
        "Per token and per layer, an MHA/GQA pool stores one K row and one V row for every KV head "
        "(not every query head): chapter 02 draws both buffers. Count values first, then multiply "
        "by the bytes of one value.",
        "K rows are head_dim wide, V rows v_head_dim wide (the same unless given). MLA keeps no V "
        "at all: one latent row of kv_lora_rank + qk_rope_head_dim values per layer, shared by "
        "every head.",
        "The argument checks are graded too: every argument must be a positive int, and True is an "
        "int in Python (isinstance(True, int) holds), so test the type exactly. The ValueError's "
        "message must name the argument, e.g. 'head_num must be a positive int, got 0'.",
    ),
    "ch03_token_allocator": (
        "With page size 1 a slot is a page: free_pages is an int64 tensor of free slot ids, handed "
        "out from its head and given back at its tail (FIFO, chapter 03): taking from the head and "
        "keeping the rest are slices.",
        "need_sort stages frees in release_pages instead of free_pages, so available_size counts "
        "both. Merging (concatenate, then sort ascending) happens only when free_pages alone is "
        "too short for an alloc: a sort costs, so the merge waits until it is needed.",
        "Check what comes back: alloc(0) is an EMPTY int64 tensor (not None, not a list), a "
        "refused alloc returns None, and an empty free changes nothing. With need_sort, a refused "
        "alloc keeps the merge it made: the staged slots were free all along.",
    ),
    "ch04_alloc_extend": (
        "Chapter 04's three parts: a request growing from p to s tokens first fills the rest of "
        "its old page (slots after last_loc), then takes whole new pages, then one partial page. "
        "It needs ceil(s/P) - ceil(p/P) new pages; compute that for the whole batch and refuse "
        "(None, nothing taken) before anything else.",
        "Work per token, not per request: give every new token its request and its position "
        "(repeat_interleave of the request ids by their token counts, plus prefix sums of the "
        "counts). A token below the end of its request's old page continues from last_loc; every "
        "other one lives on a new page.",
        "For a token on a new page, count its new pages from the batch's prefix sum of pages per "
        "request (the request's first page in free_pages), plus how many whole pages past its old "
        "page's end it is. Its slot is page * P + position % P. Then drop exactly the pages taken "
        "from the head of free_pages, and leave the input tensors as they were.",
    ),
    "ch04_alloc_extend_kernel": (
        "Only part 2, the whole new pages, is missing: above it the kernel has already worked out "
        "where this request's output starts, where its pages start in free_pages and how many "
        "tokens parts 1 and 2 hold. A token of part 2 lands on the request's new page (its index "
        "within part 2) // page_size.",
        "Part 2 can be long, so go over it in blocks of TOK_BLOCK consecutive tokens with a loop "
        "whose bound is a runtime value (one compiled kernel then serves every length). Part 1, "
        "just above, shows the pattern of a block of offsets and a masked store.",
        "Mask the LOAD from free_pages as well as the store: the last block reaches past the pages "
        "this request owns, and the grader places free_pages right before memory that may not be "
        "read (a load past it crashes). The output position of a part-2 token comes after part 1's "
        "tokens.",
    ),
    "ch05_alloc_decode": (
        "A decode step adds one token per request, at position seq_len - 1. It continues its page "
        "(last_loc + 1) unless it is the first token of a page, which chapter 05 shows happens "
        "when seq_len % page_size == 1 (with page size 1: every time).",
        "The requests that open a page take pages from the head of free_pages in batch order: a "
        "running count (a cumulative sum over the batch of 'opens a page') tells each opener which "
        "free page is its own.",
        "Count the openers first and return None when there are fewer free pages, without taking "
        "any; mind that an empty free_pages may still serve a batch in which nobody opens a page. "
        "Then drop exactly the pages taken.",
    ),
    "ch05_paged_free": (
        "A request's slots share pages, so free takes pages, not slots: page = slot // page_size, "
        "each page ONCE (torch.unique, which also sorts). Freed pages go to the HEAD of free_pages "
        "(LIFO): the page just freed is the next one handed out, as chapter 05 shows.",
        "free_segment frees a run of consecutive positions: when its first position is "
        "page-aligned, every page_size-th slot is the first slot of a new page, so no unique is "
        "needed. An unaligned start would miss or repeat pages: refuse it with a ValueError, after "
        "the empty check.",
        "Inside a free group nothing is released: queue the slots and free them all at once at the "
        "end (one free of everything queued, so a page shared by two frees is freed once). Queue a "
        "copy: the caller may overwrite its tensor right after calling free.",
    ),
    "ch06_free_queue": (
        "Chapter 06 frees a finished request's blocks from its LAST block to its first, so that "
        "the free queue evicts the end of a cached prefix before its start. A block another "
        "request still uses (ref_cnt above 0 after the decrement) stays out of the queue; null "
        "blocks are placeholders: skip them entirely.",
        "A freed block with a hash can still be revived by a prefix hit, so it goes to the queue's "
        "tail (evicted last); one without a hash holds nothing worth keeping, so it goes to the "
        "head. A hash is any value that is not None, even 0 or b''.",
        "Collect the two groups in walk order, then add each group to the queue in one call "
        "(prepend_n for the head-bound ones, append_n for the tail-bound ones). Walk with "
        "reversed(blocks): the caller's list must come back unchanged.",
    ),
    "ch06_block_hash": (
        "Each full block's hash covers its parent's hash, its tokens (as a tuple) and its extra "
        "keys, so one hash stands for the whole prefix (chapter 06). A last partial block is still "
        "growing: it gets no hash.",
        "Extra keys are a tuple, None when empty, in a fixed order: the lora key on every block "
        "(whenever lora_name is not None), then one key per multimodal item that overlaps the "
        "block, then the cache salt on block 0 only (and only when it is a non-empty string).",
        "An item covers positions offset .. offset + length - 1; it overlaps block [start, end) "
        "when it starts before end and ends after start, and its key holds offset - start "
        "(negative when the item began in an earlier block). Keep the items in the order given.",
    ),
    "ch06_slot_mapping": (
        "One program per request: its tokens are query_start_loc[r] .. query_start_loc[r + 1] - 1 "
        "of the batch. For each token, its position says which block of the request's block-table "
        "row it is in, and where in that block.",
        "The block table may be a view of a wider table: row r starts at r * block_table_stride, "
        "not r times the row's length. Load blocks of BLOCK tokens at a time with a mask for the "
        "request's end.",
        "Block ids of a big pool times block_size pass 2^31: load the block id, cast it to int64, "
        "then multiply. Padding tokens after the last request get -1, and no store may go past "
        "num_tokens_padded.",
    ),
    "ch07_swa_release": (
        "The next query sits at position seq_len and reads the last sliding_window tokens, so "
        "everything below seq_len - sliding_window is dead on the SWA side (chapter 07). Release "
        "whole pages only: round that end DOWN to a page.",
        "The start is where the previous release ended, unless the prefix cache owns more: the "
        "cache's part, rounded UP to a page, is the cache's to free. When the end is not past the "
        "start there is nothing to release: say so by returning the previous end twice.",
        "take_swa_slots reads the map under the given full slots, drops the zeros (0 is the SWA "
        "pool's padding slot) and then clears the map over every slot of every page those slots "
        "touch. Leave the map's last entry (-1) and the caller's full_indices alone.",
    ),
    "ch07_mamba_tracking": (
        "Tracking slots hold snapshots of a request's recurrent state for the prefix cache: none "
        "without the extra buffer, one lazily, and two under the overlap scheduler, where one step "
        "still reads the snapshot the next one writes (ping-pong, chapter 07).",
        "alloc_row is all or nothing: it needs 1 + tracking free slots from the head of free_slots "
        "(the state slot first). The slots it hands out must start from zeroed state rows, and "
        "only those: the state of other rows stays as it is.",
        "free_row gives back only the non-zero slots (0 means 'no slot' and is padding) and resets "
        "all four per-row fields, or a reused row would start from a stale index. next_track_slot "
        "cycles through the row's tracking slots, and refuses a row that has none.",
    ),
    "ch08_sizing": (
        "From bytes to tokens (chapter 08): a budget holds budget // bytes_per_token tokens, "
        "floored to whole pages, since a pool is made of pages.",
        "max_new_tokens_for_memory asks whether a request could ever run in an EMPTY pool: its "
        "prompt in whole pages, one more page a decode step may open, one more slot; what is left "
        "is the most it may generate. Never return a negative number.",
        "alloc_len_per_decode without speculation is 1 slot. With a draft tree on pages each "
        "branch may need pages of its own: ceil((page_size - 1 + num_steps) / page_size) of them "
        "per branch; the verify block of draft tokens may still be larger. The reserve doubles "
        "that.",
    ),
    "ch09_paged_gather": (
        "Request b's KV is not contiguous: its token p lives in slot req_to_token[row, p], where "
        "row comes from req_pool_indices[b] (batch entry b is not row b). Chapter 09 gathers a "
        "block of slots first, then the K and V rows of those slots.",
        "K and V may come in different layouts: address each with its own strides (slot * stride + "
        "head * head_stride + dim), and mask every load with the positions that are below seq_len.",
        "The slots come from an int32 table: cast them to int64 BEFORE multiplying by a stride, or "
        "slot * stride wraps past 2^31 elements. The grader reads your gather's source to check "
        "this.",
    ),
    "ch10_admission": (
        "Chapter 10's admission is first come, first served against a budget: what the allocator "
        "has free, minus a decode reserve for every request already running. Walk the waiting list "
        "in order and stop at the first request that does not fit: a later, smaller one must not "
        "overtake it.",
        "Before its cost, ask max_new_tokens_for_memory for the request's clip: 0 while the "
        "request asks for new tokens means it can never run: reject it and go on. A prefill-only "
        "request (max_new_tokens 0) clips to 0 too, and can run.",
        "A request's cost is its prompt in whole pages plus one decode reserve; an admitted "
        "request's cost comes off what is left, and only an admitted request gets its clip written "
        "into max_new_tokens. Stop as well once the running and admitted requests reach "
        "max_running_requests; leave the waiting list as it was.",
    ),
    "ch11_radix_match": (
        "A match walks down from the root one child at a time, keyed by the next token (or page) "
        "of the key, and stamps every node it passes with one tick of the tree's clock (chapter "
        "11). Cut the key to whole pages first.",
        "When a match ends inside a node, split it so the match ends exactly on a node: the new "
        "upper node takes the first part of the key and slots, the node's place under its parent, "
        "a copy of its lock count and a fresh time; the old node keeps the rest and hangs below "
        "it.",
        "evict is a least-recently-used heap over the evictable leaves; a tie in time must still "
        "order, so put something comparable between the time and the node. When a leaf goes and "
        "its parent is left without children and unlocked (and is not the root), that parent is "
        "now a leaf: push it into the heap in the same call.",
    ),
    "ch12_virtual_pages": (
        "A virtual id splits like any slot id: its page (id // page_size) and its offset in the "
        "page. Look the page up in v2p and put the offset back on the physical page; every id that "
        "has no physical page (negative, past the table, unbound) goes to the padding sink "
        "(chapter 12, virtual ids and their translation). Work on the whole tensor at once and "
        "build a new one.",
        "Capacity is counted in bytes, then in pages: the gap between this sub-pool's frontier and "
        "its neighbour's, in whole pages of this sub-pool's entry size, but never more pages than "
        "its own page numbers still allow. Mind which way the frontier faces for a sub-pool that "
        "grows down.",
        "After a free the sub-pool shrinks toward its own end by as many pages as were freed. The "
        "pages still in use inside the band it gives up must move out, into the freed pages that "
        "lie outside the band, both taken in ascending order; both page tables follow each move, "
        "and the band is left unused.",
    ),
}

STATE_ENV = "MEMLAB_HINTS_STATE"


def state_file() -> Path:
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "memlab" / "hints.json"


def _read_state() -> dict:
    try:
        data = json.loads(state_file().read_text())
    # none yet, unreadable or garbled: start from the first hint
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(state: dict) -> None:
    path = state_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state, indent=1, sort_keys=True))
    except (OSError, ValueError):
        pass  # a read-only home: the hint is still shown, it just is not remembered


def hints_for(name: str) -> tuple[str, tuple[str, ...]]:
    """(exercise file, its hints) for a file name or id."""
    e = catalog.find(name)
    return e.file, HINTS[e.file]


def next_hint(name: str) -> str:
    """The next hint of an exercise, as text (the last one again once all were shown)."""
    file, hints = hints_for(name)
    state = _read_state()
    shown = min(int(state.get(file, 0)), len(hints))
    if shown >= len(hints):
        return (
            f"{file}: no more hints: that was the last ({len(hints)}/{len(hints)}). It said:\n\n"
            f"{_wrap(hints[-1])}\n\n(--all shows them all again; --reset starts over)"
        )
    state[file] = shown + 1
    _write_state(state)
    more = (
        "; run it again for the next"
        if shown + 1 < len(hints)
        else "; that was the last"
    )
    return f"{file}: hint {shown + 1}/{len(hints)}{more}\n\n{_wrap(hints[shown])}"


def all_hints(name: str) -> str:
    file, hints = hints_for(name)
    state = _read_state()
    state[file] = len(hints)
    _write_state(state)
    return "\n\n".join(
        f"{file}: hint {i}/{len(hints)}\n\n{_wrap(h)}" for i, h in enumerate(hints, 1)
    )


def reset(name: str) -> str:
    file, _ = hints_for(name)
    state = _read_state()
    state.pop(file, None)
    _write_state(state)
    return f"{file}: hints start over at 1"


def _wrap(text: str, width: int = 96) -> str:
    import textwrap

    return textwrap.fill(text, width, initial_indent="  ", subsequent_indent="  ")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="./course hint", description="A hint for an exercise, one more each time."
    )
    p.add_argument(
        "exercise",
        nargs="?",
        help="the exercise's file (ch04_alloc_extend) or id (ch04.alloc_extend)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--all", action="store_true", help="every hint of the exercise at once"
    )
    g.add_argument(
        "--reset", action="store_true", help="start the exercise's hints over"
    )
    try:
        a = p.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if not a.exercise:
        print(
            "usage: ./course hint EXERCISE [--all | --reset]; the exercises and their hints:"
        )
        for e in catalog.EXERCISES:
            print(f"  {e.file:<26} {len(HINTS[e.file])} hints   {e.title}")
        return 0
    try:
        text = (
            all_hints(a.exercise)
            if a.all
            else reset(a.exercise)
            if a.reset
            else next_hint(a.exercise)
        )
    except ValueError as exc:
        print(f"memlab hint: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
