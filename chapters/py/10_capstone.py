# %% [markdown]
# # 10 · Capstone: serve a tiny model, replay real traces
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/10_capstone.ipynb)
#
# Time to run the books for real. `memlab.engine` serves a small Llama-style transformer (random
# weights, fixed seed) through everything the course built: the request table, a KV pool, a paged
# allocator, a prefix cache and a scheduler with chunked prefill, decode batches, admission and
# retraction. Then `memlab.sim` replays request streams from production traces to measure how much
# of a pool each allocation policy wastes.
#
# **After this chapter you can**
# - follow a serving engine step by step: which requests run, which wait, which pages they own
#   or share through the prefix cache, and when one is retracted;
# - check that serving through paged books gives the same tokens as contiguous KV;
# - compare allocation policies (reserve the maximum, round to a power of two, an oracle, paging)
#   on real traces, and read the fragmentation they cause;
# - write the scheduler's admission step (exercise `ch10_admission`).

# %%
# Setup: the course around this notebook, or (Colab) a clone of this notebook's version of it.
import os
import pathlib
import shutil
import subprocess
import sys

HOME, REF = "memlab-course/memlab", "v0.1.0"  # the course's home and version (scripts/set_home.py)
DRIVE = False  # Colab: True keeps your exercise files in a folder on your Google Drive
here = pathlib.Path.cwd().resolve()
root = next((p for p in (here, *here.parents) if (p / "pyproject.toml").exists() and (p / "memlab").is_dir()), None)
if root is None:  # Colab or a bare kernel: clone version REF next to this notebook, once
    root, url = here / f"memlab-{REF}", os.environ.get("MEMLAB_REPO_URL", f"https://github.com/{HOME}")
    part = root.with_name(root.name + ".partial")  # becomes root only when the clone is complete
    if not root.is_dir():
        if part.exists():
            print(f"removing {part.name}, an unfinished clone from an earlier run")
            shutil.rmtree(part)
        git = subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", REF, url, str(part)],
                             capture_output=True, text=True, env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
        if git.returncode:
            offline = any(w in git.stderr for w in ("resolve host", "connect to", "timed out", "unreachable"))
            raise RuntimeError(f"could not clone the course from {url} at version {REF}: " + (
                "no network (this runtime cannot reach the server); check the connection, then re-run this cell"
                if offline else f"no such repository or version ({HOME} does not exist, is private, or has no "
                f"tag {REF})") + f"\ngit said: {git.stderr.strip()[-400:]}") from None
        part.rename(root)
sys.path.insert(0, str(root))
from memlab.viz.notebook import start

FAST = start("10", REF, drive=DRIVE)

# %% [markdown]
# ## See it: the engine, step by step
#
# Eight requests share a 16-token system prompt; the pool has 40 pages of 4 slots and at most 4
# requests run at once. Left: every page, in its owner's colour; beige pages are cached (kept for
# prefix hits); hatched ones are cached pages that running requests map (xN: how many). Right: the
# pool over the steps so far (owned, cached, free) and the running and waiting requests.
#
# ![The engine mid-run: the shared system prompt is mapped by four requests](https://raw.githubusercontent.com/memlab-course/memlab/v0.1.0/chapters/img/10_engine.png)

# %%
import torch

from memlab import viz
from memlab.engine import Engine, TinyLlama, generate_reference
from memlab.viz.draw_engine import WORKLOADS, draw_engine, draw_policies, engine_frames

model = TinyLlama()
g = torch.Generator().manual_seed(0)
system = torch.randint(0, 128, (16,), generator=g).tolist()
prompts = [system + torch.randint(0, 128, (int(n),), generator=g).tolist() for n in torch.randint(4, 24, (8,), generator=g)]
engine = Engine(model, page_size=4, num_tokens=160, max_running=4, max_context=96, chunk_size=32, attention="torch")
frames = engine_frames(engine, prompts, max_new_tokens=16)
viz.Stepper(frames, draw_engine, interval_ms=700)

# %% [markdown]
# ## What one step does
#
# `Engine.step()` is one forward pass:
#
# 1. **Schedule a prefill batch**: unfinished chunked prefills first, then waiting requests in
#    order, each only if its pages fit next to the reserve the running requests need for their
#    next decode step; a new request first looks its prompt up in the prefix cache and maps the
#    hit pages into its row. Nobody overtakes the first request that does not fit.
# 2. Otherwise **decode**: every running request adds one token; if the pages for this step are
#    short, retract requests (fewest decoded tokens first) until they fit, always keeping one.
# 3. Allocate slots (`alloc_extend` / `alloc_decode`), write them into the request table, write
#    K/V at those slots (`set_kv_buffer`), attend through `req_to_token`.
# 4. A finished request's full pages go into the prefix cache; its partial last page is freed.
#
# The books stay balanced at every step: each page is free, owned by one running request, or cached.

# %%
print(dict(engine.stats))
engine.check_books()
print("books balanced: every page is free, owned or cached")

