"""memlab's import graph, read statically from the source (every import statement, also those
inside functions: a lazy import is still a dependency): no cycle between modules, none between
the library's parts (sim and viz, env and kernels once imported each other), the layers point one
way (``memlab.common`` <- ``memlab.sglang``, ``memlab.vllm`` <- ``memlab.capstone`` <-
``memlab.course``, sglang and vllm never each other), and the library's floors follow the
teaching order: a module taught in chapter N imports nothing taught later.

The layers are also import-linter's contract (``[tool.importlinter]`` in ``pyproject.toml``,
``lint-imports``); this test holds them where import-linter is not installed.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The chapter that teaches each part of the library: a part may import only parts of its chapter
# or earlier ones. 0: the floor under every chapter. A part is a module or package right under a
# section (memlab.sglang.allocator) or right under memlab (memlab.kernels). TOOLS sit above the
# library (memlab.course: notebooks, pictures, grading, the environment report; and the commands):
# they may import any part, and no part imports them.
SECTIONS = ("common", "sglang", "vllm", "capstone")
FLOORS = {
    # the sections' own __init__ files hold docstrings only (memlab.vllm re-exports chapter 06)
    "memlab.common": 0,
    "memlab.sglang": 0,
    "memlab.capstone": 0,
    "memlab.vllm": 6,
    "memlab.common.env": 0,
    "memlab.kernels": 0,
    "memlab.common.utils": 0,
    "memlab.common._checks": 0,
    "memlab.sglang.req_to_token": 1,
    "memlab.sglang.kv_pool": 2,
    "memlab.common.models": 2,
    "memlab.sglang.allocator": 3,  # chapters 03 to 05
    "memlab.sglang.allocation": 4,  # the scheduler's side of the allocators (chapters 04 and 05)
    "memlab.vllm.block_pool": 6,
    "memlab.vllm.hashing": 6,
    "memlab.vllm.request": 6,
    "memlab.vllm.kv_cache_manager": 6,
    "memlab.vllm.block_table": 6,
    "memlab.vllm.kv_layout": 6,
    "memlab.vllm.trace_replay": 6,
    "memlab.sglang.swa": 7,
    "memlab.sglang.mamba": 7,
    "memlab.sglang.write_loc": 7,  # write_loc: 07 to 09
    "memlab.sglang.sizing": 8,
    "memlab.common.attention": 9,
    "memlab.sglang.schedule_policy": 10,  # admission (10), the cache-aware order (12)
    "memlab.capstone.tiny_llama": 10,
    "memlab.capstone.sim": 10,
    "memlab.capstone.checkpoint": 10,
    "memlab.course.chat": 10,
    # The capstone engine is built in chapter 10 and gets its "radix" and "hicache" prefix caches
    # in chapter 11, so it sits on chapter 11's floor.
    "memlab.capstone.engine": 11,
    "memlab.sglang.radix_cache": 11,
    "memlab.sglang.hicache": 11,
    "memlab.sglang.page_copy": 11,
    "memlab.capstone.prefix_compare": 11,
    "memlab.sglang.unified": 12,
    "memlab.capstone.schedule_compare": 12,
    # moved modules: importing the old name raises an ImportError naming the new home
    "memlab.capstone.compare": 6,
    "memlab.capstone.trace_replay": 6,
    "memlab.common.sizing": 8,
}
TOOLS = {"memlab", "memlab.__main__", "memlab.course", "memlab.grade"}

# Floor violations still on main, each with what removes it. When one is gone, delete its line.
PENDING: dict = {}

# The layers, lowest first: a module may import its own section, its layer's siblings where they
# share a layer on purpose (common and the kernels: memlab.kernels reads common.env, and
# common.attention launches a kernel), and any lower layer. SGLang's and vLLM's sides share a
# layer and never import each other. Everything that is not a section of the library is a tool.
LAYERS = (
    ("memlab.common", "memlab.kernels"),
    ("memlab.sglang",),
    ("memlab.vllm",),
    ("memlab.capstone",),
)
SIBLINGS = {frozenset(("memlab.common", "memlab.kernels"))}
# (importing module, imported section) allowed across the layers for now, each with what
# removes it.
LAYER_EXCEPTIONS: dict = {}


def modules(package_dir: Path) -> dict[str, Path]:
    """Module name -> file, for every .py under the package (through memlab/kernels, a link)."""
    found = {}
    for folder, dirs, files in os.walk(package_dir, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = (Path(folder) / f).relative_to(package_dir.parent).with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                found[".".join(parts)] = Path(folder) / f
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The memlab modules ``name`` imports: each named module, or its closest known parent (a
    name imported from a module), and the parent packages that Python runs first (their
    __init__), except the importer's own packages, which are already being imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets |= {f"{base}.{a.name}" for a in node.names} | {base}
    out = set()
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    for t in targets:
        while t and t not in known:
            t = t.rpartition(".")[0]
        if not t:
            continue  # not memlab
        parents = {".".join(t.split(".")[:i]) for i in range(1, t.count(".") + 1)}
        out |= ({t} | parents) - own
    out.discard(name)
    return out


def graph(package_dir: Path = ROOT / "memlab") -> dict[str, set[str]]:
    mods = modules(package_dir)
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def unit(module: str) -> str:
    """The part a module belongs to: the module or package right under its section
    (memlab.sglang.allocator.paged -> memlab.sglang.allocator), or right under memlab
    (memlab.kernels.canary -> memlab.kernels); everything in memlab.course is one part."""
    parts = module.split(".")
    depth = 3 if len(parts) > 2 and parts[1] in SECTIONS else 2
    return ".".join(parts[:depth])


def units(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in g.items():
        out.setdefault(unit(m), set()).update(
            unit(t) for t in targets if unit(t) != unit(m)
        )
    return out


@pytest.fixture(scope="module")
def memlab_graph():
    return graph()


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "memlab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from memlab.sub import b  # lazy\n")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nimport numpy\n")
    (pkg / "sub" / "c.py").write_text("from .b import thing\n")
    g = graph(pkg)
    assert g["memlab.a"] == {"memlab.sub", "memlab.sub.b"}
    assert g["memlab.sub.b"] == {"memlab.a"} and g["memlab.sub"] == {"memlab.sub.c"}
    assert g["memlab.sub.c"] == {"memlab.sub.b"}  # its own package is not an edge back
    assert cycles(g) == [["memlab.a", "memlab.sub", "memlab.sub.b", "memlab.sub.c"]]
    assert cycles(units(g)) == [["memlab.a", "memlab.sub"]]


def test_the_kernels_are_in_the_graph(memlab_graph):
    assert (
        "memlab.kernels.alloc_extend" in memlab_graph
        and "memlab.common.env" in memlab_graph["memlab.kernels"]
    )


def test_no_module_imports_itself_back(memlab_graph):
    assert cycles(memlab_graph) == []


def test_no_two_parts_of_memlab_import_each_other(memlab_graph):
    assert cycles(units(memlab_graph)) == []


def upward(
    parts: dict[str, set[str]], floors: dict[str, int] = FLOORS, tools: set = TOOLS
) -> list:
    """(part, what it imports) where a part imports a tool or a part taught in a later chapter."""
    return sorted(
        (a, b)
        for a, targets in parts.items()
        if a in floors
        for b in targets
        if b in tools or floors[b] > floors[a]
    )


def test_the_floor_check_sees_a_late_import_and_a_tool():
    parts = {
        "memlab.a": {"memlab.b"},
        "memlab.b": {"memlab.a", "memlab.t"},
        "memlab.t": {"memlab.a"},
    }
    assert upward(parts, {"memlab.a": 1, "memlab.b": 2}, {"memlab.t"}) == [
        ("memlab.a", "memlab.b"),
        ("memlab.b", "memlab.t"),
    ]


def test_floors_follow_the_teaching_order(memlab_graph):
    parts = units(memlab_graph)
    unplaced = sorted(set(parts) - set(FLOORS) - TOOLS)
    assert not unplaced, (
        f"give each a floor (the chapter that teaches it) in FLOORS, or put it in TOOLS: {unplaced}"
    )
    up = upward(parts)
    assert set(up) - set(PENDING) == set(), "\n".join(
        f"{a} (chapter {FLOORS[a]:02d}) imports {b} "
        + ("(a tool above the library)" if b in TOOLS else f"(chapter {FLOORS[b]:02d})")
        for a, b in up
    )
    assert set(PENDING) <= set(up), (
        f"no longer imported: delete from PENDING {sorted(set(PENDING) - set(up))}"
    )


def section(module: str) -> str:
    """The section a module belongs to (memlab.sglang.allocator.paged -> memlab.sglang);
    anything outside the library's sections is a tool (memlab.course, memlab.grade, memlab)."""
    for sec in (s for layer in LAYERS for s in layer):
        if module == sec or module.startswith(sec + "."):
            return sec
    return "tools"


