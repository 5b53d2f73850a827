# %% [markdown]
# # 01 · The request table
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/01_request_table.ipynb)
#
# The first mapping: a running request -> one [row](glossary.md#row) of a table. The row holds, for
# every position of the request, the physical [slot](glossary.md#slot) of that token's KV. SGLang
# calls this table, the [request table](glossary.md#request-table),
# [`ReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py).
#
# **After this chapter you can**
# - allocate and free rows the way SGLang's [`ReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) does (from the tail of a plain list,
#   all or nothing);
# - explain why row 0 is never handed out, and why `free_slots[-0:]` is a bug;
# - use the generation counter to tell that a row changed hands, even across `clear()`;
# - say why a request continuing a chunked prefill keeps its row;
# - write `alloc_rows`, `free` and `clear` yourself (exercise `ch01_alloc_rows`).

# %%
# @title Setup: run this cell first (Colab: tick DRIVE to keep your exercises on Google Drive) { display-mode: "form" }
# fmt: off
DRIVE = False  # @param {type:"boolean"}
HOME, REF = "memlab-course/memlab", "v0.1.0"  # the course's home and version (scripts/set_home.py)
import os, pathlib, re, subprocess, sys; here, url = pathlib.Path.cwd().resolve(), os.environ.get("MEMLAB_REPO_URL", f"https://github.com/{HOME}")
root = next((p for p in (here, *here.parents) if (p / "memlab/course/notebook.py").is_file()), here / f"memlab-{REF}")
if not root.is_dir() and (git := subprocess.run(["sh", "-c", 'rm -rf "$0.partial" && git clone -q --depth 1 -b "$1" "$2" "$0.partial" && mv "$0.partial" "$0"', root, REF, url], capture_output=True, text=True, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})).returncode:
    raise RuntimeError(f"could not clone the course from {url} at version {REF}: " + ("no network (check the connection, then re-run this cell)" if re.search("resolve host|connect to|timed out|unreachable", git.stderr) else f"no such repository or version ({HOME} does not exist, is private, or has no tag {REF})") + f"\ngit said: {git.stderr.strip()[-400:]}")
