"""The bug zoo: classic mistakes, each a small patch to one solution file.

Each row: the variant's name (``<solution file>__<mistake>``), the exercise it breaks, the graded
test meant to catch it, the mistake in words, and the patch: (old, new) pairs of exact text.
``build`` applies a patch to the solution; every ``old`` must occur exactly once, else building
fails with the variant's name, so editing a solution cannot silently disarm the zoo.
tests/test_grader.py grades every variant in place of its solution and checks that the grader
gives it fewer points than the solution, with that test failing.
"""

from pathlib import Path
from typing import NamedTuple

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


class ZooPatchError(ValueError):
    """A variant's patch no longer fits its solution file."""


class Variant(NamedTuple):
    name: str
    exercise: str
    catches: str
    mistake: str
    patch: tuple[tuple[str, str], ...]

    @property
    def solution(self) -> str:
        return self.name.split("__")[0]


def apply_patch(text: str, patch, label: str, where: str) -> str:
    """``text`` with each (old, new) applied in turn; each ``old`` must occur exactly once."""
    for i, (old, new) in enumerate(patch):
        found = text.count(old)
        if found != 1:
            raise ZooPatchError(f"{label}: patch {i} expects its old text exactly once in {where}, found it "
                                f"{found} times: {old!r}; the solution changed, so update the patch")
        text = text.replace(old, new)
    return text


def build(variant: Variant, solutions: Path = SOLUTIONS) -> str:
    """The variant's source: its solution file with the patch applied."""
    path = Path(solutions) / f"{variant.solution}.py"
    return apply_patch(path.read_text(), variant.patch, f"bug zoo variant {variant.name}", path.name)


