"""Graded: chapter 02, bytes per token (exercises/ch02_bytes_per_token.py)."""

import pytest
import torch

from memlab.course.grading.checks import expect_equal, expect_raises, plural
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch02.bytes_per_token", requires=requires)


def ex():
    return load("ch02_bytes_per_token")


def shapes(rng, n=3):
    """Random model shapes: (layers, KV heads, K width, V width, bytes per value)."""
    for _ in range(n):
        yield (
            rng.randint(1, 128),
            rng.randint(1, 64),
            rng.choice((rng.randint(1, 576), 64, 128)),
            rng.randint(1, 576),
            rng.choice((1, 2, 4)),
        )


@points(1)
def test_mha_llama3_8b(rng):
    # Llama-3-8B: 32 layers, 8 KV heads of 128 (config.json), bf16.
    got = ex().mha_bytes_per_token(32, 8, 128)
    expect_equal(
        got,
        2 * 32 * 8 * 128 * 2,
        "Llama-3-8B (32 layers, 8 KV heads, head_dim 128, 2 bytes) stores K AND V: "
        "bytes per token",
    )
    expect_equal(
        ex().mha_bytes_per_token(32, 8, 128, dtype_bytes=1),
        65536,
        "the same model in fp8 (1 byte)",
    )
    for layers, heads, dim, _, nbytes in shapes(rng):
        expect_equal(
            ex().mha_bytes_per_token(layers, heads, dim, dtype_bytes=nbytes),
            2 * layers * heads * dim * nbytes,
            f"{plural(layers, 'layer')}, {plural(heads, 'KV head')} of {dim}, "
            f"{plural(nbytes, 'byte')} a value: K and V",
        )


@points(1)
def test_mha_v_head_dim(rng):
    got = ex().mha_bytes_per_token(2, 4, 192, v_head_dim=128, dtype_bytes=2)
    expect_equal(
        got,
        2 * 4 * (192 + 128) * 2,
        "2 layers, 4 heads, K width 192 and V width 128: bytes per token",
    )
    for layers, heads, dk, dv, nbytes in shapes(rng):
        expect_equal(
            ex().mha_bytes_per_token(layers, heads, dk, dv),
            layers * heads * (dk + dv) * 2,
            f"{plural(layers, 'layer')}, {plural(heads, 'head')}, K width {dk} and V width {dv} "
            "(positional), 2 bytes",
        )
        expect_equal(
            ex().mha_bytes_per_token(
                layers, heads, dk, v_head_dim=dv, dtype_bytes=nbytes
            ),
            layers * heads * (dk + dv) * nbytes,
            f"{plural(layers, 'layer')}, {plural(heads, 'head')}, K width {dk}, V width "
            f"{dv}, {plural(nbytes, 'byte')}",
        )


@points(1)
def test_mla_deepseek_v3(rng):
    # DeepSeek-V3: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64 (config.json), bf16.
    got = ex().mla_bytes_per_token(61, 512, 64)
    expect_equal(
        got,
        61 * 576 * 2,
        "DeepSeek-V3's MLA latent (61 layers x (512 + 64) values x 2 bytes, "
        "one row shared by all heads, no V)",
    )
    for layers, _, rank, rope, nbytes in shapes(rng):
        expect_equal(
            ex().mla_bytes_per_token(layers, rank, rope, dtype_bytes=nbytes),
            layers * (rank + rope) * nbytes,
            f"MLA: {plural(layers, 'layer')}, kv_lora_rank {rank}, qk_rope_head_dim {rope}, "
            f"{plural(nbytes, 'byte')} (one latent row, no V)",
        )


