"""Graded: chapter 09, the gather of paged decode attention (exercises/ch09_paged_gather.py).

The kernel's output is compared with dense attention over each request's KV gathered in torch.
K and V come in several layouts (views of wider buffers, with strides of their own), the request
table is fenced (a read past its end crashes), and unowned slots hold poison; a check on the
gather's source, and a GPU check on a pool past 2^31 elements, cover 32-bit address arithmetic.
"""

import math

import pytest
import torch

from memlab.course.grading.checks import expect, expect_equal, plural
from memlab_tests.exercises.exercise_refs import fenced, i64, narrow_products


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch09.paged_gather", requires=requires)


def kv_views(k, v, kind):
    """K and V with the same values in another memory layout (their strides differ)."""
    if kind == "dense":
        return k, v

    def in_wider(x):  # every slot's row inside a wider buffer: stride (h + 1) * d, d, 1
        n, h, d = x.shape
        wide = torch.full((n, h + 1, d), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, 1:] = x
        return wide[:, 1:]

    # a (slots, heads, dim) view of a (heads, slots, dim) tensor: stride d, n * d, 1
    def heads_outer(x):
        return x.transpose(0, 1).contiguous().transpose(0, 1)

    if kind == "strided":
        return in_wider(k), heads_outer(v)
    return heads_outer(k), in_wider(v)  # "swapped"


def layout(
    lens,
    rows,
    num_slots,
    kv_heads,
    head_dim,
    seed,
    dtype=torch.float32,
    poison=False,
    extra_cols=8,
    wide_table=0,
):
    """KV scattered over a pool: each request's tokens on random distinct slots of its row."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    v = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    r2t = torch.zeros(
        max(rows) + 1, max(lens) + extra_cols + wide_table, dtype=torch.int32
    )
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    used, i = [], 0
    for row, n in zip(rows, lens):
        r2t[row, :n] = perm[i : i + n].to(torch.int32)
        used.append(perm[i : i + n])
        i += n
    if poison:  # every slot no request owns holds garbage: reading one shows
        owned = torch.zeros(num_slots, dtype=torch.bool)
        owned[torch.cat(used)] = True
        k[~owned] = 1e4
        v[~owned] = float("nan")
        r2t[r2t == 0] = int(perm[-1])  # past each request's length: an unowned slot
    return k.to(dtype), v.to(dtype), r2t


def reference(q, k, v, r2t, rows, lens):
    out = []
    group = q.shape[1] // k.shape[1]
    for b, (row, n) in enumerate(zip(rows, lens)):
        s = r2t[row, :n].long()
        kk = k[s].float().repeat_interleave(group, 1)
        vv = v[s].float().repeat_interleave(group, 1)
        p = (
            torch.einsum("hd,thd->ht", q[b].float(), kk) / math.sqrt(q.shape[-1])
        ).softmax(-1)
        out.append(torch.einsum("ht,thd->hd", p, vv))
    return torch.stack(out)


def run(
    lens,
    rows,
    heads=4,
    kv_heads=2,
    head_dim=16,
    seed=0,
    dtype=torch.float32,
    poison=False,
    kv="dense",
    extra_cols=8,
    wide_table=0,
    atol=1e-4,
):
    """The learner's kernel on a fenced request table (its last row ends the readable memory)."""
    from memlab.common.env import kernel_device
    from memlab.course.grading.loader import load

    dev = kernel_device()
    k, v, r2t = layout(
        lens, rows, 256, kv_heads, head_dim, seed, dtype, poison, extra_cols, wide_table
    )
    q = torch.randn(
        len(lens), heads, head_dim, generator=torch.Generator().manual_seed(seed + 1)
    ).to(dtype)
    # the views are made where the kernel runs
    kd, vd = kv_views(k.to(dev), v.to(dev), kv)
    table = fenced(r2t, torch.int32, dev)
    if wide_table:
        # a view: its row stride is wider than its rows
        table = table[:, : r2t.shape[1] - wide_table]
    inputs = [
        q.to(dev),
        kd,
        vd,
        table,
        i64(*rows).to(dev),
        i64(*lens).to(dev),
    ]
    before = [x.clone() for x in inputs]
    got = load("ch09_paged_gather").decode_attention(*inputs)
    expect(
        isinstance(got, torch.Tensor) and got.shape == q.shape and got.dtype == dtype,
        f"decode_attention must return a {dtype} tensor of shape {tuple(q.shape)}, got "
        f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}",
    )
    for name, x, b in zip(
        ("q", "k_buffer", "v_buffer", "req_to_token", "req_pool_indices", "seq_lens"),
        inputs,
        before,
    ):
        expect_equal(x, b, f"decode_attention must only read {name}")
    got = got.float().cpu()
    want = reference(q, k, v, r2t, rows, lens)
    for b in range(len(lens)):
        err = (got[b] - want[b]).abs().max().item()
        expect(
            err <= atol,
            f"request {b} (row {rows[b]}, {plural(lens[b], 'token')}; K strides "
            f"{tuple(kd.stride())}, V strides "
            f"{tuple(vd.stride())}, req_to_token row stride {table.stride(0)}): output differs "
            "from "
            f"attention over its own KV by {err:.3g} (tolerance {atol:g}); does the gather read "
            "row "
            "req_pool_indices[b], the right KV head, and V with V's own strides?",
        )


