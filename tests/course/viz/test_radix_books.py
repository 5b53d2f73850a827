"""memlab.course.viz.radix_books without a browser: the story replays the real HiRadixCache,
snapshots read the real tree and pools, and the drawing (SVG) paints each node and page the
colour its state and owner give (derived here independently of the drawing code)."""

import xml.etree.ElementTree as ET

import pytest

from memlab.course.viz.radix_books import (
    DEVICE,
    EVICTABLE,
    HOST_ONLY,
    LOCKED,
    RadixScene,
    draw_radix,
    encode,
    story,
)
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, owner_color, same_color
from memlab.course.viz.svg import PART_FILL

SVG = "{http://www.w3.org/2000/svg}"


def by_gid(svg, prefix):
    """The box of every element whose gid starts with ``prefix`` (a cell's first rect; the
    root's circle), by gid."""
    found = {}
    for e in ET.fromstring(svg).iter():
        gid = e.get("data-gid") or ""
        if gid.startswith(prefix):
            found[gid] = e if e.tag == f"{SVG}circle" else e.findall(f"{SVG}rect")
    return found


@pytest.fixture(scope="module")
def frames():
    return story()


def expected_node_fill(n):
    if n.value is None:
        return HOST_ONLY
    if n.lock_ref:
        return LOCKED
    return EVICTABLE if n.evictable else DEVICE


