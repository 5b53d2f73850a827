# %% [markdown]
# # 00 · Orientation: three mappings
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/00_orientation.ipynb)
#
# An LLM serving engine keeps the keys and values (the KV cache) of every running request in one
# big block of GPU memory. Most of what SGLang and vLLM do with that memory is bookkeeping: who
# owns which piece, and where the piece lives (SGLang's [`ReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)
# and its allocators, vLLM's [`BlockPool`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)). Each chapter links the engine
# file it talks about, at the release this course follows (SGLang 0.5.23, vLLM 0.33). This course opens those books one layer at a time.
# A word you have not met yet is in the [glossary](glossary.md): each chapter links a word there
# where it first uses it.
#
# **After this chapter you can**
# - name the three mappings every engine keeps, and say which object owns each;
# - read a request's row in the request table and find the bytes of any of its tokens;
# - run a real Triton kernel (`alloc_extend`) on a GPU or in the Triton interpreter and check it
#   against its torch reference;
# - find your way around the repository: chapters, the `memlab` library, `kernels/`, exercises
#   and the grader.

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
from memlab.course.notebook import exercise, start; FAST = start("00", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## The three mappings
#
# | mapping | from -> to | kept by |
# |---|---|---|
# | request -> row | a running [request](glossary.md#request) -> its [row](glossary.md#row) in the [request table](glossary.md#request-table) | `ReqToTokenPool` (chapter 01) |
# | logical token -> physical slot | (row, position) -> [slot](glossary.md#slot) id; with [pages](glossary.md#page), slot = page * page_size + offset | the [allocators](glossary.md#allocator) (chapters 03-05), written into the request table |
# | physical slot -> bytes | slot id -> one row of every layer's K and V tensors | the `KVCache` [pools](glossary.md#kv-pool) (chapter 02) |
#
# A request sees its tokens as positions 0, 1, 2, ... The engine stores them wherever there is
# room. The request table remembers, per position, the *slot* it went to; the KV pools turn a
# slot into memory: slot `s` is row `s` of each layer's key tensor and of each layer's value tensor.
#
# Three conventions show up everywhere:
# - **Padding.** Row 0 of the request table and slot 0 (with pages: all of page 0) are never
#   handed out: the [padding row](glossary.md#padding-row) and the
#   [padding slot](glossary.md#padding-slot). Batches padded to a fixed shape
#   ([CUDA graphs](glossary.md#cuda-graph)) point their dummy entries there and may read or write
#   them without harming anyone.
# - **Pages.** With `page_size` > 1, slots are handed out a page at a time. A request's tokens
#   fill its pages in order, so inside a page its slots are consecutive.
# - **Reuse.** Freed rows and pages are handed out again, soon. That is the whole point, and the
#   source of most bugs.

# %% [markdown]
# ## Your environment
#
# The same report as `./course doctor` (or `python -m memlab doctor`). The canary is a tiny
# [kernel](glossary.md#kernel) whose answer is known: some Triton and NumPy pairings silently
# return zeros in the [interpreter](glossary.md#triton-interpreter), and the canary catches that
# before any chapter trusts a kernel.

# %%
from memlab.course.doctor import report

for key, value in report():
    print(f"{key:>18}  {value}")

# %% [markdown]
# ## See it: three requests, step by step
#
# The widget replays a short story on real memlab objects: a request table with 4 rows, a paged
# allocator with 8 pages of 4 slots (pages 1 to 8: the picture also draws page 0, the padding page,
# never handed out), and a KV pool with 2 layers. Requests A, B and C arrive with their prompts
# (their [prefill](glossary.md#prefill)), each then [decodes](glossary.md#decode) one token (a decode
# step adds one generated token to every running request), B finishes, and D arrives in B's place.
# Move the slider or press play.
#
# - Left: the request table. Each row is a request; cell `pos` holds the slot of its token `pos`.
#   `gen` beside a row counts how many times that row has been handed out, its
#   [generation](glossary.md#generation) (chapter 01 says why engines keep it).
# - Right: the slots, grouped by page. A pale cell belongs to a page a request holds but has not
#   filled yet. A black edge marks what the step changed.
# - Middle strip: every layer's K and V tensor, one column per slot. The same slot is the same
#   column in every tensor.
# - Bottom: the allocator's [free list](glossary.md#free-list), the page it hands out next on the
#   left.

# %% [markdown]
# ![The three mappings after D arrives (static picture of the widget's last step)](img/00_mappings.png)

# %%
from memlab.course import viz

PAGE_SIZE = 4
scene = viz.sglang_books.orientation(page_size=PAGE_SIZE)
viz.Stepper(
    scene.frames,
    lambda books: viz.draw_books(books, ("table", "slots", "buffers", "free")),
)

# %% [markdown]
# ## Read it: the same books in code
#
# The widget's last step (press play, or drag the slider to the end) is the live state of
# `scene`. Follow request A through the three mappings by hand.

# %%
req_pool, allocator, kv = scene.req_pool, scene.allocator, scene.kvcache
a = scene.reqs["A"]
row = a.kv.req_pool_idx  # mapping 1: request -> row
# mapping 2: position -> slot
slots = req_pool.req_to_token[row, : a.kv.kv_allocated_len]
print(
    f"A owns row {row} (handed out {int(req_pool.req_generation[row])} time(s) so far: the row's generation, "
    f"chapter 01); its slots: {slots.tolist()}"
)
print(f"pages under those slots: {sorted(set((slots // PAGE_SIZE).tolist()))}")

k0 = kv.get_key_buffer(0)  # mapping 3: slot -> bytes
s = int(slots[-1])
row_bytes = k0[s].nbytes
offset = k0[s].data_ptr() - k0.data_ptr()
print(
    f"slot {s} is k_buffer[0][{s}], shape {tuple(k0[s].shape)}: bytes {offset}..{offset + row_bytes - 1} "
    f"of that tensor (= {s} * {row_bytes})"
)
assert offset == s * row_bytes

# %% [markdown]
# A token's K and V are one row per layer, so a token costs `row_bytes * 2 * layers` bytes in
# total: `kv.bytes_per_token`. Chapter 02 derives that number for real models.

# %%
print(
    f"{kv.bytes_per_token} bytes per token = 2 (K and V) x {kv.layer_num} layers x {kv.head_num} heads "
    f"x {kv.head_dim} dims x 2 bytes (fp16)"
)
print(
    f"free pages, head first: {allocator.free_pages.tolist()}; free rows: {req_pool.free_slots}"
)

# %% [markdown]
# ## Run it: a real kernel on the same state
#
# When a batch of several new tokens per request arrives (an [extend](glossary.md#extend): a
# prefill, or the next piece of a [chunked prefill](glossary.md#chunked-prefill)) and pages are
# bigger than one token, SGLang works out the slot of every new token in one kernel,
# [`alloc_extend_kernel`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/memory/allocator.py), which runs one GPU program per request. (With
# a page size of 1, [`TokenToKVPoolAllocator.alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/token.py) just takes the
# first free slots, no kernel.) Here one extend batch gives A 6 more tokens (after its decode step:
# the tokens of a follow-up message, say) and D 3 more (the next piece of its prompt). Each request's
# new tokens come in up to [three parts](glossary.md#the-three-parts): the rest of its last page,
# whole new pages, and a new partial page. Chapter 04 builds this kernel from scratch; here we only
# run it.
#
# On a GPU the kernel is compiled; on a CPU it runs in the Triton interpreter, which executes the
# same program with NumPy. Either way we compare it with the torch reference, a vectorised
# version of the same algorithm, on the same inputs.

# %%
import torch

from memlab.common.env import kernel_device
from memlab.kernels import alloc_extend
from memlab.sglang.allocator.reference import alloc_extend_torch

dev = kernel_device()
batch = {"A": 6, "D": 3}
prefix = [scene.reqs[r].kv.kv_allocated_len for r in batch]
seq = [p + n for p, n in zip(prefix, batch.values())]
last = [scene.last_loc(r) for r in batch]  # each request's last slot so far


def on(xs):
    return torch.tensor(xs, dtype=torch.int64, device=dev)


free_pages = allocator.free_pages.to(dev)
n_new = sum(batch.values())
by_kernel = alloc_extend.alloc_extend(
    on(prefix), on(seq), on(last), free_pages, PAGE_SIZE, n_new
)
by_torch = alloc_extend_torch(
    on(prefix), on(seq), on(last), free_pages, PAGE_SIZE, n_new
)
print(f"kernel on {dev}: {by_kernel.tolist()}")
print(f"torch reference: {by_torch.tolist()}")
assert torch.equal(by_kernel, by_torch)

# %% [markdown]
# The kernel only computes slots; it takes nothing. Before launching it, the allocator makes sure
# on the host that there are enough free pages: usually a quick upper bound is enough for that,
# and only when the bound fails does it count the pages exactly first (chapters 04 and 05 say
# why). Then it runs the kernel (or a torch fallback) and drops the pages it used from the head of
# its free list. Let the scene do that for real and look at the books again:

# %%
out = scene.extend_batch(batch)
assert out.tolist() == by_kernel.tolist()
viz.show(
    viz.draw_books(
        scene.books(
            "A +6 and D +3 tokens, slots from alloc_extend", new_slots=out.tolist()
        ),
        ("table", "slots", "free"),
    )
)

# %% [markdown]
# ## The same books in vLLM
#
# vLLM keeps the same three mappings under other names: its [block table](glossary.md#block-table)
# ([`BlockTable`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py)) has a row per request listing the request's
# [block](glossary.md#block) ids (a block is a page of $B$ tokens, $B$ = vLLM's `block_size`), and
# before each step it computes a per-token [`slot_mapping`](glossary.md#slot-mapping)
# ([`BlockTable.compute_slot_mapping`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py)):
#
# $$\text{slot} = \text{block\_table}[\text{req}, \lfloor \text{pos} / B \rfloor] \cdot B + \text{pos} \bmod B$$
#
# SGLang's `req_to_token` ([`ReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) stores that slot
# directly for every position; vLLM's [`BlockTable`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py) stores one id per
# block and derives the slots. Chapter 06 shows both spellings side by side.
#
# ## Where things are
#
# - `chapters/`: these notebooks (and `chapters/py/`, the same text as plain Python for review).
# - `memlab/`: the library, one module per layer, named as the engine file it mirrors (its first
#   docstring line names that file).
# - `kernels/`: the Triton kernels; import them as `from memlab.kernels import alloc_extend`.
# - `exercises/`: the stubs you fill in; `solutions/`: the filled-in twins (look only when stuck).
# - `tests/`: the test suite; `tests/exercises/` holds the graded tests.
# - `chapters/glossary.md`: [the glossary](glossary.md), every word of the books in plain terms
#   (row, slot, page, block, `last_loc`, generation, padding, free list, staged pages, locked and
#   evictable ...). In Colab, open it on GitHub:
#   [glossary.md](https://github.com/memlab-course/memlab/blob/v0.1.0/chapters/glossary.md) (the
#   first cell prints that address too).
#
# ## Exercises
#
# Chapter 00 has no exercise of its own. Every other chapter ends with one or two, for example
# `exercises/ch01_alloc_rows.py` in chapter 01. Here is the full list; the cell after it runs the
# grader over all of them, so you see your starting score.

# %%
from memlab.course.grading.catalog import EXERCISES

for e in EXERCISES:
    gpu = f" (+{e.gpu_points} on a GPU)" if e.gpu_points else ""
    print(
        f"ch{e.chapter:02d}  exercises/{e.file}.py  {e.points} points{gpu}: {e.title}"
    )

# %% [markdown]
# ## Grade
#
# The grader runs the graded tests against your files in `exercises/` and prints a table. From
# a terminal: `python -m memlab.grade` (all chapters) or `python -m memlab.grade 04` (one).
# Untouched stubs score 0: that is where everyone starts. An exercise you have not started takes
# one line of the table; once you start one, the grader lists its failing checks below the table.

# %%
from memlab.grade import main as grade

grade(["--quiet"])
