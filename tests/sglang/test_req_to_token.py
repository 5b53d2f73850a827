import re

import pytest
import torch

from memlab.sglang.req_to_token import Req, ReqToTokenPool


def test_row_zero_is_padding_and_never_handed_out():
    pool = ReqToTokenPool(4, 8)
    assert pool.req_to_token.shape == (5, 8) and pool.req_to_token.dtype == torch.int32
    rows = pool.alloc_rows(4)
    assert sorted(rows) == [1, 2, 3, 4]
    assert pool.alloc_rows(1) is None


def test_rows_come_from_the_tail_and_return_to_it():
    pool = ReqToTokenPool(6, 4)
    assert pool.alloc_rows(2) == [5, 6]
    pool.free(5)
    assert pool.free_slots[-1] == 5
    assert pool.alloc_rows(1) == [5]


def test_alloc_rows_is_all_or_nothing():
    pool = ReqToTokenPool(3, 4)
    pool.alloc_rows(2)
    before = (list(pool.free_slots), pool.req_generation.clone())
    assert pool.alloc_rows(2) is None
    assert pool.free_slots == before[0] and torch.equal(pool.req_generation, before[1])


def test_zero_rows_is_empty_not_the_whole_free_list():
    pool = ReqToTokenPool(5, 4)
    assert pool.alloc_rows(0) == []
    assert pool.available_size() == 5


def test_the_minus_zero_slice_trap_exists():
    # The bug the special case avoids: lst[-0:] is the whole list.
    free = [1, 2, 3]
    assert free[-0:] == [1, 2, 3]


def test_generation_bumps_per_allocation_and_survives_clear():
    pool = ReqToTokenPool(2, 4)
    (r,) = pool.alloc_rows(1)
    g1 = int(pool.req_generation[r])
    pool.free(r)
    assert pool.alloc_rows(1) == [r] and int(pool.req_generation[r]) == g1 + 1
    pool.clear()
    assert pool.available_size() == 2
    assert int(pool.req_generation[r]) == g1 + 1  # never reset
    pool.alloc_rows(2)
    assert int(pool.req_generation[r]) == g1 + 2


def test_alloc_binds_new_requests_and_keeps_chunked_rows():
    pool = ReqToTokenPool(4, 16)
    a, b = Req("a"), Req("b")
    assert pool.alloc([a]) == [a.kv.req_pool_idx]
    a.kv.kv_allocated_len = 8  # its first chunk wrote KV
    left = pool.available_size()
    rows = pool.alloc([a, b])
    assert (
        rows[0] == a.kv.req_pool_idx
        and rows[1] == b.kv.req_pool_idx != a.kv.req_pool_idx
    )
    assert pool.available_size() == left - 1  # only b consumed a row
    assert b.generation == int(pool.req_generation[b.kv.req_pool_idx])


def test_a_kept_row_must_already_own_kv():
    pool = ReqToTokenPool(4, 16)
    a = Req("a")
    pool.alloc([a])
    with pytest.raises(ValueError, match="owns no KV"):
        pool.alloc([a])


def test_alloc_refusal_leaves_requests_unbound():
    pool = ReqToTokenPool(1, 4)
    reqs = [Req(i) for i in range(2)]
    assert pool.alloc(reqs) is None
    assert all(r.kv.req_pool_idx is None for r in reqs) and pool.available_size() == 1


def test_free_req_clears_its_row_and_write_fills_it():
    pool = ReqToTokenPool(2, 4)
    r = Req("r")
    pool.alloc([r])
    row = r.kv.req_pool_idx
    pool.write((row, slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int32))
    assert pool.req_to_token[row, :3].tolist() == [7, 8, 9]
    pool.free(r)
    assert r.kv.req_pool_idx is None and row in pool.free_slots