# %% [markdown]
# ## Equal to the reference
#
# `generate_reference` runs the same model keeping each request's K/V in one contiguous tensor:
# no pages, no cache, no scheduler. Greedy decoding must give the same tokens, request by request.
# Here the engine's attention is the real Triton kernel of chapter 09 (compiled on a GPU, in the
# interpreter on a CPU), on a short run.

# %%
from memlab.env import kernel_device

few = [p[:20] for p in prompts[: 2 if FAST else 4]]
new_tokens = 4 if FAST else 8
kmodel = TinyLlama(device=kernel_device())  # the same weights (one seed), where the kernels run
kernel_engine = Engine(kmodel, page_size=4, num_tokens=160, max_running=4, max_context=96, chunk_size=32,
                       attention="triton", alloc_backend="triton")
served = kernel_engine.generate(few, new_tokens)
reference = generate_reference(kmodel, few, new_tokens)
for s, r in zip(served, reference):
    print("engine", s, " reference", r)
assert served == reference

# %% [markdown]
# ## Replaying traces: how much does each policy waste?
#
# `memlab.sim` replays a request stream on a pool of slots under four policies: reserve the model's
# maximum length per request (`max`, what systems did before paging), round the final length up
# to a power of two (`pow2`), know the exact final length (`oracle`, unattainable), and allocate
# blocks on demand (`paged`, SGLang and vLLM). Every iteration the pool's slots split into four
# shares: **used** (real KV), **reserved** (held, to be written later), **internal** fragmentation
# (held, never to be written) and **free** (including *external* fragmentation: free but in pieces
# too small for the next request). Pick a workload and a block size.
#
# ![The pool split per policy on the ShareGPT-like workload](https://raw.githubusercontent.com/memlab-course/memlab/v0.1.0/chapters/img/10_policies.png)

# %%
import ipywidgets as W

n_requests = 400 if FAST else 4000
controls = dict(workload_name=W.Dropdown(options=WORKLOADS, description="workload"),
                block_size=W.Dropdown(options=[1, 4, 16, 64, 256], value=16, description="block size"),
                n=W.Dropdown(options=[n_requests], description="requests"))
viz.Explorer(controls, draw_policies, columns=3)

# %% [markdown]
# Paging leaves almost no internal fragmentation (at most a block's tail per request) and no
# external fragmentation (any free block serves any request), so the batch grows and throughput
# with it. The price is preemption: paging admits requests on what they need *now*, so when they
# grow together some must be preempted and recomputed. Larger blocks waste more in each last
# block:

# %%
from memlab import sim
from memlab.viz.style import new_figure

sweep = sim.block_size_sweep(sim.sharegpt_like(n_requests), block_sizes=(1, 4, 16, 64, 256), progress=False)
fig, ax = new_figure(8, 3.6)
sim.plot_sweep(sweep, ax=ax)
viz.show(fig)

# %% [markdown]
# ## What the engines do differently
#
# Both engines page. SGLang's prefix cache is a radix tree over token ids that shares any common
# prefix; vLLM hashes full blocks and shares whole blocks of a prefix. SGLang's scheduler admits
# against `available_size()` minus the running requests' decode reserve and clips each request's
# `max_new_tokens` to what the pool could ever hold; vLLM's admits on the blocks needed now and,
# when a decode step runs short, preempts running requests and recomputes them later. memlab's engine follows
# SGLang's scheduling and borrows vLLM's block hashes for its cache.
#
# ## Admission
#
# The scheduler's admission step, first come, first served: the budget is what is free minus a
# decode reserve per running request; each request costs its prompt in whole pages plus its own
# reserve; a request that could never fit even an empty pool is rejected; the first one that does
# not fit now stops admission, so a later, smaller request cannot overtake it and starve it.
#
# ## Exercise: `exercises/ch10_admission.py`
#
# Write `admit` (8 points). The cell runs yours on a small queue.

# %%
with viz.notebook.exercise("ch10_admission") as ex:
    hooks = ex.CapacityHooks(available=200, token_capacity=400, page_size=16, decode_reserve=16)
    waiting = [ex.Request("a", 40, 50), ex.Request("b", 900, 10), ex.Request("c", 60, 20), ex.Request("d", 100, 20),
               ex.Request("e", 10, 5)]
    admitted, rejected = ex.admit(waiting, num_running=2, hooks=hooks, max_running_requests=8)
    print("admitted", [r.rid for r in admitted], "rejected", [r.rid for r in rejected])
    assert [r.rid for r in admitted] == ["a", "c"] and [r.rid for r in rejected] == ["b"], \
        "d must stop admission: e waits"

# %% [markdown]
# ## Grade
#
# This is the last chapter. `python -m memlab.grade` (no chapter) grades every exercise of the
# course; `--results results.json` writes Gradescope's file.

# %%
from memlab.grade import main as grade

grade(["10"]);
