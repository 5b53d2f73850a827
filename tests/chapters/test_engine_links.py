"""Every claim about SGLang or vLLM points at the engine's source, and every pointer is real.

The chapters (their jupytext twins), the README and the glossary cite the engines with links to
their source at the release tag the course follows, the symbol in the link text:
[`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py).
This test reads every such link and checks, against the release wheels (downloaded once by
``tests/tools/engines/wheels.py``; only the cited files are read out of them), that the file is in
the wheel and the backticked symbol is defined in it (a class, a function, a method as
``Class.method``, a module or class attribute). A sentence that names SGLang or vLLM without such a
link, or without naming the differential test (``tests/engines/...``) that compares memlab with the
engine, is reported: a heuristic (a sentence, a list item or a table row that names an engine is a
claim about it), with a short allow-list of sentences that only point elsewhere.

The library's comments and docstrings (memlab/, kernels/) point at the engines by path inside the
package, ``Name in sglang/srt/managers/utils.py``: each file named must be in the wheel and each
name of code cited with it defined there.

Without the wheels the file checks skip; in CI (``CI`` set) they fail.
"""

import ast
import functools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TWINS = sorted((ROOT / "chapters" / "py").glob("[0-9][0-9]_*.py"))
TEXTS = [*TWINS, ROOT / "README.md", ROOT / "chapters" / "glossary.md"]
TAGS = {"sglang": "v0.5.23", "vllm": "v0.33.0"}
REPOS = {"sglang": "sgl-project/sglang", "vllm": "vllm-project/vllm"}
# The path inside each repository where the wheel's files live: SGLang's package is under python/.
REPO_PREFIX = {"sglang": "python/", "vllm": ""}
LINK = re.compile(
    r"\[(?P<text>[^\]]*)\]\((?P<url>https://github\.com/"
    r"(?P<repo>sgl-project/sglang|vllm-project/vllm)/(?:blob|tree)/(?P<tag>[^/]+)/"
    r"(?P<path>[^)#\s]+)(?:#[^)\s]*)?)\)"
)
ENGINE = re.compile(r"\b(SGLang|vLLM)\b")
DIFFERENTIAL = re.compile(r"tests/engines/(?:sglang|vllm)/test_\w+\.py")
# "the vLLM paper" (Kwon et al., SOSP 2023) and its figures are a paper's claims, cited as such.
PAPER = re.compile(r"\bpaper\b")
# Sentences that name an engine only to send the reader elsewhere (no claim of their own).
ALLOWED = (
    "Chapter 06 covers vLLM's side.",
    "Chapter 06 shows both spellings side by side.",
    "Names follow SGLang and vLLM, so the real engines read familiar afterwards.",
)


def engine_of(repo: str) -> str:
    return "sglang" if repo.endswith("sglang") else "vllm"


# -- reading the texts -------------------------------------------------------------------------


# The README's sections about the chapters and the engines; the others (set-up, versions,
# grading, the module table) say what memlab is and where it lives.
README_SECTIONS = re.compile(r"^## (The course|.*\(chapters? \d|Paged attention)", re.M)


def markdown_of(path: Path) -> str:
    """The markdown a reader sees: a twin's markdown cells (without '# '), or the file itself (the
    README: its sections about the chapters and the engines)."""
    text = path.read_text()
    if path.name == "README.md":
        parts = re.split(r"^(?=## )", text, flags=re.M)
        return "\n".join(p for p in parts if README_SECTIONS.match(p))
    if path.suffix != ".py":
        return text
    cells = re.split(r"^# %%.*$", text, flags=re.M)
    heads = re.findall(r"^# %%.*$", text, flags=re.M)
    md = [c for h, c in zip(heads, cells[1:]) if "[markdown]" in h]
    return "\n\n".join(
        "\n".join(re.sub(r"^# ?", "", line) for line in c.splitlines()) for c in md
    )


