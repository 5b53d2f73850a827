"""Paged decode attention (chapter 09): kernel vs torch reference vs plain-Python reference.

Tolerances (stated once, used everywhere):
- fp32: atol = rtol = 1e-5 (only the order of fp32 additions differs).
- fp16: atol = rtol = 2e-3. Storage is fp16 but every implementation accumulates in fp32; the
  outputs differ by the final rounding to fp16 (half an ulp is 1e-3 at magnitude 2) and the
  order of additions. The Python reference (float64 arithmetic on the fp16 values) is compared
  before any rounding with the same tolerance.
Guard bands: slots no request owns and slot 0 hold NaN, table entries past a request's length
point at a NaN slot, and the output is a view into a larger tensor filled with a sentinel; a
kernel that reads or writes outside what it should turns up as NaN or a changed sentinel.
"""

import math

import pytest
import torch

from memlab.common import attention as A
from memlab.common.env import kernel_device

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}
SENTINEL = 777.0


def make_layout(seed, seq_lens, page_size, num_pages=None, table_rows=8, device="cpu"):
    """Scatter the pages of a batch over a pool in random order; spell it both ways.

    Returns (req_to_token, req_pool_indices, block_table, num_slots, poison_slot). Slot 0 / page 0
    is padding (never handed out), as in SGLang and vLLM. Table entries past a request's length
    point at ``poison_slot``, a slot no request owns.
    """
    g = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    need = sum(pages_per_req)
    num_pages = num_pages or need + 4
    # pages 1.., shuffled
    order = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    poison_page = order.pop()
    max_blocks = max(pages_per_req) + 1
    block_table = torch.full(
        (len(seq_lens), max_blocks), poison_page, dtype=torch.int32
    )
    for b, n_pages in enumerate(pages_per_req):
        block_table[b, :n_pages] = torch.tensor(
            [order.pop() for _ in range(n_pages)], dtype=torch.int32
        )
    max_ctx = max_blocks * page_size
    poison_slot = poison_page * page_size
    rows = (torch.randperm(table_rows - 1, generator=g)[: len(seq_lens)] + 1).to(
        torch.int64
    )
    req_to_token = torch.full((table_rows, max_ctx), poison_slot, dtype=torch.int32)
    pos = torch.arange(max_ctx)
    for b, n in enumerate(seq_lens):
        slots = block_table[b, pos // page_size].long() * page_size + pos % page_size
        req_to_token[rows[b], :n] = slots[:n].int()
    to = dict(device=device)
    return (
        req_to_token.to(**to),
        rows.to(**to),
        block_table.to(**to),
        num_pages * page_size,
        poison_slot,
    )


def poisoned_buffer(seed, num_slots, heads, dim, dtype, owned, device):
    """Random rows for owned slots, NaN everywhere else (slot 0 and unowned slots included)."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.full((num_slots, heads, dim), float("nan"))
    buf[owned] = torch.randn(len(owned), heads, dim, generator=g)
    return buf.to(dtype=dtype, device=device)


def guarded_out(bs, heads, dim, dtype, device):
    full = torch.full(
        (bs + 2, heads + 1, dim + 3), SENTINEL, dtype=dtype, device=device
    )
    return full, full[1:-1, :heads, :dim]


def check_guard(full, bs, heads, dim):
    inside = torch.zeros_like(full, dtype=torch.bool)
    inside[1:-1, :heads, :dim] = True
    assert torch.all(full[~inside] == SENTINEL), "the kernel wrote outside its output"


SEQ_CASES = {
    1: [1, 5, 37, 2],
    16: [1, 16, 17, 70, 33],
    64: [1, 64, 65, 130],
}


def _owned(req_to_token, rows, seq_lens):
    return torch.cat(
        [req_to_token[r, :n].long() for r, n in zip(rows.tolist(), seq_lens)]
    )


# ---------------------------------------------------------------------------------------------
# References (no kernel): they agree with each other and with dense attention.
# ---------------------------------------------------------------------------------------------
def test_torch_reference_equals_dense_sdpa_on_contiguous_kv():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 8)
    slots = torch.arange(1, 9)[None]  # one request holding slots 1..8 in order
    got = A.attention_over_slots(
        q, k, v, slots, torch.ones_like(slots, dtype=torch.bool), 0.25
    )
    kk = k[1:].repeat_interleave(2, dim=1).permute(1, 0, 2)  # (H, L, D)
    vv = v[1:].repeat_interleave(2, dim=1).permute(1, 0, 2)
    want = torch.nn.functional.scaled_dot_product_attention(
        q[0][:, None], kk, vv, scale=0.25
    )[:, 0]
    torch.testing.assert_close(got[0], want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_python_reference_equals_torch_reference(page_size):
    seq_lens = SEQ_CASES[page_size]
    r2t, rows, bt, n_slots, _ = make_layout(1, seq_lens, page_size)
    owned = _owned(r2t, rows, seq_lens)
    k = poisoned_buffer(2, n_slots, 2, 8, torch.float32, owned, "cpu")
    v = poisoned_buffer(3, n_slots, 2, 4, torch.float32, owned, "cpu")
    q = torch.randn(len(seq_lens), 4, 8)
    lens = torch.tensor(seq_lens)
    slots, mask = A.slots_from_req_to_token(r2t, rows, lens)
    slots_bt, mask_bt = A.slots_from_block_table(bt, lens, page_size)
    assert torch.equal(slots, slots_bt) and torch.equal(mask, mask_bt)
    py_slots = A.python_slots_from_req_to_token(r2t, rows, lens)
    assert py_slots == A.python_slots_from_block_table(bt, lens, page_size)
    assert py_slots == [s[:n] for s, n in zip(slots.tolist(), seq_lens)]
    want = A.attention_over_slots(q, k, v, slots, mask, 0.3)
    got = A.python_attention_over_slots(q, k, v, py_slots, 0.3)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


# Bug zoo: two classic mistakes; the reference comparison used by the kernel tests catches both.
def buggy_slots_forgets_page_scale(block_table, seq_lens, block_size):
    slots, mask = A.slots_from_block_table(block_table, seq_lens, block_size)
    pos = torch.arange(slots.shape[1])
    blocks = (slots - pos % block_size) // block_size
    # block id + offset: no * block_size
    return torch.where(mask, blocks + pos % block_size, 0), mask


def buggy_gqa_head_map(q, k, v, slots, mask, sm_scale):
    kv_heads = k.shape[1]
    group = q.shape[1] // kv_heads
    # h % kv_heads instead of h // group: interleaves query heads over KV heads
    perm = [(h % kv_heads) * group + h // kv_heads for h in range(q.shape[1])]
    return A.attention_over_slots(q[:, perm], k, v, slots, mask, sm_scale)[
        :, torch.argsort(torch.tensor(perm))
    ]


def test_bug_zoo_is_caught_by_the_reference_check():
    seq_lens = [20, 9, 33]
    r2t, rows, bt, n_slots, _ = make_layout(4, seq_lens, 16)
    owned = _owned(r2t, rows, seq_lens)
    k = poisoned_buffer(5, n_slots, 2, 8, torch.float32, owned, "cpu")
    v = poisoned_buffer(6, n_slots, 2, 8, torch.float32, owned, "cpu")
    q = torch.randn(3, 4, 8)
    lens = torch.tensor(seq_lens)
    slots, mask = A.slots_from_block_table(bt, lens, 16)
    want = A.attention_over_slots(q, k, v, slots, mask, 0.3)
    bad_slots, _ = buggy_slots_forgets_page_scale(bt, lens, 16)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            A.attention_over_slots(q, k, v, bad_slots, mask, 0.3), want
        )
    with pytest.raises(AssertionError):
        torch.testing.assert_close(buggy_gqa_head_map(q, k, v, slots, mask, 0.3), want)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors, raised before any kernel is launched.
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    q, k = torch.randn(2, 3, 8), torch.randn(10, 2, 8)
    r2t, rows, lens = (
        torch.zeros(3, 4, dtype=torch.int32),
        torch.tensor([1, 2]),
        torch.tensor([1, 1]),
    )
    with pytest.raises(ValueError, match="multiple of kv heads"):
        A.decode_attention_fwd(q, k, k, r2t, rows, lens)
    q = torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="bfloat16"):
        A.decode_attention_fwd(
            q.bfloat16(), k.bfloat16(), k.bfloat16(), r2t, rows, lens
        )
    with pytest.raises(TypeError, match="like q"):
        A.decode_attention_fwd(q, k.half(), k, r2t, rows, lens)
    with pytest.raises(TypeError, match="req_to_token must be int32"):
        A.decode_attention_fwd(q, k, k, r2t.long(), rows, lens)
    with pytest.raises(TypeError, match="seq_lens must be int32 or int64"):
        A.decode_attention_fwd(q, k, k, r2t, rows, lens.float())
    with pytest.raises(ValueError, match="entries for a batch of"):
        A.decode_attention_fwd(q, k, k, r2t, rows[:1], lens)
    with pytest.raises(ValueError, match="o must have shape"):
        A.decode_attention_fwd(q, k, k, r2t, rows, lens, o=torch.empty(2, 4, 7))
    with pytest.raises(ValueError, match="num_blocks, block_size"):
        A.paged_attention(q, k, k, r2t, lens)
    with pytest.raises(ValueError, match="latent buffer"):
        A.mla_decode_attention_fwd(
            q, q[..., :2], torch.randn(10, 1, 8), r2t, rows, lens, sm_scale=0.1
        )
    with pytest.raises(ValueError, match="contiguously"):
        # (8, 4, 2, 8) whose blocks are not contiguous
        cache = torch.randn(4, 8, 2, 8).transpose(0, 1)
        A.paged_attention(q, cache, cache, r2t, lens)


# ---------------------------------------------------------------------------------------------
# The kernel, through both spellings, against both references.
# ---------------------------------------------------------------------------------------------
def _run_mha(seed, seq_lens, page_size, dtype, q_heads, kv_heads, head_dim, v_head_dim):
    dev = kernel_device()
    r2t, rows, bt, n_slots, _ = make_layout(seed, seq_lens, page_size, device=dev)
    owned = _owned(r2t.cpu(), rows.cpu(), seq_lens)
    k = poisoned_buffer(seed + 1, n_slots, kv_heads, head_dim, dtype, owned, dev)
    v = poisoned_buffer(seed + 2, n_slots, kv_heads, v_head_dim, dtype, owned, dev)
    g = torch.Generator().manual_seed(seed + 3)
    q = torch.randn(len(seq_lens), q_heads, head_dim, generator=g).to(
        dtype=dtype, device=dev
    )
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(head_dim)
    bs = len(seq_lens)

    slots, mask = A.slots_from_req_to_token(r2t, rows, lens)
    want = A.attention_over_slots(q, k, v, slots, mask, scale)
    py = A.python_attention_over_slots(
        q.cpu(),
        k.cpu(),
        v.cpu(),
        A.python_slots_from_req_to_token(r2t, rows, lens),
        scale,
    )
    torch.testing.assert_close(py, want.float().cpu(), **TOL[dtype])

    full, o = guarded_out(bs, q_heads, v_head_dim, dtype, dev)
    got = A.decode_attention_fwd(q, k, v, r2t, rows, lens, o=o)
    assert got.data_ptr() == o.data_ptr()
    check_guard(full, bs, q_heads, v_head_dim)
    torch.testing.assert_close(got, want, **TOL[dtype])

    # vLLM's spelling reads the very same pool, viewed as (num_blocks, block_size, heads, dim).
    kc = k.view(-1, page_size, kv_heads, head_dim)
    vc = v.view(-1, page_size, kv_heads, v_head_dim)
    full, out = guarded_out(bs, q_heads, v_head_dim, dtype, dev)
    got_bt = A.paged_attention(q, kc, vc, bt, lens.long(), out=out)
    check_guard(full, bs, q_heads, v_head_dim)
    torch.testing.assert_close(got_bt, want, **TOL[dtype])


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_mha_gqa_kernel_matches_references(page_size, dtype):
    _run_mha(
        10 + page_size,
        SEQ_CASES[page_size],
        page_size,
        dtype,
        q_heads=4,
        kv_heads=2,
        head_dim=16,
        v_head_dim=16,
    )


@pytest.mark.kernel
@pytest.mark.parametrize(
    "kv_heads,v_head_dim", [(1, 8), (4, 16)], ids=["mqa-dv8", "mha"]
)
def test_kernel_head_layouts(kv_heads, v_head_dim):
    # MQA (all query heads share one KV head) with a narrower V, and plain MHA (group of 1).
    _run_mha(
        40 + kv_heads,
        [3, 1, 18],
        16,
        torch.float32,
        q_heads=4,
        kv_heads=kv_heads,
        head_dim=16,
        v_head_dim=v_head_dim,
    )


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_mla_kernel_matches_references(page_size, dtype):
    dev = kernel_device()
    seq_lens = SEQ_CASES[page_size]
    rank, rope, heads, bs = 32, 8, 2, len(seq_lens)
    r2t, rows, bt, n_slots, _ = make_layout(
        20 + page_size, seq_lens, page_size, device=dev
    )
    owned = _owned(r2t.cpu(), rows.cpu(), seq_lens)
    kv = poisoned_buffer(21, n_slots, 1, rank + rope, dtype, owned, dev)
    g = torch.Generator().manual_seed(22)
    q_nope = torch.randn(bs, heads, rank, generator=g).to(dtype=dtype, device=dev)
    q_rope = torch.randn(bs, heads, rope, generator=g).to(dtype=dtype, device=dev)
    lens = torch.tensor(seq_lens, device=dev)
    scale = 1.0 / math.sqrt(24)  # the model's own head dim, not rank + rope

    # MLA is attention with one KV head whose key is the whole latent row and value its
    # first r columns.
    q_full = torch.cat([q_nope, q_rope], dim=-1)
    slots, mask = A.slots_from_req_to_token(r2t, rows, lens)
    want = A.attention_over_slots(q_full, kv, kv[..., :rank], slots, mask, scale)
    py = A.python_attention_over_slots(
        q_full.cpu(),
        kv.cpu(),
        kv[..., :rank].cpu(),
        A.python_slots_from_block_table(bt, lens, page_size),
        scale,
    )
    torch.testing.assert_close(py, want.float().cpu(), **TOL[dtype])

    full, o = guarded_out(bs, heads, rank, dtype, dev)
    got = A.mla_decode_attention_fwd(
        q_nope, q_rope, kv, r2t, rows, lens, sm_scale=scale, o=o
    )
    check_guard(full, bs, heads, rank)
    torch.testing.assert_close(got, want, **TOL[dtype])

    cache = kv.view(-1, page_size, rank + rope)  # vLLM's MLA cache has no head axis
    full, out = guarded_out(bs, heads, rank, dtype, dev)
    got_bt = A.mla_paged_attention(
        q_nope, q_rope, cache, bt, lens, scale=scale, out=out
    )
    check_guard(full, bs, heads, rank)
    torch.testing.assert_close(got_bt, want, **TOL[dtype])


@pytest.mark.kernel
def test_empty_request_gives_zeros_and_one_token_request_returns_its_value():
    # seq_len 0 is a padded batch entry; with one token, softmax weight 1 returns V exactly.
    dev = kernel_device()
    k = torch.randn(8, 1, 4, device=dev)
    v = torch.randn(8, 1, 4, device=dev)
    r2t = torch.tensor([[0, 0], [5, 0], [0, 0]], dtype=torch.int32, device=dev)
    rows = torch.tensor([2, 1], device=dev)
    lens = torch.tensor([0, 1], device=dev)
    o = A.decode_attention_fwd(torch.randn(2, 2, 4, device=dev), k, v, r2t, rows, lens)
    assert torch.equal(o[0], torch.zeros(2, 4, device=dev))
    torch.testing.assert_close(o[1], v[5].expand(2, 4))


@pytest.mark.kernel
def test_kernel_reads_what_memlabs_books_wrote():
    # The engine's path: rows from ReqToTokenPool, slots from the paged allocator (prefill, then
    # decode steps that interleave requests on the page grid, and a freed request's pages reused),
    # K/V written with set_kv_buffer; the kernel must equal attention over each request's own
    # K/V kept contiguously on the side.
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
    from memlab.sglang.kv_pool import MHATokenToKVPool
    from memlab.sglang.req_to_token import ReqToTokenPool

    dev, ps, layer, g = kernel_device(), 4, 1, torch.Generator().manual_seed(7)
    pool = MHATokenToKVPool(
        96, ps, torch.float32, head_num=2, head_dim=8, layer_num=2, device=dev
    )
    alloc = PagedTokenToKVPoolAllocator(96, ps, torch.float32, device=dev, kvcache=pool)
    table = ReqToTokenPool(6, 64, device=dev)
    kept = {}  # row -> (list of K rows, list of V rows)

    def write(rows, lens, slots):
        """Record the new tokens' slots in the request table and write random K/V there."""
        k, v = (
            torch.randn(len(slots), 2, 8, generator=g).to(dev),
            torch.randn(len(slots), 2, 8, generator=g).to(dev),
        )
        pool.set_kv_buffer(layer, slots, k, v)
        i = 0
        for row, (old, new) in zip(rows, lens):
            table.write((row, slice(old, new)), slots[i : i + new - old].int())
            kept.setdefault(row, ([], []))
            kept[row][0].extend(k[i : i + new - old])
            kept[row][1].extend(v[i : i + new - old])
            i += new - old

    def prefill(prompt_lens):
        rows = table.alloc_rows(len(prompt_lens))
        seq = torch.tensor(prompt_lens)
        slots = alloc.alloc_extend(
            torch.zeros_like(seq).to(dev),
            torch.zeros_like(seq),
            seq.to(dev),
            seq,
            torch.full_like(seq, -1).to(dev),
            int(seq.sum()),
        )
        write(rows, [(0, n) for n in prompt_lens], slots)
        return rows

    def decode(rows):
        lens = torch.tensor([len(kept[r][0]) for r in rows])
        last = table.req_to_token[
            torch.tensor(rows, device=dev), (lens - 1).to(dev)
        ].long()
        slots = alloc.alloc_decode((lens + 1).to(dev), lens + 1, last)
        write(rows, [(n, n + 1) for n in lens.tolist()], slots)

    rows = prefill([5, 3, 9])
    gone = prefill([6])[0]
    for _ in range(6):
        decode(rows)
    # its pages come back first (LIFO) ...
    alloc.free(table.req_to_token[gone, :6].long())
    table.free(gone)
    del kept[gone]
    rows += prefill([7])  # ... and a new request lands on them
    for _ in range(3):
        decode(rows)

    lens = torch.tensor([len(kept[r][0]) for r in rows], device=dev)
    q = torch.randn(len(rows), 4, 8, generator=g).to(dev)
    got = A.decode_attention_fwd(
        q,
        pool.get_key_buffer(layer),
        pool.get_value_buffer(layer),
        table.req_to_token,
        torch.tensor(rows, device=dev),
        lens,
    )
    for b, row in enumerate(rows):
        k = torch.stack(kept[row][0]).repeat_interleave(2, dim=1)  # (L, 4, 8)
        v = torch.stack(kept[row][1]).repeat_interleave(2, dim=1)
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[b], k) / math.sqrt(8), dim=-1)
        torch.testing.assert_close(
            got[b], torch.einsum("hl,lhd->hd", p, v), **TOL[torch.float32]
        )