@points(1)
def test_matches_real_buffers(rng):
    e = ex()
    layers, tokens = rng.randint(1, 4), rng.randint(1, 12)
    dtypes = (torch.float16, torch.float32, torch.uint8, torch.bfloat16)
    for heads, dk, dv, dtype in [
        (rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 40), rng.choice(dtypes))
        for _ in range(3)
    ]:
        k = [torch.empty(tokens, heads, dk, dtype=dtype) for _ in range(layers)]
        v = [torch.empty(tokens, heads, dv, dtype=dtype) for _ in range(layers)]
        real = sum(t.nbytes for t in k + v) // tokens
        got = e.mha_bytes_per_token(
            layers, heads, dk, v_head_dim=dv, dtype_bytes=dtype.itemsize
        )
        expect_equal(
            got,
            real,
            f"MHA bytes per token vs real buffers ({plural(layers, 'layer')}, "
            f"{plural(heads, 'head')}, K {dk}, V {dv}, {dtype})",
        )
    rank, rope = rng.randint(1, 64), rng.randint(1, 16)
    latent = [
        torch.empty(tokens, 1, rank + rope, dtype=torch.float16) for _ in range(layers)
    ]
    expect_equal(
        e.mla_bytes_per_token(layers, rank, rope),
        sum(t.nbytes for t in latent) // tokens,
        f"MLA bytes per token vs real latent buffers (rank {rank}, rope {rope}, fp16)",
    )


@points(1, requires="test_mha_llama3_8b")
def test_bad_input(rng):
    e = ex()
    layers, heads, dk, dv, _ = next(shapes(rng, 1))
    good = {
        "mha_bytes_per_token": dict(
            layer_num=layers, head_num=heads, head_dim=dk, v_head_dim=dv, dtype_bytes=2
        ),
        "mla_bytes_per_token": dict(
            layer_num=layers, kv_lora_rank=dk, qk_rope_head_dim=dv, dtype_bytes=2
        ),
    }
    for fn, kwargs in good.items():
        # every argument, each bad value: a ValueError that names the argument
        for name in kwargs:
            for bad in (0, -rng.randint(1, 2**31), True, float(rng.randint(1, 8))):
                args = dict(kwargs, **{name: bad})
                expect_raises(
                    ValueError,
                    lambda: getattr(e, fn)(**args),
                    f"{fn}({name}={bad!r})",
                    naming=name,
                )
        expect_equal(
            getattr(e, fn)(**dict(kwargs, layer_num=1, dtype_bytes=1)),
            heads * (dk + dv) if fn[1] == "h" else dk + dv,
            f"{fn} with layer_num=1 and dtype_bytes=1 (the smallest good values)",
        )


# -- the learner's sizes against the engine's (memlab.sglang.kv_pool), on random shapes -----------


def random_case(d):
    from memlab.course.grading.fuzz import Raised
    from memlab.sglang import kv_pool
    from memlab_tests.exercises.exercise_refs import INT31

    mla = d.chance(0.4)
    fn = "mla_bytes_per_token" if mla else "mha_bytes_per_token"
    names = (
        ("layer_num", "kv_lora_rank", "qk_rope_head_dim")
        if mla
        else ("layer_num", "head_num", "head_dim")
    )
    args = {n: (d.big(1, INT31) if d.chance(0.2) else d.int(1, 200)) for n in names}
    if not mla and d.chance(0.5):
        args["v_head_dim"] = d.big(1, 4096)
    if d.chance(0.6):
        args["dtype_bytes"] = d.pick((1, 2, 4, 8))
    bad = d.chance(0.25)
    if bad:  # one argument that is not a positive int: the docstring's ValueError
        name = d.pick(list(args) + (["v_head_dim"] if not mla else []))
        args[name] = d.pick((0, -1, True, False, 2.0, -(2**31)))
    # the first arguments by position, the rest by name
    positional = d.int(0, len(names))
    pos = [args.pop(n) for n in names[:positional]]
    d.given(**dict(zip(names, pos)), **args)
    shown = ", ".join([repr(v) for v in pos] + [f"{k}={v!r}" for k, v in args.items()])
    d.code(f"print(ex.{fn}({shown}))")
    got = d.call(fn, getattr(ex(), fn), *pos, **args)
    want = Raised(ValueError()) if bad else getattr(kv_pool, fn)(*pos, **args)
    d.returns(fn, got, want)


@points(2)
def test_random_shapes_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=200, name="ch02_bytes_per_token")
