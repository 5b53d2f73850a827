import pytest
import torch

from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab_tests.tools.alloc import check_books, decode, extend, same, snapshot

T = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
staged = lambda a: a.get_all_free_pages()[len(a.free_pages) :].tolist()  # noqa: E731


def test_padding_slot_and_page_are_never_handed_out():
    tok = TokenToKVPoolAllocator(8)
    assert sorted(tok.alloc(8).tolist()) == list(range(1, 9)) and tok.alloc(1) is None
    pag = PagedTokenToKVPoolAllocator(16, 4)
    assert sorted(pag.alloc(16).tolist()) == list(range(4, 20)) and pag.alloc(4) is None


def test_token_allocator_reuses_fifo_and_paged_lifo():
    tok = TokenToKVPoolAllocator(4)
    a = tok.alloc(2)
    tok.free(a)
    # appended: the oldest free slots go first
    assert tok.free_pages.tolist() == [3, 4, 1, 2]
    pag = PagedTokenToKVPoolAllocator(16, 4)
    b = pag.alloc(8)
    pag.free(b)
    # prepended: just-freed pages go first
    assert pag.free_pages.tolist() == [1, 2, 3, 4]
    pag.alloc(4)
    pag.free(T(12, 13))
    assert pag.free_pages.tolist()[0] == 3


def test_need_sort_stages_frees_until_an_allocation_runs_short():
    pag = PagedTokenToKVPoolAllocator(32, 4, need_sort=True)
    got = pag.alloc(32)
    pag.free(got[16:20])  # page 5
    pag.free(got[4:8])  # page 2
    assert pag.free_pages.numel() == 0 and staged(pag) == [5, 2]
    assert pag.available_size() == 8  # staged pages count as free
    # ran short: merged and sorted, page 2 first
    assert pag.alloc(4).tolist() == [8, 9, 10, 11]
    assert pag.num_staged_pages == 0 and pag.free_pages.tolist() == [5]


def test_need_sort_does_not_merge_when_the_free_list_suffices():
    pag = PagedTokenToKVPoolAllocator(32, 4, need_sort=True)
    a = pag.alloc(4)
    pag.free(a)
    pag.alloc(4)
    assert staged(pag) == [1]


def test_alloc_extend_three_parts_by_hand():
    pag = PagedTokenToKVPoolAllocator(64, 4)
    pag.free_pages = T(5, 9, 2, 7, 11)
    # prefix 6 tokens, last one at slot 13 (page 3, offset 1); extend to 17 tokens
    out = pag.alloc_extend(T(6), T(6), T(17), T(17), T(13), 11)
    assert out.tolist() == [14, 15] + [20, 21, 22, 23] + [36, 37, 38, 39] + [8]
    assert pag.free_pages.tolist() == [7, 11]


def test_alloc_extend_batch_offsets_are_prefix_sums():
    pag = PagedTokenToKVPoolAllocator(64, 4)
    pag.free_pages = T(3, 8, 1, 6)
    # r0: empty prefix, 5 tokens (pages 3, 8); r1: prefix 2 at slot 41, 1 token (no page);
    # r2: aligned prefix 4 ending at slot 27, 4 tokens (page 1)
    out = pag.alloc_extend(
        T(0, 2, 4), T(0, 2, 4), T(5, 3, 8), T(5, 3, 8), T(-1, 41, 27), 10
    )
    assert out.tolist() == [12, 13, 14, 15, 32] + [42] + [4, 5, 6, 7]
    assert pag.free_pages.tolist() == [6]


def test_zero_length_extend_takes_nothing():
    pag = PagedTokenToKVPoolAllocator(16, 4)
    out = pag.alloc_extend(T(3), T(3), T(3), T(3), T(6), 0)
    assert out.numel() == 0 and pag.free_pages.numel() == 4


