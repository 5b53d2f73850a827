"""memlab's unified pool (memlab.sglang.unified) against SGLang 0.5.23's, stream by stream.

What runs from the wheel (see unified_loader.py): ``UnifiedKVPool`` and the sub-pool specs,
``MultiEndedAllocator``, ``UnifiedSWATokenToKVPoolAllocator``, the ``virtual_slot`` functions on
their torch paths, and the paged ``alloc_extend``/``alloc_decode`` Triton kernels (in the
interpreter; the unified allocator has no torch fallback for them).

Compared after every step, in random streams:
- the pool: entry bytes, the reserved floor, ``max_slots`` and ``min_slot_index`` of each sub-pool;
- two END allocators over one buffer (a paged KV end growing down; a KV end, or a Mamba-state end
  of page size 1, growing up), eager: every virtual id handed out and every refusal, both page
  tables, the watermark, the free virtual ids (order included), ``available_size``,
  ``schedulable_available_size``, ``allocated_count``, every page move (sources and holes), and
  the translation of every live token plus ids that must go to the sink (negative, past the table);
- the SWA composite, eager, driven like a scheduler (new requests, chunked prefills and decodes
  through the kernels, ``alloc`` at page size 1, window releases with ``free_swa``,
  finished requests with ``free`` or ``free_full`` + ``free``): the same, on both sides,
  plus the joint ``available_size``, ``full_available_size`` / ``swa_available_size``
  and ``size_full`` / ``size_swa``;
- memlab's eager allocators against the wheel's LAZY ones (SGLang's default): the same accept/refuse
  decision at every step, and memlab's ``available_size`` equal to the wheel's
  ``schedulable_available_size`` (what it can allocate once its neighbour's holes are flushed).

What cannot be compared on a CPU, and why:
- the lazy flush while a forward is in flight: its urgent path waits on a CUDA event
  (``torch.cuda.current_stream().wait_event``), which raises without CUDA; the streams keep the
  latest forward event None, as an idle scheduler has it;
- the write door itself: SGLang's ``UnifiedMHATokenToKVPool`` subclasses the CUDA-heavy
  ``MHATokenToKVPool`` of ``memory_pool.py``, so it is a placeholder here and the allocators
  are handed recording stand-ins; what reaches the write door (the translated ids) is compared,
  and memlab's door is tested on its own (tests/sglang/unified/test_unified.py);
- ``KVLocPlan`` / ``KVIndexTranslator`` (the per-batch translation plan) import attention
  kernels; memlab's ``write_loc`` is compared through the translations it is made of;
- the Triton ``virtual_slot`` kernels: off CUDA the wheel takes its torch paths.
"""

import random

import pytest
import torch

from memlab.common.env import ensure_kernel_mode
from memlab.sglang.unified import (
    MambaSubPoolSpec,
    MHASubPoolSpec,
    MultiEndedAllocator,
    UnifiedKVPool,
    UnifiedSWATokenToKVPoolAllocator,
)
from memlab_tests.tools.engines.unified_loader import (
    RecordingKVPool,
    RecordingSWAKV,
    load,
)

STEPS = 80


