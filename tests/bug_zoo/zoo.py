"""The bug zoo: classic mistakes, each a copy of a solution with one mistake in it.

Each row: the variant's file here, the exercise it breaks, the graded test meant to catch it,
and the mistake. tests/test_grader.py grades every variant in place of its solution and checks
that the grader gives it fewer points than the solution, with that test failing.
"""

from typing import NamedTuple


class Variant(NamedTuple):
    file: str
    exercise: str
    catches: str
    mistake: str

    @property
    def solution(self) -> str:
        return self.file.split("__")[0]


ZOO = (
    Variant("ch01_alloc_rows__neg_zero_slice", "ch01.alloc_rows", "test_alloc_zero_returns_empty",
            "alloc_rows(0) takes free_slots[-0:], which is the whole list"),
    Variant("ch01_alloc_rows__generation_reset_on_clear", "ch01.alloc_rows", "test_generation_survives_clear",
            "clear() zeroes req_generation, so a reused row can repeat an old generation"),
    Variant("ch01_alloc_rows__rows_from_head", "ch01.alloc_rows", "test_alloc_takes_from_tail",
            "rows taken from the head of free_slots (O(n) per allocation)"),
    Variant("ch02_bytes_per_token__k_only", "ch02.bytes_per_token", "test_mha_llama3_8b",
            "MHA bytes count K only, forgetting V"),
    Variant("ch02_bytes_per_token__mla_with_v", "ch02.bytes_per_token", "test_mla_deepseek_v3",
            "MLA counted twice, as if it stored a V buffer"),
    Variant("ch03_token_allocator__staged_not_counted", "ch03.token_allocator", "test_staged_frees_counted",
            "available_size() forgets the staged frees in release_pages"),
    Variant("ch03_token_allocator__free_to_head", "ch03.token_allocator", "test_free_appends_fifo",
            "the token allocator puts freed slots at the head (LIFO) instead of the tail"),
    Variant("ch03_token_allocator__merge_unsorted", "ch03.token_allocator", "test_merge_when_short",
            "merge_and_sort_free merges without sorting"),
    Variant("ch04_alloc_extend__last_loc_without_plus_one", "ch04.alloc_extend", "test_continues_from_last_loc",
            "part 1 continues from last_loc instead of last_loc + 1 (overwrites the last token's slot)"),
    Variant("ch04_alloc_extend__capacity_after_taking", "ch04.alloc_extend", "test_refusal_takes_nothing",
            "pages taken before the capacity check: a refused request still consumes the free list"),
    Variant("ch04_alloc_extend__floor_page_count", "ch04.alloc_extend", "test_fresh_requests_whole_and_partial",
            "new pages counted with floor instead of ceil: a partial last page is never paid for"),
    Variant("ch04_alloc_extend_kernel__part2_without_part1_offset", "ch04.alloc_extend_kernel",
            "test_mixed_random_batches", "part 2 stores at out_start + k, forgetting the n1 tokens of part 1"),
    Variant("ch04_alloc_extend_kernel__part2_ignores_page_start", "ch04.alloc_extend_kernel",
            "test_whole_pages_only", "part 2 reads free_pages from 0, not from the request's page_start"),
    Variant("ch05_alloc_decode__opens_at_multiple", "ch05.alloc_decode", "test_crossing_boundary_takes_new_page",
            "a new page opened when seq_len % page_size == 0 instead of == 1"),
    Variant("ch05_paged_free__no_dedup", "ch05.paged_free", "test_free_dedups_pages",
            "free without page dedup: a page is freed once per slot and later handed to several requests"),
    Variant("ch05_paged_free__segment_unaligned", "ch05.paged_free", "test_free_segment_rejects_unaligned",
            "free_segment accepts an unaligned run, where every page_size-th slot misses or repeats pages"),
    Variant("ch05_paged_free__group_no_copy", "ch05.paged_free", "test_free_group_batches_once",
            "a free group queues the caller's tensor without copying it"),
    Variant("ch06_free_queue__forward_order", "ch06.free_queue", "test_reverse_order_hashed_to_tail",
            "a request's blocks freed in forward order: the start of a prefix is evicted first"),
    Variant("ch06_free_queue__unhashed_to_tail", "ch06.free_queue", "test_unhashed_to_head",
            "unhashed blocks appended to the tail, behind cached blocks they should be reused before"),
    Variant("ch06_block_hash__partial_blocks", "ch06.block_hash", "test_full_blocks_only",
            "the last, partial block is hashed too"),
    Variant("ch06_block_hash__salt_every_block", "ch06.block_hash", "test_salt_first_block_only",
            "the cache salt added to every block's extra keys, not just the first"),
    Variant("ch06_block_hash__no_chain", "ch06.block_hash", "test_chain_stands_for_the_prefix",
            "every block hashed with the seed as parent: a hash no longer stands for its prefix"),
    Variant("ch06_slot_mapping__block_index_swapped", "ch06.slot_mapping", "test_small_batch_by_hand",
            "block index and offset swapped: pos % block_size used to index the block table"),
    Variant("ch07_swa_release__frees_padding", "ch07.swa_release", "test_take_swa_slots_skips_padding",
            "the SWA padding id 0 (no SWA slot) handed to the free list"),
    Variant("ch07_swa_release__no_page_floor", "ch07.swa_release", "test_release_whole_pages_out_of_window",
            "out-of-window release not rounded down to pages: a page still in use is released"),
    Variant("ch07_mamba_tracking__partial_reset", "ch07.mamba_tracking", "test_free_resets_every_field",
            "free_row resets the slots but not the ping-pong index and last tracked length"),
    Variant("ch07_mamba_tracking__no_zeroing", "ch07.mamba_tracking", "test_slots_zeroed_before_reuse",
            "state slots handed out without zeroing: the previous owner's state leaks"),
    Variant("ch08_sizing__reserve_not_doubled", "ch08.sizing", "test_reserve_doubled",
            "the doubled decode reserve of the overlap scheduler forgotten"),
    Variant("ch08_sizing__no_page_margin", "ch08.sizing", "test_max_new_tokens_formula",
            "max_new_tokens_for_memory without the extra page and slot"),
    Variant("ch09_paged_gather__row_is_batch_index", "ch09.paged_gather", "test_matches_dense_attention",
            "the gather reads request-table row b instead of req_pool_indices[b]"),
    Variant("ch10_admission__overtaking", "ch10.admission", "test_no_overtaking",
            "admission skips a request that does not fit and lets later ones overtake it"),
    Variant("ch10_admission__running_reserve_forgotten", "ch10.admission", "test_running_requests_keep_their_reserve",
            "admission forgets the decode reserve of the requests already running"),
)
