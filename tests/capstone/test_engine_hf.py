"""memlab's engine against transformers itself, with no download: small random
LlamaForCausalLM models built by transformers, saved with save_pretrained, loaded by
memlab.capstone.checkpoint and served through the engine (page sizes 1 and 16, chunked
prefill, prefix sharing, retraction).

Float32 throughout. Prefill logits must agree within LOGIT_ATOL + LOGIT_RTOL * |logit|
(measured: at most 1.2e-5 on logits of magnitude 15-60). Greedy tokens must agree
exactly; that is meaningful only if no greedy step is a near tie, so the weights are
drawn with unit-variance activations (matrices scaled by 1/sqrt(fan_in), norms around 1,
a sharp output head) instead of transformers' tiny initialisation (there: logits under
0.6, gaps down to 1e-3 on these prompts), and the tests check that transformers' best
logit beats the second by more than MIN_GAP at every greedy step they compare: more than
a tolerance-respecting engine could flip (measured smallest gap: 6e-3, 500 times the
measured logit error)."""

import math
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from memlab.capstone import checkpoint
from memlab.capstone.engine import (
    Engine,
    TinyConfig,
    TinyLlama,
    generate_reference,
    rope_inv_freq,
)

LOGIT_ATOL, LOGIT_RTOL = 1e-4, 1e-5
# Logits here stay under 64 in magnitude, so within the tolerance each is off by at most 7.4e-4 and
# a greedy choice can flip only where the best logit beats the second by less than twice that.
MIN_GAP = 2e-3
NEW = 12
# with head_dim 16 the frequencies span all three bands
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
CONFIGS = {
    "gqa-untied": dict(num_attention_heads=4, num_key_value_heads=2),
    "mha-tied-theta5e5": dict(
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
        rope_theta=5e5,
        head_dim=24,
    ),
    "gqa4-llama3-rope": dict(
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=5e5,
        rope_scaling=dict(LLAMA3),
    ),  # a copy: transformers writes rope_theta into it
}
_rng = random.Random(0)
SHARED = [_rng.randrange(4, 128) for _ in range(20)]  # a 20-token "system prompt"
# shares nothing
PROMPTS = [
    SHARED + [1] + [_rng.randrange(128) for _ in range(2)],
    SHARED + [2] + [_rng.randrange(128) for _ in range(8)],
    SHARED + [3],
    [SHARED[0] + 1] + [_rng.randrange(128) for _ in range(22)],
]


def build(config: dict, seed: int):
    """A random LlamaForCausalLM (eager attention, float32) with weights far from ties."""
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
        **config,
    )
    model = transformers.LlamaForCausalLM(cfg)
    # the plainest attention as the reference
    assert model.config._attn_implementation == "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (
            name,
            p,
            # a tied head is the embedding's parameter: listed once
        ) in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            # norms: random around 1, so a skipped or swapped norm shows
            if p.ndim == 1:
                p.copy_(1 + 0.2 * r)
            elif "embed_tokens" in name:
                p.copy_(r)
            else:
                p.copy_(
                    r / math.sqrt(p.shape[1]) * (4 if name.startswith("lm_head") else 1)
                )
    return model.eval()


@torch.no_grad()
def hf_generate(model, prompts, new=NEW):
    """transformers' greedy generate, one prompt at a time; new tokens and each step's top-2 gap."""
    outs, gaps = [], []
    for p in prompts:
        ids = torch.tensor([p])
        g = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        outs.append(g.sequences[0, len(p) :].tolist())
        top2 = torch.stack([lg[0].topk(2).values for lg in g.logits])
        gaps += (top2[:, 0] - top2[:, 1]).tolist()
    return outs, gaps


class Case:
    def __init__(self, name, folder):
        self.name = name
        self.hf = build(CONFIGS[name], seed=list(CONFIGS).index(name))
        self.hf.save_pretrained(folder)
        self.folder = folder
        self.model = checkpoint.load(folder)
        self.ref, self.gaps = hf_generate(self.hf, PROMPTS)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = Case(name, tmp_path_factory.mktemp(name))
        return made[name]

    return get


