"""The bug zoo: classic mistakes, each a small patch to one solution file.

Each row: the variant's name (``<solution file>__<mistake>``), the exercise it breaks,
the graded test meant to catch it, the mistake in words, and the patch: (old, new) pairs
of exact text. ``build`` applies a patch to the solution; every ``old`` must occur
exactly once, else building fails with the variant's name, so editing a solution cannot
silently disarm the zoo. tests/course/grading/test_grader.py grades every variant in
place of its solution and checks that the grader gives it fewer points than the
solution, with that test failing.
"""

from pathlib import Path
from typing import NamedTuple

SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"


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
            raise ZooPatchError(
                f"{label}: patch {i} expects its old text exactly once in {where}, found it "
                f"{found} times: {old!r}; the solution changed, so update the patch"
            )
        text = text.replace(old, new)
    return text


def build(variant: Variant, solutions: Path = SOLUTIONS) -> str:
    """The variant's source: its solution file with the patch applied."""
    path = Path(solutions) / f"{variant.solution}.py"
    return apply_patch(
        path.read_text(), variant.patch, f"bug zoo variant {variant.name}", path.name
    )


ZOO = (
    Variant(
        "ch01_alloc_rows__neg_zero_slice",
        "ch01.alloc_rows",
        "test_alloc_zero_returns_empty",
        "alloc_rows(0) takes free_slots[-0:], which is the whole list",
        (("        if need_size == 0:\n            return []\n", ""),),
    ),
    Variant(
        "ch01_alloc_rows__generation_reset_on_clear",
        "ch01.alloc_rows",
        "test_generation_survives_clear",
        "clear() zeroes req_generation, so a reused row can repeat an old generation",
        (
            (
                "        self.free_slots = list(range(1, self.size + 1))\n",
                "        self.free_slots = list(range(1, self.size + 1))\n        "
                "self.req_generation.zero_()\n",
            ),
        ),
    ),
    Variant(
        "ch01_alloc_rows__rows_from_head",
        "ch01.alloc_rows",
        "test_alloc_takes_from_tail",
        "rows taken from the head of free_slots (O(n) per allocation)",
        (
            (
                "rows = self.free_slots[-need_size:]",
                "rows = self.free_slots[:need_size]",
            ),
            ("del self.free_slots[-need_size:]", "del self.free_slots[:need_size]"),
        ),
    ),
    Variant(
        "ch02_bytes_per_token__k_only",
        "ch02.bytes_per_token",
        "test_mha_llama3_8b",
        "MHA bytes count K only, forgetting V",
        (
            (
                "head_num * (head_dim + v_head_dim) * dtype_bytes",
                "head_num * head_dim * dtype_bytes",
            ),
        ),
    ),
    Variant(
        "ch02_bytes_per_token__mla_with_v",
        "ch02.bytes_per_token",
        "test_mla_deepseek_v3",
        "MLA counted twice, as if it stored a V buffer",
        (
            (
                "return layer_num * (kv_lora_rank + qk_rope_head_dim)",
                "return 2 * layer_num * (kv_lora_rank + qk_rope_head_dim)",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__staged_not_counted",
        "ch03.token_allocator",
        "test_staged_frees_counted",
        "available_size() forgets the staged frees in release_pages",
        (
            (
                "return len(self.free_pages) + len(self.release_pages)",
                "return len(self.free_pages)",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__free_to_head",
        "ch03.token_allocator",
        "test_free_appends_fifo",
        "the token allocator puts freed slots at the head (LIFO) instead of the tail",
        (
            (
                "torch.cat((self.free_pages, free_index))",
                "torch.cat((free_index, self.free_pages))",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__merge_unsorted",
        "ch03.token_allocator",
        "test_merge_when_short",
        "merge_and_sort_free merges without sorting",
        (
            (
                "        Sorted, the next allocations get runs of neighbouring slots. See chapter "
                "03\n        (merge and sort).\n",
                "        Sorted, the next allocations get runs of neighbouring slots. See chapter "
                "03 (merge and sort).\n",
            ),
            (
                "        self.free_pages = torch.sort(\n            torch.cat((self.free_pages, "
                "self.release_pages))\n        ).values\n",
                "        self.free_pages = torch.cat((self.free_pages, self.release_pages))\n",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__last_loc_without_plus_one",
        "ch04.alloc_extend",
        "test_continues_from_last_loc",
        "part 1 continues from last_loc instead of last_loc + 1 (overwrites the last token's slot)",
        (
            (
                "last_loc[req] + 1 + (pos - prefix_lens[req])",
                "last_loc[req] + (pos - prefix_lens[req])",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__capacity_after_taking",
        "ch04.alloc_extend",
        "test_refusal_takes_nothing",
        "pages taken before the capacity check: a refused request still consumes the free list",
        (
            (
                "        if num_pages > len(self.free_pages):\n",
                "        taken, self.free_pages = self.free_pages[:num_pages], "
                "self.free_pages[num_pages:]\n"
                "        if len(taken) < num_pages:\n",
            ),
            ("fresh = self.free_pages[k] * ps", "fresh = taken[k] * ps"),
            ("        self.free_pages = self.free_pages[num_pages:]\n", ""),
        ),
    ),
    Variant(
        "ch04_alloc_extend__floor_page_count",
        "ch04.alloc_extend",
        "test_fresh_requests_whole_and_partial",
        "new pages counted with floor instead of ceil: a partial last page is never paid for",
        (
            (
                "new_pages = (seq_lens + ps - 1) // ps - (prefix_lens + ps - 1) // ps",
                "new_pages = seq_lens // ps - prefix_lens // ps",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend_kernel__part2_without_part1_offset",
        "ch04.alloc_extend_kernel",
        "test_mixed_random_batches",
        "part 2 stores at out_start + k, forgetting the n1 tokens of part 1",
        (
            (
                "        tl.store(\n            out_ptr + out_start + n1 + k, page * page_size + "
                "k % page_size, mask=live\n        )\n",
                "        tl.store(out_ptr + out_start + k, page * page_size + k % page_size, "
                "mask=live)\n",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend_kernel__part2_ignores_page_start",
        "ch04.alloc_extend_kernel",
        "test_whole_pages_only",
        "part 2 reads free_pages from 0, not from the request's page_start",
        (
            (
                "tl.load(free_pages_ptr + page_start + k // page_size",
                "tl.load(free_pages_ptr + k // page_size",
            ),
        ),
    ),
    Variant(
        "ch05_alloc_decode__opens_at_multiple",
        "ch05.alloc_decode",
        "test_crossing_boundary_takes_new_page",
        "a new page opened when seq_len % page_size == 0 instead of == 1",
        (("opens = (seq_lens - 1) % ps == 0", "opens = seq_lens % ps == 0"),),
    ),
    Variant(
        "ch05_paged_free__no_dedup",
        "ch05.paged_free",
        "test_free_dedups_pages",
        "free without page dedup: a page is freed once per slot and later handed to several "
        "requests",
        (
            (
                "torch.unique(free_index // self.page_size)",
                "free_index // self.page_size",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__segment_unaligned",
        "ch05.paged_free",
        "test_free_segment_rejects_unaligned",
        "free_segment accepts an unaligned run, where every page_size-th slot misses or repeats "
        "pages",
        (
            (
                "        if start_pos % self.page_size:\n"
                "            raise ValueError(\n"
                '                f"free_segment: start_pos {start_pos} is not a multiple of '
                'page_size "\n'
                '                f"{self.page_size}"\n'
                "            )\n",
                "",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__group_no_copy",
        "ch05.paged_free",
        "test_free_group_batches_once",
        "a free group queues the caller's tensor without copying it",
        (
            (
                "self.free_group.append(free_index.clone())",
                "self.free_group.append(free_index)",
            ),
        ),
    ),
    Variant(
        "ch06_free_queue__forward_order",
        "ch06.free_queue",
        "test_reverse_order_hashed_to_tail",
        "a request's blocks freed in forward order: the start of a prefix is evicted first",
        (("for block in reversed(blocks):", "for block in blocks:"),),
    ),
    Variant(
        "ch06_free_queue__unhashed_to_tail",
        "ch06.free_queue",
        "test_unhashed_to_head",
        "unhashed blocks appended to the tail, behind cached blocks they should be reused before",
        (
            (
                "(to_tail if block.block_hash is not None else to_head).append(block)",
                "to_tail.append(block)",
            ),
        ),
    ),
    Variant(
        "ch06_block_hash__partial_blocks",
        "ch06.block_hash",
        "test_full_blocks_only",
        "the last, partial block is hashed too",
        (
            (
                "for i in range(len(token_ids) // block_size):",
                "for i in range(-(-len(token_ids) // block_size)):",
            ),
        ),
    ),
    Variant(
        "ch06_block_hash__salt_every_block",
        "ch06.block_hash",
        "test_salt_first_block_only",
        "the cache salt added to every block's extra keys, not just the first",
        (("if i == 0 and cache_salt:", "if cache_salt:"),),
    ),
    Variant(
        "ch06_block_hash__no_chain",
        "ch06.block_hash",
        "test_chain_stands_for_the_prefix",
        "every block hashed with the seed as parent: a hash no longer stands for its prefix",
        (
            (
                "        parent = hash_fn(\n            (parent, tuple(token_ids[start:end]), "
                "tuple(keys) if keys else None)\n",
                "        hashes.append(\n            hash_fn(\n                (parent, "
                "tuple(token_ids[start:end]), tuple(keys) if keys else None)\n            )\n",
            ),
            ("        hashes.append(parent)\n", ""),
        ),
    ),
    Variant(
        "ch06_slot_mapping__block_index_swapped",
        "ch06.slot_mapping",
        "test_small_batch_by_hand",
        "block index and offset swapped: pos % block_size used to index the block table",
        (
            (
                "                block_table_ptr + req * block_table_stride + pos // block_size,\n",
                "                block_table_ptr + req * block_table_stride + pos % block_size,\n",
            ),
            (
                "                block.to(tl.int64) * block_size + pos % block_size,\n",
                "                block.to(tl.int64) * block_size + pos // block_size,\n",
            ),
        ),
    ),
    Variant(
        "ch07_swa_release__frees_padding",
        "ch07.swa_release",
        "test_take_swa_slots_skips_padding",
        "the SWA padding id 0 (no SWA slot) handed to the free list",
        (("    swa = swa[swa > 0]\n", ""),),
    ),
    Variant(
        "ch07_swa_release__no_page_floor",
        "ch07.swa_release",
        "test_release_whole_pages_out_of_window",
        "out-of-window release not rounded down to pages: a page still in use is released",
        (
            (
                "end = (seq_len - sliding_window) // ps * ps",
                "end = seq_len - sliding_window",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__partial_reset",
        "ch07.mamba_tracking",
        "test_free_resets_every_field",
        "free_row resets the slots but not the ping-pong index and last tracked length",
        (
            (
                "        self.next_track_idx[row] = 0\n        self.last_track_seqlen[row] = -1\n",
                "",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__no_zeroing",
        "ch07.mamba_tracking",
        "test_slots_zeroed_before_reuse",
        "state slots handed out without zeroing: the previous owner's state leaks",
        (("        self.state[slots] = 0\n", ""),),
    ),
    Variant(
        "ch08_sizing__reserve_not_doubled",
        "ch08.sizing",
        "test_reserve_doubled",
        "the doubled decode reserve forgotten (SGLang always reserves two steps' slots)",
        (("    return 2 * n\n", "    return n\n"),),
    ),
    Variant(
        "ch08_sizing__no_page_margin",
        "ch08.sizing",
        "test_max_new_tokens_formula",
        "max_new_tokens_for_memory without the extra page and slot",
        (
            (
                "token_capacity - paged_input - page_size - 1))",
                "token_capacity - paged_input))",
            ),
        ),
    ),
    Variant(
        "ch09_paged_gather__row_is_batch_index",
        "ch09.paged_gather",
        "test_matches_dense_attention",
        "the gather reads request-table row b instead of req_pool_indices[b]",
        (
            (
                "row = tl.load(req_pool_indices_ptr + b).to(tl.int64)",
                "row = b.to(tl.int64)",
            ),
        ),
    ),
    Variant(
        "ch10_admission__overtaking",
        "ch10.admission",
        "test_no_overtaking",
        "admission skips a request that does not fit and lets later ones overtake it",
        (
            (
                "        if cost > budget:\n            break\n",
                "        if cost > budget:\n            continue\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__running_reserve_forgotten",
        "ch10.admission",
        "test_running_requests_keep_their_reserve",
        "admission forgets the decode reserve of the requests already running",
        (
            (
                "    budget = hooks.available_size() - ps * sum(\n        1 for s in "
                "running_seq_lens if s % ps == 0\n    )\n",
                "    budget = hooks.available_size()\n",
            ),
        ),
    ),
    # -- the mistakes of issue 11 and their kind: exact fits, types, inputs changed in place,
    # truthiness for None, layouts, writes one past the end, edge requests, 32-bit addresses
    Variant(
        "ch01_alloc_rows__exact_fit_refused",
        "ch01.alloc_rows",
        "test_all_or_nothing",
        "alloc_rows refuses when exactly enough rows are free (>= where 'fewer than' is meant)",
        (
            (
                "        if need_size > len(self.free_slots):\n",
                "        if need_size >= len(self.free_slots):\n",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__merge_on_exact_fit",
        "ch03.token_allocator",
        "test_no_merge_when_enough",
        "the staged slots merged when free_pages holds exactly enough (>= instead of >)",
        (
            (
                "if self.need_sort and need_size > len(self.free_pages):",
                "if self.need_sort and need_size >= len(self.free_pages):",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__float_empty",
        "ch03.token_allocator",
        "test_fresh_allocation_from_head",
        "alloc(0) returns torch.tensor([]), a float32 tensor, where an int64 one is promised",
        (
            (
                "        if self.need_sort and need_size > len(self.free_pages):\n",
                "        if need_size == 0:\n            return torch.tensor([])\n"
                "        if self.need_sort and need_size > len(self.free_pages):\n",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__merge_undone",
        "ch03.token_allocator",
        "test_refusal",
        "need_sort merges only when the merge would make the call succeed (SGLang merges, then "
        "refuses)",
        (
            (
                "if self.need_sort and need_size > len(self.free_pages):",
                "if self.need_sort and len(self.free_pages) < need_size <= self.available_size():",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__returns_list",
        "ch04.alloc_extend",
        "test_fresh_requests_whole_and_partial",
        "alloc_extend returns a Python list of slots instead of an int64 tensor",
        (
            (
                "        self.free_pages = self.free_pages[num_pages:]\n        return out\n",
                "        self.free_pages = self.free_pages[num_pages:]\n        return "
                "out.tolist()\n",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__seq_lens_in_place",
        "ch04.alloc_extend",
        "test_continues_from_last_loc",
        "ext = seq_lens; ext -= prefix_lens: the right slots, and the caller's seq_lens corrupted",
        (
            (
                "        ext = seq_lens - prefix_lens\n",
                "        ext = seq_lens\n        ext -= prefix_lens\n",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend_kernel__unmasked_page_load",
        "ch04.alloc_extend_kernel",
        "test_whole_pages_only",
        "part 2 loads free_pages without the mask: past the pages the batch owns (the store is "
        "masked)",
        (
            (
                "page = tl.load(free_pages_ptr + page_start + k // page_size, mask=live, other=0)",
                "page = tl.load(free_pages_ptr + page_start + k // page_size)",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend_kernel__inclusive_mask",
        "ch04.alloc_extend_kernel",
        "test_whole_pages_only",
        "part 2 masked with k <= n2: one token too many, written past the request's part 2",
        (("        live = k < n2\n", "        live = k <= n2\n"),),
    ),
    Variant(
        "ch05_alloc_decode__last_loc_in_place",
        "ch05.alloc_decode",
        "test_within_page_continues",
        "out = last_loc; out += 1: the caller's last_loc is changed in place",
        (
            (
                "        out = last_loc + 1\n",
                "        out = last_loc\n        out += 1\n",
            ),
        ),
    ),
    Variant(
        "ch05_alloc_decode__exact_fit_refused",
        "ch05.alloc_decode",
        "test_refusal",
        "alloc_decode refuses when exactly enough pages are free",
        (
            (
                "        if need > len(self.free_pages):\n",
                "        if need >= len(self.free_pages):\n",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__group_truthiness",
        "ch05.paged_free",
        "test_free_group_batches_once",
        "an open free group tested by truthiness: while it is still empty ([]) frees are released "
        "at once",
        (
            (
                "        if self.free_group is not None:\n            "
                "self.free_group.append(free_index.clone())",
                "        if self.free_group:\n            "
                "self.free_group.append(free_index.clone())",
            ),
        ),
    ),
    Variant(
        "ch06_free_queue__hash_truthiness",
        "ch06.free_queue",
        "test_unhashed_to_head",
        "a block whose hash is 0 or b'' treated as unhashed (truthiness instead of `is not None`)",
        (
            (
                "(to_tail if block.block_hash is not None else to_head).append(block)",
                "(to_tail if block.block_hash else to_head).append(block)",
            ),
        ),
    ),
    Variant(
        "ch06_block_hash__empty_salt_hashed",
        "ch06.block_hash",
        "test_salt_first_block_only",
        "cache_salt='' added as a salt (`is not None` where vLLM tests truth)",
        (("if i == 0 and cache_salt:", "if i == 0 and cache_salt is not None:"),),
    ),
    Variant(
        "ch06_slot_mapping__inclusive_mask",
        "ch06.slot_mapping",
        "test_padding_only_after_requests",
        "the request's tokens masked with i <= end: one slot written past them (hidden when "
        "padding follows)",
        (("            live = i < end\n", "            live = i <= end\n"),),
    ),
    Variant(
        "ch06_slot_mapping__int32_slot",
        "ch06.slot_mapping",
        "test_random_batches",
        "block * block_size computed in int32: wraps for block ids of a big pool",
        (
            (
                "block.to(tl.int64) * block_size + pos % block_size",
                "block * block_size + pos % block_size",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__frees_empty_row_padding",
        "ch07.mamba_tracking",
        "test_free_resets_every_field",
        "free_row gives back every entry of the row, zeros included: slot 0 (padding) reaches the "
        "free list",
        (
            (
                "self.free_slots = torch.cat((self.free_slots, owned[owned > 0]))",
                "self.free_slots = torch.cat((self.free_slots, owned))",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__exact_fit_refused",
        "ch07.mamba_tracking",
        "test_alloc_all_or_nothing",
        "alloc_row refuses when exactly 1 + tracking slots are free",
        (
            (
                "        if need > len(self.free_slots):\n",
                "        if need >= len(self.free_slots):\n",
            ),
        ),
    ),
    Variant(
        "ch08_sizing__float_pool_size",
        "ch08.sizing",
        "test_pool_size_floored_to_pages",
        "pool_size_tokens divides with / and returns a float",
        (
            (
                "return budget_bytes // bytes_per_token // page_size * page_size",
                "return budget_bytes / bytes_per_token // page_size * page_size",
            ),
        ),
    ),
    Variant(
        "ch09_paged_gather__v_with_k_strides",
        "ch09.paged_gather",
        "test_k_and_v_layouts_differ",
        "V addressed with K's strides (the same when K and V share one contiguous layout)",
        (
            (
                "v_ptr + slots[:, None] * stride_vs + kv_h * stride_vh",
                "v_ptr + slots[:, None] * stride_ks + kv_h * stride_kh",
            ),
        ),
    ),
    Variant(
        "ch09_paged_gather__int32_addresses",
        "ch09.paged_gather",
        "test_addresses_in_64_bit",
        "the slots kept int32: slot * stride_ks wraps past 2^31 elements (a pool of a few million "
        "tokens)",
        (
            (
                "        slots = tl.load(\n            req_to_token_ptr + row * stride_r2t + pos, "
                "mask=live, other=0\n        ).to(tl.int64)\n",
                "        slots = tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=live, "
                "other=0)\n",
            ),
        ),
    ),
    Variant(
        "ch09_paged_gather__int32_through_stride_aliases",
        "ch09.paged_gather",
        "test_addresses_in_64_bit",
        "the slots kept int32, the strides renamed: sk = stride_ks still multiplies in 32 bits",
        (
            (
                "        slots = tl.load(\n            req_to_token_ptr + row * stride_r2t + pos, "
                "mask=live, other=0\n        ).to(tl.int64)\n",
                "        slots = tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=live, "
                "other=0)\n        sk = stride_ks\n        sv = stride_vs\n",
            ),
            (
                "            k_ptr + slots[:, None] * stride_ks + kv_h * stride_kh + d[None, :],\n",
                "            k_ptr + slots[:, None] * sk + kv_h * stride_kh + d[None, :],\n",
            ),
            (
                "            v_ptr + slots[:, None] * stride_vs + kv_h * stride_vh + d[None, :],\n",
                "            v_ptr + slots[:, None] * sv + kv_h * stride_vh + d[None, :],\n",
            ),
        ),
    ),
    Variant(
        "ch09_paged_gather__int64_cast_then_reloaded",
        "ch09.paged_gather",
        "test_addresses_in_64_bit",
        "the slots cast to int64, then loaded again as int32 before the addresses are computed",
        (
            (
                "        ).to(tl.int64)\n        k = tl.load(\n",
                "        ).to(tl.int64)\n        slots = tl.load(req_to_token_ptr + row * "
                "stride_r2t + pos, mask=live, other=0)\n        k = tl.load(\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__prefill_only_rejected",
        "ch10.admission",
        "test_reject_and_clip",
        "a prefill-only request (max_new_tokens 0, clip 0) rejected even in an empty pool",
        (
            (
                "        if clip == 0 and r.max_new_tokens > 0:\n",
                "        if clip == 0:\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__exact_budget_refused",
        "ch10.admission",
        "test_admits_in_order_until_budget",
        "a request whose cost equals the budget left is not admitted (>= instead of >)",
        (
            (
                "        if cost > budget:\n            break\n",
                "        if cost >= budget:\n            break\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_parent_not_relinked",
        "ch11.radix_match",
        "test_split_by_hand",
        "the split forgets to point the parent's entry at the new node: the prefix hangs in the "
        "air",
        (("    child.parent.children[tree.child_key(child.key)] = new_node\n", ""),),
    ),
    Variant(
        "ch11_radix_match__split_drops_locks",
        "ch11.radix_match",
        "test_split_keeps_locks",
        "the new node of a split starts unlocked, so eviction can take a prefix a request uses",
        (("    new_node.lock_ref = child.lock_ref\n", ""),),
    ),
    Variant(
        "ch11_radix_match__child_by_token",
        "ch11.radix_match",
        "test_match_whole_pages",
        "children looked up by their first token even with pages (they are keyed by their first "
        "page)",
        (
            (
                "        child = node.children.get(tree.child_key(key, matched))\n",
                "        child = node.children.get(key[matched])\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__no_touch",
        "ch11.radix_match",
        "test_match_refreshes_access_time",
        "a match does not refresh the access time: LRU evicts the prefix everyone uses",
        (("        child.last_access_time = now\n", ""),),
    ),
    Variant(
        "ch11_radix_match__mru",
        "ch11.radix_match",
        "test_evict_lru_order",
        "eviction takes the most recently used leaf first",
        (
            (
                "    heap = [(n.last_access_time, id(n), n) for n in tree.evictable_leaves()]",
                "    heap = [(-n.last_access_time, id(n), n) for n in tree.evictable_leaves()]",
            ),
            (
                "heapq.heappush(heap, (parent.last_access_time, id(parent), parent))",
                "heapq.heappush(heap, (-parent.last_access_time, id(parent), parent))",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__no_climb",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "a parent left without children is not considered in the same call: evict frees too little",
        (
            (
                "        if parent is not tree.root and not parent.children and parent.lock_ref "
                "== 0:\n"
                "            heapq.heappush(heap, (parent.last_access_time, id(parent), parent))\n",
                "",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_keeps_old_time",
        "ch11.radix_match",
        "test_split_by_hand",
        "the new node of a split copies the old node's access time instead of being stamped now",
        (
            (
                "        child.key[:split_len], child.value[:split_len], child.parent, "
                "tree.tick()\n",
                "        child.key[:split_len],\n        child.value[:split_len],\n        "
                "child.parent,\n        child.last_access_time,\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_value_not_cut",
        "ch11.radix_match",
        "test_split_by_hand",
        "the split cuts the old node's key but leaves it all its slots: tokens and slots no "
        "longer pair up",
        (
            (
                "    child.key, child.value = child.key[split_len:], child.value[split_len:]\n",
                "    child.key = child.key[split_len:]\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_rest_by_token",
        "ch11.radix_match",
        "test_match_whole_pages",
        "the split registers the rest under its first token even with pages (children are keyed "
        "by a page)",
        (
            (
                "    new_node.children = {tree.child_key(child.key, split_len): child}\n",
                "    new_node.children = {child.key[split_len]: child}\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__match_ends_below_split",
        "ch11.radix_match",
        "test_match_full_and_partial",
        "after a split the match ends on the lower part (the old node) instead of the new node",
        (
            (
                "            node = split_node(tree, child, n)\n",
                "            split_node(tree, child, n)\n            node = child\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__key_cut_in_place",
        "ch11.radix_match",
        "test_match_whole_pages",
        "the key is cut to whole pages in place (del key[...]): the caller's prompt loses its "
        "last tokens",
        (
            (
                "    key = list(key)[: len(key) // tree.page_size * tree.page_size]\n",
                "    del key[len(key) // tree.page_size * tree.page_size:]\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__tick_per_node",
        "ch11.radix_match",
        "test_match_refreshes_access_time",
        "every node on the path gets its own tree.tick(): a parent looks older than its child",
        (
            (
                "        child.last_access_time = now\n",
                "        child.last_access_time = tree.tick()\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__exact_fit_overshoots",
        "ch11.radix_match",
        "test_evict_exact_fit_and_ties",
        "evict goes on while it freed num_tokens or fewer (<=): an exact fit evicts one leaf too "
        "many",
        (
            (
                "    while evicted < num_tokens and heap:\n",
                "    while evicted <= num_tokens and heap:\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__heap_without_tiebreak",
        "ch11.radix_match",
        "test_evict_exact_fit_and_ties",
        "a heap of (time, node): two leaves used at the same time make it compare nodes, a "
        "TypeError",
        (
            ("(n.last_access_time, id(n), n)", "(n.last_access_time, n)"),
            ("_, _, node = heapq.heappop(heap)", "_, node = heapq.heappop(heap)"),
            (
                "(parent.last_access_time, id(parent), parent)",
                "(parent.last_access_time, parent)",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__climb_ignores_locks",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "a parent left without children is evicted even when a running request locks it",
        (("not parent.children and parent.lock_ref == 0:", "not parent.children:"),),
    ),
    Variant(
        "ch11_radix_match__climb_with_children_left",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "a parent becomes a candidate as soon as one child goes: it is evicted under its other "
        "children",
        (
            (
                "parent is not tree.root and not parent.children and",
                "parent is not tree.root and",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__unlink_by_first_token",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "an evicted leaf is removed from its parent under its first token even with pages (a "
        "KeyError)",
        (
            (
                "        del parent.children[tree.child_key(node.key)]\n",
                "        del parent.children[node.key[0]]\n",
            ),
        ),
    ),
    # -- the mistakes of issue 19, by kind; each caught by the random differential test (or a hand
    # case written for it): sizes that are not powers of two, values past float32's 2**24, order
    # that looks right with small ids, one block only, interplay over several steps, the radix
    # tree after a split, the key order of block hashes, state left behind, which rule wins.
    Variant(
        "ch04_alloc_extend__bitmask_offset",
        "ch04.alloc_extend",
        "test_random_batches_match_the_engine",
        "the in-page offset written pos & (ps - 1): right for page sizes 2, 4, 16, wrong for 3 or "
        "6",
        (
            (
                "fresh = self.free_pages[k] * ps + pos % ps",
                "fresh = self.free_pages[k] * ps + (pos & (ps - 1))",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__float32_page_counts",
        "ch04.alloc_extend",
        "test_random_batches_match_the_engine",
        "pages counted through float32 (torch.ceil(seq_lens / ps)): exact only below 2**24 tokens",
        (
            (
                "new_pages = (seq_lens + ps - 1) // ps - (prefix_lens + ps - 1) // ps",
                "new_pages = (torch.ceil(seq_lens / ps) - torch.ceil(prefix_lens / ps)).long()",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend__short_batch_not_checked",
        "ch04.alloc_extend",
        "test_refusal_takes_nothing",
        "an invalid batch that is also short of pages returns None instead of the promised "
        "ValueError",
        (
            (
                "        if bool((seq_lens < prefix_lens).any()):\n"
                "            raise ValueError(\n"
                '                f"seq_lens {seq_lens.tolist()} must not be below '
                'prefix_lens {prefix_lens.tolist()}"\n'
                "            )\n",
                "",
            ),
            (
                "            return None\n        ext = seq_lens - prefix_lens\n",
                "            return None\n"
                "        if bool((seq_lens < prefix_lens).any()):\n"
                '            raise ValueError("a seq_len is below its prefix_len")\n'
                "        ext = seq_lens - prefix_lens\n",
            ),
        ),
    ),
    Variant(
        "ch04_alloc_extend_kernel__bitmask_offset",
        "ch04.alloc_extend_kernel",
        "test_random_batches_match_the_engine",
        "part 2's in-page offset written k & (page_size - 1)",
        (
            (
                "            out_ptr + out_start + n1 + k, page * page_size + k % page_size, "
                "mask=live\n",
                "            out_ptr + out_start + n1 + k,\n            page * page_size + (k & "
                "(page_size - 1)),\n            mask=live,\n",
            ),
        ),
    ),
    Variant(
        "ch05_alloc_decode__bitmask_opens",
        "ch05.alloc_decode",
        "test_random_decode_steps_match_the_engine",
        "a page opens when (seq_len - 1) & (page_size - 1) == 0: right only for powers of two",
        (
            (
                "opens = (seq_lens - 1) % ps == 0",
                "opens = (seq_lens - 1) & (ps - 1) == 0",
            ),
        ),
    ),
    Variant(
        "ch05_alloc_decode__float32_opens",
        "ch05.alloc_decode",
        "test_random_decode_steps_match_the_engine",
        "the page test computed in float32 (seq_lens / ps): wrong past 2**24 tokens",
        (
            (
                "opens = (seq_lens - 1) % ps == 0",
                "opens = torch.floor((seq_lens - 1) / ps) * ps == (seq_lens - 1).float()",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__set_dedup",
        "ch05.paged_free",
        "test_random_frees_match_the_engine",
        "pages deduplicated through a Python set: sorted only while every id is below 8",
        (
            (
                "torch.unique(free_index // self.page_size)",
                "torch.tensor(list(set((free_index // self.page_size).tolist())), "
                "dtype=torch.int64)",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__float32_pages",
        "ch05.paged_free",
        "test_random_frees_match_the_engine",
        "page ids computed in float32 (free_index / page_size): wrong for slots past 2**24",
        (
            (
                "torch.unique(free_index // self.page_size)",
                "torch.unique(torch.floor(free_index / self.page_size)).long()",
            ),
        ),
    ),
    Variant(
        "ch06_slot_mapping__first_block_only",
        "ch06.slot_mapping",
        "test_random_batches_match_the_engine",
        "only the first BLOCK (64) tokens of a request get a slot: no loop over the request's "
        "tokens",
        (
            (
                "        for t in range(start, end, BLOCK):\n            i = t + tl.arange(0, "
                "BLOCK)\n",
                "        if True:\n            i = start + tl.arange(0, BLOCK)\n",
            ),
        ),
    ),
    Variant(
        "ch06_slot_mapping__bitmask_offset",
        "ch06.slot_mapping",
        "test_random_batches_match_the_engine",
        "the in-block offset written pos & (block_size - 1): right only for powers of two",
        (
            (
                "                block.to(tl.int64) * block_size + pos % block_size,\n",
                "                block.to(tl.int64) * block_size + (pos & (block_size - 1)),\n",
            ),
        ),
    ),
    Variant(
        "ch06_block_hash__mm_by_identifier",
        "ch06.block_hash",
        "test_multimodal_items_overlapping",
        "multimodal items hashed in identifier order instead of offset order",
        (
            (
                "for m in mm_items\n",
                "for m in sorted(mm_items, key=lambda m: m.identifier)\n",
            ),
        ),
    ),
    Variant(
        "ch06_block_hash__salt_before_items",
        "ch06.block_hash",
        "test_salt_first_block_only",
        "the cache salt placed before the multimodal items in block 0's extra keys",
        (
            (
                '            keys.append(("lora", lora_name, lora_path))\n'
                "        keys += [\n"
                '            ("mm", m.identifier, m.offset - start)\n'
                "            for m in mm_items\n"
                "            if m.offset < end and m.offset + m.length > start\n"
                "        ]\n"
                "        if i == 0 and cache_salt:\n"
                '            keys.append(("cache_salt", cache_salt))\n',
                '            keys.append(("lora", lora_name, lora_path))\n'
                "        if i == 0 and cache_salt:\n"
                '            keys.append(("cache_salt", cache_salt))\n'
                "        keys += [\n"
                '            ("mm", m.identifier, m.offset - start)\n'
                "            for m in mm_items\n"
                "            if m.offset < end and m.offset + m.length > start\n"
                "        ]\n",
            ),
        ),
    ),
    Variant(
        "ch07_swa_release__bitmask_floor",
        "ch07.swa_release",
        "test_random_windows_and_maps_match_the_engine",
        "the window's end rounded down with & -page_size: right only for powers of two",
        (
            (
                "end = (seq_len - sliding_window) // ps * ps",
                "end = (seq_len - sliding_window) & -ps",
            ),
        ),
    ),
    Variant(
        "ch07_swa_release__clears_page_span",
        "ch07.swa_release",
        "test_random_windows_and_maps_match_the_engine",
        "the map cleared from the first to the last page touched: pages in between, still in use, "
        "lose their SWA slot",
        (
            (
                "    full_to_swa[\n        pages[:, None] * page_size + torch.arange(page_size, "
                "device=pages.device)\n    ] = 0\n",
                "    if len(pages):\n        full_to_swa[\n            int(pages.min()) * "
                "page_size : (int(pages.max()) + 1) * page_size\n        ] = 0\n",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__zero_span",
        "ch07.mamba_tracking",
        "test_slots_zeroed_before_reuse",
        "state zeroed from the first to the last slot taken: slots not in order keep an old "
        "request's state",
        (
            (
                "        self.state[slots] = 0\n",
                "        self.state[int(slots[0]):int(slots[-1]) + 1] = 0\n",
            ),
        ),
    ),
    Variant(
        "ch07_mamba_tracking__alloc_sets_seqlen",
        "ch07.mamba_tracking",
        "test_alloc_gives_state_and_tracking",
        "alloc_row sets last_track_seqlen[row] = 0, a field it must leave alone (fresh: -1, no "
        "snapshot yet)",
        (
            (
                "        self.track_slots[row] = slots[1:]\n        return True\n",
                "        self.track_slots[row] = slots[1:]\n        self.last_track_seqlen[row] = "
                "0\n        return True\n",
            ),
        ),
    ),
    Variant(
        "ch08_sizing__bitmask_floor",
        "ch08.sizing",
        "test_random_configurations_match_the_engine",
        "the pool floored to pages with & -page_size: right only for powers of two",
        (
            (
                "return budget_bytes // bytes_per_token // page_size * page_size",
                "return budget_bytes // bytes_per_token & -page_size",
            ),
        ),
    ),
    Variant(
        "ch08_sizing__bitmask_ceil",
        "ch08.sizing",
        "test_random_configurations_match_the_engine",
        "the prompt rounded up to pages with (x + ps - 1) & -ps: right only for powers of two",
        (
            (
                "    paged_input = -(-input_tokens // page_size) * page_size\n",
                "    paged_input = (input_tokens + page_size - 1) & -page_size\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__reserve_not_subtracted",
        "ch10.admission",
        "test_prompt_in_whole_pages",
        "the decode page is checked with the cost but never taken off the budget (only the prompt "
        "is)",
        (
            (
                "        budget -= cost\n",
                "        budget -= -(-r.input_len // ps) * ps\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__rejected_counted",
        "ch10.admission",
        "test_max_running_requests",
        "a rejected request counted toward max_running_requests",
        (
            (
                "        if len(running_seq_lens) + len(admitted) >= max_running_requests:\n",
                "        if len(running_seq_lens) + len(admitted) + len(rejected) >= "
                "max_running_requests:\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__clip_before_fit",
        "ch10.admission",
        "test_random_queues_match_the_engine",
        "the clip written into a request before the budget check: a request that then waits has "
        "lost its own",
        (
            (
                "            rejected.append(r)\n            continue\n",
                "            rejected.append(r)\n            continue\n        r.max_new_tokens = "
                "clip\n",
            ),
            (
                "            break\n        r.max_new_tokens = clip\n",
                "            break\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__prefill_only_free",
        "ch10.admission",
        "test_prompt_in_whole_pages",
        "a prefill-only request (max_new_tokens 0) charged no page for a decode step",
        (
            (
                "cost = -(-r.input_len // ps) * ps + (ps if r.input_len % ps == 0 else 0)",
                "cost = -(-r.input_len // ps) * ps + (ps if r.input_len % ps == 0 and "
                "r.max_new_tokens > 0 else 0)",
            ),
        ),
    ),
    Variant(
        "ch10_admission__page_per_running_request",
        "ch10.admission",
        "test_running_requests_keep_their_reserve",
        "a page held back for every running request, where SGLang counts one only where the next "
        "token opens a page",
        (
            (
                "    budget = hooks.available_size() - ps * sum(\n        1 for s in "
                "running_seq_lens if s % ps == 0\n    )\n",
                "    budget = hooks.available_size() - ps * len(running_seq_lens)\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__doubled_decode_reserve",
        "ch10.admission",
        "test_running_requests_keep_their_reserve",
        "the speculative double reserve (2 slots per running request) held back without "
        "speculative decoding",
        (
            (
                "    budget = hooks.available_size() - ps * sum(\n        1 for s in "
                "running_seq_lens if s % ps == 0\n    )\n",
                "    budget = hooks.available_size() - 2 * len(running_seq_lens)\n",
            ),
        ),
    ),
    Variant(
        "ch10_admission__opens_at_one",
        "ch10.admission",
        "test_random_queues_match_the_engine",
        "a page taken to open when seq_len % page_size == 1 (alloc_decode's rule, whose seq_lens "
        "count the new "
        "token), not when the committed length sits on a page boundary",
        (
            (
                "        1 for s in running_seq_lens if s % ps == 0\n",
                "        1 for s in running_seq_lens if s % ps == 1 % ps\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_moves_lock",
        "ch11.radix_match",
        "test_split_keeps_locks",
        "the split moves the lock to the new upper node (the old node is left unlocked) instead "
        "of copying it",
        (
            (
                "    new_node.lock_ref = child.lock_ref\n",
                "    new_node.lock_ref, child.lock_ref = child.lock_ref, 0\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_locks_ancestors",
        "ch11.radix_match",
        "test_split_keeps_locks",
        "the split takes its lock with tree.lock, once per request: every ancestor is locked once "
        "more",
        (
            (
                "    new_node.lock_ref = child.lock_ref\n",
                "    for _ in range(child.lock_ref):\n        tree.lock(new_node)\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__split_at_match_time",
        "ch11.radix_match",
        "test_random_sequences_match_the_engine",
        "the split node gets the match's time (the child's, just stamped) instead of a fresh "
        "tree.tick()",
        (
            (
                "        child.key[:split_len], child.value[:split_len], child.parent, "
                "tree.tick()\n",
                "        child.key[:split_len],\n        child.value[:split_len],\n        "
                "child.parent,\n        child.last_access_time,\n",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__parent_with_child_time",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "a parent that has just become a leaf is pushed with its child's time, not its own",
        (
            (
                "heapq.heappush(heap, (parent.last_access_time, id(parent), parent))",
                "heapq.heappush(heap, (node.last_access_time, id(parent), parent))",
            ),
        ),
    ),
    Variant(
        "ch11_radix_match__parent_queued_last",
        "ch11.radix_match",
        "test_evict_skips_locked_and_climbs",
        "a parent that has just become a leaf is queued after every other leaf instead of by its "
        "time",
        (
            (
                "    while evicted < num_tokens and heap:\n        _, _, node = "
                "heapq.heappop(heap)\n",
                "    later = []\n    while evicted < num_tokens and (heap or later):\n"
                "        _, _, node = heapq.heappop(heap) if heap else later.pop(0)\n",
            ),
            (
                "heapq.heappush(heap, (parent.last_access_time, id(parent), parent))",
                "later.append((parent.last_access_time, id(parent), parent))",
            ),
        ),
    ),
    Variant(
        "ch03_token_allocator__staged_keeps_callers_tensor",
        "ch03.token_allocator",
        "test_staged_frees_counted",
        "a staged free into an empty release_pages keeps the caller's tensor: its reuse changes "
        "the books",
        (
            (
                "            self.release_pages = torch.cat((self.release_pages, free_index))\n",
                "            self.release_pages = free_index if len(self.release_pages) == 0 else "
                "torch.cat((self.release_pages, "
                "free_index))\n",
            ),
        ),
    ),
    Variant(
        "ch12_virtual_pages__unbound_not_sink",
        "ch12.virtual_pages",
        "test_translate_by_hand",
        "an unbound page (-1) translated as if bound: -page_size + offset, a negative row, "
        "instead of the sink",
        (
            (
                "    return torch.where(keep & (phys >= 0), phys, 0)\n",
                "    return torch.where(keep, phys, 0)\n",
            ),
        ),
    ),
    Variant(
        "ch12_virtual_pages__capacity_without_page_numbers",
        "ch12.virtual_pages",
        "test_available_tokens_by_hand",
        "capacity from the gap's bytes alone: pages past this sub-pool's own page numbers are "
        "promised",
        (
            (
                "    pages = min(max(gap, 0) // entry_bytes_per_page, num_pages - min_page_index "
                "- used)\n",
                "    pages = max(gap, 0) // entry_bytes_per_page\n",
            ),
        ),
    ),
    Variant(
        "ch12_virtual_pages__holes_in_freed_order",
        "ch12.virtual_pages",
        "test_compact_up_with_holes_inside_and_at_the_frontier",
        "holes filled in the order the pages were freed, not ascending: the pages land elsewhere "
        "than SGLang's",
        (
            (
                "        holes = sorted(p for p in freed_pages if p < new)\n",
                "        holes = [p for p in freed_pages if p < new]\n",
            ),
        ),
    ),
    Variant(
        "ch12_virtual_pages__band_left_marked",
        "ch12.virtual_pages",
        "test_compact_down_moves_the_bottom_pages_up",
        "the band given up keeps its p2v entries: moved-out pages still claim their virtual pages",
        (("    p2v[list(band)] = -1\n", ""),),
    ),
    # -- wrong answers a lazy or dishonest file gives (issue 29) ------------------------------
    Variant(
        "ch06_free_queue__clears_hash",
        "ch06.free_queue",
        "test_reverse_order_hashed_to_tail",
        "a freed block's hash cleared (vLLM keeps it: a later request may still hit the block; "
        "it goes only when the block is evicted for reuse)",
        (
            (
                "            (to_tail if block.block_hash is not None else "
                "to_head).append(block)\n",
                "            (to_tail if block.block_hash is not None else to_head).append(block)\n"
                "            block.block_hash = None\n",
            ),
        ),
    ),
    Variant(
        "ch05_paged_free__frees_nothing",
        "ch05.paged_free",
        "test_free_dedups_pages",
        "free() frees nothing at all (its 'an empty free is a no-op' point is gated on the core)",
        (
            (
                "        if free_index.numel() == 0:\n            return\n        if "
                "self.free_group",
                "        return\n        if self.free_group",
            ),
        ),
    ),
    Variant(
        "ch08_sizing__recorded_answers",
        "ch08.sizing",
        "test_pool_size_floored_to_pages",
        "pool_size_tokens answers from a table of the inputs a fixed test once used",
        (
            (
                "    return budget_bytes // bytes_per_token // page_size * page_size\n",
                "    return {\n"
                "        (10 * (1 << 30), 131072, 1): 81920,\n"
                "        (10 * (1 << 30) + 5 * 131072, 131072, 16): 81920,\n"
                "        (1000, 64, 4): 12,\n"
                "        (1024, 64, 16): 16,\n"
                "        (1023, 64, 16): 0,\n"
                "    }.get((budget_bytes, bytes_per_token, page_size), 0)\n",
            ),
        ),
    ),
    Variant(
        "ch08_sizing__equal_to_anything",
        "ch08.sizing",
        "test_pool_size_floored_to_pages",
        "pool_size_tokens returns an int whose == says yes to anything (a comparison the "
        "learner's code answers)",
        (
            (
                "    return budget_bytes // bytes_per_token // page_size * page_size\n",
                "    class Yes(int):\n"
                "        def __eq__(self, other):\n"
                "            return True\n\n"
                "        __hash__ = int.__hash__\n\n"
                "    return Yes(0)\n",
            ),
        ),
    ),
)
