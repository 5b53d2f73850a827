"""The library's import graph follows the teaching order: a layer imports only layers taught before it.

A learner reading chapter 02's ``kv_pool`` must not need chapter 07's write locations to import
it. Only module-level imports count (a function may import a later layer lazily, at run time).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The chapter that teaches each library module (0: shared by every layer). The capstone's engine
# serves everything the course built, chapter 11's caches included, so it sits on top. The
# allocator package exports chapters 03 to 05 (its paged class: chapter 04).
FLOOR = {
    "memlab.env": 0, "memlab.utils": 0, "memlab._checks": 0,
    "memlab.req_to_token": 1,
    "memlab.kv_pool": 2, "memlab.models": 2,
    "memlab.allocator": 4, "memlab.allocator.base": 3, "memlab.allocator.token": 3,
    "memlab.allocator.reference": 4, "memlab.allocator.paged": 4, "memlab.allocation": 4,
    "memlab.vllm": 6, "memlab.vllm.block_pool": 6, "memlab.vllm.hashing": 6, "memlab.vllm.request": 6,
    "memlab.vllm.kv_cache_manager": 6, "memlab.vllm.block_table": 6, "memlab.vllm.kv_layout": 6,
    "memlab.vllm.compare": 6, "memlab.vllm.replay": 6,
    "memlab.hybrid": 7, "memlab.hybrid.swa": 7, "memlab.hybrid.mamba": 7, "memlab.write_loc": 7,
    "memlab.sizing": 8,
    "memlab.attention": 9,
    "memlab.radix_cache": 11, "memlab.page_copy": 11, "memlab.hicache": 11, "memlab.prefix_compare": 11,
    "memlab.engine": 12, "memlab.checkpoint": 12, "memlab.chat": 12,
}


def module_path(name: str) -> Path:
    p = ROOT / Path(*name.split("."))
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def top_level_imports(name: str) -> set[str]:
    tree = ast.parse(module_path(name).read_text())
    out = set()
    for node in tree.body:  # module level only
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memlab"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in FLOOR)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("memlab"))
    return {m for m in out if m in FLOOR}


@pytest.mark.parametrize("name", sorted(FLOOR))
def test_a_layer_imports_only_earlier_layers(name):
    later = {m: FLOOR[m] for m in top_level_imports(name) if FLOOR[m] > FLOOR[name]}
    assert not later, f"{name} (chapter {FLOOR[name]}) imports later chapters' modules {later}"


def test_the_check_sees_a_late_import(tmp_path, monkeypatch):
    fake = tmp_path / "memlab"
    fake.mkdir()
    (fake / "kv_pool.py").write_text("from memlab.write_loc import KVWriteLoc\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert top_level_imports("memlab.kv_pool") == {"memlab.write_loc"}


def test_every_library_module_has_a_floor():
    skip = {"viz", "grading", "sim", "grade.py", "kernels.py", "home.py", "__main__.py", "__init__.py"}
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "memlab").rglob("*.py")
            if not set(p.relative_to(ROOT / "memlab").parts) & skip}
    assert mods - set(FLOOR) == set()