def engine(case, ps, **kw):
    kw = {
        "num_tokens": 512,
        "chunk_size": 16,
        "attention": "torch",
        "all_logits": True,
        "debug_mode": True,
        **kw,
    }
    return Engine(case.model, page_size=ps, **kw)


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_steps_are_far_from_ties(cases, name):
    c = cases(name)
    assert min(c.gaps) > MIN_GAP, (
        f"{name}: a greedy step is a near tie ({min(c.gaps):.2e})"
    )
    # the answers differ: no degenerate model
    assert len(set(map(tuple, c.ref))) == len(PROMPTS)


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("name", CONFIGS)
def test_chunked_prefill_logits_match_transformers(cases, name, ps):
    c, prompt = cases(name), PROMPTS[1]
    # 29 tokens in chunks of 7 (of a page at page size 16): the later chunks attend to paged K/V
    e = engine(c, ps, chunk_size=7 if ps == 1 else 16)
    e.add_request(prompt, 1)
    ours = []
    while e.step() and e.chunked_req is not None:
        ours.append(e.last_logits)
    ours.append(e.last_logits)
    with torch.no_grad():
        ref = c.hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(torch.cat(ours), ref, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_match_transformers_with_prefix_sharing(cases, name, ps):
    c = cases(name)
    e = engine(c, ps)
    # its pages, shared prefix included, go to the cache
    assert e.generate(PROMPTS[:1], NEW) == c.ref[:1]
    assert e.generate(PROMPTS[1:], NEW) == c.ref[1:]
    # prompts 1 and 2 reuse the shared whole pages
    assert e.stats["cached_tokens"] == 2 * (20 // ps * ps)
    e.check_books()


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_match_transformers_through_retraction(cases, name, ps):
    c = cases(name)
    # eight requests of up to 41 tokens in 112 slots: admission reserves only 0.7 of what the
    # running ones will still write, so a decode step comes up short
    e = engine(c, ps, num_tokens=112)
    assert e.generate(PROMPTS * 2, NEW) == c.ref * 2
    # and the retracted ones recompute, some through prefix hits
    assert e.stats["retracted"] > 0
    e.check_books()


def test_an_end_of_sequence_token_stops_both_alike(cases, tmp_path):
    c = cases("gqa-untied")
    eos = c.ref[1][5]
    c.hf.generation_config.eos_token_id = c.hf.config.eos_token_id = eos
    try:
        c.hf.save_pretrained(tmp_path)
        want, _ = hf_generate(c.hf, PROMPTS)
    finally:
        c.hf.generation_config.eos_token_id = c.hf.config.eos_token_id = None
    assert len(want[1]) < NEW and want[1][-1] == eos
    model = checkpoint.load(tmp_path)
    assert model.cfg.eos_token_ids == (eos,)
    assert (
        Engine(model, page_size=16, num_tokens=512, attention="torch").generate(
            PROMPTS, NEW
        )
        == want
    )


def mutants():
    """Plausible loading mistakes; each must move the logits far past the tolerance."""

    # rotate adjacent pairs instead of the two halves of a head
    def halves_interleaved(m):
        d = m.cfg.head_dim
        perm = torch.arange(d).view(2, d // 2).T.reshape(-1)
        for layer in m.layers:
            for w, heads in (("wq", m.cfg.num_heads), ("wk", m.cfg.num_kv_heads)):
                layer[w] = (
                    layer[w].view(-1, heads, d)[:, :, perm].reshape(layer[w].shape)
                )

    def norms_swapped(m):
        for layer in m.layers:
            layer["attn_norm"], layer["mlp_norm"] = (
                layer["mlp_norm"],
                layer["attn_norm"],
            )

    def gate_up_swapped(m):
        for layer in m.layers:
            layer["w_gate"], layer["w_up"] = layer["w_up"], layer["w_gate"]

    def rope_scaling_ignored(m):
        m.inv_freq = rope_inv_freq(
            TinyConfig(head_dim=m.cfg.head_dim, rope_theta=m.cfg.rope_theta)
        )

    return [halves_interleaved, norms_swapped, gate_up_swapped, rope_scaling_ignored]


@pytest.mark.parametrize("mutate", mutants(), ids=lambda f: f.__name__)
def test_the_comparison_catches_loading_mistakes(cases, mutate):
    c = cases("gqa4-llama3-rope")
    model = checkpoint.load(c.folder)
    mutate(model)
    prompt = PROMPTS[3]
    with torch.no_grad():
        ref = c.hf(torch.tensor([prompt])).logits[0]
    e = Engine(
        model,
        page_size=16,
        num_tokens=256,
        chunk_size=64,
        attention="torch",
        all_logits=True,
    )
    e.add_request(prompt, 1)
    e.step()
    assert (e.last_logits - ref).abs().max() > 100 * LOGIT_ATOL


def test_memlabs_random_model_runs_the_same_in_transformers(tmp_path):
    model = TinyLlama(TinyConfig(rope_scaling=LLAMA3, num_heads=8, head_dim=16))
    hf = transformers.LlamaForCausalLM.from_pretrained(
        checkpoint.save(model, tmp_path), attn_implementation="eager"
    )
    want, gaps = hf_generate(hf, PROMPTS, 8)
    assert min(gaps) > MIN_GAP
    assert generate_reference(model, PROMPTS, 8) == want
    assert (
        Engine(model, page_size=4, num_tokens=256, attention="torch").generate(
            PROMPTS, 8
        )
        == want
    )


@pytest.mark.kernel
def test_a_loaded_checkpoint_through_the_triton_attention_kernel(cases):
    c = cases("gqa4-llama3-rope")
    from memlab.common.env import kernel_device

    model = checkpoint.load(c.folder, device=kernel_device())
    # short: the interpreter runs one program per token and head
    prompt = PROMPTS[2][:6]
    want, gaps = hf_generate(c.hf, [prompt], 2)
    assert min(gaps) > MIN_GAP
    e = Engine(
        model,
        page_size=16,
        num_tokens=128,
        chunk_size=32,
        attention="triton",
        alloc_backend="triton",
    )
    assert e.generate([prompt], 2) == want


# ---- chapter 10's real-model section, with a local checkpoint instead of a download --------------
CHAPTER = (
    __import__("pathlib").Path(__file__).resolve().parents[2]
    / "chapters"
    / "py"
    / "10_capstone.py"
)


def local_chat_checkpoint(case, folder):
    """The case's model plus a word-level tokenizer with a chat template, saved like a Hub
    folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    words += [f"w{i}" for i in range(128 - len(words))]
    tok = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<unk>",
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    case.hf.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def test_serve_chat_matches_transformers_and_keeps_the_books(cases, tmp_path):
    from memlab.course import chat

    folder = local_chat_checkpoint(cases("gqa-untied"), tmp_path)
    # 20 words: with the template's 3 tokens, 5 pages of 4
    system = " ".join(f"w{i}" for i in range(10, 30))
    questions = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w40"]
    run = chat.serve_chat(
        folder,
        system,
        questions,
        max_new_tokens=6,
        page_size=4,
        num_tokens=256,
        max_running=2,
        name="tiny",
    )
    # one shared system prompt
    assert [p[:25] for p in run.prompts] == [run.prompts[0][:25]] * 4
    assert min(g for gaps in run.gaps for g in gaps) > MIN_GAP
    assert run.outputs == run.reference
    # the two later requests map 6 shared pages each
    assert run.engine.stats["cached_tokens"] == 2 * 24
    assert len(run.frames) > 4 and run.pages_per_request() == [
        -(-(len(p) + 6) // 4) for p in run.prompts
    ]
    text = run.format()
    assert (
        "4 of 4 answers token for token the same" in text
        and text.count("identical") == 4
    )
    assert (
        "KV per token: 512 B as served (torch.float32), 256 B in bfloat16"
        in run.sizing()
    )
    run.engine.check_books()


def chapter_cells(marker: str) -> list[str]:
    """The code cells of chapter 10's twin from the first one containing ``marker`` to the next
    section."""
    cells = [
        c
        for c in CHAPTER.read_text().split("\n# %%")
        if not c.startswith(" [markdown]")
    ]
    start = next(i for i, c in enumerate(cells) if marker in c)
    return [c.split("\n", 1)[1] for c in cells[start : start + 2]]


def test_chapter_10_real_model_cells_run_with_a_local_checkpoint(
    cases, tmp_path, monkeypatch, capsys
):
    from memlab.course import chat, viz
    from memlab.course.viz.draw_engine import draw_engine

    folder = local_chat_checkpoint(cases("gqa-untied"), tmp_path)
    # the cell's own call, no network
    monkeypatch.setattr(chat, "download", lambda repo, offline: folder)
    ns = {"FAST": False, "viz": viz, "draw_engine": draw_engine}
    for cell in chapter_cells("chat.download("):
        exec(compile(cell, str(CHAPTER), "exec"), ns)
    out = capsys.readouterr().out
    assert (
        ns["run"] is not None
        and "answers token for token the same" in out
        and "KV per token" in out
    )


def test_chapter_10_real_model_cells_skip_in_one_line_offline(capsys):
    from memlab.course import viz
    from memlab.course.viz.draw_engine import draw_engine

    ns = {"FAST": True, "viz": viz, "draw_engine": draw_engine}
    for cell in chapter_cells("chat.download("):
        exec(compile(cell, str(CHAPTER), "exec"), ns)
    assert (
        ns["run"] is None
        and capsys.readouterr().out == "real model skipped: offline mode\n"
    )


def test_download_says_in_one_line_why_it_cannot(monkeypatch, capsys):
    import socket

    from memlab.course import chat

    def unreachable(*a, **kw):
        raise OSError("no route")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert chat.download(chat.SMOLLM2) is None
    # the host is huggingface.co unless HF_ENDPOINT names a mirror
    out = capsys.readouterr().out
    assert out.startswith("real model skipped: ") and out.endswith(
        " cannot be reached from this runtime\n"
    )
    assert out.count("\n") == 1
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert chat.download(chat.SMOLLM2) is None
    assert capsys.readouterr().out == "real model skipped: offline mode\n"