@pytest.mark.parametrize("ps", [2, 4])
def test_alloc_decode_opens_a_page_exactly_when_seq_len_mod_ps_is_1(ps):
    pag = PagedTokenToKVPoolAllocator(64, ps)
    pag.free_pages = T(9, 4)
    # opens, continues, opens, continues (3 % ps != 1 for ps in 2, 4 ... )
    seqs = T(ps + 1, 2 * ps, 1, 3)
    lasts = T(5 * ps + ps - 1, 6 * ps + ps - 2, -1, 7 * ps + 1)
    out = pag.alloc_decode(seqs, seqs, lasts)
    want = (
        [9 * ps, 6 * ps + ps - 1, 4 * ps, 7 * ps + 2]
        if ps == 4
        else [9 * ps, 6 * ps + 1, 4 * ps, None]
    )
    # 3 % 2 == 1: the fourth request opens a page too, and there is none left
    if ps == 2:
        assert out is None and pag.free_pages.tolist() == [9, 4]
    else:
        assert out.tolist() == want and pag.free_pages.numel() == 0


def test_refused_extend_changes_nothing_and_exact_exhaustion_succeeds():
    pag = PagedTokenToKVPoolAllocator(16, 4, debug_mode=True)
    before = snapshot(pag)
    # needs 5 pages of 4
    assert pag.alloc_extend(T(0, 0), T(0, 0), T(9, 8), T(9, 8), T(-1, -1), 17) is None
    assert same(before, snapshot(pag))
    # exactly 4 pages
    out = pag.alloc_extend(T(0, 0), T(0, 0), T(8, 8), T(8, 8), T(-1, -1), 16)
    assert len(set(out.tolist())) == 16 and pag.available_size() == 0
    pag.check_books()


class CheckAfterTaking(PagedTokenToKVPoolAllocator):
    """The SGLang bug: take (launch) first, count after."""

    def alloc_extend(
        self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, n
    ):
        from memlab.sglang.allocator.reference import num_new_pages

        need = num_new_pages(prefix_lens_cpu, seq_lens_cpu, self.page_size)
        self.free_pages = self.free_pages[need:]
        return (
            None
            if need > len(self.free_pages) + need
            else super().alloc_extend(
                prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, n
            )
        )


def test_the_refusal_check_catches_counting_after_taking():
    for cls, ok in ((PagedTokenToKVPoolAllocator, True), (CheckAfterTaking, False)):
        pag = cls(16, 4)
        before = snapshot(pag)
        assert pag.alloc_extend(T(0), T(0), T(17), T(17), T(-1), 17) is None
        assert same(before, snapshot(pag)) is ok