@pytest.mark.kernel
@points(1)
def test_matches_dense_attention(rng):
    # Batch entry b is NOT row b: rows come from req_pool_indices.
    run([1, 7, 33], [4, 1, 2], heads=4, kv_heads=2, seed=rng.randrange(2**31))


@pytest.mark.kernel
@points(1)
def test_k_and_v_layouts_differ(rng):
    # K inside a wider buffer, V heads-outermost, the request table a view of a wider one.
    run(
        [5, 19, 2],
        [3, 0, 2],
        heads=4,
        kv_heads=2,
        seed=rng.randrange(2**31),
        kv="strided",
        wide_table=5,
    )
    run([40], [1], heads=2, kv_heads=2, seed=rng.randrange(2**31), kv="swapped")
    run(
        [7, 21],
        [1, 3],
        heads=4,
        kv_heads=2,
        seed=rng.randrange(2**31),
        kv="swapped",
        wide_table=3,
    )


@pytest.mark.kernel
@points(1)
def test_grouped_query_heads(rng):
    run([9, 20], [2, 3], heads=8, kv_heads=2, seed=rng.randrange(2**31))
    run([5], [1], heads=2, kv_heads=2, seed=rng.randrange(2**31))
    run([3, 6], [1, 2], heads=4, kv_heads=1, seed=rng.randrange(2**31), kv="strided")


@pytest.mark.kernel
@points(1, requires="test_matches_dense_attention")
def test_reads_only_its_own_slots(rng):
    # Slots no request owns hold 1e4 (K) and NaN (V): a gather past seq_len or from the
    # wrong row shows.
    run([3, 17, 40], [5, 2, 1], seed=rng.randrange(2**31), poison=True)
    # One-token requests; the last row of the table is full (its request's tokens end
    # the table's memory): a load of the table past seq_len reads past the end, which
    # the fence turns into a crash.
    run([1, 1, 1], [3, 1, 2], seed=rng.randrange(2**31), poison=True)
    run([2, 16], [0, 1], seed=rng.randrange(2**31), poison=True, extra_cols=0)
    run(
        [4, 13],
        [1, 0],
        seed=rng.randrange(2**31),
        poison=True,
        extra_cols=0,
        kv="strided",
    )


# -- 32-bit address arithmetic ------------------------------------------------------------------


@pytest.mark.kernel
@points(1, requires="test_matches_dense_attention")
def test_addresses_in_64_bit(rng):
    from memlab.course.grading.loader import load

    # the gather works at all (the stub raises NotImplementedError here)
    run([2, 3], [1, 0], seed=rng.randrange(2**31))
    from memlab.course.grading.loader import source_dir

    load("ch09_paged_gather")  # the file imports (else its error is the message)
    # the file, read from disk
    source = (source_dir() / "ch09_paged_gather.py").read_text()
    bad = narrow_products(source)
    expect(
        not bad or not bad[0].startswith("(nothing"),
        f"the 64-bit check found {bad[0] if bad else ''}",
    )
    expect(
        not bad,
        f"the gather computes {bad[0] if bad else ''} in 32 bits: the slots come from req_to_token "
        "(int32) and the stride fits in 32 bits, so the product is int32 and wraps past 2^31 "
        "elements (a pool of a few million tokens): the kernel would read another token's KV or "
        "fault. Cast the slots to int64 first (.to(tl.int64)), as SGLang does",
    )