ZOO = (
    Variant("ch01_alloc_rows__neg_zero_slice", "ch01.alloc_rows", "test_alloc_zero_returns_empty",
            "alloc_rows(0) takes free_slots[-0:], which is the whole list",
            (("        if need_size == 0:\n            return []\n", ""),)),
    Variant("ch01_alloc_rows__generation_reset_on_clear", "ch01.alloc_rows", "test_generation_survives_clear",
            "clear() zeroes req_generation, so a reused row can repeat an old generation",
            (("        self.free_slots = list(range(1, self.size + 1))\n",
              "        self.free_slots = list(range(1, self.size + 1))\n        self.req_generation.zero_()\n"),)),
    Variant("ch01_alloc_rows__rows_from_head", "ch01.alloc_rows", "test_alloc_takes_from_tail",
            "rows taken from the head of free_slots (O(n) per allocation)",
            (("rows = self.free_slots[-need_size:]", "rows = self.free_slots[:need_size]"),
             ("del self.free_slots[-need_size:]", "del self.free_slots[:need_size]"))),
    Variant("ch02_bytes_per_token__k_only", "ch02.bytes_per_token", "test_mha_llama3_8b",
            "MHA bytes count K only, forgetting V",
            (("head_num * (head_dim + v_head_dim) * dtype_bytes", "head_num * head_dim * dtype_bytes"),)),
    Variant("ch02_bytes_per_token__mla_with_v", "ch02.bytes_per_token", "test_mla_deepseek_v3",
            "MLA counted twice, as if it stored a V buffer",
            (("return layer_num * (kv_lora_rank + qk_rope_head_dim)",
              "return 2 * layer_num * (kv_lora_rank + qk_rope_head_dim)"),)),
    Variant("ch03_token_allocator__staged_not_counted", "ch03.token_allocator", "test_staged_frees_counted",
            "available_size() forgets the staged frees in release_pages",
            (("return len(self.free_pages) + len(self.release_pages)", "return len(self.free_pages)"),)),
    Variant("ch03_token_allocator__free_to_head", "ch03.token_allocator", "test_free_appends_fifo",
            "the token allocator puts freed slots at the head (LIFO) instead of the tail",
            (("torch.cat((self.free_pages, free_index))", "torch.cat((free_index, self.free_pages))"),)),
    Variant("ch03_token_allocator__merge_unsorted", "ch03.token_allocator", "test_merge_when_short",
            "merge_and_sort_free merges without sorting",
            (("torch.sort(torch.cat((self.free_pages, self.release_pages))).values",
              "torch.cat((self.free_pages, self.release_pages))"),)),
    Variant("ch04_alloc_extend__last_loc_without_plus_one", "ch04.alloc_extend", "test_continues_from_last_loc",
            "part 1 continues from last_loc instead of last_loc + 1 (overwrites the last token's slot)",
            (("last_loc[req] + 1 + (pos - prefix_lens[req])", "last_loc[req] + (pos - prefix_lens[req])"),)),
    Variant("ch04_alloc_extend__capacity_after_taking", "ch04.alloc_extend", "test_refusal_takes_nothing",
            "pages taken before the capacity check: a refused request still consumes the free list",
            (("        if num_pages > len(self.free_pages):\n",
              "        taken, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]\n"
              "        if len(taken) < num_pages:\n"),
             ("fresh = self.free_pages[k] * ps", "fresh = taken[k] * ps"),
             ("        self.free_pages = self.free_pages[num_pages:]\n", ""))),
    Variant("ch04_alloc_extend__floor_page_count", "ch04.alloc_extend", "test_fresh_requests_whole_and_partial",
            "new pages counted with floor instead of ceil: a partial last page is never paid for",
            (("new_pages = (seq_lens + ps - 1) // ps - (prefix_lens + ps - 1) // ps",
              "new_pages = seq_lens // ps - prefix_lens // ps"),)),
    Variant("ch04_alloc_extend_kernel__part2_without_part1_offset", "ch04.alloc_extend_kernel",
            "test_mixed_random_batches", "part 2 stores at out_start + k, forgetting the n1 tokens of part 1",
            (("tl.store(out_ptr + out_start + n1 + k, page * page_size",
              "tl.store(out_ptr + out_start + k, page * page_size"),)),
    Variant("ch04_alloc_extend_kernel__part2_ignores_page_start", "ch04.alloc_extend_kernel",
            "test_whole_pages_only", "part 2 reads free_pages from 0, not from the request's page_start",
            (("tl.load(free_pages_ptr + page_start + k // page_size", "tl.load(free_pages_ptr + k // page_size"),)),
    Variant("ch05_alloc_decode__opens_at_multiple", "ch05.alloc_decode", "test_crossing_boundary_takes_new_page",
            "a new page opened when seq_len % page_size == 0 instead of == 1",
            (("opens = (seq_lens - 1) % ps == 0", "opens = seq_lens % ps == 0"),)),
    Variant("ch05_paged_free__no_dedup", "ch05.paged_free", "test_free_dedups_pages",
            "free without page dedup: a page is freed once per slot and later handed to several requests",
            (("torch.unique(free_index // self.page_size)", "free_index // self.page_size"),)),
    Variant("ch05_paged_free__segment_unaligned", "ch05.paged_free", "test_free_segment_rejects_unaligned",
            "free_segment accepts an unaligned run, where every page_size-th slot misses or repeats pages",
            (("        if start_pos % self.page_size:\n"
              '            raise ValueError(f"free_segment: start_pos {start_pos} is not a multiple of page_size '
              '{self.page_size}")\n', ""),)),
    Variant("ch05_paged_free__group_no_copy", "ch05.paged_free", "test_free_group_batches_once",
            "a free group queues the caller's tensor without copying it",
            (("self.free_group.append(free_index.clone())", "self.free_group.append(free_index)"),)),
    Variant("ch06_free_queue__forward_order", "ch06.free_queue", "test_reverse_order_hashed_to_tail",
            "a request's blocks freed in forward order: the start of a prefix is evicted first",
            (("for block in reversed(blocks):", "for block in blocks:"),)),
    Variant("ch06_free_queue__unhashed_to_tail", "ch06.free_queue", "test_unhashed_to_head",
            "unhashed blocks appended to the tail, behind cached blocks they should be reused before",
            (("(to_tail if block.block_hash is not None else to_head).append(block)", "to_tail.append(block)"),)),
    Variant("ch06_block_hash__partial_blocks", "ch06.block_hash", "test_full_blocks_only",
            "the last, partial block is hashed too",
            (("for i in range(len(token_ids) // block_size):",
              "for i in range(-(-len(token_ids) // block_size)):"),)),
    Variant("ch06_block_hash__salt_every_block", "ch06.block_hash", "test_salt_first_block_only",
            "the cache salt added to every block's extra keys, not just the first",
            (("if i == 0 and cache_salt:", "if cache_salt:"),)),
    Variant("ch06_block_hash__no_chain", "ch06.block_hash", "test_chain_stands_for_the_prefix",
            "every block hashed with the seed as parent: a hash no longer stands for its prefix",
            (("parent = hash_fn((parent, tuple(token_ids[start:end]), tuple(keys) if keys else None))\n"
              "        hashes.append(parent)\n",
              "hashes.append(hash_fn((parent, tuple(token_ids[start:end]), tuple(keys) if keys else None)))\n"),)),
    Variant("ch06_slot_mapping__block_index_swapped", "ch06.slot_mapping", "test_small_batch_by_hand",
            "block index and offset swapped: pos % block_size used to index the block table",
            (("req * block_table_stride + pos // block_size", "req * block_table_stride + pos % block_size"),
             ("* block_size + pos % block_size, mask=live)", "* block_size + pos // block_size, mask=live)"))),
    Variant("ch07_swa_release__frees_padding", "ch07.swa_release", "test_take_swa_slots_skips_padding",
            "the SWA padding id 0 (no SWA slot) handed to the free list",
            (("    swa = swa[swa > 0]\n", ""),)),
    Variant("ch07_swa_release__no_page_floor", "ch07.swa_release", "test_release_whole_pages_out_of_window",
            "out-of-window release not rounded down to pages: a page still in use is released",
            (("end = (seq_len - sliding_window) // ps * ps", "end = seq_len - sliding_window"),)),
    Variant("ch07_mamba_tracking__partial_reset", "ch07.mamba_tracking", "test_free_resets_every_field",
            "free_row resets the slots but not the ping-pong index and last tracked length",
            (("        self.next_track_idx[row] = 0\n        self.last_track_seqlen[row] = -1\n", ""),)),
    Variant("ch07_mamba_tracking__no_zeroing", "ch07.mamba_tracking", "test_slots_zeroed_before_reuse",
            "state slots handed out without zeroing: the previous owner's state leaks",
            (("        self.state[slots] = 0\n", ""),)),
    Variant("ch08_sizing__reserve_not_doubled", "ch08.sizing", "test_reserve_doubled",
            "the doubled decode reserve forgotten (SGLang always reserves two steps' slots)",
            (("    return 2 * n\n", "    return n\n"),)),
    Variant("ch08_sizing__no_page_margin", "ch08.sizing", "test_max_new_tokens_formula",
            "max_new_tokens_for_memory without the extra page and slot",
            (("token_capacity - paged_input - page_size - 1))", "token_capacity - paged_input))"),)),
    Variant("ch09_paged_gather__row_is_batch_index", "ch09.paged_gather", "test_matches_dense_attention",
            "the gather reads request-table row b instead of req_pool_indices[b]",
            (("row = tl.load(req_pool_indices_ptr + b).to(tl.int64)", "row = b.to(tl.int64)"),)),
    Variant("ch10_admission__overtaking", "ch10.admission", "test_no_overtaking",
            "admission skips a request that does not fit and lets later ones overtake it",
            (("        if cost > budget:\n            break\n", "        if cost > budget:\n            continue\n"),)),
    Variant("ch10_admission__running_reserve_forgotten", "ch10.admission", "test_running_requests_keep_their_reserve",
            "admission forgets the decode reserve of the requests already running",
            (("budget = hooks.available_size() - num_running * hooks.decode_reserve",
              "budget = hooks.available_size()"),)),

    # -- the mistakes of issue 11 and their kind: exact fits, types, inputs changed in place,
    # truthiness for None, layouts, writes one past the end, edge requests, 32-bit addresses
    Variant("ch01_alloc_rows__exact_fit_refused", "ch01.alloc_rows", "test_all_or_nothing",
            "alloc_rows refuses when exactly enough rows are free (>= where 'fewer than' is meant)",
            (("        if need_size > len(self.free_slots):\n", "        if need_size >= len(self.free_slots):\n"),)),
    Variant("ch03_token_allocator__merge_on_exact_fit", "ch03.token_allocator", "test_no_merge_when_enough",
            "the staged slots merged when free_pages holds exactly enough (>= instead of >)",
            (("if self.need_sort and need_size > len(self.free_pages):",
              "if self.need_sort and need_size >= len(self.free_pages):"),)),
    Variant("ch03_token_allocator__float_empty", "ch03.token_allocator", "test_fresh_allocation_from_head",
            "alloc(0) returns torch.tensor([]), a float32 tensor, where an int64 one is promised",
            (("        if self.need_sort and need_size > len(self.free_pages):\n",
              "        if need_size == 0:\n            return torch.tensor([])\n"
              "        if self.need_sort and need_size > len(self.free_pages):\n"),)),
    Variant("ch03_token_allocator__merge_undone", "ch03.token_allocator", "test_refusal",
            "need_sort merges only when the merge would make the call succeed (SGLang merges, then refuses)",
            (("if self.need_sort and need_size > len(self.free_pages):",
              "if self.need_sort and len(self.free_pages) < need_size <= self.available_size():"),)),
    Variant("ch04_alloc_extend__returns_list", "ch04.alloc_extend", "test_fresh_requests_whole_and_partial",
            "alloc_extend returns a Python list of slots instead of an int64 tensor",
            (("        self.free_pages = self.free_pages[num_pages:]\n        return out\n",
              "        self.free_pages = self.free_pages[num_pages:]\n        return out.tolist()\n"),)),
    Variant("ch04_alloc_extend__seq_lens_in_place", "ch04.alloc_extend", "test_continues_from_last_loc",
            "ext = seq_lens; ext -= prefix_lens: the right slots, and the caller's seq_lens corrupted",
            (("        ext = seq_lens - prefix_lens\n", "        ext = seq_lens\n        ext -= prefix_lens\n"),)),
    Variant("ch04_alloc_extend_kernel__unmasked_page_load", "ch04.alloc_extend_kernel", "test_whole_pages_only",
            "part 2 loads free_pages without the mask: past the pages the batch owns (the store is masked)",
            (("page = tl.load(free_pages_ptr + page_start + k // page_size, mask=live, other=0)",
              "page = tl.load(free_pages_ptr + page_start + k // page_size)"),)),
    Variant("ch04_alloc_extend_kernel__inclusive_mask", "ch04.alloc_extend_kernel", "test_whole_pages_only",
            "part 2 masked with k <= n2: one token too many, written past the request's part 2",
            (("        live = k < n2\n", "        live = k <= n2\n"),)),
    Variant("ch05_alloc_decode__last_loc_in_place", "ch05.alloc_decode", "test_within_page_continues",
            "out = last_loc; out += 1: the caller's last_loc is changed in place",
            (("        out = last_loc + 1\n", "        out = last_loc\n        out += 1\n"),)),
    Variant("ch05_alloc_decode__exact_fit_refused", "ch05.alloc_decode", "test_refusal",
            "alloc_decode refuses when exactly enough pages are free",
            (("        if need > len(self.free_pages):\n", "        if need >= len(self.free_pages):\n"),)),
    Variant("ch05_paged_free__group_truthiness", "ch05.paged_free", "test_free_group_batches_once",
            "an open free group tested by truthiness: while it is still empty ([]) frees are released at once",
            (("        if self.free_group is not None:\n            self.free_group.append(free_index.clone())",
              "        if self.free_group:\n            self.free_group.append(free_index.clone())"),)),
    Variant("ch06_free_queue__hash_truthiness", "ch06.free_queue", "test_unhashed_to_head",
            "a block whose hash is 0 or b'' treated as unhashed (truthiness instead of `is not None`)",
            (("(to_tail if block.block_hash is not None else to_head).append(block)",
              "(to_tail if block.block_hash else to_head).append(block)"),)),
    Variant("ch06_block_hash__empty_salt_hashed", "ch06.block_hash", "test_salt_first_block_only",
            "cache_salt='' added as a salt (`is not None` where vLLM tests truth)",
            (("if i == 0 and cache_salt:", "if i == 0 and cache_salt is not None:"),)),
    Variant("ch06_slot_mapping__inclusive_mask", "ch06.slot_mapping", "test_padding_only_after_requests",
            "the request's tokens masked with i <= end: one slot written past them (hidden when padding follows)",
            (("            live = i < end\n", "            live = i <= end\n"),)),
    Variant("ch06_slot_mapping__int32_slot", "ch06.slot_mapping", "test_random_batches",
            "block * block_size computed in int32: wraps for block ids of a big pool",
            (("block.to(tl.int64) * block_size + pos % block_size", "block * block_size + pos % block_size"),)),
    Variant("ch07_mamba_tracking__frees_empty_row_padding", "ch07.mamba_tracking", "test_free_resets_every_field",
            "free_row gives back every entry of the row, zeros included: slot 0 (padding) reaches the free list",
            (("self.free_slots = torch.cat((self.free_slots, owned[owned > 0]))",
              "self.free_slots = torch.cat((self.free_slots, owned))"),)),
    Variant("ch07_mamba_tracking__exact_fit_refused", "ch07.mamba_tracking", "test_alloc_all_or_nothing",
            "alloc_row refuses when exactly 1 + tracking slots are free",
            (("        if need > len(self.free_slots):\n", "        if need >= len(self.free_slots):\n"),)),
    Variant("ch08_sizing__float_pool_size", "ch08.sizing", "test_pool_size_floored_to_pages",
            "pool_size_tokens divides with / and returns a float",
            (("return budget_bytes // bytes_per_token // page_size * page_size",
              "return budget_bytes / bytes_per_token // page_size * page_size"),)),
    Variant("ch09_paged_gather__v_with_k_strides", "ch09.paged_gather", "test_k_and_v_layouts_differ",
            "V addressed with K's strides (the same when K and V share one contiguous layout)",
            (("v_ptr + slots[:, None] * stride_vs + kv_h * stride_vh", "v_ptr + slots[:, None] * stride_ks + kv_h * stride_kh"),)),
    Variant("ch09_paged_gather__int32_addresses", "ch09.paged_gather", "test_addresses_in_64_bit",
            "the slots kept int32: slot * stride_ks wraps past 2^31 elements (a pool of a few million tokens)",
            (("slots = tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=live, other=0).to(tl.int64)",
              "slots = tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=live, other=0)"),)),
    Variant("ch10_admission__prefill_only_rejected", "ch10.admission", "test_reject_and_clip",
            "a prefill-only request (max_new_tokens 0, clip 0) rejected even in an empty pool",
            (("        if clip == 0 and r.max_new_tokens > 0:\n", "        if clip == 0:\n"),)),
    Variant("ch10_admission__exact_budget_refused", "ch10.admission", "test_admits_in_order_until_budget",
            "a request whose cost equals the budget left is not admitted (>= instead of >)",
            (("        if cost > budget:\n            break\n", "        if cost >= budget:\n            break\n"),)),
    Variant("ch11_radix_match__split_parent_not_relinked", "ch11.radix_match", "test_split_by_hand",
            "the split forgets to point the parent's entry at the new node: the prefix hangs in the air",
            (("    child.parent.children[tree.child_key(child.key)] = new_node\n", ""),)),
    Variant("ch11_radix_match__split_drops_locks", "ch11.radix_match", "test_split_keeps_locks",
            "the new node of a split starts unlocked, so eviction can take a prefix a request uses",
            (("    new_node.lock_ref = child.lock_ref\n", ""),)),
    Variant("ch11_radix_match__child_by_token", "ch11.radix_match", "test_match_whole_pages",
            "children looked up by their first token even with pages (they are keyed by their first page)",
            (("        child = node.children.get(tree.child_key(key, matched))\n",
              "        child = node.children.get(key[matched])\n"),)),
    Variant("ch11_radix_match__no_touch", "ch11.radix_match", "test_match_refreshes_access_time",
            "a match does not refresh the access time: LRU evicts the prefix everyone uses",
            (("        child.last_access_time = now\n", ""),)),
    Variant("ch11_radix_match__mru", "ch11.radix_match", "test_evict_lru_order",
            "eviction takes the most recently used leaf first",
            (("    heap = [(n.last_access_time, id(n), n) for n in tree.evictable_leaves()]",
              "    heap = [(-n.last_access_time, id(n), n) for n in tree.evictable_leaves()]"),
             ("heapq.heappush(heap, (parent.last_access_time, id(parent), parent))",
              "heapq.heappush(heap, (-parent.last_access_time, id(parent), parent))"))),
    Variant("ch11_radix_match__no_climb", "ch11.radix_match", "test_evict_skips_locked_and_climbs",
            "a parent left without children is not considered in the same call: evict frees too little",
            (("        if parent is not tree.root and not parent.children and parent.lock_ref == 0:\n"
              "            heapq.heappush(heap, (parent.last_access_time, id(parent), parent))\n", ""),)),
)