def test_free_dedups_pages_and_a_free_without_dedup_is_caught():
    pag = PagedTokenToKVPoolAllocator(16, 4)
    held = {}
    extend(pag, held, "a", 6)
    pag.free(torch.tensor(held.pop("a")))
    check_books(pag, held)

    class NoDedup(PagedTokenToKVPoolAllocator):
        def free(self, free_index):  # the free path without its unique
            self._release_page_ids(free_index // self.page_size)

    bad = NoDedup(16, 4)
    held = {}
    extend(bad, held, "a", 6)
    bad.free(torch.tensor(held.pop("a")))
    with pytest.raises(AssertionError, match="twice"):
        check_books(bad, held)


def test_free_segment_equals_free_on_an_aligned_run():
    a, b = PagedTokenToKVPoolAllocator(32, 4), PagedTokenToKVPoolAllocator(32, 4)
    ha, hb = {}, {}
    extend(a, ha, "r", 11)
    extend(b, hb, "r", 11)
    a.free(torch.tensor(ha["r"][4:]))
    b.free_segment(torch.tensor(hb["r"][4:]), start_pos=4)
    assert a.free_pages.tolist() == b.free_pages.tolist()


def test_free_segment_refuses_an_unaligned_start_and_why():
    pag = PagedTokenToKVPoolAllocator(32, 4)
    held = {}
    extend(pag, held, "r", 12)
    run = torch.tensor(held["r"][2:10])  # positions 2..9 span pages 1, 2 and 3
    with pytest.raises(ValueError, match="position 2 is not a multiple of page_size 4"):
        pag.free_segment(run, start_pos=2)
    # The counter-example: every 4th slot of an unaligned run misses the run's last page.
    assert sorted({s // 4 for s in run[::4].tolist()}) != sorted(
        {s // 4 for s in run.tolist()}
    )


def test_free_group_defers_copies_and_does_not_nest():
    pag = PagedTokenToKVPoolAllocator(32, 4)
    buf = pag.alloc(8)
    pag.free_group_begin()
    pag.free(buf[:4])
    with pytest.raises(RuntimeError, match="do not nest"):
        pag.free_group_begin()
    assert pag.free_pages.numel() == 6  # nothing released yet
    buf[:4] = 100  # the caller reuses its buffer: the queued copy must not see it
    pag.free_group_end()
    assert pag.free_pages.tolist()[:1] == [1] and pag.free_pages.numel() == 7
    with pytest.raises(RuntimeError, match="without free_group_begin"):
        pag.free_group_end()


def test_debug_mode_catches_double_free_and_padding():
    pag = PagedTokenToKVPoolAllocator(16, 4, debug_mode=True)
    got = pag.alloc(8)
    pag.free(got[:4])
    with pytest.raises(ValueError, match="double free: page 1"):
        pag.free(got[:2])
    with pytest.raises(ValueError, match="page 0"):
        pag.free(T(1, 2))
    pag.free_group_begin()
    pag.free(got[4:8])
    with pytest.raises(ValueError, match="double free: page 1"):
        pag.free(got[:1])  # page 1 is already free: refused at once, inside a group too
    pag.free_group_end()  # the group survives and releases what it queued
    assert pag.available_size() == 16


def test_a_free_group_dedups_once_over_all_its_frees():
    # A request freed in two pieces (a finished request and its over-allocated tail): both pieces
    # hold slots of page 2. SGLang queues the raw slots and dedups once at free_group_end.
    pag = PagedTokenToKVPoolAllocator(16, 4, debug_mode=True)
    got = pag.alloc(8)  # pages 1, 2
    pag.free_group_begin()
    pag.free(got[:6])
    pag.free(got[6:])
    # raw slots
    assert [t.tolist() for t in pag.free_group] == [[4, 5, 6, 7, 8, 9], [10, 11]]
    pag.free_group_end()
    # page 2 once
    assert pag.free_pages.tolist() == [1, 2, 3, 4] and pag.available_size() == 16
    pag.check_books()


def test_free_page_ids_in_a_group_are_released_after_the_slots():
    pag = PagedTokenToKVPoolAllocator(32, 4)
    got = pag.alloc(16)  # pages 1..4
    pag.free_group_begin()
    pag.free_segment(got[8:], start_pos=8)  # pages 3, 4 as page ids
    pag.free(got[:8])  # pages 1, 2 as slots
    pag.free_group_end()
    # as SGLang: the slots' pages are released first, then the page ids, each prepended
    assert pag.free_pages.tolist()[:4] == [3, 4, 1, 2]


def test_debug_books_balance_and_clear_restores():
    pag = PagedTokenToKVPoolAllocator(16, 2, debug_mode=True, need_sort=True)
    got = pag.alloc(6)
    pag.check_books()
    pag.free(got[2:4])
    pag.check_books()
    pag.clear()
    assert pag.available_size() == 16 and pag.num_staged_pages == 0
    pag.check_books()


def test_token_allocator_speaks_the_same_interface():
    tok = TokenToKVPoolAllocator(6, need_sort=True)
    held = {}
    assert extend(tok, held, "a", 4).tolist() == [1, 2, 3, 4]
    assert decode(tok, held, ["a"]).tolist() == [5]
    tok.free(torch.tensor(held["a"][:2]))
    assert tok.available_size() == 3 and extend(tok, held, "b", 3) is not None
    assert tok.free_pages.numel() == 0


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda: PagedTokenToKVPoolAllocator(0, 4),
            "size must be an int >= 1 and <= 2147483647, got 0",
        ),
        (lambda: PagedTokenToKVPoolAllocator(-8, 4), "-8"),
        (
            lambda: PagedTokenToKVPoolAllocator(8, 0),
            r"page_size \(.*\) must be an int >= 1 and <= 8, got 0",
        ),
        (lambda: PagedTokenToKVPoolAllocator(3, 4), "no whole page"),
        (lambda: PagedTokenToKVPoolAllocator(8, 4, backend="cuda"), "'cuda'"),
        (lambda: TokenToKVPoolAllocator(8).alloc(-1), "-1"),
        (
            lambda: PagedTokenToKVPoolAllocator(8, 4).alloc(6),
            "need_size must be whole pages: 6 is not a multiple of page_size 4",
        ),
    ],
)
def test_bad_sizes_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_batches_are_named():
    pag = PagedTokenToKVPoolAllocator(64, 4)
    with pytest.raises(
        ValueError, match="request 1: seq_len 2 is shorter than its prefix 5"
    ):
        pag.alloc_extend(T(0, 5), T(0, 5), T(3, 2), T(3, 2), T(-1, 9), 0)
    with pytest.raises(
        ValueError, match="extend_num_tokens is 4 but the lengths add up to 3"
    ):
        pag.alloc_extend(T(0), T(0), T(3), T(3), T(-1), 4)
    with pytest.raises(TypeError, match="float32"):
        pag.alloc_extend(T(0), T(0), torch.tensor([3.0]), T(3), T(-1), 3)
    with pytest.raises(ValueError, match="meta"):
        pag.free(torch.tensor([4], device="meta"))
    # a wrong type: TypeError
    with pytest.raises(TypeError, match="seq_lens_cpu must be a torch.Tensor"):
        pag.alloc_decode(T(3), [3], T(5))
    with pytest.raises(ValueError, match=r"must be >= 1: \[0\]"):
        pag.alloc_decode(T(0), T(0), T(-1))
    with pytest.raises(ValueError, match="cannot free page 17"):
        pag.free(T(17 * 4))
    with pytest.raises(TypeError, match="list"):
        pag.free([4, 5])


