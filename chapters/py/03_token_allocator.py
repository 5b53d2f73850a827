# %% [markdown]
# # 03 · The token allocator and its free list
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/03_token_allocator.ipynb)
#
# The second mapping, in its simplest form: with a page size of 1, every token gets one slot, any
# free slot will do, and the [allocator](glossary.md#allocator) is a list of free slot ids, its
# [free list](glossary.md#free-list). SGLang calls it
# [`TokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/token.py).
#
# **After this chapter you can**
# - say which end of the free list allocation takes from and which end frees go to, and why;
# - follow the `need_sort` mode: frees staged aside, merged and sorted only when an allocation
#   runs short;
# - explain why sorted free slots give requests contiguous runs, and why that helps;
# - write the token allocator's `available_size`, `alloc`, `free`, `merge_and_sort_free`
#   (exercise `ch03_token_allocator`).

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
from memlab.course.notebook import exercise, start; FAST = start("03", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# Two stories with the same requests: A, B and C take slots, A and B finish, D and E arrive.
# Pick a story with the dropdown. In the first, freed slots join the tail of the free list; in the
# second (`need_sort=True`), they wait in a staging area (yellow,
# [staged pages](glossary.md#staged-pages)) until an allocation runs short.
# Watch where D's slots land in each. The picture is the second story just before D arrives: A's
# and B's slots are staged, behind the three slots still on the free list.

# %% [markdown]
# ![need_sort=True after A and B finish: their slots wait in the staging area (yellow)](img/03_token_allocator.png)

# %%
from memlab.course import viz

stories = {
    "FIFO (need_sort=False)": viz.sglang_books.token_allocator(need_sort=False).frames,
    "staged (need_sort=True)": viz.sglang_books.token_allocator(need_sort=True).frames,
}
viz.Stepper(stories, lambda books: viz.draw_books(books, ("table", "slots", "free")))

# %% [markdown]
# ### Your own allocs and frees
#
# The instrument below starts where the second story ends (`need_sort=True`: D and E have their
# slots, C still holds its six). `alloc(n)` gives a request `n` slots from the head of
# `free_pages` (a new request takes a row first); `free request` gives them back (staged, in
# yellow, while `need_sort` is on; at the tail of `free_pages` when it is off);
# `merge_and_sort_free()` folds the staged slots in and sorts the list. The books list the free
# list's contiguity (its runs of consecutive slots) before and after the merge. Switch
# `need_sort` to replay your steps under the other rule. A negative `n` gets the library's
# message; more than `available_size()` is refused with nothing taken.

# %%
from memlab.course.viz.token_books import token_instrument

inst = token_instrument(need_sort=True)
inst

# %% [markdown]
# ## Allocation takes the head
#
# The free list `free_pages` is an int64 tensor (with page size 1, a "page" is a slot). `alloc(n)`
# hands out its first `n` entries and keeps the rest: one slice, no loop, on the device where the
# KV lives. Slot 0 is padding and is never on the list. A request for more than is free returns
# `None` and hands out nothing. (With `need_sort`, below, the failed attempt may first have merged
# and sorted the staged slots.)

# %%
import torch

from memlab.sglang.allocator import TokenToKVPoolAllocator

alloc = TokenToKVPoolAllocator(size=16)
a = alloc.alloc(4)
b = alloc.alloc(3)
print("A:", a.tolist(), " B:", b.tolist(), " free:", alloc.free_pages.tolist())
print("alloc(99) ->", alloc.alloc(99), " available:", alloc.available_size())

# %% [markdown]
# ## FIFO reuse
#
# `free(slots)` appends to the **tail**: a freed slot is handed out again only after every slot
# that was already free. With one slot per token there is nothing to keep warm, and this spreads
# reuse evenly. The price: after a while the free list is a shuffle of old and new ids, and a
# request's slots are scattered.

# %%
alloc.free(a)
print("after freeing A:", alloc.free_pages.tolist())
print("next 11 slots  :", alloc.alloc(11).tolist(), "(A's slots come last)")

# %% [markdown]
# ### A double free, and `debug_mode`
#
# `free` trusts its caller. Free the same slots twice (a [double free](glossary.md#double-free))
# and they sit on the list twice; a few allocations later two requests share them and overwrite
# each other's KV, with no error anywhere. Checking every free would cost a scan on every step, so
# the engines check only on request ([debug mode](glossary.md#debug-mode)): SGLang's paged
# allocator (not this token allocator, which has no such mode) asserts after each free, when
# `SGLANG_DEBUG_MEMORY_POOL=1`, that no page is on its free list twice
# ([`PagedTokenToKVPoolAllocator._debug_check_no_duplicate_pages`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)); memlab's allocators take
# `debug_mode=True`, which the tests turn on. When books look wrong, run with it first.

# %%
quiet = TokenToKVPoolAllocator(size=4)
x = quiet.alloc(2)
quiet.free(x)
quiet.free(x)  # the bug: freed twice, silently
print("free_pages:", quiet.free_pages.tolist(), "(slots 1 and 2 twice)")
p, q = quiet.alloc(4), quiet.alloc(2)
print(
    f"request P gets {p.tolist()}, request Q gets {q.tolist()}: both own slots 1 and 2"
)
checked = TokenToKVPoolAllocator(size=4, debug_mode=True)
y = checked.alloc(2)
checked.free(y)
try:
    checked.free(y)
except (ValueError, AssertionError) as exc:
    print(
        f"with debug_mode=True the second free is refused: {type(exc).__name__}: {exc}"
    )
else:
    raise AssertionError("debug_mode let a double free through")

# %% [markdown]
# ## Staged frees
#
# With `need_sort=True`, `free` does not touch the free list: it appends to `release_pages`, a
# staging area. `available_size()` counts both, because staged slots are free; leaving them out
# would make the scheduler think memory is short when it is not. (SGLang turns `need_sort` on only
# when prefill and decode run on separate servers, PD disaggregation:
# [`KVCacheConfigurator._build_token_to_kv_pool_allocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py).)

# %%
alloc = TokenToKVPoolAllocator(size=16, need_sort=True)
a, b, c = alloc.alloc(4), alloc.alloc(3), alloc.alloc(6)
alloc.free(a)
alloc.free(b)
print(
    "free_pages:",
    alloc.free_pages.tolist(),
    " release_pages:",
    alloc.release_pages.tolist(),
)
print("available_size:", alloc.available_size(), "= 3 free + 7 staged")

# %% [markdown]
# ## Merge and sort
#
# Only when an allocation finds `free_pages` too short does the allocator call
# `merge_and_sort_free()` ([merge and sort](glossary.md#merge-and-sort)): staged and free slots
# become one **sorted** list. Sorting costs a
# sort, so it happens rarely; in exchange the next requests get runs of neighbouring slots.
# Contiguous slots make the attention kernel's reads of a request's KV closer together in memory,
# and let a run be described by its start and length.

# %%
d = alloc.alloc(4)  # 3 on the free list < 4: merge and sort first
print(
    "D:",
    d.tolist(),
    " free:",
    alloc.free_pages.tolist(),
    " staged:",
    alloc.release_pages.tolist(),
)

# %% [markdown]
# ## What the engines do differently
#
# SGLang's *paged* allocator (chapter 04) puts freed pages at the **head** instead (LIFO,
# [`PagedTokenToKVPoolAllocator._release_page_ids`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)): the pages just released are the next
# handed out, so the live set stays on few, recently used pages. vLLM's block pool (chapter 06)
# keeps a doubly linked [free queue](glossary.md#free-queue)
# ([`FreeKVCacheBlockQueue`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)): freed blocks without a cached hash go
# to the head, cached ones to the tail ([`BlockPool.free_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)), so the
# prefix cache keeps them as long as possible.
#
# ## Exercise: `exercises/ch03_token_allocator.py`
#
# Write `available_size`, `alloc`, `free` and `merge_and_sort_free` (10 points). The cell below
# replays the story of the widget on your allocator and on memlab's, in both modes.

# %%
with exercise("ch03_token_allocator") as ex:
    for need_sort in (False, True):
        mine, ref = (
            ex.TokenToKVPoolAllocator(16, need_sort=need_sort),
            TokenToKVPoolAllocator(16, need_sort=need_sort),
        )
        held = {}
        for step, (op, who, n) in enumerate(
            [
                ("alloc", "A", 4),
                ("alloc", "B", 3),
                ("alloc", "C", 6),
                ("free", "A", 0),
                ("free", "B", 0),
                ("alloc", "D", 4),
                ("alloc", "E", 2),
            ]
        ):
            if op == "alloc":
                x, y = mine.alloc(n), ref.alloc(n)
                assert torch.equal(x, y), (
                    f"need_sort={need_sort}, {who} alloc({n}): yours {x.tolist()}, memlab {y.tolist()}"
                )
                held[who] = y
            else:
                mine.free(held[who].clone())
                ref.free(held[who].clone())
            assert mine.available_size() == ref.available_size(), (
                f"step {step}: available_size differs"
            )
        print(f"need_sort={need_sort}: same slots at every step")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["03"])
