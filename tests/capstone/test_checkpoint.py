"""Loading Llama checkpoints without transformers: config.json fields, refusals by name, a
save/load round trip, llama3 rope scaling against its piecewise definition, end-of-sequence stops,
and SmolLM2-135M-Instruct's published config read and sized."""

import json
import math

import pytest
import torch

from memlab.capstone import checkpoint
from memlab.capstone.checkpoint import UnsupportedCheckpoint
from memlab.capstone.engine import (
    Engine,
    TinyConfig,
    TinyLlama,
    generate_reference,
    rope_inv_freq,
)

# HuggingFaceTB/SmolLM2-135M-Instruct's config.json as published on the Hub (transformers 4.42).
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def write(folder, config, generation=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_smollm2_published_config_is_read_and_sized():
    cfg = checkpoint.config_from_dict(SMOLLM2_CONFIG, eos_token_ids=(2,))
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        30,
        9,
        3,
        64,
    )
    assert (
        cfg.rope_theta == 100000.0
        and cfg.rope_scaling is None
        and cfg.tie_word_embeddings
    )
    assert cfg.rms_eps == 1e-5 and cfg.eos_token_ids == (2,)
    # the parameter count the model's loaders report
    assert checkpoint.num_params(cfg) == 134_515_008
    m = checkpoint.sizing_model(cfg, "SmolLM2-135M-Instruct", 8192)
    assert m.kv_bytes_per_token(dtype_bytes=2) == 2 * 30 * 3 * 64 * 2 == 23_040
    assert m.kv_bytes_per_token(dtype_bytes=4) == 46_080


@pytest.mark.parametrize(
    "change,message",
    [
        ({"model_type": "mistral"}, "model_type 'mistral'"),
        ({"architectures": ["Qwen2ForCausalLM"]}, "architectures"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"attention_bias": True}, "attention_bias is true"),
        ({"mlp_bias": True}, "mlp_bias is true"),
        ({"rope_interleaved": True}, "rope_interleaved is true"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling.rope_type 'yarn' is not implemented",
        ),
        (
            {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "rope_scaling.rope_type 'dynamic'",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "rope_parameters.rope_type 'longrope'",
        ),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "lacks \\['low_freq_factor', 'high_freq_factor'\\]",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"head_dim": 15}, "head_dim 15 is odd"),
    ],
)
def test_unsupported_configs_are_refused_by_field(tmp_path, change, message):
    with pytest.raises(UnsupportedCheckpoint, match=message):
        checkpoint.read_config(write(tmp_path, {**TINY, **change}))


def test_a_config_without_its_shapes_names_them(tmp_path):
    with pytest.raises(UnsupportedCheckpoint, match="lacks \\['vocab_size'\\]"):
        checkpoint.read_config(
            write(tmp_path, {k: v for k, v in TINY.items() if k != "vocab_size"})
        )
    with pytest.raises(FileNotFoundError, match="no config.json"):
        checkpoint.read_config(tmp_path / "nowhere")


def test_both_rope_spellings_and_the_defaults(tmp_path):
    v4 = checkpoint.read_config(
        write(tmp_path / "v4", {**TINY, "rope_theta": 5e5, "rope_scaling": LLAMA3})
    )
    v5 = checkpoint.read_config(
        write(
            tmp_path / "v5", {**TINY, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}}
        )
    )
    assert (
        v4 == v5
        and v4.rope_theta == 5e5
        and v4.rope_scaling["original_max_position_embeddings"] == 256
    )
    bare = checkpoint.read_config(
        write(tmp_path / "bare", {**TINY, "num_key_value_heads": None})
    )
    # transformers.LlamaConfig's defaults: MHA, head_dim = hidden / heads, eps 1e-6,
    # theta 1e4, untied
    assert (bare.num_kv_heads, bare.head_dim, bare.rms_eps, bare.rope_theta) == (
        4,
        16,
        1e-6,
        1e4,
    )
    assert not bare.tie_word_embeddings and bare.eos_token_ids == ()
    # generate stops on generation_config.json's ids first, config.json's otherwise
    gen = checkpoint.read_config(
        write(tmp_path / "gen", {**TINY, "eos_token_id": 2}, {"eos_token_id": [5, 7]})
    )
    assert gen.eos_token_ids == (5, 7)
    assert checkpoint.read_config(
        write(tmp_path / "cfg", {**TINY, "eos_token_id": 2})
    ).eos_token_ids == (2,)


def test_llama3_rope_scaling_matches_its_piecewise_definition():
    cfg = TinyConfig(head_dim=16, rope_theta=1e4, rope_scaling=LLAMA3)
    got = rope_inv_freq(cfg).tolist()
    # wavelengths (tokens) bounding the blended band
    low_wl, high_wl = (256 / 1.0, 256 / 4.0)
    bands = set()
    for i, ours in enumerate(got):
        f = 1.0 / 1e4 ** (2 * i / 16)
        wl = 2 * math.pi / f
        if wl < high_wl:
            want, band = f, "kept"
        elif wl > low_wl:
            want, band = f / 8.0, "scaled"
        else:
            s = (256 / wl - 1.0) / (4.0 - 1.0)
            want, band = (1 - s) * f / 8.0 + s * f, "blended"
        bands.add(band)
        assert ours == pytest.approx(want, rel=1e-6), (i, band)
    # the test frequencies cross all three bands
    assert bands == {"kept", "scaled", "blended"}
    linear = rope_inv_freq(
        TinyConfig(rope_scaling={"rope_type": "linear", "factor": 2.0})
    )
    assert torch.allclose(linear, rope_inv_freq(TinyConfig()) / 2)


