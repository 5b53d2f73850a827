# %% [markdown]
# # 05 · Decode steps and freeing pages
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/05_decode_and_free.ipynb)
#
# After prefill, and without speculative decoding, every [decode](glossary.md#decode) step adds
# exactly one token to every running request. Most steps need no new page; a few cross a page
# boundary. When a request ends, its pages go back, each exactly once.
#
# **After this chapter you can**
# - say exactly when a decode step opens a page, and run the `alloc_decode` kernel;
# - free a request's slots as whole pages, without freeing any page twice;
# - use `free_segment` for an aligned run and show why an unaligned one is refused;
# - batch frees with free groups (one dedup for the whole group), and let debug mode catch a double free;
# - say when staged pages are merged (`need_sort`) and why the cheap capacity bound comes first;
# - write `alloc_decode` and the paged free path (exercises `ch05_alloc_decode`, `ch05_paged_free`).

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
from memlab.course.notebook import exercise, start; FAST = start("05", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# The first story runs decode steps for A, B and C (3, 4 and 6 tokens after prefill, page size 4).
# The others give pages back four ways: a plain `free`, `free_segment` (and an unaligned run it
# refuses), a free group, and a double free caught in debug mode. Yellow pages are queued, not
# yet released.

# %% [markdown]
# ![Decode steps: which request opens a page at which step](img/05_decode.png)

# %%
from memlab.course import viz

stories = {"decode steps": viz.sglang_books.decode_steps(page_size=4).frames}
stories.update(
    {
        story: viz.sglang_books.paged_free(story).frames
        for story in ("free", "free_segment", "free group", "double free")
    }
)
viz.Stepper(stories, lambda books: viz.draw_books(books, ("table", "slots", "free")))

# %% [markdown]
# ### Your own decode steps and frees
#
# The instrument below starts where the decode story ends (A, B and C hold 9, 10 and 12 tokens,
# page size 4), with the allocator in debug mode. `alloc_decode` runs one decode step for the
# requests you name and shows the `alloc_decode` call and the slots it returned; `free request`
# ends a request; `free_group_begin()` and `free_group_end()` bracket frees that are queued
# (yellow) and released at once; `free_segment` gives back a run of a request's positions (an
# unaligned start is refused with the library's message); `free again (stale copy)` frees a
# finished request's old slots a second time, and debug mode raises. Each refusal leaves the
# books as they were; `undo`, `reset` and another page size replay your steps.

# %%
from memlab.course.viz.token_books import paged_free_instrument

inst = paged_free_instrument(page_size=4)
inst

# %% [markdown]
# ## One token per step
#
# `alloc_decode(seq_lens, seq_lens_cpu, last_loc)` gets each request's length **after** the new
# token (its [seq length](glossary.md#seq-length); [`last_loc`](glossary.md#last_loc) is the slot
# of its last token so far). The new token sits at position `seq_len - 1`; it opens a page exactly when that position
# is a multiple of the page size:
#
# $$(\text{seq\_len} - 1) \bmod P = 0 \iff \text{seq\_len} \bmod P = 1 \quad (P > 1)$$
#
# Then it gets the first slot of the next free page; otherwise its slot is `last_loc + 1`. The
# requests that open a page take pages in batch order: a prefix sum of the "opens" flags tells
# each one which. The count of opening requests is known on the host before the kernel runs, so
# the capacity check is exact and cheap.

# %%
import torch

from memlab.common.env import kernel_device
from memlab.kernels import alloc_decode
from memlab.sglang.allocator.reference import alloc_decode_python, alloc_decode_torch

P = 4
dev = kernel_device()
seq_lens = torch.tensor([4, 5, 7, 9, 13])  # after the new token
last_loc = torch.tensor([10, 23, 33, 47, 59])
free_pages = torch.tensor([20, 21, 22])
opens = ((seq_lens - 1) % P == 0).tolist()
print("opens a page:", opens, "->", sum(opens), "new pages")
by_kernel = alloc_decode.alloc_decode(
    seq_lens.to(dev), last_loc.to(dev), free_pages.to(dev), P
)
print(
    "kernel:",
    by_kernel.tolist(),
    " torch:",
    alloc_decode_torch(seq_lens, last_loc, free_pages, P).tolist(),
    " python:",
    alloc_decode_python(seq_lens.tolist(), last_loc.tolist(), free_pages.tolist(), P),
)
assert by_kernel.cpu().tolist() == alloc_decode_python(
    seq_lens.tolist(), last_loc.tolist(), free_pages.tolist(), P
)

# %% [markdown]
# Over a long generation a request opens a page every $P$ steps, so a batch of $B$ requests needs
# about $B / P$ new pages per step. Larger pages mean fewer page allocations, but more room wasted
# in each request's last page (on average $(P - 1)/2$ slots).
#
# ## Freeing whole pages
#
# `free(slots)` releases the **pages** under the slots. A request's slots share pages, so the page
# ids are deduplicated first: `unique(slot // P)`. Without the dedup a page would be released once
# per slot on it (a [double free](glossary.md#double-free)), and later handed to several requests
# at once. `unique` sorts on the device and
# the result's length is data-dependent: a host-device sync, paid once per free.
#
# Released pages go to the **head** of the free list (LIFO), so the next allocation reuses them.

# %%
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator

al = PagedTokenToKVPoolAllocator(64, P, debug_mode=True)
a_slots = al.alloc(8)  # two pages
print("A holds", a_slots.tolist())
al.free(a_slots)
print(
    f"free list: {len(al.free_pages)} of {al.num_pages} pages, head {al.free_pages[:2].tolist()} (A's pages, each once)"
)

# %% [markdown]
# ## free_segment
#
# When the caller knows the slots form a contiguous run of one request starting on a page
# boundary (a [page-aligned segment](glossary.md#page-aligned-segment): for example, tokens leaving
# a sliding window, chapter 07, or a finished request's row), every $P$-th slot is the
# first slot of a distinct page: `free_index[::P] // P` are the pages, no `unique` needed. An
# unaligned start breaks that: the first slot taken is in the middle of a page, and the pages
# counted are wrong. `free_segment` asserts the alignment.

# %%
run = al.alloc(12)
al.free_segment(run[:8], start_pos=0)
print("aligned run of 8 -> pages", (run[:8][::P] // P).tolist(), "released")
try:
    al.free_segment(run[9:], start_pos=9)
except ValueError as exc:
    print("ValueError:", exc)

# %% [markdown]
# ## Free groups
#
# When several requests finish in one step, `free_group_begin()` ... `free_group_end()` (a
# [free group](glossary.md#free-group)) queues their frees and releases them as one: one
# concatenation of the free list instead of many. Queued tensors are copied (the caller may reuse
# its buffers). Groups do not nest. SGLang's scheduler opens a group around the processing of each
# batch's results ([`SchedulerBatchResultProcessor.process_batch_result_prefill`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/scheduler_components/batch_result_processor.py)
# and its decode twin), so every request that finishes in a step is freed inside one.
#
# A group queues the **raw slots** and removes duplicate pages **once**, at `free_group_end`:
# `unique(cat(slots) // P)` over the whole group. That matters whenever two `free` calls of one
# group touch the same page, for example a request's slots and a tail of them freed apart, with
# the cut inside a page (the cell below does exactly this). Deduplicating each call on its own
# would release that page twice: it would sit on the free list twice, `available_size()` would
# count a page someone still holds, and two requests would later be handed the same page.
# (SGLang 0.5.23 also avoids the case where it starts: it frees a finished request's row and its
# over-allocated tail as page-aligned segments, the tail from the next page boundary on:
# [`release_kv_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py) and [`free_kv_row_segments`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py).)
#
# Besides `free(slots)` the allocator has a lower-level door, `free_page_ids(pages)`: it releases
# exactly the pages it is given, with no dedup, so the caller must not name a page twice.
# `free_segment` ends there. Inside a group these page ids wait in a second queue, and
# `free_group_end` releases them just after the group's deduplicated slots. (In the exercise,
# `free_segment` is only called outside groups.)
#
# In debug mode memlab's allocator also checks its books after each release: no page free twice,
# free + held = capacity. (SGLang's debug mode checks the first of the two:
# [`PagedTokenToKVPoolAllocator._debug_check_no_duplicate_pages`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py).)

# %%
b, c = al.alloc(4), al.alloc(8)
al.free_group_begin()
al.free(b)
al.free(c[:6])  # c finishes ...
al.free(c[6:])  # ... and its tail, freed apart: both touch c's second page
print("inside the group, queued slots:", [t.tolist() for t in al.free_group])
al.free_group_end()
print("released pages:", al.free_pages[:3].tolist(), "(c's second page once)")
try:
    al.free(b)  # b's page is already free
except ValueError as exc:
    print("ValueError:", exc)

# %% [markdown]
# ## need_sort: when the staged pages come back
#
# With `need_sort=True` (chapter 03) SGLang's paged allocator
# ([`PagedTokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) stages freed pages in a list, `staged_pages` (their count
# in `num_staged_pages`): the [staged pages](glossary.md#staged-pages). They are merged into the free
# list and sorted when an allocation runs short. "Runs short" is decided by the same two-step test
# as the capacity check, and SGLang merges as soon as the **cheap bound** fails
# ([`PagedTokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py), [`PagedTokenToKVPoolAllocator.alloc_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)):
#
# - `alloc_extend`: merge when `extend_num_tokens // P + bs + 1 > len(free_pages)`;
# - `alloc_decode`: merge when `bs > len(free_pages)` (at most one new page per request).
#
# `alloc_extend` then tests the bound again; only if it still fails does it make the exact count
# and compare it with the merged free list. `alloc_decode` always makes its exact count, after
# the merge test and before its kernel runs. Either call may still be refused after a merge. A
# refusal takes no page, but it may have reordered the free list.
#
# **Why the cheap bound comes first.** It is integer arithmetic on numbers the scheduler already
# has. The exact count for a prefill (`ceil(seq / P) - ceil(prefix / P)` summed over the batch)
# takes a few small tensor operations on the host copies of the lengths. In the common case, a
# deep free list, the bound proves there is room, so `alloc_extend` launches its kernel right away
# and makes the exact count afterwards, while the GPU works (to know how many pages to drop from
# the free list). It pays for the count before the launch only when the bound cannot prove room,
# which is also when merging the staged pages can help. A decode step is cheaper to count (one
# comparison per request), so `alloc_decode` always counts before it launches.

# %%
ns = PagedTokenToKVPoolAllocator(32, P, need_sort=True)  # 8 pages
held = ns.alloc(24)  # pages 1..6 held, 7 and 8 free
ns.free(held[4:8])  # page 2 staged
t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
print(
    "free",
    ns.free_pages.tolist(),
    "staged",
    [s.tolist() for s in ns.staged_pages],
    ns.num_staged_pages,
)
print(
    "a 16-token prefill (4 pages) ->",
    ns.alloc_extend(t([0]), t([0]), t([16]), t([16]), t([-1]), 16),
)
print(
    "refused, but merged first: free",
    ns.free_pages.tolist(),
    "staged",
    ns.staged_pages,
    ns.num_staged_pages,
)

# %% [markdown]
# ## memlab and SGLang, stream by stream
#
# memlab's allocators are not a paraphrase of SGLang's: run (or `pytest tests/engines/sglang/test_allocators.py`)
#
# ```
# ./course engines
# ```
#
# and a differential suite (`tests/engines/`, here `tests/engines/sglang/test_allocators.py`) downloads SGLang 0.5.23's published wheel, loads its
# allocator modules (never copying them into the course), and drives random scheduler streams on
# both in lockstep: extend batches mixing new and continuing requests, decode batches, frees,
# free groups that free one page from two calls, `need_sort` staging, `clear()`. In
# `tests/engines/sglang/test_allocators.py` SGLang runs with its torch fallback and with its Triton
# kernels, memlab with all three backends. After every
# step each slot handed out, each refusal, the free list (content and order) and
# `available_size()` must be identical. The run ends with a table of what was compared:
#
# ```
# compared                                               streams     steps  all identical
# PagedTokenToKVPoolAllocator page  4, Triton kernels (both)    2       120  yes
# PagedTokenToKVPoolAllocator page  4, torch/python backends    8       480  yes
# ...
# ```
#
# The suite found the two behaviours this chapter now teaches (one dedup per free group; the
# merge at the cheap bound) before they were fixed.
#
# ## Where memlab differs from the engine
#
# | | memlab | SGLang 0.5.23 | why |
# |---|---|---|---|
# | bad ids | `free` refuses page 0 and ids past the pool at once (ids on the CPU, or debug mode) | no check ([`PagedTokenToKVPoolAllocator.free`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) | a learner's bug gets a message, not a corrupt list |
# | double free | debug mode keeps a ledger of held pages and names the page freed twice | debug mode asserts that no page is on the free list twice ([`PagedTokenToKVPoolAllocator._debug_check_no_duplicate_pages`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) | the same bug, caught with its page number |
# | `free_segment` in debug mode | checks that every `P`-th slot starts a page | compares the page set with `unique(slot // P)` ([`PagedTokenToKVPoolAllocator.free_segment`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) | same guarantee |
# | decode page count at `P = 1` | counts every token (each opens a page) | the paged class counts none (`seq_len % 1 == 1` never holds, [`PagedTokenToKVPoolAllocator.alloc_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)); SGLang uses the token allocator there | memlab's paged class stays correct at every page size |
#
# Everything else on this page (which page goes where, when, in which order) is SGLang's, as
# `tests/engines/sglang/test_allocators.py` checks.

# %% [markdown]
# ## What the engines do differently
#
# vLLM frees per request too, but by block object and reference count
# ([`BlockPool.free_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)): a block shared by several requests (a
# prefix-cache hit) only becomes free when the last one lets go, and it keeps its hash so it can be
# hit again until it is reused. Chapter 06 shows the order in which a finished
# request's blocks join the free queue, and why it is reversed.
#
# ## Exercises
#
# **`exercises/ch05_alloc_decode.py`** (8 points): `alloc_decode`. The cell runs yours on the
# batch above.

# %%
with exercise("ch05_alloc_decode") as ex:
    mine = ex.PagedAllocator(64, P)
    mine.free_pages = free_pages.clone()
    got = mine.alloc_decode(seq_lens, last_loc)
    assert got.tolist() == by_kernel.tolist(), (
        f"yours {got.tolist()}, the kernel's {by_kernel.tolist()}"
    )
    print("same slots as the kernel; pages left:", mine.free_pages.tolist())

# %% [markdown]
# **`exercises/ch05_paged_free.py`** (9 points): `free` with dedup, `free_segment`, free groups.

# %%
with exercise("ch05_paged_free") as exf:
    fl = exf.PagedFreeList(num_pages=16, page_size=P)
    pages = fl.alloc_pages(3)
    slots = (pages[:, None] * P + torch.arange(P)).reshape(-1)
    fl.free(slots)
    assert fl.free_pages[:3].tolist() == sorted(pages.tolist()), (
        f"free list head: {fl.free_pages[:5].tolist()}"
    )
    print("each page freed once, at the head:", fl.free_pages[:3].tolist())

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["05"])