@pytest.mark.parametrize(
    "bad, err", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_bad_sizes_are_named(bad, err):
    # a number out of range is a ValueError; a value that is not an integer at all (a float, a
    # bool) is a TypeError whose message names the type
    with pytest.raises(err, match=str(bad)):
        ReqToTokenPool(bad, 4)
    with pytest.raises(err, match=str(bad)):
        ReqToTokenPool(4, bad)


def test_integral_numbers_of_any_kind_are_counts():
    np = pytest.importorskip("numpy")
    pool = ReqToTokenPool(np.int64(4), torch.tensor(8))
    assert (pool.size, pool.max_context_len) == (4, 8) and type(pool.size) is int
    assert len(pool.alloc_rows(np.int32(2))) == 2
    with pytest.raises(TypeError, match="got float 2.0"):
        pool.alloc_rows(2.0)


@pytest.mark.parametrize(
    "row, err",
    [
        (0, ValueError),
        (5, ValueError),
        (-1, ValueError),
        ("x", TypeError),
        (True, TypeError),
    ],
)
def test_freeing_padding_or_unknown_rows_is_refused(row, err):
    pool = ReqToTokenPool(4, 4)
    with pytest.raises(err, match=rf"row to free .* got .*{re.escape(repr(row))}"):
        pool.free(row)


def test_negative_row_count_is_refused():
    with pytest.raises(ValueError, match="-2"):
        ReqToTokenPool(4, 4).alloc_rows(-2)


# Classic bugs, kept to prove the checks above bite: each buggy pool must fail its check.
def check_zero_rows(cls):
    pool = cls(5, 4)
    assert pool.alloc_rows(0) == [] and pool.available_size() == 5


def check_generation_survives_clear(cls):
    pool = cls(1, 4)
    pool.alloc_rows(1)
    pool.clear()
    pool.alloc_rows(1)
    assert int(pool.req_generation[1]) == 2


def check_tail_allocation(cls):
    pool = cls(6, 4)
    assert pool.alloc_rows(2) == [5, 6]


class MinusZeroSlice(ReqToTokenPool):
    def alloc_rows(self, n):
        if n > len(self.free_slots):
            return None
        rows = self.free_slots[-n:]
        del self.free_slots[-n:]
        self.req_generation[rows] += 1
        return rows


class ResetGenerationOnClear(ReqToTokenPool):
    def clear(self):
        super().clear()
        self.req_generation.zero_()


class HeadAllocation(ReqToTokenPool):
    def alloc_rows(self, n):
        if n > len(self.free_slots):
            return None
        rows, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        self.req_generation[rows] += 1
        return rows


@pytest.mark.parametrize(
    "check,buggy",
    [
        (check_zero_rows, MinusZeroSlice),
        (check_generation_survives_clear, ResetGenerationOnClear),
        (check_tail_allocation, HeadAllocation),
    ],
)
def test_checks_pass_on_the_pool_and_catch_the_classic_bugs(check, buggy):
    check(ReqToTokenPool)
    with pytest.raises(AssertionError):
        check(buggy)


def test_double_free_of_a_row_is_refused():
    pool = ReqToTokenPool(3, 4)
    (row,) = pool.alloc_rows(1)
    pool.free(row)
    with pytest.raises(ValueError, match=f"double free: row {row} is already free"):
        pool.free(row)
    assert sorted(pool.free_slots) == [1, 2, 3]


def test_a_request_listed_twice_is_refused_before_taking_rows():
    pool = ReqToTokenPool(4, 4)
    r = Req("r")
    with pytest.raises(ValueError, match="Req\\('r'.*appears twice"):
        pool.alloc([r, r])
    assert pool.available_size() == 4 and r.kv.req_pool_idx is None


def test_a_request_claiming_a_free_or_foreign_row_is_refused_and_write_needs_rows():
    pool = ReqToTokenPool(4, 4)
    a, b = Req("a"), Req("b")
    pool.alloc([a])
    a.kv.kv_allocated_len = 2  # a chunked prefill that wrote KV keeps its row
    assert pool.alloc([a]) == [a.kv.req_pool_idx]
    free_row = pool.free_slots[-1]
    # a free row, another request's, padding, past the pool
    for claim in (free_row, a.kv.req_pool_idx, 0, 9):
        b.kv.req_pool_idx, b.kv.kv_allocated_len = claim, 2
        before = (list(pool.free_slots), bytes(pool._row_free))
        with pytest.raises(ValueError, match=f"claims row {claim}"):
            pool.alloc([b])
        assert (list(pool.free_slots), bytes(pool._row_free)) == before
    table = pool.req_to_token.clone()
    with pytest.raises(TypeError, match="every row"):
        pool.write(None, 7)
    assert torch.equal(pool.req_to_token, table)


def test_write_checks_an_int_row_but_never_scans_a_tensor_of_rows(monkeypatch):
    """The hot path: a tensor of rows is the caller's contract (SGLang's too), so write reads no
    tensor values; an int row past the end is refused, naming it."""
    from memlab.common import _checks

    pool = ReqToTokenPool(4, 8)
    with pytest.raises(ValueError, match="indices \\(row\\) must be .* got 9"):
        pool.write((9, slice(0, 2)), torch.tensor([1, 2], dtype=torch.int32))
    scans = []
    monkeypatch.setattr(_checks, "values_in", lambda *a, **k: scans.append(a))
    monkeypatch.setattr(
        torch.Tensor, "tolist", lambda self: scans.append("tolist") or []
    )
    pool.write(
        (torch.tensor([1, 2]), torch.tensor([0, 1])),
        torch.tensor([5, 6], dtype=torch.int32),
    )
    assert not scans
    assert pool.req_to_token[1, 0].item() == 5 and pool.req_to_token[2, 1].item() == 6


def test_the_token_allocators_batch_checks_run_in_every_mode(monkeypatch):
    """They read shapes and the host copies (no sync), so they run with debug mode off too: a bad
    batch is refused by name, not accepted because page size 1 needs no continuation."""
    from memlab.common import _checks
    from memlab.sglang.allocator import TokenToKVPoolAllocator

    calls = []
    monkeypatch.setattr(_checks, "alloc_decode", lambda *a: calls.append("decode"))
    monkeypatch.setattr(_checks, "alloc_extend", lambda *a: calls.append("extend"))
    lens = torch.tensor([3, 4])
    for debug, want in ((False, ["extend", "decode"]), (True, ["extend", "decode"])):
        al, calls[:] = TokenToKVPoolAllocator(16, debug_mode=debug), []
        al.alloc_extend(lens - 3, lens - 3, lens, lens, torch.tensor([-1, -1]), 7)
        al.alloc_decode(lens, lens, torch.tensor([2, 3]))
        assert calls == want