@pytest.mark.parametrize(
    "cfg",
    [
        TinyConfig(seed=1),
        TinyConfig(
            seed=2,
            num_kv_heads=4,
            tie_word_embeddings=True,
            rope_theta=5e5,
            eos_token_ids=(3,),
        ),
        TinyConfig(seed=3, num_heads=8, head_dim=16, rope_scaling=LLAMA3),
    ],
    ids=["gqa", "mha-tied", "llama3"],
)
def test_save_then_load_gives_the_same_model(tmp_path, cfg):
    pytest.importorskip("safetensors")
    model = TinyLlama(cfg)
    loaded = checkpoint.load(checkpoint.save(model, tmp_path))
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "rope_theta",
        "rms_eps",
        "tie_word_embeddings",
        "rope_scaling",
        "eos_token_ids",
    ):
        assert getattr(loaded.cfg, name) == getattr(cfg, name), name
    assert torch.equal(loaded.embed, model.embed) and torch.equal(
        loaded.lm_head, model.lm_head
    )
    for a, b in zip(loaded.layers, model.layers):
        assert all(torch.equal(a[k], b[k]) for k in b)
    prompts = [[5, 9, 2, 7, 1], list(range(20, 40))]
    assert generate_reference(loaded, prompts, 6) == generate_reference(
        model, prompts, 6
    )


def test_tensors_are_checked_by_name_and_shape(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    folder = checkpoint.save(TinyLlama(TinyConfig()), tmp_path / "ok")
    tensors = checkpoint.read_tensors(folder)

    def broken(edit):
        d = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "config.json").write_text((folder / "config.json").read_text())
        t = dict(tensors)
        edit(t)
        st.save_file(t, str(d / "model.safetensors"))
        return d

    with pytest.raises(
        UnsupportedCheckpoint,
        match="tensor model.layers.1.mlp.up_proj.weight is missing",
    ):
        checkpoint.load(broken(lambda t: t.pop("model.layers.1.mlp.up_proj.weight")))
    with pytest.raises(
        UnsupportedCheckpoint,
        match=r"model.layers.0.self_attn.k_proj.weight has shape \(16, 64\)",
    ):
        checkpoint.load(
            broken(
                lambda t: t.update(
                    {"model.layers.0.self_attn.k_proj.weight": torch.zeros(16, 64)}
                )
            )
        )
    with pytest.raises(UnsupportedCheckpoint, match="unexpected biases .*q_proj.bias"):
        checkpoint.load(
            broken(
                lambda t: t.update(
                    {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}
                )
            )
        )
    with pytest.raises(UnsupportedCheckpoint, match="tensor lm_head.weight is missing"):
        checkpoint.load(broken(lambda t: t.pop("lm_head.weight")))
    # an old checkpoint's rotary buffer is recomputed from the config, not refused
    checkpoint.load(
        broken(
            lambda t: t.update(
                {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}
            )
        )
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        checkpoint.read_tensors(tmp_path / "empty")


def test_sharded_checkpoints_are_read_through_their_index(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    model = TinyLlama(TinyConfig(seed=4))
    tensors = checkpoint.read_tensors(checkpoint.save(model, tmp_path / "one"))
    shard = tmp_path / "sharded"
    shard.mkdir()
    (shard / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for f, ns in halves.items():
        st.save_file({n: tensors[n] for n in ns}, str(shard / f))
    (shard / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: f for f, ns in halves.items() for n in ns}})
    )
    assert generate_reference(
        checkpoint.load(shard), [[1, 2, 3]], 5
    ) == generate_reference(model, [[1, 2, 3]], 5)


def test_the_engine_stops_a_request_at_an_end_of_sequence_token():
    base = TinyLlama(TinyConfig())
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]
    full = generate_reference(base, prompts, 10)
    eos = full[0][4]  # request 0 emits it at step 4 (or earlier, if it came before)
    stop_at = full[0].index(eos)
    model = TinyLlama(TinyConfig(eos_token_ids=(eos,)))
    want = generate_reference(model, prompts, 10)
    # the end-of-sequence token is kept, as transformers does
    assert want[0] == full[0][: stop_at + 1]
    for ps in (1, 16):
        e = Engine(
            model,
            page_size=ps,
            num_tokens=256,
            chunk_size=8 if ps == 1 else 16,  # a multiple of the page
            attention="torch",
            debug_mode=True,
        )
        assert e.generate(prompts, 10) == want
        assert len(e.finished) == 2 and not e.running
        e.check_books()
    e = Engine(model, page_size=4, num_tokens=256, attention="torch", ignore_eos=True)
    assert e.generate(prompts, 10) == full


def test_the_course_imports_neither_transformers_nor_safetensors():
    import subprocess
    import sys

    code = (
        "import sys, memlab.capstone.engine, memlab.capstone.checkpoint, memlab.course.chat\n"
        "print(sorted(m for m in ('transformers', 'safetensors', 'huggingface_hub') "
        "if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_chat_agreement_says_where_answers_part_and_how_close_it_was():
    from memlab.course.chat import ChatRun

    run = ChatRun(
        "m",
        ["a", "b", "c"],
        [[1], [2], [3]],
        outputs=[[5, 6, 7], [5, 6, 9], [5, 6]],
        answers=[""] * 3,
        engine=None,
        frames=[],
        seconds=1.0,
        reference=[[5, 6, 7], [5, 6, 8], [5, 6, 2]],
        gaps=[[3.0, 2.0, 1.0], [3.0, 2.0, 0.004], [3.0, 2.0, 0.5]],
    )
    assert run.agreement() == [
        "  0: identical (3 tokens)",
        "  1: same first 2 tokens, then differs; transformers' top-2 logit gap there: 0.004",
        "  2: same first 2 tokens, then differs; transformers' top-2 logit gap there: 0.5",
    ]
