"""Run by tests/repo/test_shadowing.py as ``python -m pytest tests/tools/shadow_probe.py`` from
the repository root, with stand-in distributions named like the repository's top-level folders
in the site folder MEMLAB_STANDINS (no test file: pytest collects it only when named)."""

import os
import site
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = (
    "kernels",
    "exercises",
    "solutions",
    "tests",
    "chapters",
    "scripts",
    "bench",
    "data",
)


def where(name: str) -> Path:
    spec = find_spec(name)
    assert spec is not None, f"{name}: neither installed nor found"
    return Path(spec.origin or next(iter(spec.submodule_search_locations))).resolve()


def test_installed_distributions_win_over_the_repository_folders():
    site.addsitedir(os.environ["MEMLAB_STANDINS"])  # installed: after site-packages
    for name in TOP:
        # the repository's own folder of that name (.venv is elsewhere)
        folder = ROOT / name
        assert folder not in where(name).parents, f"{name} comes from {folder}"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import memlab.kernels.canary as canary
    from memlab.common.env import kernel_device

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    logits = LlamaForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 64)
    x = torch.arange(4, device=kernel_device())
    assert canary.axpb(x, a=3, b=2).tolist() == [2, 5, 8, 11]
    assert ROOT / "kernels" in Path(canary.__file__).resolve().parents