@pytest.mark.kernel
@pytest.mark.gpu
@points(1)
def test_compiled_on_gpu_fp16(rng):
    from memlab.course.grading.loader import load

    lens = [rng.randint(1, 300) for _ in range(24)]
    rows = rng.sample(range(1, 60), 24)
    k, v, r2t = layout(lens, rows, 8192, 2, 64, rng.randrange(2**31), torch.float16)
    q = torch.randn(
        24, 8, 64, generator=torch.Generator().manual_seed(rng.randrange(2**31))
    ).half()
    kd, vd = kv_views(k, v, "strided")
    got = load("ch09_paged_gather").decode_attention(
        q.cuda(),
        kd.cuda(),
        vd.cuda(),
        r2t.cuda(),
        i64(*rows).cuda(),
        i64(*lens).cuda(),
    )
    err = (got.float().cpu() - reference(q, k, v, r2t, rows, lens)).abs().max().item()
    expect(
        err <= 2e-2,
        f"fp16 on the GPU (strided K and V): the output differs from attention by {err:.3g}",
    )


@pytest.mark.kernel
@pytest.mark.gpu
@points(1)
def test_gpu_pool_past_2_31_elements(rng):
    """K and V in one fp16 buffer of more than 2^31 elements (4.3 GB); the requests' slots lie at
    its end, where slot * stride_ks no longer fits in 32 bits."""
    from memlab.course.grading.loader import load

    kv_heads, dim = 2, 64
    # K and V interleaved per slot: stride_ks = stride_vs = 256
    per_slot = 2 * kv_heads * dim
    num_slots = (1 << 31) // per_slot + 4096
    try:
        kv = torch.empty(
            num_slots, 2, kv_heads, dim, dtype=torch.float16, device="cuda"
        )
    except torch.cuda.OutOfMemoryError:
        pytest.skip("needs 4.3 GB of free GPU memory")
    k, v = kv[:, 0], kv[:, 1]
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    lens, rows = [37, 5, 64], [2, 1, 3]
    slots = (num_slots - 1 - torch.randperm(4000, generator=g)[: sum(lens)]).tolist()
    r2t = torch.zeros(4, 64, dtype=torch.int32)
    i = 0
    for row, n in zip(rows, lens):
        r2t[row, :n] = torch.tensor(slots[i : i + n], dtype=torch.int32)
        i += n
    used = i64(*slots).cuda()
    k[used] = torch.randn(len(slots), kv_heads, dim, generator=g).half().cuda()
    v[used] = torch.randn(len(slots), kv_heads, dim, generator=g).half().cuda()
    q = torch.randn(3, 4, dim, generator=g).half().cuda()
    try:
        got = load("ch09_paged_gather").decode_attention(
            q,
            k,
            v,
            r2t.cuda(),
            i64(*rows).cuda(),
            i64(*lens).cuda(),
        )
        torch.cuda.synchronize()
        # the same KV in a small pool, for the reference
        small = {s: j for j, s in enumerate(slots)}
        r2t_small = r2t.clone().apply_(lambda s: small.get(s, 0))
        want = reference(q.cpu(), k[used].cpu(), v[used].cpu(), r2t_small, rows, lens)
        err = (got.float().cpu() - want).abs().max().item()
    finally:
        del kv, k, v
        torch.cuda.empty_cache()
    expect(
        err <= 2e-2,
        f"a pool of {num_slots:,} slots x {plural(per_slot, 'value')} (past 2^31 elements): the "
        "output differs "
        f"from attention by {err:.3g}; is slot * stride computed in int64?",
    )


# -- the learner's kernel against the engine's attention (memlab.common.attention), random batches

VIEW_CODE = {  # the layouts of kv_views, as code to paste
    "in_wider": "w = torch.full((x.shape[0], x.shape[1] + 1, x.shape[2]), float('nan')); "
    "w[:, 1:] = x; x = w[:, 1:]",
    "heads_outer": "x = x.transpose(0, 1).contiguous().transpose(0, 1)",
}