sys.path += [str(root)] if str(root) not in sys.path else []  # appended: no course folder hides an installed package
from memlab.course.notebook import exercise, start; FAST = start("01", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# A table of 5 rows, 8 positions wide. Requests arrive, finish and come back; a long prompt is fed
# in two chunks; a batch asks for more rows than are free; at the end, `clear()`. The strip under
# the table is `free_slots`, the list of free rows (its [free list](glossary.md#free-list)), in list order. The right column shows each
# row's owner and its **[generation](glossary.md#generation)**.

# %% [markdown]
# ![The request table after D reuses B's row](img/01_request_table.png)

# %%
from memlab.course import viz

scene = viz.sglang_books.request_table(rows=5, width=8)
viz.Stepper(scene.frames, lambda books: viz.draw_books(books, ("table", "rows")))

# %% [markdown]
# ### Your own requests
#
# The instrument below starts where the story ends: after `clear()` every row is free, but the
# generations stay. Type new requests and their first tokens and press `alloc (new rows)`: it
# runs the scheduler's path on the real `ReqToTokenPool`, and shows the `req_to_token_pool.alloc`
# call it made and the rows that came back. `continue chunk` feeds a request its next prefill
# chunk (it keeps its row), `free row` ends a request (its row goes to the tail of `free_slots`,
# so it is the next handed out), `clear()` empties the table. Ask for more rows than are free,
# or name a request twice: the library's own answer shows, and nothing changes. Hover a cell to
# read its row, generation, position and slot; `undo` and `reset` replay your steps on fresh
# objects.

# %%
from memlab.course.viz.token_books import request_instrument

inst = request_instrument()
inst

# %% [markdown]
# ## The table itself
#
# `ReqToTokenPool(size, max_context_len)` holds an int32 tensor of `size + 1` rows and
# `max_context_len` columns. Row 0 is the **[padding row](glossary.md#padding-row)**: decode
# batches replayed through a [CUDA graph](glossary.md#cuda-graph) have a fixed size, and the unused
# entries of a padded batch point at row 0. Reading or writing it harms nobody, so no kernel needs
# an "is this entry real?" branch.

# %%
from memlab.sglang.req_to_token import Req, ReqToTokenPool

pool = ReqToTokenPool(size=5, max_context_len=8)
print(pool.req_to_token.shape, pool.req_to_token.dtype)
print("free rows:", pool.free_slots)

# %% [markdown]
# ## Rows from the tail
#
# `alloc_rows(n)` takes the **last** `n` entries of `free_slots` and deletes them there. Deleting
# at the end of a Python list costs O(n); deleting at the head would shift every remaining entry,
# O(len(free_slots)), on every scheduling step. Which row a request gets does not matter, so the
# cheap end wins. Freed rows are appended, so the row freed last is the next one handed out.
#
# Allocation is **all or nothing**: if fewer than `n` rows are free, the answer is `None` and the
# list is untouched. A batch that gets half its rows is worse than one that waits.

# %%
rows = pool.alloc_rows(2)
print("alloc_rows(2) ->", rows, "  free:", pool.free_slots)
print("alloc_rows(9) ->", pool.alloc_rows(9), "  free:", pool.free_slots, "(unchanged)")
pool.free(rows[0])
print(f"free({rows[0]})      free:", pool.free_slots)

# %% [markdown]
# ### The `n == 0` trap
#
# Python's slice `lst[-n:]` is "the last n items" for every n except 0: `-0` is `0`, and `lst[0:]`
# is the whole list. An `alloc_rows(0)` written as a plain slice would hand out every free row.

# %%
free_slots = [1, 2, 3]
print("free_slots[-2:] =", free_slots[-2:], "  free_slots[-0:] =", free_slots[-0:])
print("pool.alloc_rows(0) ->", pool.alloc_rows(0))

# %% [markdown]
# ## The generation counter
#
# Some readers of the table run a step behind: with the overlap scheduler (the CPU prepares the
# next batch while the GPU runs this one), SGLang's speculative decoding keeps per-row data from
# one step and uses it in the next ([`ConfidenceRelay`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/overlap_utils.py) copies
# `req_generation` beside it). Such a reader may remember "row 5" and come back later. By
# then the row may belong to someone else.
#
# `req_generation[row]` is bumped every time the row is handed out, and **never reset**, not even
# by `clear()`. A reader stores `(row, generation)` and checks the generation again before it
# trusts the row: a different number means the row changed hands.
#
# Below, a fresh table hands out one row and a reader remembers it. The row is freed, the table
# is even cleared, and the next request gets the very same row (the last free one, again): only
# its generation tells the reader that this is a new owner.

# %%
table = ReqToTokenPool(size=3, max_context_len=8)
row = table.alloc_rows(1)[0]
seen = (row, int(table.req_generation[row]))  # what the reader keeps
table.free(row)
table.clear()  # even a full reset ...
again = table.alloc_rows(1)[0]
now = int(table.req_generation[again])
print(
    f"the reader kept (row {seen[0]}, generation {seen[1]}); the next request got row {again}, generation {now}"
)
print("same row, new owner:", (again, now) != seen)
assert again == row and now == seen[1] + 1

# %% [markdown]
# ## Chunked prefill keeps its row
#
# A long prompt is prefilled in chunks ([chunked prefill](glossary.md#chunked-prefill)), one
# scheduling step each. `alloc(reqs)` gives rows only to requests that have none; a request that
# already holds a row (and already wrote KV through it) keeps it. A request that holds a row but
# owns no KV yet is a scheduler bug, and `alloc` says so (SGLang's
# [`ReqToTokenPool.alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) checks it with an `assert`; memlab raises `ValueError` with a
# message).

# %%
e = Req("E")
pool.alloc([e])
e.kv.kv_allocated_len = 3  # its first chunk wrote 3 tokens of KV
before = pool.available_size()
print(
    "second chunk:",
    pool.alloc([e]),
    f"free rows before {before}, after {pool.available_size()}",
)
x = Req("X")
x.kv.req_pool_idx = 1  # claims a row but wrote no KV
try:
    pool.alloc([x])
except ValueError as exc:
    print("ValueError:", exc)

# %% [markdown]
# ## What the engines do differently
#
# SGLang gives a request one row for its whole life and writes a slot per token into it
# ([`ReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)). vLLM's worker keeps a **[block table](glossary.md#block-table)**
# instead: one entry per *[block](glossary.md#block)* (page), not per token. In vLLM 0.33's default
# model runner (V2, [`BlockTables`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/gpu/block_table.py)) a request keeps its row for
# its whole life too, and each step the rows of the running requests are gathered into a
# batch-ordered copy. The older V1 runner instead compacts the batch when requests finish and moves
# rows ([`BlockTable.move_row`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py), mirrored in
# `memlab.vllm.block_table`), so there a row is only a place in this step's batch. Chapter 06
# covers vLLM's side.
#
# ## Exercise: `exercises/ch01_alloc_rows.py`
#
# Write `RowTable.alloc_rows`, `free` and `clear` (9 points). The cell below replays this
# chapter's operations on your class and on `ReqToTokenPool` side by side. It prints `not written
# yet: ...` until you fill the stub in; edit the file, then run the cell again.

# %%
with exercise("ch01_alloc_rows") as ex:
    mine, ref = ex.RowTable(5), ReqToTokenPool(5, 8)
    for op, arg in [
        ("alloc_rows", 2),
        ("alloc_rows", 0),
        ("free", 4),
        ("alloc_rows", 1),
        ("alloc_rows", 9),
    ]:
        a, b = getattr(mine, op)(arg), getattr(ref, op)(arg)
        print(f"{op}({arg}): yours {a}, memlab {b}")
        assert a == b and mine.free_slots == ref.free_slots, (
            "your free_slots differ from memlab's"
        )
    assert mine.req_generation.tolist() == ref.req_generation.tolist()
    print("same rows, same free list, same generations")

# %% [markdown]
# ## Grade
#
# Runs the graded tests of chapter 01 against `exercises/` (same as `python -m memlab.grade 01`).

# %%
from memlab.grade import main as grade

grade(["01"])