def expected_page_fill(books, page, host):
    if page == 0:
        return PADDING
    for n in books.nodes:
        slots = n.host_value if host else n.value
        if slots is not None and page in {s // books.page_size for s in slots}:
            return expected_node_fill(n)
    if not host:
        for rid, pages in books.requests.items():
            if page in pages:
                return owner_color(rid)
    return FREE


def check_drawing(books):
    svg = draw_radix(books)
    nodes = by_gid(svg, "node:")
    assert len(nodes) == len(books.nodes) + 1  # and the root
    for n in books.nodes:
        box, *over = nodes[f"node:{n.id}"]
        assert same_color(box.get("fill"), expected_node_fill(n)), (
            f"node {n.id} ({n.key}) has the wrong colour"
        )
        assert bool(over and over[0].get("fill") == PART_FILL[1]) == (n.value is None)
        assert (
            same_color(box.get("stroke"), HIGHLIGHT)
            and float(box.get("stroke-width")) > 1
        ) == (n.id in books.highlight)
    for prefix, pages, host in (
        ("dpage", books.device_pages, False),
        ("hpage", books.host_pages, True),
    ):
        cells = by_gid(svg, f"{prefix}:")
        assert len(cells) == pages + 1
        for p in range(pages + 1):
            assert same_color(
                cells[f"{prefix}:{p}"][0].get("fill"),
                expected_page_fill(books, p, host),
            ), f"{prefix} {p} has the wrong colour"


def test_story_steps_through_split_eviction_and_load_back(frames):
    assert len(frames) == 12 and all(f.caption for f in frames)
    keys = lambda f: sorted(n.key for n in f.nodes)  # noqa: E731
    assert keys(frames[2]) == [tuple(encode("<s> You are brief . What is KV ?"))]
    # split, and B's checkpointed tail
    assert keys(frames[3]) == sorted(
        [
            tuple(encode("<s> You are brief . What is")),
            tuple(encode("KV ?")),
            tuple(encode("HiCache ?")),
        ]
    )
    locked = [n for n in frames[3].nodes if n.lock_ref]
    assert [n.key for n in locked] == [
        tuple(encode("<s> You are brief . What is")),
        tuple(encode("HiCache ?")),
    ]
    assert any(n.value is None for n in frames[6].nodes)  # demoted to the host
    assert "loaded back" in frames[8].note and frames[8].highlight
    assert all(n.value is None for n in frames[10].nodes)
    assert len(frames[11].nodes) < len(frames[10].nodes)  # host eviction dropped leaves


def test_snapshots_read_the_real_tree_and_pools():
    sc = RadixScene()
    sc.arrive("A", "<s> You are brief . What is KV ?", "A")
    sc.finish("A", "done")
    sc.arrive("B", "<s> You are brief . What is HiCache ?", "B")
    books = sc.frames[-1]
    tree = sc.tree
    real = {n.id: n for n in tree._all_nodes()}
    assert {n.id for n in books.nodes} == set(real)
    for n in books.nodes:
        assert (
            n.value == tuple(real[n.id].value.tolist())
            and n.lock_ref == real[n.id].lock_ref
        )
        assert n.evictable == (real[n.id] in tree.evictable_leaves)
    assert books.free_device == frozenset(
        tree.token_to_kv_pool_allocator.free_pages.tolist()
    )
    assert books.requests["B"] == frozenset(
        sc.running["B"].kv_indices[sc.running["B"].kv.cache_protected_len :].tolist()
    )
    # the shared 7 and B's own 2, checkpointed
    assert books.sizes["protected"] == tree.protected_size() == 9


def test_load_back_in_the_story_brings_back_the_right_kv():
    """The scene's 'model' writes (position, token id) as each token's K: after the load-back,
    D's whole row reads exactly that."""
    sc = RadixScene()
    sc.arrive("A", "<s> You are brief . What is KV ?", "A")
    sc.finish("A", "")
    sc.evict(100, "")
    sc.arrive("D", "<s> You are brief . What is KV ? a", "D")
    req = sc.running["D"]
    assert req.host_hit_tokens == 9
    k = sc.pool.get_key_buffer(0)[req.kv_indices][:, 0]
    assert k[:, 0].tolist() == list(range(10)) and k[:, 1].tolist() == [
        float(t) for t in req.tokens
    ]


@pytest.mark.parametrize("step", [1, 3, 6, 8, 11])
def test_drawing_colours_follow_the_books(frames, step):
    check_drawing(frames[step])


def test_drawing_check_catches_a_drawing_that_ignores_locks(frames, monkeypatch):
    import memlab.course.viz.radix_books as rb

    monkeypatch.setattr(rb, "STATE_FILL", {**rb.STATE_FILL, "locked": rb.DEVICE})
    with pytest.raises(AssertionError, match="wrong colour"):
        check_drawing(frames[3])


def test_page_size_two_keeps_whole_pages():
    frames = story(page_size=2)
    for f in frames:
        for n in f.nodes:
            assert len(n.key) % 2 == 0
    # the split falls on a page
    assert sorted(n.key for n in frames[5].nodes)[0] == tuple(encode("<s> You"))


@pytest.mark.parametrize(
    "page_size, split_b, split_c",
    [
        (1, "<s> You are brief . What is", "<s> You are"),
        (2, "<s> You are brief . What", "<s> You"),
    ],
)
def test_captions_name_the_split_the_tree_made(page_size, split_b, split_c):
    frames = story(page_size=page_size)
    assert (
        f"through '{split_b}'" in frames[3].caption
        and f"shares '{split_c}'" in frames[5].caption
    )
    for f, split in ((frames[3], split_b), (frames[5], split_c)):
        locked = [n for n in f.nodes if n.lock_ref and n.parent is None]
        assert [n.key for n in locked] == [tuple(encode(split))], (
            "the caption names the node the match split off"
        )
    assert ("whole pages of 2" in frames[3].caption) == (page_size == 2)


def test_stepper_over_stories(frames):
    """The chapter's widget over the story's frames (the drawings are checked above; a caption
    stands in for the picture here, so the test stays quick)."""
    from memlab.course.viz.widgets import Stepper

    w = Stepper(
        {"first steps": frames[:4], "later": frames[6:8]}, lambda b: f"<p>{b.note}</p>"
    )
    w._move(+3)
    assert "SPLITS" in w.caption.value and "hit 7 tokens" in w.view.value
    w.story.value = "later"
    assert w.slider.max == 1 and "DEMOTED" in w.caption.value
