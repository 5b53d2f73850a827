"""SGLang's radix tree and vLLM's block hashes, side by side on one request stream.

``shared_prefix_conversations`` makes a stream of multi-turn conversations that share a few
system prompts: turn t's prompt is the whole conversation so far plus a new user message, so
each request repeats its conversation's history and its system prompt. ``compare`` replays the
stream, one request at a time, through

- ``RadixDriver``: memlab's ``RadixCache`` (or ``HiRadixCache`` with a host tier) over a paged
  allocator, driven the way SGLang's scheduler does it: match the prompt (all but its last
  token), lock the match, allocate the rest (evicting when short), checkpoint the prompt into the
  tree once it is computed (``checkpoint_kv_cache``), and when the request ends hand its prompt
  and answer to the tree (``release_kv_cache(req, tree, checkpoint=True)``: the answer becomes a
  leaf under the prompt);
- ``VllmDriver``: memlab's vLLM ``KVCacheManager`` (block pool, chained block hashes), driven the
  way vLLM's scheduler does it: ``get_computed_blocks``, ``allocate_slots`` for the prompt, then
  for the answer, ``free``;

at a few cache sizes (tokens of KV the pool holds), and reports for each the hit rate (prompt
tokens whose KV was reused / prompt tokens) and the evictions (tokens of cached KV dropped to
make room). Requests run one after another, so the pool holds cached KV plus one request.

    from memlab.capstone.prefix_compare import compare, shared_prefix_conversations
    print(compare(shared_prefix_conversations(), cache_sizes=(4096, 16384)).table())
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from memlab.common.utils import ceil_align
from memlab.sglang.allocation import checkpoint_kv_cache, release_kv_cache
from memlab.sglang.allocator import make_allocator
from memlab.sglang.radix_cache import RadixCache
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.schedule_policy import match_and_lock


class Turn(NamedTuple):
    rid: str
    prompt: list  # token ids: the conversation so far and the new user message
    answer: list  # the tokens the model generates


def shared_prefix_conversations(
    num_conversations: int = 120,
    turns: int = 4,
    num_system_prompts: int = 4,
    system_len: int = 384,
    user_len=(24, 160),
    answer_len=(24, 160),
    vocab: int = 32000,
    seed: int = 0,
) -> list[Turn]:
    """Conversations that share system prompts, turns interleaved in a random arrival order."""
    rng = random.Random(seed)

    def tokens(n):
        return [rng.randrange(vocab) for _ in range(n)]

    systems = [tokens(system_len) for _ in range(num_system_prompts)]
    history = {c: list(rng.choice(systems)) for c in range(num_conversations)}
    left = {c: turns for c in range(num_conversations)}
    stream = []
    while left:
        c = rng.choice(sorted(left))
        prompt = history[c] + tokens(rng.randint(*user_len))
        answer = tokens(rng.randint(*answer_len))
        stream.append(Turn(f"c{c}-t{turns - left[c]}", prompt, answer))
        history[c] = prompt + answer
        left[c] -= 1
        if not left[c]:
            del left[c]
    return stream


class RadixReq(Req):
    """A request of the replay: SGLang's request books plus what it hit."""

    __slots__ = ("hit_tokens", "host_hit_tokens", "row_pool")

    @property
    def tokens(self) -> list[int]:
        return self.full_untruncated_fill_ids

    @property
    def kv_indices(self):
        """Its row: the slot of each token with KV (the tree's up to ``kv.cache_protected_len``)."""
        return self.row_pool.req_to_token[
            self.kv.req_pool_idx, : self.kv.kv_allocated_len
        ].to(torch.int64)