def random_case(d):
    from memlab.common.attention import attention_over_slots, slots_from_req_to_token
    from memlab.common.env import kernel_device
    from memlab.course.grading.loader import load

    (kv_heads, group), head_dim = (
        d.pick(((1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (3, 1))),
        d.pick((16, 4, 8, 32)),
    )
    heads = kv_heads * group
    # past a block of 16
    lens = [
        d.int(17, 40) if d.chance(0.3) else d.int(1, 16) for _ in d.count(1, 3, 0.4)
    ]
    num_rows = len(lens) + d.int(0, 3)
    rows = d.sample(range(num_rows), len(lens))  # batch entry b is not row b
    num_slots = sum(lens) + d.int(1, 40)
    # each token on a random slot of the pool
    slots = d.sample(range(1, num_slots), sum(lens))
    # 0: the last row ends the table's memory (the fence)
    cols = max(lens) + d.pick((0, 3))
    table = [[0] * cols for _ in range(num_rows)]
    i = 0
    for row, n in zip(rows, lens):
        table[row][:n] = slots[i : i + n]
        i += n
    kind = d.pick(("dense", "strided", "swapped"))
    poison, half, seed = d.chance(0.5), d.chance(0.2), d.int(0, 999)
    dtype = torch.float16 if half else torch.float32
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    v = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    q = torch.randn(len(lens), heads, head_dim, generator=g)
    unowned = sorted(set(range(num_slots)) - set(slots))
    if poison:  # slots no request owns hold garbage: reading one shows
        k[unowned], v[unowned] = 1e4, float("nan")
    k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
    d.given(
        seq_lens=lens,
        req_pool_indices=rows,
        req_to_token=table,
        kv_heads=kv_heads,
        heads=heads,
        head_dim=head_dim,
        layout=kind,
        dtype=str(dtype).removeprefix("torch."),
        unowned_slots_poisoned=poison,
    )
    d.code(f"g = torch.Generator().manual_seed({seed})")
    for name, shape in (
        ("k", (num_slots, kv_heads, head_dim)),
        ("v", (num_slots, kv_heads, head_dim)),
        ("q", (len(lens), heads, head_dim)),
    ):
        d.code(
            f"{name} = torch.randn{shape}, generator=g)".replace(
                "randn(", "randn(", 1
            ).replace(f"randn{shape}", f"randn({', '.join(map(str, shape))}")
        )
    if poison:
        d.code(f"k[{unowned}], v[{unowned}] = 1e4, float('nan')")
    d.code(
        f"k, v, q = k.to(torch.{dtype}), v.to(torch.{dtype}), q.to(torch.{dtype})".replace(
            "torch.torch.", "torch."
        )
    )
    views = {
        "dense": (),
        "strided": ("in_wider", "heads_outer"),
        "swapped": ("heads_outer", "in_wider"),
    }[kind]
    for name, view in zip("kv", views):
        d.code(f"x = {name}; {VIEW_CODE[view]}; {name} = x")
    d.code(
        f"print(ex.decode_attention(q, k, v, torch.tensor({table}, dtype=torch.int32), "
        f"torch.tensor({rows}), "
        f"torch.tensor({lens})))"
    )
    dev = kernel_device()
    kd, vd = kv_views(k.to(dev), v.to(dev), kind)
    r2t = fenced(table, torch.int32, dev)  # a load past the table's end crashes
    inputs = [
        q.to(dev),
        kd,
        vd,
        r2t,
        i64(*rows).to(dev),
        i64(*lens).to(dev),
    ]
    before = [x.clone() for x in inputs]
    got = d.call(
        "decode_attention",
        load("ch09_paged_gather").decode_attention,
        *inputs,
        keep=False,
    )
    if not (
        isinstance(got, torch.Tensor) and got.shape == q.shape and got.dtype == dtype
    ):
        d.returns(
            "decode_attention", got, f"a {dtype} tensor of shape {tuple(q.shape)}"
        )
    for name, x, b in zip(
        ("q", "k_buffer", "v_buffer", "req_to_token", "req_pool_indices", "seq_lens"),
        inputs,
        before,
    ):
        d.same(f"{name} after the call", x, b, "decode_attention must only read it")
    slot_ids, mask = slots_from_req_to_token(
        torch.tensor(table, dtype=torch.int32),
        i64(*rows),
        i64(*lens),
    )
    want = attention_over_slots(
        q.float(), k.float(), v.float(), slot_ids, mask, 1 / math.sqrt(head_dim)
    )
    err = (got.float().cpu() - want).abs().amax(dim=(1, 2))
    atol = 2e-2 if half else 1e-4
    if bool((err > atol).any()) or bool(err.isnan().any()):
        b = int(torch.nan_to_num(err, nan=float("inf")).argmax())
        d.fail(
            "decode_attention output",
            f"your `decode_attention` differs from the engine's on {d.words()}: "
            f"request {b}'s output is off by {float(err[b]):.3g} (tolerance {atol:g}); does the "
            "gather read row "
            "req_pool_indices[b], the right KV head, only the request's own slots, and V with V's "
            "own strides?",
        )


@pytest.mark.kernel
@points(2)
def test_random_batches_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=8, name="ch09_paged_gather")