def test_last_loc_must_end_its_prefix():
    pag = PagedTokenToKVPoolAllocator(64, 4)
    before = snapshot(pag)
    with pytest.raises(
        ValueError, match="request 0: last_loc -1 cannot end a prefix of 3 tokens"
    ):
        # would hand out padding slot 0
        pag.alloc_extend(T(3), T(3), T(5), T(5), T(-1), 2)
    with pytest.raises(
        ValueError, match="request 1: last_loc 6 cannot end a prefix of 0"
    ):
        pag.alloc_extend(T(2, 0), T(2, 0), T(3, 1), T(3, 1), T(5, 6), 2)
    with pytest.raises(
        ValueError, match="request 0: last_loc 8 cannot end a prefix of 2"
    ):
        # prefix 2 ends at offset 1, slot 8 is offset 0
        pag.alloc_decode(T(3), T(3), T(8))
    assert same(before, snapshot(pag))


def test_a_bad_id_in_a_free_group_is_refused_at_once_and_the_group_survives():
    pag = PagedTokenToKVPoolAllocator(16, 4)
    got = pag.alloc(8)
    pag.free_group_begin()
    pag.free(got[:4])
    with pytest.raises(ValueError, match="cannot free page 0"):
        pag.free(T(1))
    pag.free_group_end()
    assert pag.available_size() == 12  # the good page was not lost with the bad id


def test_free_segment_checks_alignment_in_memory_in_debug_mode():
    pag = PagedTokenToKVPoolAllocator(32, 4, debug_mode=True)
    pag.alloc(8)
    with pytest.raises(
        ValueError, match="slot 5 should start a page but sits at offset 1"
    ):
        pag.free_segment(T(5, 6, 7, 8), start_pos=0)