class RadixDriver:
    """A radix tree driven like SGLang's scheduler. ``on_compute(slots, tokens, start)``, when
    given, is called with the slots a request computes (positions ``start..``), e.g. to write KV.

    The driver is the scheduler: when the tree has no request table yet it gives it one of
    ``max_running`` rows, each ``max_context`` slots wide (by default the pool's size, at most
    4096). A request's prompt and answer are allocated at admission, the prompt computed and
    checkpointed into the tree; ``finish`` releases it as a finished request."""

    def __init__(
        self,
        tree: RadixCache,
        on_compute=None,
        max_running: int = 8,
        max_context: int | None = None,
    ):
        self.tree, self.allocator, self.on_compute = (
            tree,
            tree.token_to_kv_pool_allocator,
            on_compute,
        )
        self.page_size = tree.page_size
        if tree.req_to_token_pool is None:
            width = (
                min(self.allocator.size, 4096) + self.page_size
                if max_context is None
                else max_context
            )
            tree.req_to_token_pool = ReqToTokenPool(
                max_running, width, device=self.allocator.device
            )
        self.req_to_token_pool = tree.req_to_token_pool
        self.evict_requested = (
            0  # the tokens every evict call asked for (the tree may free more)
        )
        self._rids = 0

    def admit(
        self, tokens: Sequence[int], prompt_len: int | None = None
    ) -> RadixReq | None:
        """Match, lock, allocate, compute and checkpoint the prompt: a request that holds KV for
        ``tokens`` (the prompt, ``tokens[:prompt_len]``, and the answer it decodes); None when the
        pool or the request table cannot hold it (then only the LRU order and the tree's shape
        may have changed). Only ``tokens[:prompt_len - 1]`` may hit: the last prompt token is
        computed for its logits."""
        prompt_len = len(tokens) if prompt_len is None else prompt_len
        if len(tokens) > self.allocator.size:
            return None  # not even an empty pool could hold it
        if len(tokens) > self.req_to_token_pool.max_context_len:
            raise ValueError(
                f"a request of {len(tokens)} tokens is wider than the request table "
                f"({self.req_to_token_pool.max_context_len}): give RadixDriver a larger max_context"
            )
        tree, ps = self.tree, self.page_size
        self._rids += 1
        req = RadixReq(self._rids, tokens[:prompt_len])
        req.row_pool = self.req_to_token_pool
        prefix, req.host_hit_tokens = match_and_lock(tree, req)
        req.hit_tokens = len(prefix)
        need = len(tokens) - len(prefix)
        # the prefix is whole pages
        short = ceil_align(need, ps) - self.allocator.available_size()
        if short > 0:
            self.evict_requested += short
            tree.evict(short)
        # The prefix is whole pages, so the new tokens start a page: alloc hands out the very
        # slots alloc_for_extend's alloc_extend would, without the batch machinery.
        new = self.allocator.alloc(ceil_align(need, ps))
        if new is None or self.req_to_token_pool.alloc([req]) is None:
            if new is not None:
                self.allocator.free(new)
            tree.unlock(req.lock)
            return None
        new = new[:need]
        self.req_to_token_pool.write(
            (req.kv.req_pool_idx, slice(0, len(tokens))),
            torch.cat((prefix, new)).to(torch.int32),
        )
        req.kv.kv_allocated_len = req.kv.kv_committed_len = len(tokens)
        req.output_ids = list(tokens[prompt_len:])
        if self.on_compute is not None:
            self.on_compute(new, req.tokens, len(prefix))
        req.extend_end = prompt_len  # the prefill's end: SGLang checkpoints there
        checkpoint_kv_cache(req, tree)
        return req

    def finish(self, req: RadixReq) -> None:
        release_kv_cache(req, self.tree, checkpoint=True)

    @property
    def evicted_tokens(self) -> int:
        return self.tree.num_evicted_tokens


class VllmDriver:
    """vLLM's KV cache manager with ``num_blocks`` usable blocks, driven like vLLM's scheduler."""

    def __init__(self, num_blocks: int, block_size: int, hash_fn: str = "sha256"):
        from memlab.vllm.kv_cache_manager import KVCacheManager

        # + the null block
        self.manager = KVCacheManager(
            num_blocks + 1, block_size=block_size, hash_fn=hash_fn
        )
        self.block_size = block_size

    def run(self, turn: Turn) -> int | None:
        """One request start to end; returns its prompt tokens that hit, None when it cannot fit."""
        from memlab.vllm.request import Request

        mgr = self.manager
        req = Request(turn.rid, turn.prompt, block_hasher=mgr.request_block_hasher)
        hits, n = mgr.get_computed_blocks(req)
        if mgr.allocate_slots(req, req.num_tokens - n, n, hits) is None:
            return None
        req.num_computed_tokens = req.num_tokens
        # the last answer token is sampled, its KV never computed
        if len(turn.answer) > 1:
            req.append_output_token_ids(turn.answer[:-1])
            if mgr.allocate_slots(req, len(turn.answer) - 1) is None:
                mgr.free(req)
                return None
            req.num_computed_tokens = req.num_tokens
        mgr.free(req)
        return n

    @property
    def evicted_tokens(self) -> int:
        return self.manager.block_pool.num_evictions * self.block_size


@dataclass
class ReplayStats:
    name: str
    cache_tokens: int
    prompt_tokens: int = 0
    hit_tokens: int = (
        0  # device hits (and, with a host tier, loaded back: host_hit_tokens of them)
    )
    host_hit_tokens: int = 0
    evicted_tokens: int = 0
    evict_requested: int | None = None  # radix only: what its evict calls asked for

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def over_eviction(self) -> float | None:
        """The share of the evicted tokens beyond what ``evict`` was asked for: the radix tree
        frees whole leaves (vLLM frees exactly the blocks it needs, so it has none)."""
        if self.evict_requested is None or not self.evicted_tokens:
            return None
        return (self.evicted_tokens - self.evict_requested) / self.evicted_tokens


def radix_tree(
    cache_tokens: int,
    page_size: int,
    host_tokens: int = 0,
    write_policy: str = "write_through",
):
    """A radix tree over a fresh allocator of ``cache_tokens`` slots; with ``host_tokens``, a
    HiRadixCache over a tiny real KV pool (1 layer, 1 head of 4) and a host pool of that size."""
    if not host_tokens:
        return RadixCache(make_allocator(cache_tokens, page_size))
    from memlab.sglang.hicache import HiRadixCache, HostKVCache
    from memlab.sglang.kv_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(
        cache_tokens, page_size, torch.float16, head_num=1, head_dim=4, layer_num=1
    )
    alloc = make_allocator(cache_tokens, page_size, kvcache=pool)
    host = HostKVCache(
        pool.host_pool_decls()[0], host_tokens, page_size, pin_memory=False
    )
    return HiRadixCache(
        alloc,
        host,
        write_policy=write_policy,
        io_backend="torch",
        load_back_threshold=page_size,
    )