def T(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def specs(mod, entry_down: int, entry_up: int, mamba_up: bool, names=("full", "up")):
    """The same two sub-pools in the wheel's classes (mod = the picked unified_memory_pool) or
    memlab's: an MHA entry of ``entry_down`` bytes (one layer, one head, bf16 K and V) growing down,
    and an MHA or Mamba entry of ``entry_up`` bytes growing up."""
    down = mod.MHASubPoolSpec(
        name=names[0],
        layer_num=1,
        head_num=1,
        head_dim=entry_down // 4,
        store_dtype=torch.bfloat16,
        grow_direction="down",
    )
    if mamba_up:
        up = mod.MambaSubPoolSpec(
            name=names[1],
            layer_num=1,
            conv_state_shapes=((entry_up // 2,),),
            conv_dtype=torch.bfloat16,
            temporal_state_shape=(0,),
            temporal_dtype=torch.float32,
            grow_direction="up",
        )
    else:
        up = mod.MHASubPoolSpec(
            name=names[1],
            layer_num=1,
            head_num=1,
            head_dim=entry_up // 4,
            store_dtype=torch.bfloat16,
            grow_direction="up",
        )
    return [down, up]


class Memlab:  # memlab's classes under the same names as the picked wheel module's
    MHASubPoolSpec, MambaSubPoolSpec = MHASubPoolSpec, MambaSubPoolSpec


def pools(u, total, e_down, e_up, ps, mamba_up, names=("full", "up")):
    wheel = u.ump.UnifiedKVPool(
        total_bytes=total,
        sub_pool_specs=specs(u.ump, e_down, e_up, mamba_up, names),
        device="cpu",
        enable_memory_saver=False,
        page_size=ps,
    )
    mine = UnifiedKVPool(
        total_bytes=total,
        sub_pool_specs=specs(Memlab, e_down, e_up, mamba_up, names),
        page_size=ps,
    )
    for s in mine.sub_pool_specs:
        assert s.entry_bytes() == wheel.spec(s.name).entry_bytes()
        assert (mine.max_slots(s.name), mine.min_slot_index(s.name)) == (
            wheel.max_slots(s.name),
            wheel.min_slot_index(s.name),
        ), s.name
    return wheel, mine


def end_state(a, moves: bool = True) -> dict:
    free = a.free_virtual_ids
    state = dict(
        wm=a.watermark_physical,
        v2p=a.virtual_to_physical.tolist(),
        p2v=a.physical_to_virtual.tolist(),
        free=None if free is None or not a.is_id_owner else free.tolist(),
        available=a.available_size(),
        schedulable=a.schedulable_available_size(),
        allocated=a.allocated_count(),
    )
    if moves:
        state["moves"] = list(a._kvcache.moves)
    return state


def same(wheel: dict, mine: dict, where: str) -> None:
    for k in wheel:
        assert wheel[k] == mine[k], (
            f"{where}: {k}: SGLang {wheel[k]} != memlab {mine[k]}"
        )


def sink_probe(a, live: list[int]) -> torch.Tensor:
    """Live ids and ids that must translate to the sink: negative, past the table, unbound."""
    return T(
        live
        + [
            -1,
            -a.page_size - 3,
            len(a.virtual_to_physical) * a.page_size + 5,
            (len(a.virtual_to_physical) - 1) * a.page_size,
        ]
    )


# -- two END allocators over one buffer ---------------------------------------------------------


def end_pair(u, pool, names, ps, up_ps, lazy=False, wheel=True):
    if wheel:
        make = lambda name, p: u.sub.MultiEndedAllocator(  # noqa: E731
            kvcache=RecordingKVPool(),
            unified_buffer=pool,
            sub_pool_name=name,
            device="cpu",
            is_id_owner=True,
            page_size=p,
            lazy_compaction=lazy,
        )
    else:
        make = lambda name, p: MultiEndedAllocator(  # noqa: E731
            kvcache=RecordingKVPool(),
            unified_buffer=pool,
            sub_pool_name=name,
            is_id_owner=True,
            page_size=p,
            debug_mode=True,
        )
    down, up = make(names[0], ps), make(names[1], up_ps)
    down.bind_peer(up), up.bind_peer(down)
    return down, up


def end_stream(u, seed, ps, mamba_up, steps=STEPS):
    rng = random.Random(seed)
    e_down, e_up = (
        rng.choice([32, 64, 96]),
        rng.choice([48, 160, 400]) if mamba_up else rng.choice([32, 64, 128]),
    )
    total, up_ps = rng.randint(40, 90) * 64, 1 if mamba_up else ps
    names = ("full", "mamba" if mamba_up else "swa")
    wpool, mpool = pools(u, total, e_down, e_up, ps, mamba_up, names)
    wheel, mine = (
        end_pair(u, wpool, names, ps, up_ps),
        end_pair(u, mpool, names, ps, up_ps, wheel=False),
    )
    # a second wheel pair on the same specs
    lazy = end_pair(u, wpool, names, ps, up_ps, lazy=True)
    live = [[], []]
    refusals = 0
    for step in range(steps):
        side = rng.randrange(2)
        w, m, lz = wheel[side], mine[side], lazy[side]
        where = f"seed {seed} step {step} ({names[side]})"
        if rng.random() < 0.55 or not live[side]:
            n = rng.randint(0, 6) * m.page_size
            a, b, c = w.alloc(n), m.alloc(n), lz.alloc(n)
            assert (a is None) == (b is None) == (c is None), (
                f"{where}: alloc({n}) refused by some only"
            )
            refusals += a is None
            if a is not None:
                assert a.tolist() == b.tolist(), (
                    f"{where}: alloc({n}) ids {a.tolist()} != {b.tolist()}"
                )
                live[side].append((a.tolist(), c.tolist()))
        else:
            ids, lazy_ids = live[side].pop(rng.randrange(len(live[side])))
            # a free need not come in allocation order
            order = rng.sample(ids, len(ids))
            (
                w.free(T(order)),
                m.free(T(order)),
                lz.free(T(rng.sample(lazy_ids, len(lazy_ids)))),
            )
        for ww, mm, ll in zip(wheel, mine, lazy):
            same(end_state(ww), end_state(mm), where)
            assert mm.available_size() == ll.schedulable_available_size(), (
                f"{where}: eager vs lazy capacity"
            )
            mm.check_books()
        held = [t for ids, _ in live[side] for t in ids]
        probe = sink_probe(m, held)
        assert (
            w.translate_kv_loc(probe).tolist() == m.translate_kv_loc(probe).tolist()
        ), where
        assert (
            w.translate_write_loc(probe).tolist()
            == m.translate_write_loc(probe).tolist()
        ), where
    return refusals


@pytest.mark.parametrize("ps", [1, 2, 3, 4])
@pytest.mark.parametrize("mamba_up", [False, True], ids=["kv_up", "mamba_up"])
def test_end_pair_matches_sglang(ps, mamba_up, tally):
    u = load()
    streams = 4
    refusals = sum(
        end_stream(u, 1000 * ps + 10 * seed + mamba_up, ps, mamba_up)
        for seed in range(streams)
    )
    assert refusals > 0, "the streams never ran short: make the buffers smaller"
    tally(
        f"MultiEndedAllocator pair, page {ps}, "
        f"{'Mamba' if mamba_up else 'KV'} lower end (+ lazy wheel)",
        streams,
        streams * STEPS,
    )


def test_pool_views_and_floor_match_sglang():
    """The per-layer views start where the wheel's do: the same bytes for the same physical slot."""
    u = load()
    for ps, (layers, heads, d) in ((1, (2, 1, 8)), (4, (3, 2, 16)), (3, (1, 4, 8))):
        mk = lambda mod, name, grow: mod.MHASubPoolSpec(  # noqa: E731
            name=name,
            layer_num=layers,
            head_num=heads,
            head_dim=d,
            store_dtype=torch.bfloat16,
            grow_direction=grow,
        )
        wheel = u.ump.UnifiedKVPool(
            total_bytes=8192,
            sub_pool_specs=[mk(u.ump, "full", "down"), mk(u.ump, "swa", "up")],
            device="cpu",
            enable_memory_saver=False,
            page_size=ps,
        )
        mine = UnifiedKVPool(
            total_bytes=8192,
            sub_pool_specs=[mk(Memlab, "full", "down"), mk(Memlab, "swa", "up")],
            page_size=ps,
        )
        assert mine.reserved_floor == wheel._reserved_floor
        wk, wv = wheel.mha_views_for("full")
        mk_, mv = mine.mha_views_for("full")
        base_w, base_m = wheel._raw.data_ptr(), mine._raw.data_ptr()
        for a, b in zip(wk + wv, mk_ + mv):
            assert a.shape == b.shape and a.stride() == b.stride()
            assert a.data_ptr() - base_w == b.data_ptr() - base_m


# -- the SWA composite -------------------------------------------------------------------------


def composite(u, pool, ps, lazy=False, wheel=True, backend="torch"):
    kv = RecordingSWAKV()
    if wheel:
        a = u.hswa.UnifiedSWATokenToKVPoolAllocator(
            unified_buffer=pool,
            kvcache=kv,
            device="cpu",
            page_size=ps,
            lazy_compaction=lazy,
        )
        a.full_attn_allocator._kvcache, a.swa_attn_allocator._kvcache = (
            kv.full_kv_pool,
            kv.swa_kv_pool,
        )
        return a
    return UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=pool, kvcache=kv, page_size=ps, debug_mode=True, backend=backend
    )


def composite_state(a) -> dict:
    return dict(
        full=end_state(a.full_attn_allocator),
        swa=end_state(a.swa_attn_allocator),
        available=a.available_size(),
        full_available=a.full_available_size(),
        swa_available=a.swa_available_size(),
        sizes=(a.size_full, a.size_swa),
    )


class Req:
    def __init__(self):
        self.ids: dict[int, list[int]] = {}  # engine index -> virtual token ids
        self.released = 0  # tokens whose SWA pages were given back (page-aligned)


def composite_step(rng, ps, engines, reqs, kernels):
    """One scheduler action on every engine; returns (what, answers) for the comparison."""
    r = rng.random()
    if r < 0.45 or not reqs:
        n = rng.randint(1, 9)
        # the scheduler's path at page size 1 (and alloc(k * ps) above it)
        if not kernels:
            n = -(-n // ps) * ps
            outs = [e.alloc(n) for e in engines]
            return ("alloc", n, None), outs
        bs = rng.randint(1, 3)
        batch = [
            rng.choice(list(reqs)) if reqs and rng.random() < 0.3 else None
            for _ in range(bs)
        ]
        batch = [q for i, q in enumerate(batch) if q is None or q not in batch[:i]]
        pre = [0 if q is None else len(q.ids[0]) for q in batch]
        ext = [rng.randint(1, 9) for _ in batch]
        outs = []
        for i, e in enumerate(engines):
            last = [-1 if q is None else q.ids[i][-1] for q in batch]
            seq = [p + x for p, x in zip(pre, ext)]
            outs.append(
                e.alloc_extend(T(pre), T(pre), T(seq), T(seq), T(last), sum(ext))
            )
        return ("extend", batch, ext), outs
    q_list = list(reqs)
    if r < 0.65 and kernels:
        batch = rng.sample(q_list, rng.randint(1, min(4, len(q_list))))
        outs = []
        for i, e in enumerate(engines):
            seq = [len(q.ids[i]) + 1 for q in batch]
            outs.append(
                e.alloc_decode(T(seq), T(seq), T([q.ids[i][-1] for q in batch]))
            )
        return ("decode", batch, None), outs
    q = rng.choice(q_list)
    if r < 0.82:  # the window moved on: release whole pages of SWA KV from q.released
        k = min(len(q.ids[0]) // ps * ps, q.released + rng.randint(1, 3) * ps)
        for i, e in enumerate(engines):
            e.free_swa(T(q.ids[i][q.released : k]))
        q.released = max(q.released, k)
        return ("free_swa", q, None), None
    split = q.released and rng.random() < 0.5
    order = rng.sample(range(len(q.ids[0])), len(q.ids[0]))
    for i, e in enumerate(engines):  # q finishes
        if split:  # the part out of the window on the full side only, then the rest
            e.free_full(T(q.ids[i][: q.released]))
            e.free(T(q.ids[i][q.released :]))
        else:
            e.free(T([q.ids[i][j] for j in order]))
    del reqs[q]
    return ("finish", q, None), None


def composite_stream(u, seed, ps, kernels, steps=STEPS, backend="torch"):
    rng = random.Random(seed)
    e_full, e_swa = rng.choice([32, 64, 128]), rng.choice([32, 64])
    total = rng.randint(40, 100) * 64 * ps
    wpool, mpool = pools(u, total, e_full, e_swa, ps, False, ("full", "swa"))
    engines = [
        composite(u, wpool, ps),
        composite(u, mpool, ps, wheel=False, backend=backend),
        composite(u, wpool, ps, lazy=True),
    ]
    reqs: dict[Req, None] = {}
    refusals = 0
    for step in range(steps):
        (what, arg, ext), outs = composite_step(rng, ps, engines, reqs, kernels)
        where = f"seed {seed} step {step} ({what})"
        if outs is not None:
            assert len({o is None for o in outs}) == 1, (
                f"{where}: refused by some only ({[o is None for o in outs]})"
            )
            refusals += outs[0] is None
            if outs[0] is not None:
                assert outs[0].tolist() == outs[1].tolist(), (
                    f"{where}: ids {outs[0].tolist()} != {outs[1].tolist()}"
                )
                if what == "alloc":
                    q = Req()
                    q.ids = {i: o.tolist() for i, o in enumerate(outs)}
                    reqs[q] = None
                elif what == "decode":
                    for i, o in enumerate(outs):
                        for q, t in zip(arg, o.tolist()):
                            q.ids[i].append(t)
                else:
                    for i, o in enumerate(outs):
                        flat, at = o.tolist(), 0
                        for j, (q, x) in enumerate(zip(arg, ext)):
                            if q is None:
                                q = arg[j] = Req()
                                q.ids = {k: [] for k in range(len(engines))}
                                reqs[q] = None
                            q.ids[i] += flat[at : at + x]
                            at += x
        w, m, lz = engines
        same(composite_state(w), composite_state(m), where)
        # The lazy wheel's available_size counts only what fits before compacting; memlab's (eager)
        # is the most its ensure_capacity accepts, compacting both sides first.
        n = m.available_size() // ps
        assert lz._fits_page_demand(n, n, compacted=True) and not lz._fits_page_demand(
            n + 1, n + 1, compacted=True
        ), (
            f"{where}: eager available_size {n * ps} is not the lazy wheel's compacted capacity"
        )
        assert (m.full_available_size(), m.swa_available_size()) == (
            lz.full_available_size(),
            lz.swa_available_size(),
        ), where
        m.check_books()
        held = [t for q in reqs for t in q.ids[0]]
        probe = sink_probe(m.full_attn_allocator, held)
        for fn in (
            "translate_kv_loc",
            "translate_loc_from_full_to_swa",
            "translate_write_loc",
        ):
            assert getattr(w, fn)(probe).tolist() == getattr(m, fn)(probe).tolist(), (
                f"{where}: {fn}"
            )
        wl = m.write_loc(T(held))
        assert (
            wl.physical and wl.loc.tolist() == w.translate_write_loc(T(held)).tolist()
        )
        assert wl.swa_loc.tolist() == w.translate_loc_from_full_to_swa(T(held)).tolist()
    return refusals


@pytest.mark.parametrize("ps", [1, 2, 3, 4])
def test_swa_composite_alloc_streams_match_sglang(ps, tally):
    u = load()
    streams = 4
    refusals = sum(
        composite_stream(u, 500 + 7 * seed + ps, ps, kernels=False)
        for seed in range(streams)
    )
    assert refusals > 0
    tally(
        f"UnifiedSWATokenToKVPoolAllocator page {ps}, alloc/free/free_swa (+ lazy wheel)",
        streams,
        streams * STEPS,
    )


@pytest.mark.parametrize("ps", [2, 4, 16])
def test_swa_composite_kernel_streams_match_sglang(ps, tally):
    """alloc_extend / alloc_decode: the wheel's paged kernels and memlab's chapter 04-05 code path
    (its torch reference, and in one stream its Triton kernel) in virtual space. (SGLang's kernels
    take power-of-two pages only: page size 3 runs in the alloc streams.)"""
    ensure_kernel_mode()
    u = load()
    streams = 2
    for seed in range(streams):
        composite_stream(
            u,
            900 + 11 * seed + ps,
            ps,
            kernels=True,
            steps=40,
            backend="triton" if seed == 0 else "torch",
        )
    tally(
        f"UnifiedSWATokenToKVPoolAllocator page {ps}, alloc_extend/alloc_decode kernels",
        streams,
        streams * 40,
    )


def test_the_streams_catch_a_wrong_free_list(monkeypatch):
    """The comparison can fail: memlab with freed virtual pages put at the head (LIFO, as chapter
    05's paged allocator does) instead of SGLang's tail differs within a stream."""
    u = load()
    release = MultiEndedAllocator._release_page_ids

    def lifo(self, page_ids):
        release(self, page_ids)
        if self.is_id_owner:
            self.free_pages = torch.cat((page_ids, self.free_pages[: -len(page_ids)]))

    monkeypatch.setattr(MultiEndedAllocator, "_release_page_ids", lifo)
    with pytest.raises(AssertionError, match="free"):
        end_stream(u, 7, 2, False)


def _ancestors(cls) -> list[str]:
    return [c.__name__ for c in cls.__mro__ if c.__name__ not in ("object", "ABC")]


def test_the_class_trees_are_sglangs():
    """memlab's composites derive as SGLang 0.5.23's do: the two-pool SWA allocator from the
    base allocator, the unified one from the two-pool one (SGLang puts its
    ``UnifiedSWAAllocatorBase`` between them, memlab has one unified class). Every ancestor memlab
    names is one of SGLang's, in SGLang's order."""
    from memlab.sglang.swa import SWATokenToKVPoolAllocator

    u = load()
    for ours, theirs in (
        (SWATokenToKVPoolAllocator, u.hswa.SWATokenToKVPoolAllocator),
        (UnifiedSWATokenToKVPoolAllocator, u.hswa.UnifiedSWATokenToKVPoolAllocator),
    ):
        mine, sg = _ancestors(ours), _ancestors(theirs)
        assert [n for n in sg if n in mine] == mine, (mine, sg)
        assert "BaseTokenToKVPoolAllocator" in mine
    # one free_segments / free_full_segments, written in the base allocator only
    for name in ("free_segments", "free_full_segments"):
        owners = {
            c.__name__
            for c in UnifiedSWATokenToKVPoolAllocator.__mro__
            if name in vars(c)
        }
        assert owners == {"BaseTokenToKVPoolAllocator"}, (name, owners)
