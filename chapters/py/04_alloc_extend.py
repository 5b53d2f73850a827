# %% [markdown]
# # 04 · Paged allocation: `alloc_extend`
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/04_alloc_extend.ipynb)
#
# With [pages](glossary.md#page), slots are handed out [`page_size`](glossary.md#page-size) at a
# time and a request's tokens fill its pages in order. A prefill batch (an
# [extend](glossary.md#extend)) then needs, for every new token, the slot it lands in. SGLang
# computes all of them in one GPU [kernel](glossary.md#kernel), [`alloc_extend_kernel`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/memory/allocator.py), one program per request, called
# from [`PagedTokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py).
#
# **After this chapter you can**
# - compute how many new pages a request needs, and where each of its new tokens lands;
# - split a request's new tokens into the three parts (rest of the old page, whole new pages, a
#   new partial page) and find each request's place in the output and in the free list with
#   prefix sums;
# - explain why capacity is settled on the host before the kernel runs (a cheap bound first, the
#   exact count only when the bound cannot prove room);
# - run the Triton kernel, its torch reference and its plain-Python reference on one batch;
# - write `alloc_extend` in torch and the kernel's whole-page part (exercises `ch04_alloc_extend`
#   and `ch04_alloc_extend_kernel`).

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
from memlab.course.notebook import exercise, start; FAST = start("04", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# Three prefill batches on a paged allocator: A and B start; A, B and a new C continue; C
# continues again. Every slot a batch hands out has a black edge, and its hatching says which of
# the three parts it belongs to. Pick a page size with the dropdown: with page size 1 there is
# only part 2; with larger pages, more tokens continue an old page.

# %% [markdown]
# ![Second prefill batch with page size 4: the three parts](img/04_alloc_extend.png)

# %%
from memlab.course import viz

stories = {
    f"page_size {ps}": viz.sglang_books.paged_extend(page_size=ps).frames
    for ps in (1, 2, 4, 8)
}
viz.Stepper(
    stories,
    lambda books: viz.draw_books(books, ("table", "slots", "free")),
    start=2,
    story="page_size 4",
)

# %% [markdown]
# ### Your own batch
#
# The instrument below starts where the story ends: A, B and C hold 11, 12 and 11 tokens, three
# pages are free. Two scheduler functions drive it. `alloc_for_extend` is the scheduler's side of an
# extend (SGLang's [`alloc_for_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation.py)): it gives each new request a
# row, calls the allocator's `alloc_extend` and writes the slots into the request table.
# `release_kv_cache` (SGLang's [`release_kv_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py)) is what the scheduler
# calls when a request finishes: its pages go back to the free list and its row to the free rows.
#
# Type a batch (a name, its prefix length and its sequence length per request; a request's prefix
# is what it already holds: the instrument fills it in when you name the requests, and leaves alone
# a value you typed yourself) and press `alloc_extend`. It runs `alloc_for_extend` on the real
# allocator and shows the `alloc_extend` call that made, the slots coloured by part, the two prefix
# sums, and the Triton kernel and both references run on that batch. A batch the pool cannot hold
# is refused, with nothing taken; `release_kv_cache` gives a request's pages back (their slots get
# a dashed edge). Hover a cell to read what it is; `undo`, `reset` and another page size
# replay your steps on fresh objects. To run a call yourself, `undo` it and paste it into a cell
# under `import copy; from torch import tensor; allocator = copy.deepcopy(inst.world.allocator)`:
# the same slots come back.

# %%
inst = viz.sglang_books.extend_instrument(page_size=4)
inst

# %% [markdown]
# ## Pages
#
# Page `p` holds slots `p * P .. p * P + P - 1` (page size $P$); page 0 is padding. A request with
# $s$ tokens occupies $\lceil s / P \rceil$ pages, its last one possibly partly filled. Growing from
# a prefix of $p$ tokens ([prefix length](glossary.md#prefix-length), `prefix_lens`) to $s$ tokens
# ([seq length](glossary.md#seq-length), `seq_lens`; the difference is its
# [extend length](glossary.md#extend-length)), it needs
#
# $$n_{\text{new}} = \lceil s / P \rceil - \lceil p / P \rceil$$
#
# new pages, taken from the head of the free list.

# %%
import torch

from memlab.sglang.allocator.reference import (
    alloc_extend_python,
    alloc_extend_torch,
    num_new_pages,
)

P = 4
# the second batch of the widget: A, B continue, C is new
prefix, seq = ([6, 3, 0], [11, 12, 4])
print("new pages per request:", [num_new_pages(p, s, P) for p, s in zip(prefix, seq)])

# %% [markdown]
# ## Three parts
#
# Request $i$'s new tokens, positions $p_i .. s_i - 1$, fall into
# [three parts](glossary.md#the-three-parts):
#
# 1. **the rest of its old page**: positions $p_i$ up to $\min(s_i, \lceil p_i / P \rceil P) - 1$;
#    the slots continue from `last_loc + 1`, where [`last_loc`](glossary.md#last_loc) is the slot
#    of its last token (-1 for an empty prefix). A request that ends inside its old page gets only
#    this part, and takes no new page (5 -> 7 tokens with $P = 4$: positions 5 and 6 go to
#    `last_loc + 1` and `last_loc + 2`);
# 2. **whole new pages**, only for a request that grows past the end of its old page: positions
#    $\lceil p_i / P \rceil P$ up to $\lfloor s_i / P \rfloor P - 1$;
# 3. **one new partial page**, only for a request that grows past the end of its old page and whose
#    $s_i$ is not a multiple of $P$: positions $\lfloor s_i / P \rfloor P$ to $s_i - 1$, starting at
#    offset 0 of one more new page.
#
# Every request writes its slots at an output offset and takes pages from a free-list offset that
# depend only on the requests before it: two **prefix sums** over the batch.

# %%
pre, sq = torch.tensor(prefix), torch.tensor(seq)
new_tokens = sq - pre
new_pages = (sq + P - 1) // P - (pre + P - 1) // P
print(
    "new tokens :",
    new_tokens.tolist(),
    "-> output starts",
    (torch.cumsum(new_tokens, 0) - new_tokens).tolist(),
)
print(
    "new pages  :",
    new_pages.tolist(),
    "-> free-list starts",
    (torch.cumsum(new_pages, 0) - new_pages).tolist(),
)
for name, p, s in zip("ABC", prefix, seq):
    parts = viz.sglang_books.extend_parts(p, s, P)
    print(
        f"{name}: {p} -> {s}: part 1 x{parts.count(1)}, part 2 x{parts.count(2)}, part 3 x{parts.count(3)}"
    )

# %% [markdown]
# ## The kernel and its two references
#
# `kernels/alloc_extend.py` runs one program per request. Each program sums the new tokens and
# new pages of the requests before it (its prefix sums), then writes its three parts with masked
# stores (a Triton program works on a block of positions at once; a masked store writes only the
# lanes whose mask is true, so a block of 8 lanes for a part of 3 slots writes 3). SGLang's
# [`alloc_extend_kernel`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/memory/allocator.py) is built the same way. The loop over whole pages has a *runtime* bound, so one compiled kernel serves every
# extend length. `memlab.sglang.allocator.reference` holds a vectorised torch version (no loop over
# requests) and a plain-Python version that reads like the definition. All three must agree.
#
# The cell runs them on a random batch. The kernel writes into a buffer with a guard band of
# sentinels on both sides: the interpreter does not catch out-of-bounds stores, so we check the
# guards are untouched.

# %%
from memlab.common.env import kernel_device
from memlab.kernels import alloc_extend

dev = kernel_device()
gen = torch.Generator().manual_seed(4)
bs = 8 if FAST else 64
prefix_r = torch.randint(0, 40, (bs,), generator=gen)
seq_r = prefix_r + torch.randint(0, 40, (bs,), generator=gen)
free_r = (
    torch.randperm(400, generator=gen)[: int(num_new_pages(prefix_r, seq_r, P))] + 1
)
# any slot works for the check
last_r = torch.where(prefix_r > 0, 1000 * P + prefix_r - 1, -1)
n = int((seq_r - prefix_r).sum())

buf = torch.full((n + 16,), -7, dtype=torch.int64, device=dev)
kernel = alloc_extend.alloc_extend(
    prefix_r.to(dev), seq_r.to(dev), last_r.to(dev), free_r.to(dev), P, n, out=buf[8:-8]
)
ref_t = alloc_extend_torch(prefix_r, seq_r, last_r, free_r, P, n)
ref_py = alloc_extend_python(
    prefix_r.tolist(), seq_r.tolist(), last_r.tolist(), free_r.tolist(), P
)
print(
    f"{bs} requests, {n} new tokens on {dev}: kernel == torch: {torch.equal(kernel.cpu(), ref_t)}, "
    f"torch == python: {ref_t.tolist() == ref_py}, guards intact: {bool((buf[:8] == -7).all() and (buf[-8:] == -7).all())}"
)
assert torch.equal(kernel.cpu(), ref_t) and ref_t.tolist() == ref_py

# %% [markdown]
# ## Capacity first
#
# The kernel trusts the free list to be deep enough: a program reads `free_pages[page_start + k]`
# without a bound. So the allocator decides on the host **before** anything runs (the
# [capacity check](glossary.md#capacity-check)). First it tries a
# [cheap bound](glossary.md#cheap-bound) from two numbers it already has: the batch can never
# need more than $\lfloor \text{extend\_num\_tokens} / P \rfloor$ + batch size + 1 pages, so a free
# list at least that long certainly has room. Only if the free list is shorter than that bound does
# it make the exact count, from CPU copies of the lengths, before the launch. Short means `None`,
# with no page taken. When the bound does prove room, SGLang launches right away and makes the exact
# count afterwards, while the GPU works, to know how many pages to drop from the free list
# ([`PagedTokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py); chapter 05). What must never
# happen is a launch before the host knows there are enough pages: the kernel would read past the
# end of the free list. Chapter 05 says why the bound comes first, and what `need_sort` does when
# it fails.

# %%
scene = viz.sglang_books.paged_extend(page_size=P)
al = scene.allocator
before = al.free_pages.clone()
t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
print("free pages:", before.tolist())
print(
    "a 40-token request ->",
    al.alloc_extend(t([0]), t([0]), t([40]), t([40]), t([-1]), 40),
)
assert torch.equal(al.free_pages, before)
print("free pages unchanged:", al.free_pages.tolist())

# %% [markdown]
# The same allocator can run any of the three: `backend="triton" | "torch" | "python"`. Here the
# kernel serves the widget's scenario end to end, on the GPU or in the interpreter:

# %%
# free list where the kernel runs
kscene = viz.sglang_books.paged_extend(page_size=P, backend="triton", device=dev)
same = all(
    a.rows == b.rows and a.free_pages == b.free_pages
    for a, b in zip(kscene.frames, scene.frames)
)
print("triton backend gives the same books at every step:", same)
assert same

# %% [markdown]
# ## What the engines do differently
#
# vLLM never computes a slot per token at allocation time: its scheduler asks the KV cache manager
# for whole *blocks* ([`KVCacheManager.allocate_slots`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py), plain
# Python over a block pool, chapter 06) and sends the new block ids to the workers, which append
# them to the block table. Before each step a small kernel derives `slot_mapping` for the batch's
# tokens from the block table ([`BlockTable.compute_slot_mapping`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py)).
# SGLang works per token from the start: its kernel ([`alloc_extend_kernel`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/memory/allocator.py)) computes every new token's slot from
# the pages at the head of the free list, the allocator then drops those pages from the list, and a
# second kernel ([`write_cache_indices`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation.py), called by the scheduler's
# `alloc_for_extend`) copies the slots into each request's row of `req_to_token`.
#
# ## Where memlab differs from the engine
#
# memlab hands out the same slots as SGLang 0.5.23 for every batch:
# `tests/engines/sglang/test_allocators.py` (run by `./course engines`) checks it stream by stream,
# for both of SGLang's backends against all three of memlab's (chapter 05).
# What differs is around the algorithm, not in it:
#
# | | memlab | SGLang 0.5.23 | why |
# |---|---|---|---|
# | backends | `backend="torch" / "triton" / "python"`, chosen per allocator | its Triton kernel where the platform has Triton, else a torch fallback ([`PagedTokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) | the chapter compares all three |
# | the kernel's loops | prefix sums over earlier requests in blocks of 128; page size a compile-time constant, parts 1 and 3 in blocks of its next power of two; part 2 in blocks of 256 | loads `next_power_of_2(bs)` lengths at once (one compiled variant per power of two of the batch size); page size a compile-time constant, powers of two only; part 2 in blocks of 4096 ([`alloc_extend_kernel`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/memory/allocator.py)) | one compiled kernel per page size serves every batch, any page size works, fewer registers; same output |
# | bad arguments | refused with a message naming the value (lengths, `last_loc` that cannot end its prefix), by one validator per method in `memlab/common/_checks.py`, so `alloc_extend` in `memlab/sglang/allocator/paged.py` reads like SGLang's | assumed correct; a debug-mode assert on `last_loc` ([`PagedTokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/paged.py)) | mistakes in a notebook should explain themselves |
# | page size 1 | `TokenToKVPoolAllocator.alloc_extend` exists and takes any free slots | the token allocator has only `alloc(n)` ([`TokenToKVPoolAllocator.alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/token.py)); the scheduler calls it for a prefill | one interface for the chapters |
#
# ## Exercises
#
# **`exercises/ch04_alloc_extend.py`** (11 points): `PagedAllocator.alloc_extend` in torch, the
# whole batch at once, capacity first. The cell below runs yours on the widget's batches.

# %%
with exercise("ch04_alloc_extend") as ex:
    mine = ex.PagedAllocator(48, P)
    held = {}
    for batch in ({"A": 6, "B": 3}, {"A": 5, "B": 9, "C": 4}, {"C": 7}):
        rids = list(batch)
        pre_l = [len(held.get(r, [])) for r in rids]
        seq_l = [p + batch[r] for p, r in zip(pre_l, rids)]
        last_l = [held[r][-1] if held.get(r) else -1 for r in rids]
        got = mine.alloc_extend(t(pre_l), t(seq_l), t(last_l))
        print("yours:", got.tolist())
        i = 0
        for r, p, s in zip(rids, pre_l, seq_l):
            held[r] = held.get(r, []) + got[i : i + s - p].tolist()
            i += s - p
    want = {r: scene.slots(r) for r in scene.reqs}
    assert held == want, f"memlab's books: {want}"
    print("same slots as memlab for every request")

# %% [markdown]
# **`exercises/ch04_alloc_extend_kernel.py`** (8 points, +2 on a GPU): part 2 of the Triton
# kernel, the whole pages. The cell runs yours on the random batch above.

# %%
with exercise("ch04_alloc_extend_kernel") as exk:
    got = exk.alloc_extend(
        prefix_r.to(dev), seq_r.to(dev), last_r.to(dev), free_r.to(dev), P, n
    )
    assert torch.equal(got.cpu(), ref_t), (
        f"first difference at output {int((got.cpu() != ref_t).nonzero()[0])}"
    )
    print("your kernel matches the torch reference")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["04"])