def test_the_bound_spares_the_merge_and_the_exact_count_decides_when_it_cannot():
    pag = PagedTokenToKVPoolAllocator(64, 4, need_sort=True)  # 16 pages
    got = pag.alloc(40)  # pages 1..10 held, 6 free
    pag.free(got[:8])  # pages 1, 2 staged
    # bound 4 // 4 + 1 + 1 = 3 <= 6: no count, no merge
    assert pag.alloc_extend(T(0), T(0), T(4), T(4), T(-1), 4) is not None
    assert staged(pag) == [1, 2]
    # bound 20 // 4 + 2 + 1 = 8 > 5 free: merged first (as SGLang), then the exact count
    # (5 pages) fits
    assert pag.alloc_extend(
        T(0, 0), T(0, 0), T(8, 12), T(8, 12), T(-1, -1), 20
    ).tolist()[:4] == [4, 5, 6, 7]
    assert pag.num_staged_pages == 0 and pag.free_pages.tolist() == [15, 16]


def test_need_sort_merges_when_the_bound_fails_even_if_it_then_refuses():
    pag = PagedTokenToKVPoolAllocator(32, 4, need_sort=True)  # 8 pages
    got = pag.alloc(24)  # pages 1..6 held, 7 and 8 free
    pag.free(got[4:8])  # page 2 staged
    # needs 4 pages, 3 free
    assert pag.alloc_extend(T(0), T(0), T(16), T(16), T(-1), 16) is None
    # merged all the same
    assert pag.free_pages.tolist() == [2, 7, 8] and pag.num_staged_pages == 0
    pag.free(got[:4])  # page 1 staged
    # five new tokens, each opening a page; 4 pages free in all
    seq = T(5, 9, 13, 17, 21)
    assert pag.alloc_decode(seq, seq, T(7, 11, 15, 19, 23)) is None
    # bs 5 > 3 on the list: merged, then refused
    assert pag.free_pages.tolist() == [1, 2, 7, 8]


def test_counts_of_any_integral_type_are_accepted():
    np = pytest.importorskip("numpy")
    tok, pag = TokenToKVPoolAllocator(8), PagedTokenToKVPoolAllocator(16, 4)
    assert tok.alloc(np.int64(3)).tolist() == [1, 2, 3]
    assert tok.alloc(torch.tensor(2)).tolist() == [4, 5]  # a 0-d integer tensor
    assert pag.alloc(np.int32(8)).tolist() == list(range(4, 12))
    assert PagedTokenToKVPoolAllocator(np.int64(16), np.int64(4)).num_pages == 4


@pytest.mark.parametrize("bad", [3.0, "3", True, torch.tensor(3.0), torch.tensor([3])])
def test_a_count_that_is_no_integer_names_its_type(bad):
    with pytest.raises(
        TypeError, match=f"need_size must be an int .*got {type(bad).__name__}"
    ):
        TokenToKVPoolAllocator(8).alloc(bad)


def test_the_token_allocator_speaks_of_slots():
    # chapter 03 speaks of slots: page size 1 has no pages to name
    tok = TokenToKVPoolAllocator(8, debug_mode=True)
    got = tok.alloc(2)
    with pytest.raises(
        ValueError, match=r"cannot free slot 9: slots are 1..8 \(slot 0 is padding\)"
    ):
        tok.free(T(9))
    tok.free(got)
    with pytest.raises(ValueError, match="double free: slot 1 is already free"):
        tok.free(got[:1])
    pag = PagedTokenToKVPoolAllocator(16, 4, debug_mode=True)
    with pytest.raises(
        ValueError, match=r"cannot free page 5: pages are 1..4 \(page 0 is padding\)"
    ):
        pag.free(T(20))


def test_make_allocator_picks_the_class_sglang_picks():
    from memlab.sglang.allocator import make_allocator

    a = make_allocator(16, 1, debug_mode=True)
    assert type(a) is TokenToKVPoolAllocator and a.debug_mode and a.page_size == 1
    b = make_allocator(16, 4, backend="python", need_sort=True)
    assert type(b) is PagedTokenToKVPoolAllocator and (
        b.page_size,
        b.backend,
        b.need_sort,
    ) == (4, "python", True)


# -- debug mode read per call, SGLang's asserts, free_segments -------------------------------------