def replay_radix(
    stream: Sequence[Turn],
    cache_tokens: int,
    page_size: int,
    host_tokens: int = 0,
    name: str | None = None,
) -> ReplayStats:
    driver = RadixDriver(radix_tree(cache_tokens, page_size, host_tokens))
    stats = ReplayStats(
        name
        or f"radix, page {page_size}"
        + (f", host {host_tokens}" if host_tokens else ""),
        cache_tokens,
    )
    for turn in stream:
        req = driver.admit(turn.prompt + turn.answer[:-1], len(turn.prompt))
        if req is None:
            raise RuntimeError(
                f"{turn.rid} ({len(turn.prompt) + len(turn.answer)} tokens) does not fit "
                f"{cache_tokens} slots"
            )
        driver.finish(req)
        stats.prompt_tokens += len(turn.prompt)
        stats.hit_tokens += req.hit_tokens
        stats.host_hit_tokens += req.host_hit_tokens
    stats.evicted_tokens, stats.evict_requested = (
        driver.evicted_tokens,
        driver.evict_requested,
    )
    return stats


def replay_vllm(
    stream: Sequence[Turn], cache_tokens: int, block_size: int
) -> ReplayStats:
    driver = VllmDriver(cache_tokens // block_size, block_size)
    stats = ReplayStats(f"vLLM hashes, block {block_size}", cache_tokens)
    for turn in stream:
        n = driver.run(turn)
        if n is None:
            raise RuntimeError(f"{turn.rid} does not fit {cache_tokens} slots")
        stats.prompt_tokens += len(turn.prompt)
        stats.hit_tokens += n
    stats.evicted_tokens = driver.evicted_tokens
    return stats


@dataclass
class Comparison:
    cache_sizes: list
    rows: dict = field(default_factory=dict)  # name -> [ReplayStats per cache size]
    num_requests: int = 0
    prompt_tokens: int = 0

    def table(self) -> str:
        head = f"{'':32}" + "".join(f"{s:>20,}" for s in self.cache_sizes)
        lines = [
            f"{self.num_requests} requests, {self.prompt_tokens:,} prompt tokens; "
            "per cache size (tokens): hit rate / tokens evicted",
            head,
        ]
        for name, stats in self.rows.items():
            cells = "".join(
                f"{s.hit_rate:>10.1%} /{s.evicted_tokens:>8,}" for s in stats
            )
            lines.append(f"{name:32}{cells}")
        # The radix tree frees whole leaves: the share of its evicted tokens beyond what
        # evict asked.
        for name, stats in self.rows.items():
            if stats[0].evict_requested is not None and "host" not in name:
                lines.append(
                    f"{name + ': beyond the ask':32}"
                    + "".join(
                        f"{'-':>20}"
                        if s.over_eviction is None
                        else f"{s.over_eviction:>20.1%}"
                        for s in stats
                    )
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()

    def plot(self, ax=None):
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(10, 3.6))
        for name, stats in self.rows.items():
            ax[0].plot(
                self.cache_sizes, [100 * s.hit_rate for s in stats], "o-", label=name
            )
            ax[1].plot(
                self.cache_sizes, [s.evicted_tokens for s in stats], "o-", label=name
            )
        for a, label in zip(
            ax, ("prefix hit rate, % of prompt tokens", "tokens of cached KV evicted")
        ):
            a.set_xscale("log", base=2)
            a.set_xlabel("cache size (tokens of KV)")
            a.set_ylabel(label)
            a.grid(True, alpha=0.3)
        ax[0].legend(fontsize=8)
        return ax[0].figure


def compare(
    stream: Sequence[Turn],
    cache_sizes=(2048, 4096, 8192, 16384),
    page_size: int = 16,
    host_tokens: int = 0,
) -> Comparison:
    """Hit rate and evictions of the radix tree (pages of ``page_size`` and of 1 token) and of
    vLLM's block hashes (blocks of ``page_size``), each at every cache size; with
    ``host_tokens``, also the radix tree with a host tier of that many tokens."""
    out = Comparison(
        list(cache_sizes),
        num_requests=len(stream),
        prompt_tokens=sum(len(t.prompt) for t in stream),
    )
    out.rows[f"vLLM hashes, block {page_size}"] = [
        replay_vllm(stream, c, page_size) for c in cache_sizes
    ]
    out.rows[f"radix, page {page_size}"] = [
        replay_radix(stream, c, page_size) for c in cache_sizes
    ]
    out.rows["radix, page 1"] = [replay_radix(stream, c, 1) for c in cache_sizes]
    if host_tokens:
        out.rows[f"radix, page {page_size} + host {host_tokens:,}"] = [
            replay_radix(stream, c, page_size, host_tokens) for c in cache_sizes
        ]
    return out
