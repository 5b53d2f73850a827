"""What the chapters say: their pictures and cells (the cells assert the rest when the chapters run
in tests/chapters/test_notebooks.py), text that renders as written (no raw HTML tag
swallowing a token), the
engine facts a reading against the wheels corrected, and the glossary the chapters link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TWINS = sorted((ROOT / "chapters" / "py").glob("[0-9][0-9]_*.py"))
GLOSSARY = ROOT / "chapters" / "glossary.md"


def twin(name: str) -> str:
    return next((ROOT / "chapters" / "py").glob(f"{name}_*.py")).read_text()


def markdown_of(text: str) -> str:
    """The markdown cells of a jupytext twin, without their '# ' prefix."""
    cells = re.split(r"^# %%.*$", text, flags=re.M)
    heads = re.findall(r"^# %%.*$", text, flags=re.M)
    md = [c for h, c in zip(heads, cells[1:]) if "[markdown]" in h]
    return "\n".join(re.sub(r"^# ?", "", line) for c in md for line in c.splitlines())


def prose(md: str) -> str:
    """Markdown with code blocks, code spans and math taken out: what becomes HTML as written."""
    md = re.sub(r"```.*?```", "", md, flags=re.S)
    md = re.sub(r"`[^`\n]*`", "", md)
    return re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", "", md, flags=re.S)


# -- pictures and cells ---------------------------------------------------------------------------


def test_chapter_03_picture_shows_the_yellow_staging_area():
    from memlab.course.viz.render_static import token_allocator_books

    books = token_allocator_books()
    assert books.staged_pages and set(books.staged_pages) == {1, 2, 3, 4, 5, 6, 7}, (
        books.staged_pages
    )
    text = twin("03")
    assert (
        "staging area (yellow" in text
        and "The picture is the second story just before D arrives" in text
    )


def test_chapter_03_points_at_debug_mode_where_a_double_free_first_matters():
    text = twin("03")
    fifo = text.index("## FIFO reuse")
    assert (
        fifo
        < text.index("### A double free, and `debug_mode`")
        < text.index("## Staged frees")
    )
    assert "debug_mode=True" in text and "SGLANG_DEBUG_MEMORY_POOL" in text


def test_chapter_01_generation_demo_reuses_one_row():
    text = twin("01")
    assert "assert again == row and now == seen[1] + 1" in text


def test_chapter_00_says_what_a_generation_is_before_chapter_01_teaches_it():
    text = twin("00")
    assert "(generation {" not in text, (
        "a bare 'generation N' before generations are taught"
    )
    assert (
        "how many times that row has been handed out" in text and "handed out {" in text
    )


# -- text that renders as written ----------------------------------------------------------------

HTML_TAG = re.compile(r"</?([A-Za-z][\w-]*)[^<>\n]*>")
HTML_ON_PURPOSE = {
    "br",
    "sub",
    "sup",
    "b",
    "i",
    "em",
    "strong",
    "details",
    "summary",
    "img",
}


def raw_tags(md: str) -> list[str]:
    return [
        m.group(0)
        for m in HTML_TAG.finditer(prose(md))
        if m.group(1).lower() not in HTML_ON_PURPOSE
    ]


@pytest.mark.parametrize("path", TWINS, ids=[p.stem for p in TWINS])
def test_no_token_is_written_as_raw_html(path):
    # A token such as <s> outside code renders as a strikethrough and vanishes: write `<s>`.
    assert raw_tags(markdown_of(path.read_text())) == [], path.name


def test_the_raw_tag_check_finds_a_token():
    assert raw_tags("B shares 7 tokens with A ('<s> You are brief')") == ["<s>"]
    assert (
        raw_tags(
            "B shares 7 tokens with A (`<s> You are brief`), $a < b$ and a -> b > c"
        )
        == []
    )


def test_widget_captions_escape_their_text():
    from memlab.course.viz.widgets import Stepper

    class State:
        caption = "B shares '<s> You are' & more"

    w = Stepper([State()], lambda s: "<p>x</p>")
    assert "&lt;s&gt; You are" in w.caption.value and "<s>" not in w.caption.value
    assert "&amp; more" in w.caption.value and w.caption.value.startswith(
        "<b>step 0 of 0</b>"
    )


# -- engine facts, as the wheels have them ---------------------------------------------------------

# Names a chapter may only give as memlab's own: SGLang 0.5.23 and vLLM 0.33 have no such thing.
NOT_THE_ENGINES = {
    "SlidingWindowKVCacheManager": (
        "vLLM's manager is SlidingWindowManager, reached through a coordinator"
    ),
    "cache_finished_req": "SGLang 0.5.23 releases with release_kv_cache(..., checkpoint=True)",
    "mla_decode_attention_fwd": "SGLang passes the latent buffer to decode_attention_fwd",
    "allocator.write_loc": "SGLang's backend builds KVWriteLoc.for_batch",
}


def misattributed(md: str) -> list[str]:
    """Sentences (or table cells) naming one of NOT_THE_ENGINES without saying it is memlab's: the
    sentence says "memlab", or the table column it sits in is memlab's."""
    found, header, prose_lines = [], None, []
    for line in md.splitlines() + [""]:
        if not line.startswith("|"):
            header = None
            prose_lines.append(line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            for name in NOT_THE_ENGINES:
                for i, cell in enumerate(cells):
                    owner = header[i] if i < len(header) else ""
                    if name in cell and "memlab" not in cell and "memlab" not in owner:
                        found.append(f"{name}: {cell[:120]}")
    for sentence in re.split(r"(?<=[.;:])\s+|\n\s*\n", "\n".join(prose_lines)):
        for name in NOT_THE_ENGINES:
            if name in sentence and "memlab" not in sentence:
                found.append(f"{name}: {' '.join(sentence.split())[:120]}")
    return found


@pytest.mark.parametrize("path", TWINS, ids=[p.stem for p in TWINS])
def test_no_chapter_gives_an_engine_a_name_it_does_not_have(path):
    found = misattributed(markdown_of(path.read_text()))
    assert not found, "\n".join(
        f"{f} ({NOT_THE_ENGINES[f.split(':')[0]]})" for f in found
    )


def test_the_name_check_catches_one():
    assert misattributed(
        "vLLM's `SlidingWindowKVCacheManager` replaces blocks with the null block."
    )
    assert not misattributed(
        "(memlab's `SlidingWindowKVCacheManager` plays both parts.)"
    )
    table = "| | vLLM 0.33 | memlab |\n|---|---|---|\n| managers | {} | {} |\n"
    assert not misattributed(
        table.format("`SlidingWindowManager`", "`SlidingWindowKVCacheManager`")
    )
    assert misattributed(
        table.format("`SlidingWindowKVCacheManager`", "`SlidingWindowManager`")
    )


def test_corrected_engine_facts_stay_corrected():
    """Each sentence here was wrong once (checked against the SGLang 0.5.23 / vLLM 0.33 wheels)."""
    ch04, ch05, ch06, ch07, ch08 = (
        markdown_of(twin(n)) for n in ("04", "05", "06", "07", "08")
    )
    # 04: part 1 stops at the request's end too; a request inside its old page takes no page.
    assert (
        r"\min(s_i, \lceil p_i / P \rceil P) - 1" in ch04
        and "takes no new page" in ch04
    )
    assert "SGLang once had exactly this bug" not in ch04
    # 05: only alloc_extend launches before its exact count; alloc_decode always counts first.
    assert "`alloc_decode` always makes its exact count" in ch05
    assert (
        "SGLang launches the kernel\nfirst and counts the pages it took afterwards"
        not in ch05
    )
    # 05: free_page_ids is introduced where it is first named; SGLang's staging list.
    first = ch05.index("free_page_ids")
    assert "lower-level door" in ch05[first - 200 : first], (
        "free_page_ids is named before it is introduced"
    )
    assert "`staged_pages`" in ch05 and "frees wait in `release_pages`" not in ch05
    # 06: a hit is whole blocks: a 12-token prompt in 3 blocks recomputes its whole last block.
    assert (
        "the last token is recomputed" not in twin("06") and "whole last block" in ch06
    )
    # 07: the two window counts, with the positions each keeps; the zeroing is deferred.
    assert (
        "### Two ways to count a window" in ch07
        and "keeps positions 6-9" in ch07
        and "only 7-9" in ch07
    )
    assert (
        "`mamba_needs_clear`" in ch07 and "A slot is zeroed when handed out" not in ch07
    )
    # 08: SGLang's budget from two measurements; the 2x reserve only on the speculative paths.
    assert (
        r"F_\text{after} - (1 - f) \cdot F_\text{before}" in ch08
        and "whatever the scheduler mode" not in ch08
    )
    assert "Without speculative decoding there is no reserve at all" in ch08


def test_chapter_11_says_what_memlab_differs_in_plain_words():
    md = markdown_of(twin("11"))
    table = md[
        md.index("## Where memlab differs from SGLang") : md.index(
            "What stays the same"
        )
    ]
    rows = [
        r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| |")
    ]
    assert (
        len(rows) >= 8
        and "| | what differs, in plain words | SGLang 0.5.23's names |" in table
    )
    for row in rows:
        plain = row.split(" | ")[1]
        # The plain column names no engine class or flag: those go to the names column.
        assert not re.search(
            r"`|HiCacheAck|LayerDoneCounter|HF3FS|NIXL|EAGLE", plain
        ), row[:80]
        assert plain.rstrip().endswith("."), (
            f"one plain sentence (or two) per row: {row[:80]}"
        )
    assert (
        "beyond the ask" not in md
        and "at the same time the scheduler's admission test" not in md
    )


# -- the glossary ---------------------------------------------------------------------------------

TERMS = [
    "row",
    "slot",
    "page",
    "block",
    "last_loc",
    "prefix length",
    "extend length",
    "seq length",
    "generation",
    "padding row",
    "padding slot",
    "padding block",
    "free list",
    "free queue",
    "staged pages",
    "locked",
    "evictable",
]


def headings() -> list[str]:
    return [
        h.replace("`", "")
        for h in re.findall(r"^### (.+)$", GLOSSARY.read_text(), re.M)
    ]


def anchor(heading: str) -> str:
    """The anchor both JupyterLab (spaces to '-', case kept) and GitHub (lower case) give a
    lower-case heading of letters, digits, '_', '-' and spaces."""
    return heading.replace(" ", "-")


def glossary_links(text: str) -> list[str]:
    return re.findall(r"\]\(glossary\.md(?:#([^)\s]*))?\)", text)


def test_the_glossary_holds_every_term_and_anchors_agree_everywhere():
    heads = headings()
    for term in TERMS:
        assert term in heads, f"the glossary has no entry for {term!r}"
    # JupyterLab keeps case, GitHub lowers it: only a lower-case heading works in both
    for h in heads:
        assert re.fullmatch(r"[a-z0-9_ -]+", h), (
            f"glossary heading {h!r}: lower case, letters, digits, '_', '-' only"
        )
    jumps = re.findall(r"\]\(#([^)]+)\)", GLOSSARY.read_text())
    assert sorted(set(jumps)) == sorted(anchor(h) for h in heads), (
        "the jump list and the entries differ"
    )


def test_every_glossary_link_of_a_chapter_resolves():
    targets = {anchor(h) for h in headings()}
    linked = set()
    for path in TWINS:
        for frag in glossary_links(path.read_text()):
            assert frag == "" or frag in targets, (
                f"{path.name} links glossary.md#{frag}, which has no entry"
            )
            linked.add(frag)
    unused = (
        targets - linked - {anchor(t) for t in ("request", "extend", "block", "kernel")}
    )
    assert len(unused) < len(targets) / 3, (
        f"most entries should be linked from a chapter; not linked: {sorted(unused)}"
    )


@pytest.mark.parametrize("nn", ["00", "01", "02", "03", "04", "05"])
def test_chapters_00_to_05_point_their_words_at_the_glossary(nn):
    links = [f for f in glossary_links(twin(nn)) if f]
    assert len(links) >= 3, (
        f"chapter {nn} links {links}: each chapter's first use of a term points at the glossary"
    )


def test_chapter_00_opens_the_glossary_in_jupyterlab_github_and_colab():
    from memlab.course.home import github_url

    md = markdown_of(twin("00"))
    first_cell = md[: md.index("After this chapter you can")]
    assert "](glossary.md)" in first_cell, (
        "chapter 00 points at the glossary before anything else"
    )
    # JupyterLab and GitHub follow the relative link; Colab opens the GitHub page
    # (set_home moves it).
    assert f"]({github_url('chapters/glossary.md')})" in md


def test_issue_30_engine_and_memlab_facts_stay_corrected():
    """Each sentence here was wrong or misleading once (issue 30), checked against the SGLang
    0.5.23 / vLLM 0.33 wheels and against memlab itself."""
    ch = {
        n: " ".join(markdown_of(twin(n)).split())
        for n in ("00", "04", "07", "10", "11", "12")
    }
    readme = " ".join((ROOT / "README.md").read_text().split())
    # 12: the flag is refused loudly, DeepSeek-V4 too; the scheduler does branch on types.
    assert "turns the flag down" not in ch["12"] and "`ValueError`" in ch["12"]
    assert "DeepSeek-V4" in ch["12"] and "never asks what kind" not in ch["12"]
    assert "`isinstance`" in ch["12"] and "pages it has never used" not in ch["12"]
    assert "seed" not in ch["12"] and "padding sink" not in ch["12"]
    assert "SGLang's default is **lazy** compaction" in ch["12"]
    assert "memlab keeps SGLang's **eager** compaction" not in ch["12"]
    assert "`min(full, swa)`" in ch["12"]
    # 10: vLLM admits only when the whole current sequence fits; SGLang's 4096 caps.
    assert (
        "full_sequence_must_fit" in ch["10"]
        and "scheduler_reserve_full_isl" in ch["10"]
    )
    assert "admits on the blocks needed now" not in ch["10"]
    assert ch["10"].count("4096") >= 2
    # 07: the release cadence and window, why two counts, the deferred zeroing, the real state.
    assert "max(w, draft window)" in ch["07"] and "every chunk" in ch["07"]
    assert "(memlab zeroes the slot when it hands it out.)" not in ch["07"]
    assert "Why two counts?" in ch["07"] and "A holds 9 tokens" in ch["07"]
    assert "| extra buffer | overlap scheduler | lazy | tracking slots |" in ch["07"]
    # 11: RadixKey's fields and SGLang's parameter objects.
    assert "name for name" not in ch["11"] and "`MatchPrefixParams`" in ch["11"]
    assert "(token_ids, extra_key, is_bigram, limit, cache_salt)" in ch["11"]
    # 00, 04: words defined before use.
    assert ch["00"].index("[decodes](glossary.md#decode)") < ch["00"].index("## Run it")
    assert "A continues its prefill with 6 more tokens" not in ch["00"]
    assert "page 0, the padding page" in ch["00"] and "vLLM's `block_size`" in ch["00"]
    assert ch["04"].index("`alloc_for_extend` is the scheduler's side") < ch[
        "04"
    ].index("## Pages")
    assert "masked store writes only the lanes" in ch["04"]
    assert "never fewer than the batch needs" not in ch["04"]
    # README: what memlab names and what the engines name.
    assert "SGLang has no `mla_decode_attention_fwd`" in readme
    assert "vLLM 0.33 has no `paged_attention`" in readme