def test_debug_mode_turned_on_later_catches_a_double_free():
    for alloc in (TokenToKVPoolAllocator(8), PagedTokenToKVPoolAllocator(16, 4)):
        a, b = alloc.alloc(alloc.page_size), alloc.alloc(alloc.page_size)
        alloc.free(a)
        alloc.debug_mode = (
            True  # the ledger is built now, from the free list: a is free, b held
        )
        before = snapshot(alloc)
        with pytest.raises(ValueError, match="double free"):
            alloc.free(a)
        assert same(before, snapshot(alloc))
        alloc.free(b)
        alloc.check_books()


def test_debug_mode_asserts_the_handed_out_slots_are_unique(monkeypatch):
    from memlab.sglang.allocator import reference as ref

    pag = PagedTokenToKVPoolAllocator(64, 4, debug_mode=True)
    # a broken kernel: one slot twice
    monkeypatch.setattr(ref, "alloc_extend_torch", lambda *a: T(4, 4))
    with pytest.raises(AssertionError, match="twice"):
        pag.alloc_extend(T(0), T(0), T(2), T(2), T(-1), 2)
    monkeypatch.setattr(ref, "alloc_decode_torch", lambda *a: T(8, 8))
    with pytest.raises(AssertionError, match="twice"):
        pag.alloc_decode(T(1, 1), T(1, 1), T(-1, -1))


def test_debug_mode_refuses_a_last_loc_in_a_page_nobody_holds_and_lengths_that_disagree():
    pag = PagedTokenToKVPoolAllocator(64, 4, debug_mode=True)
    mine = pag.alloc_extend(T(0), T(0), T(3), T(3), T(-1), 3)  # one page, 3 slots used
    before = snapshot(pag)
    # ends a 3-token prefix, but in a free page
    free_page_slot = int(pag.free_pages[0]) * 4 + 2
    with pytest.raises(ValueError, match="which no request holds"):
        pag.alloc_extend(T(3), T(3), T(5), T(5), T(free_page_slot), 2)
    with pytest.raises(ValueError, match="which no request holds"):
        pag.alloc_decode(T(4), T(4), T(free_page_slot))
    with pytest.raises(ValueError, match="disagrees with its device tensor"):
        pag.alloc_extend(T(3), T(3), T(9), T(5), T(int(mine[-1])), 2)
    assert same(before, snapshot(pag))
    # the real last_loc
    assert pag.alloc_decode(T(4), T(4), T(int(mine[-1]))).tolist() == [
        int(mine[-1]) + 1
    ]


def test_free_segments_release_each_page_once_and_refuse_segments_sharing_a_page():
    pag = PagedTokenToKVPoolAllocator(64, 4, debug_mode=True)
    row = pag.alloc(16)  # pages of positions 0-3, 4-7, 8-11, 12-15
    # the end of a segment may fall mid-page
    pag.free_segments([(row[0:6], 0), (T(), 6), (row[8:16], 8)])
    # row[4:6] freed page 2 whole
    assert pag.available_size() == 64 and pag.free_pages.tolist()[:4] == [3, 4, 1, 2]
    with pytest.raises(AssertionError, match="shares a page"):
        PagedTokenToKVPoolAllocator(64, 4).free_segments(
            [(T(4, 5, 6, 7, 8), 0), (T(12), 4)]
        )


def test_a_counted_num_new_pages_is_used_and_a_wrong_one_refused():
    """SGLang's ``alloc_extend(..., num_new_pages=...)``: the caller's host count saves the
    allocator counting again; a count that disagrees with the lengths changes nothing."""
    T = lambda *x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    args = (T(0, 3), T(0, 3), T(5, 9), T(5, 9), T(-1, 50), 11)
    a, b = PagedTokenToKVPoolAllocator(64, 4), PagedTokenToKVPoolAllocator(64, 4)
    a.alloc(48)
    b.alloc(48)  # both hold the prefix's page 12 (slots 48..51)
    assert torch.equal(a.alloc_extend(*args), b.alloc_extend(*args, num_new_pages=4))
    assert a.free_pages.tolist() == b.free_pages.tolist()
    before = snapshot(b)
    with pytest.raises(ValueError, match="num_new_pages is 5 but the lengths need 4"):
        b.alloc_extend(*args, num_new_pages=5)
    assert same(before, snapshot(b))