def layer(sec: str) -> int:
    """SGLang's and vLLM's sides stand side by side: one level above common, one below capstone."""
    order = {"memlab.common": 0, "memlab.kernels": 0, "memlab.sglang": 1}
    order |= {"memlab.vllm": 1, "memlab.capstone": 2, "tools": 3}
    return order[sec]


def against_the_layers(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importing module, imported section) where a section imports one above it or beside it."""
    out = set()
    for a, targets in g.items():
        for b in targets:
            sa, sb = section(a), section(b)
            if sa == sb or frozenset((sa, sb)) in SIBLINGS:
                continue
            if layer(sb) >= layer(sa):
                out.add((a, sb))
    return sorted(out)


def test_the_layer_check_sees_an_upward_and_a_sideways_import():
    g = {
        "memlab.common.models": {"memlab.sglang.kv_pool"},
        "memlab.sglang.swa": {"memlab.vllm.block_pool", "memlab.common.utils"},
        "memlab.vllm.block_pool": {"memlab.common._checks", "memlab.kernels.store_kv"},
        "memlab.kernels": {"memlab.common.env"},
        "memlab.common.attention": {"memlab.kernels"},
        "memlab.capstone.engine": {"memlab.sglang.swa", "memlab.course.viz"},
        "memlab.course.viz": {"memlab.capstone.engine"},
    }
    assert against_the_layers(g) == [
        ("memlab.capstone.engine", "tools"),
        ("memlab.common.models", "memlab.sglang"),
        ("memlab.sglang.swa", "memlab.vllm"),
    ]


def test_the_layers_point_one_way(memlab_graph):
    crossing = set(against_the_layers(memlab_graph))
    assert crossing - set(LAYER_EXCEPTIONS) == set(), "\n".join(
        f"{a} ({section(a)}) imports {b}"
        for a, b in sorted(crossing - set(LAYER_EXCEPTIONS))
    )
    assert set(LAYER_EXCEPTIONS) <= crossing, (
        "no longer imported: delete from LAYER_EXCEPTIONS "
        f"{sorted(set(LAYER_EXCEPTIONS) - crossing)}"
    )


def test_import_linter_holds_the_same_layers(tmp_path):
    """The contract in pyproject.toml ([tool.importlinter]), checked by import-linter itself."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), (
        f"import-linter is in the test extra and the lock: {lint} missing"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=ROOT,
        env=env | {"PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout, proc.stdout[-2000:]


def test_import_linter_sees_an_upward_import(tmp_path):
    """The same contract on a copy of the package with common importing the SGLang side."""
    copy = tmp_path / "memlab"
    shutil.copytree(ROOT / "memlab", copy, symlinks=False)
    (copy / "common" / "utils.py").write_text(
        (copy / "common" / "utils.py").read_text() + "\nimport memlab.sglang.kv_pool\n"
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = Path(sys.executable).with_name("lint-imports")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(tmp_path), "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "memlab.common.utils -> memlab.sglang.kv_pool" in (
        proc.stdout
    ), proc.stdout[-3000:]