def paragraphs(md: str) -> list[list[str]]:
    """What a claim lives in: paragraphs (and list items) as lists of sentences, and table rows,
    each a paragraph of one sentence that says whose columns its cells are. Headings, code blocks
    and math are left out."""
    md = re.sub(r"```.*?```", "", md, flags=re.S)
    md = re.sub(r"\$\$.*?\$\$", "", md, flags=re.S)
    out, header, para = [], None, []

    def flush():
        text = " ".join(para).strip()
        para.clear()
        # A sentence ends at . ! ? followed by a space and a capital, a backtick or a bracket; a
        # link's address holds no space, so it is never cut.
        sentences = [
            s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", text) if s.strip()
        ]
        if sentences:
            out.append(sentences)

    for line in md.splitlines():
        s = line.strip()
        if s.startswith("|"):
            flush()
            cells = [c.strip() for c in s.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                whose = [h for h, c in zip(header, cells) if c and c not in ("-", "")]
                out.append(
                    [" | ".join(cells) + "  [columns: " + ", ".join(whose) + "]"]
                )
            continue
        header = None
        if not s or s.startswith("#"):
            flush()
            continue
        if re.match(r"([-*]|\d+\.)\s", s):  # a list item starts a unit of its own
            flush()
        para.append(s)
    flush()
    return out


def units(md: str) -> list[str]:
    return [s for p in paragraphs(md) for s in p]


def links(md: str) -> list[re.Match]:
    return list(LINK.finditer(md))


def symbol_of(link_text: str) -> str | None:
    m = re.search(r"`([A-Za-z_][\w.]*)(?:\(\))?`", link_text)
    return m.group(1) if m else None


def unlinked(md: str) -> list[str]:
    """Sentences that name SGLang or vLLM with no link to its source and no differential test.

    A sentence passes when it cites (a link to the engine's source at the tag, or a
    ``tests/engines/`` test), when it asks a question, or when it goes on from the sentence just
    before it in the same paragraph and that one cites (a claim told in two sentences)."""
    found = []
    for para in paragraphs(md):
        cited_before = False
        for u in para:
            cites = bool(LINK.search(u) or DIFFERENTIAL.search(u))
            # a link's address, and a link to a chapter (its title), say nothing about an engine
            shown = re.sub(r"\[[^\]]*\]\((?:chapters/)?\d\d_\w+\.ipynb\)", "", u)
            names = ENGINE.search(re.sub(r"\]\([^)]*\)", "]", shown))
            if (
                names
                and not cites
                and not PAPER.search(u)
                and not cited_before
                and not u.rstrip().endswith("?")
                and u.strip() not in ALLOWED
            ):
                found.append(" ".join(u.split())[:160])
            cited_before = cites
    return found


# -- the wheels --------------------------------------------------------------------------------


def wheel_member(engine: str, path: str) -> str | None:
    """The file's path inside the wheel, or None when the link points outside the package."""
    prefix = REPO_PREFIX[engine]
    if not path.startswith(prefix + engine + "/"):
        return None
    return path[len(prefix) :]


@functools.cache
def wheel_names(engine: str) -> frozenset:
    import zipfile

    from memlab_tests.tools.engines import wheels

    try:
        whl = wheels.wheel(engine)
    except pytest.skip.Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must check the engine links: {exc.msg}")
        raise
    with zipfile.ZipFile(whl) as z:
        return frozenset(z.namelist())


@functools.cache
def defined(engine: str, member: str) -> frozenset:
    """Every name the file defines: top-level classes, functions and assignments, and for each
    class ``Class.name`` of its methods, class attributes and ``self.x`` attributes (and the bare
    attribute name too, so an environment variable declared in a class can be cited by name)."""
    from memlab_tests.tools.engines import wheels

    src = (wheels.extracted(engine, [member]) / member).read_text()
    return names_in(src)


def names_in(src: str) -> frozenset:
    tree, out = ast.parse(src), set()

    def targets(node):
        if isinstance(node, ast.Assign):
            return node.targets
        if isinstance(node, ast.AnnAssign):
            return [node.target]
        return []

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
    for node in tree.body:
        for t in targets(node):
            if isinstance(t, ast.Name):
                out.add(t.id)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(f"{cls.name}.{node.name}")
            for t in targets(node):
                if isinstance(t, ast.Name):
                    out |= {f"{cls.name}.{t.id}", t.id}
                elif (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    out.add(f"{cls.name}.{t.attr}")
    return frozenset(out)


def link_problems(md: str) -> list[str]:
    """What is wrong with each engine link: tag, path, file, symbol (checked in the wheel)."""
    problems = []
    for m in links(md):
        engine, text, path = engine_of(m["repo"]), m["text"], m["path"]
        where = f"[{text}]({m['url']})"
        if m["tag"] != TAGS[engine]:
            problems.append(
                f"{where}: tag {m['tag']}, the course follows {TAGS[engine]}"
            )
            continue
        member = wheel_member(engine, path)
        if member is None:
            problems.append(f"{where}: not a file of the {engine} package")
            continue
        if member not in wheel_names(engine):
            problems.append(f"{where}: no file {member} in the {engine} wheel")
            continue
        symbol = symbol_of(text)
        if symbol is None:
            problems.append(f"{where}: the link text names no `symbol`")
        elif member.endswith(".py") and symbol not in defined(engine, member):
            problems.append(f"{where}: {member} defines no {symbol}")
    return problems


# -- the tests ---------------------------------------------------------------------------------


def _id(p: Path) -> str:
    return p.stem if p.parent.name == "py" else str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", TEXTS, ids=[_id(p) for p in TEXTS])
def test_every_engine_link_names_a_file_and_symbol_of_the_release(path):
    problems = link_problems(markdown_of(path))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", TEXTS, ids=[_id(p) for p in TEXTS])
def test_every_sentence_about_an_engine_cites_its_source(path):
    found = unlinked(markdown_of(path))
    assert not found, (
        f"{len(found)} sentence(s) of {_id(path)} name SGLang or vLLM without a link to the "
        "engine's source at the release tag (or the tests/engines/ test that compares it):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize("path", TEXTS, ids=[_id(p) for p in TEXTS])
def test_every_differential_test_a_text_names_exists(path):
    named = set(DIFFERENTIAL.findall(markdown_of(path)))
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"{_id(path)} names {missing}, which do not exist"


def test_the_texts_cite_the_engines():
    """Counts, so a text that loses its links shows: every chapter from 01 on cites an engine."""
    counts = {_id(p): len(links(markdown_of(p))) for p in TEXTS}
    print(
        f"{sum(counts.values())} engine links in {len(TEXTS)} texts: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
    )
    assert all(v >= 2 for k, v in counts.items() if k[:2] not in ("00",))


# -- the library's own pointers ----------------------------------------------------------------

CODE = sorted([*(ROOT / "memlab").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])
# a file inside an engine's package (not tests/engines/sglang/...)
ENGINE_FILE = re.compile(r"(?<![\w/])(?:sglang|vllm)/[\w/]+\.py\b")
# "``Name`` in sglang/srt/x.py": a name and the file it is in (a comment may wrap between them)
NAME_IN_FILE = re.compile(
    r"`*(?P<name>[A-Za-z_][\w.]*)`*(?:\(\))? in `*(?P<path>(?<![\w/])(?:sglang|vllm)/[\w/]+\.py)"
)


def pointer_problems(text: str) -> list[str]:
    """The library's comments and docstrings name engine files as paths inside the package
    (``sglang/srt/mem_cache/allocation.py``), sometimes with the name cited in them: each file must
    be in the release wheel and each name of code (a dot, an underscore or a capital: not an
    English word) defined in it."""
    flat = re.sub(r"\s*\n\s*(?:#\s?)?", " ", text)
    problems = []
    for path in sorted(set(ENGINE_FILE.findall(flat))):
        if path not in wheel_names(path.split("/")[0]):
            problems.append(f"{path}: no such file in the wheel")
    for m in NAME_IN_FILE.finditer(flat):
        name, path, engine = m["name"], m["path"], m["path"].split("/")[0]
        code = re.search(r"[._A-Z]", name)
        if code and path in wheel_names(engine) and name not in defined(engine, path):
            problems.append(f"{path} defines no {name}")
    return problems


def test_every_engine_file_and_name_the_library_cites_is_in_the_release():
    problems = [
        f"{f.relative_to(ROOT)}: {p}"
        for f in CODE
        for p in pointer_problems(f.read_text())
    ]
    cited = sum(len(ENGINE_FILE.findall(f.read_text())) for f in CODE)
    print(f"{cited} pointers to engine files in {len(CODE)} library files")
    assert cited > 30 and not problems, "\n".join(problems)


# -- each check can fail -----------------------------------------------------------------------

S = "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/"
V = "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/"


def test_the_link_check_fails_on_a_wrong_tag_path_file_or_symbol():
    good = f"[`PrefillAdder`]({S}managers/schedule_policy.py)"
    assert link_problems(good) == []
    bad = {
        "tag": good.replace("v0.5.23", "v0.5.22"),
        "file": good.replace("schedule_policy.py", "schedule_polcy.py"),
        "symbol": good.replace("`PrefillAdder`", "`PrefillAdderX`"),
        "no symbol": good.replace("`PrefillAdder`", "the adder"),
        "outside": "[`x`](https://github.com/sgl-project/sglang/blob/v0.5.23/README.md)",
    }
    for why, text in bad.items():
        assert link_problems(text), f"a link with a wrong {why} passed"
    assert (
        link_problems(
            f"[`KVCacheManager.allocate_slots`]({V}v1/core/kv_cache_manager.py)"
        )
        == []
    )
    assert link_problems(
        f"[`KVCacheManager.allocate_slot`]({V}v1/core/kv_cache_manager.py)"
    )


def test_names_in_finds_classes_methods_attributes_and_constants():
    src = (
        "X = 1\nclass A:\n    Y: int = 2\n    def __init__(self):\n        self.z = 3\n"
        "    def m(self):\n        pass\ndef f():\n    pass\n"
    )
    got = names_in(src)
    assert {"X", "A", "A.Y", "Y", "A.z", "A.m", "f"} <= got
    assert "A.f" not in got and "z" not in got


def test_the_sentence_check_catches_an_unlinked_claim_in_prose_lists_and_tables():
    assert unlinked(
        "SGLang frees pages at the head. The token allocator does not."
    ) == ["SGLang frees pages at the head."]
    assert not unlinked(
        f"SGLang frees pages at the head ([`PagedTokenToKVPoolAllocator.free`]"
        f"({S}mem_cache/allocator/paged.py)). memlab does too."
    )
    assert unlinked("- vLLM pops the head of its free queue.\n- memlab too.")
    table = "| | memlab | SGLang 0.5.23 |\n|---|---|---|\n| free | {} | {} |\n"
    assert unlinked(table.format("head", "head"))
    assert not unlinked(
        table.format(
            "head",
            f"head ([`PagedTokenToKVPoolAllocator`]({S}mem_cache/allocator/paged.py))",
        )
    )
    assert not unlinked(
        "memlab and SGLang agree (`tests/engines/sglang/test_allocators.py`)."
    )
    assert not unlinked("# 06 · vLLM's block pool")  # a heading is no claim
    # a second sentence goes on from a cited one; a first sentence that names an engine does not
    paged = f"{S}mem_cache/allocator/paged.py"
    cited = f"SGLang frees at the head ([`PagedTokenToKVPoolAllocator`]({paged}))."
    assert not unlinked(cited + " SGLang does it for every free.")
    assert unlinked("SGLang does it for every free. " + cited)
    assert unlinked(cited + "\n\nSGLang does it for every free.")  # another paragraph
    # a paper, not the source
    assert not unlinked("The vLLM paper's Figure 2 measures Orca.")


def test_without_the_wheels_ci_fails_and_a_laptop_skips(monkeypatch):
    from memlab_tests.tools.engines import wheels

    def no_wheel(name):
        pytest.skip("no network")

    monkeypatch.setattr(wheels, "wheel", no_wheel)
    wheel_names.cache_clear()
    try:
        monkeypatch.setenv("CI", "true")
        with pytest.raises(
            pytest.fail.Exception, match="CI must check the engine links"
        ):
            wheel_names("vllm")
        monkeypatch.delenv("CI")
        with pytest.raises(pytest.skip.Exception):
            wheel_names("vllm")
    finally:
        wheel_names.cache_clear()


def test_the_library_pointer_check_fails_on_a_wrong_file_or_name():
    good = (
        "# refuses it (validate_input_length in\n"
        "# sglang/srt/managers/utils.py), as ``BlockPool`` in vllm/v1/core/block_pool.py"
    )
    assert pointer_problems(good) == []
    assert pointer_problems(good.replace("utils.py", "utlis.py"))
    assert pointer_problems(good.replace("validate_input_length", "validate_input_len"))
    assert pointer_problems(good.replace("``BlockPool``", "``BlockPools``"))
    assert pointer_problems("the functions in vllm/utils/hashing.py") == []
    assert pointer_problems("(tests/engines/sglang/test_unified.py)") == []
