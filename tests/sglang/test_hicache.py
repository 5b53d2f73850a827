"""HiCache's host tier: the host pool follows the device pool's declaration (MHA, MLA, fp8
storage); a device -> host -> device round trip returns every byte; the radix tree over both tiers
by hand (write-through, selective, write-back, host eviction, load-back, a host-only node revived
by an insert); and a property test over random streams of admit (match, load back), finish,
evict, host eviction: no page has two owners on either tier and every request reads back exactly
the KV its prefix was computed with, with buggy variants that the property test catches."""

import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memlab.capstone.prefix_compare import RadixDriver
from memlab.sglang.allocator import make_allocator
from memlab.sglang.hicache import HiCacheController, HiRadixCache, HostKVCache
from memlab.sglang.kv_pool import MHATokenToKVPool, MLATokenToKVPool


def make_pool(kind, size, page_size, dtype=torch.float32, layers=2):
    if kind == "mha":
        return MHATokenToKVPool(
            size,
            page_size,
            dtype,
            head_num=2,
            head_dim=4,
            layer_num=layers,
            v_head_dim=3,
        )
    return MLATokenToKVPool(
        size, page_size, dtype, kv_lora_rank=6, qk_rope_head_dim=2, layer_num=layers
    )


def make_tree(
    page_size=1,
    device_tokens=32,
    host_tokens=64,
    policy="write_through",
    kind="mha",
    threshold=1,
    backend="torch",
    cls=HiRadixCache,
    debug=True,
):
    pool = make_pool(kind, device_tokens, page_size)
    alloc = make_allocator(device_tokens, page_size, kvcache=pool, debug_mode=True)
    host = HostKVCache(
        pool.host_pool_decls()[0],
        host_tokens,
        page_size,
        pin_memory=False,
        debug_mode=True,
    )
    tree = cls(
        alloc,
        host,
        write_policy=policy,
        io_backend=backend,
        load_back_threshold=threshold,
        debug_mode=debug,
    )
    return tree, pool, alloc, host


# -- what a token's KV is: a function of the prefix it ends, so a wrong page shows -----------------


def expected_rows(tokens, start, n, row_shape, layer, salt):
    h = [
        hash((tuple(tokens[: p + 1]), layer, salt)) % 1000
        for p in range(start, start + n)
    ]
    base = torch.tensor(h, dtype=torch.float32)[:, None] + torch.arange(
        torch.Size(row_shape).numel()
    )
    return base.reshape(n, *row_shape)


def writer(pool):
    def on_compute(slots, tokens, start):
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            for layer, buf in enumerate(getattr(pool, name, [])):
                buf[slots] = expected_rows(
                    tokens, start, len(slots), buf.shape[1:], layer, name
                ).to(buf.dtype)

    return on_compute


def check_kv(pool, req):
    """Every token of a running request reads the KV its prefix was computed with."""
    n = len(req.kv_indices)
    for name in ("k_buffer", "v_buffer", "kv_buffer"):
        for layer, buf in enumerate(getattr(pool, name, [])):
            got = buf[req.kv_indices].float()
            want = expected_rows(req.tokens, 0, n, buf.shape[1:], layer, name)
            bad = (got != want).reshape(n, -1).any(-1).nonzero()
            assert len(bad) == 0, (
                f"{name}[{layer}]: token {bad[0].item()} of {req.tokens} reads the wrong KV "
                f"(slot {req.kv_indices[bad[0]].item()}; "
                f"{req.hit_tokens} hit, {req.host_hit_tokens} loaded)"
            )


# -- the host pool ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn])
def test_host_pool_mirrors_the_device_pool(kind, dtype):
    pool = make_pool(kind, 64, 4, dtype, layers=3)
    (decl,) = pool.host_pool_decls()
    names = ["k_buffer", "v_buffer"] if kind == "mha" else ["kv_buffer"]
    assert [b.name for b in decl.buffers] == names and decl.layer_num == 3
    host = HostKVCache(decl, 100, 4, pin_memory=False)
    assert host.size == 100 and host.available_size() == 100
    for name in names:
        dev, hst = getattr(pool, name), host.buffers[name]
        assert len(hst) == 3
        assert (
            hst[0].shape == (104, *dev[0].shape[1:])
            and hst[0].dtype == dev[0].dtype == torch.uint8
            if dtype == torch.float8_e4m3fn
            else hst[0].shape[1:] == dev[0].shape[1:]
        )
    # the host pool is counted in tokens like the device's
    assert host.size_per_token == pool.bytes_per_token
    assert HostKVCache(decl, 102, 4, pin_memory=False).size == 100  # whole pages


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e5m2])
def test_round_trip_returns_every_byte(kind, page_size, backend, dtype):
    pool = make_pool(kind, 8 * page_size, page_size, dtype)
    alloc = make_allocator(8 * page_size, page_size, kvcache=pool, debug_mode=True)
    host = HostKVCache(
        pool.host_pool_decls()[0],
        6 * page_size,
        page_size,
        pin_memory=False,
        debug_mode=True,
    )
    ctl = HiCacheController(alloc, host, page_size, io_backend=backend)
    gen = torch.Generator().manual_seed(page_size)
    for buf in pool.buffers():  # random bytes everywhere (fp8 pools store uint8)
        buf.copy_(
            torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=gen).view(
                buf.dtype
            )
            if buf.dtype == torch.uint8
            else torch.randn(buf.shape, generator=gen).to(buf.dtype)
        )
    slots = alloc.alloc(3 * page_size)
    sent = [buf[slots].clone() for buf in pool.buffers()]
    host_indices = ctl.write(slots)
    assert host_indices is not None and host.available_size() == 3 * page_size
    alloc.free(slots)
    for buf in pool.buffers():
        buf.zero_()
    # device pages are taken first; here the same ones come back LIFO/FIFO
    back = ctl.load(host_indices)
    for before, buf in zip(sent, pool.buffers()):
        assert torch.equal(buf[back].view(torch.uint8), before.view(torch.uint8)), (
            "a byte changed on the round trip"
        )
    # more than the device holds
    assert ctl.load(host.alloc(6 * page_size - 3 * page_size).repeat(3)) is None


def test_unknown_write_policy_is_refused():
    with pytest.raises(ValueError, match="Invalid write policy: 'write_sometimes'"):
        make_tree(policy="write_sometimes")


# -- the tree over two tiers, by hand --------------------------------------------------------------


def test_write_through_demote_then_load_back():
    tree, pool, alloc, host = make_tree(page_size=4)
    drv = RadixDriver(tree, writer(pool))
    a = drv.admit(list(range(9)))
    drv.finish(a)  # 8 tokens (two pages) cached, backed up at once (write_through)
    (node,) = tree.root_node.children.values()
    assert node.backuped and host.available_size() == 64 - 8
    # demoted: the device copy goes, the node stays
    assert tree.evict(8).num_tokens_evicted == 8
    assert node.evicted and node.backuped and alloc.available_size() == 32
    m = tree.match_prefix(list(range(9)))
    assert (m.device_prefix_len, m.host_hit_length) == (0, 8)
    assert m.last_device_node is tree.root_node and m.last_host_node is node
    # loads the two pages back into new device pages
    b = drv.admit(list(range(9)) + [42])
    assert (b.hit_tokens, b.host_hit_tokens) == (8, 8) and not node.evicted
    assert node.value.tolist() == b.kv_indices[:8].tolist()
    check_kv(pool, b)  # every byte came back
    drv.finish(b)
    tree.check_idle(32)


def test_write_through_selective_waits_for_a_second_hit():
    tree, pool, alloc, host = make_tree(policy="write_through_selective")
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3]))
    (node,) = tree.root_node.children.values()
    assert not node.backuped
    # the insert walks over it again: second hit, backed up
    drv.finish(drv.admit([1, 2, 3]))
    assert node.backuped and host.available_size() == 61


def test_write_back_copies_on_eviction_only():
    tree, pool, alloc, host = make_tree(policy="write_back")
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4]))
    (node,) = tree.root_node.children.values()
    assert not node.backuped and host.available_size() == 64
    tree.evict(1)
    assert node.evicted and node.backuped and host.available_size() == 60
    r = drv.admit([1, 2, 3, 4, 5])
    assert r.host_hit_tokens == 4
    check_kv(pool, r)


def test_write_through_backs_up_unbacked_ancestors_first():
    tree, pool, alloc, host = make_tree(host_tokens=3)
    drv = RadixDriver(tree, writer(pool))
    # 4 tokens do not fit a host of 3: not backed up
    drv.finish(drv.admit([1, 2, 3, 4]))
    (a,) = tree.root_node.children.values()
    assert not a.backuped
    host.allocator.clear()  # (make room by hand) now the chain (a) + (5, 6) needs 6 > 3: still no
    drv.finish(drv.admit([1, 2, 3, 4, 5, 6]))
    (b,) = a.children.values()
    # a host node may never hang below a device-only one
    assert not a.backuped and not b.backuped
    tree.evict(100)
    assert tree.root_node.children == {}  # neither could be demoted: both dropped
    tree.check_idle(32)


def test_write_back_drops_a_node_the_host_cannot_take():
    tree, pool, alloc, host = make_tree(policy="write_back", host_tokens=4)
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4]))
    tree.evict(4)  # (1, 2, 3, 4) -> host (full now)
    r = drv.admit([1, 2, 3, 4, 5, 6, 7])  # loads it back: on the device and the host
    drv.finish(r)
    (a,) = tree.root_node.children.values()
    (b,) = a.children.values()  # (5, 6, 7): device only
    # b cannot get a host copy (no host-only leaf to evict): dropped
    assert tree.evict(3).num_tokens_evicted == 3
    assert a.children == {} and a.backuped and not a.evicted
    assert host.available_size() == 0 and alloc.available_size() == 28


def test_host_eviction_is_lru_over_host_only_leaves():
    tree, pool, alloc, host = make_tree(host_tokens=6)
    drv = RadixDriver(tree, writer(pool))
    for key in ([1, 1], [2, 2], [3, 3]):
        drv.finish(drv.admit(key))
    tree.evict(100)  # all three demoted
    tree.match_prefix([1, 1])  # refreshed
    assert tree.evict_host(1) == 2  # (2, 2) is the least recently used host-only leaf
    assert sorted(c.key for c in tree.root_node.children.values()) == [(1, 1), (3, 3)]
    r = drv.admit([2, 2, 9])
    assert r.hit_tokens == 0  # gone from both tiers


def test_host_eviction_never_drops_a_device_nodes_copy():
    tree, pool, alloc, host = make_tree(host_tokens=4)
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4]))
    # the node is on the device: its copy stays, its next eviction is free
    assert tree.evict_host(4) == 0


def test_insert_revives_a_host_only_node_with_the_requests_slots():
    # load-back refused: the request recomputes
    tree, pool, alloc, host = make_tree(threshold=100)
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4]))
    tree.evict(4)
    (node,) = tree.root_node.children.values()
    host_before = node.host_value.clone()
    # computes all 5; its prefill checkpoint inserts them
    r = drv.admit([1, 2, 3, 4, 5])
    assert (r.hit_tokens, r.host_hit_tokens) == (0, 0)
    # the revived part is not a duplicate: the node adopts the request's slots, nothing is freed
    assert node.value.tolist() == r.kv_indices[:4].tolist() and torch.equal(
        node.host_value, host_before
    )
    assert (
        r.kv.cache_protected_len == 5 and r.lock.node.key == (5,) and node.lock_ref == 1
    )
    assert tree.total_size() == 5 and alloc.available_size() == 32 - 5
    drv.finish(r)
    tree.check_idle(32)


def test_a_match_splits_a_host_only_node():
    tree, pool, alloc, host = make_tree()
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4, 5]))
    tree.evict(5)
    m = tree.match_prefix([1, 2, 3, 9])
    assert (m.device_prefix_len, m.host_hit_length) == (
        0,
        3,
    ) and m.last_host_node.key == (1, 2, 3)
    (child,) = m.last_host_node.children.values()
    assert child.key == (4, 5) and len(child.host_value) == 2 and child.evicted
    r = drv.admit([1, 2, 3, 9])
    assert r.host_hit_tokens == 3
    check_kv(pool, r)


def test_load_back_of_a_path_of_host_only_nodes():
    tree, pool, alloc, host = make_tree()
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2, 3, 4, 5, 6, 7, 8]))
    # splits: (1, 2, 3, 4) -> (5, 6, 7, 8), (9, 9)
    drv.finish(drv.admit([1, 2, 3, 4, 9, 9]))
    tree.evict(100)
    m = tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert m.host_hit_length == 8 and m.last_device_node is tree.root_node
    # two nodes come back in one load, in path order
    r = drv.admit([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert r.host_hit_tokens == 8
    check_kv(pool, r)
    (top,) = tree.root_node.children.values()
    # its child is on the device again
    assert not top.evicted and top not in tree.evictable_leaves
    # its own token too: checkpointed
    assert tree.protected_size() == 9 and tree.evictable_size() == 0
    drv.finish(r)
    tree.check_idle(32)


def test_load_back_refused_below_threshold_or_without_room():
    tree, pool, alloc, host = make_tree(threshold=3, device_tokens=8)
    drv = RadixDriver(tree, writer(pool))
    drv.finish(drv.admit([1, 2]))
    tree.evict(2)
    (node,) = tree.root_node.children.values()
    # 2 tokens: cheaper to recompute
    assert tree.load_back(node) is None and node.evicted
    drv.finish(drv.admit([5, 6, 7, 8, 9]))
    tree.evict(100)
    (big,) = [c for c in tree.root_node.children.values() if c.key[0] == 5]
    held = drv.admit([7] * 5)  # 5 of the 8 device slots locked by a running request
    # 5 tokens, 3 slots free, nothing evictable
    assert tree.load_back(big) is None and big.evicted
    drv.finish(held)
    assert tree.load_back(big) is not None and not big.evicted


# -- property: two tiers, no page with two owners, every byte right --------------------------------


def check_owners(tree, alloc, host, running):
    ps = tree.page_size

    def ledger(free, held, num_pages, tier):
        owners = {}
        for who, pages in [("free list", free)] + held:
            for p in pages:
                assert p not in owners, (
                    f"{tier} page {p} is held by {owners[p]} and by {who}"
                )
                owners[p] = who
        assert sorted(owners) == list(range(1, num_pages + 1)), (
            f"a {tier} page has no owner: it leaked"
        )

    nodes = tree._all_nodes()
    dev = [
        (f"node {n.id}", (n.value[::ps] // ps).tolist()) for n in nodes if not n.evicted
    ]
    dev += [
        (
            f"request {i}",
            torch.unique(r.kv_indices[r.kv.cache_protected_len :] // ps).tolist(),
        )
        for i, r in enumerate(running)
    ]
    ledger(alloc.get_all_free_pages().tolist(), dev, alloc.num_pages, "device")
    hst = [
        (f"node {n.id}", (n.host_value[::ps] // ps).tolist())
        for n in nodes
        if n.backuped
    ]
    ha = host.allocator
    ledger(ha.get_all_free_pages().tolist(), hst, ha.num_pages, "host")


class HostEvictKeepsNode(HiRadixCache):
    """Bug: host eviction frees a host-only leaf's slots but leaves the node in the tree."""

    def evict_host(self, num_tokens):
        leaves = [
            n
            for n in self._all_nodes()
            if n.evicted and not n.children and n.host_lock_ref == 0
        ]
        freed = 0
        for n in sorted(leaves, key=lambda n: n.last_access_time):
            if freed >= num_tokens:
                break
            freed += self.cache_controller.evict_host(n.host_value)
        return freed


class DemoteKeepsDeviceSlots(HiRadixCache):
    """Bug: demotion gives the device slots back but the node still points at them."""

    def _evict_backuped(self, node):
        value = node.value
        n = super()._evict_backuped(node)
        node.value = value
        self.evictable_size_ += n
        return n


ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "admit",
                "admit",
                "admit",
                "finish",
                "finish",
                "evict",
                "evict_host",
                "match",
            ]
        ),
        st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=40,
)


def run_stream(
    steps, page_size=1, policy="write_through", cls=HiRadixCache, debug=True, kind="mha"
):
    tree, pool, alloc, host = make_tree(
        page_size,
        device_tokens=12 * page_size,
        host_tokens=10 * page_size,
        policy=policy,
        kind=kind,
        threshold=page_size,
        cls=cls,
        debug=debug,
    )
    drv, running = RadixDriver(tree, writer(pool)), []
    seqs = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9], [5] * 10]
    for op, x in steps:
        rng = random.Random(x)
        # mostly a long piece of a sequence seen before: hits on both tiers
        base = rng.choice(seqs)
        tokens = base[: rng.randrange(len(base) // 2, len(base) + 1)] + [
            rng.randrange(3) for _ in range(rng.randrange(1, 2 + 2 * page_size))
        ]
        if op == "admit" and len(running) < 2:
            req = drv.admit(tokens)
            if req is not None:
                check_kv(pool, req)
                running.append(req)
                seqs.append(tokens)
        elif op == "finish" and running:
            drv.finish(running.pop(x % len(running)))
        elif op == "evict":
            tree.evict(x % (8 * page_size))
        elif op == "evict_host":
            tree.evict_host(x % (6 * page_size))
        elif op == "match":
            tree.match_prefix(tokens)
        check_owners(tree, alloc, host, running)
        for r in running:
            check_kv(pool, r)
    for r in running:
        drv.finish(r)
    check_owners(tree, alloc, host, [])
    tree.check_idle(alloc.num_pages * page_size)


@pytest.mark.parametrize(
    "policy,page_size,kind",
    [
        ("write_through", 1, "mha"),
        ("write_through_selective", 1, "mla"),
        ("write_back", 1, "mha"),
        ("write_back", 4, "mla"),
        ("write_through", 4, "mha"),
    ],
)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops)
def test_two_tiers_no_page_has_two_owners_and_every_byte_is_right(
    policy, page_size, kind, steps
):
    run_stream(steps, page_size, policy, kind=kind)


@pytest.mark.parametrize(
    "policy,page_size,kind",
    [
        ("write_through", 1, "mla"),
        ("write_back", 1, "mha"),
        ("write_through", 4, "mha"),
    ],
)
def test_two_tiers_seeded_streams(policy, page_size, kind):
    """The same property over fixed longer streams (hypothesis explores, these always run)."""
    names = [
        "admit",
        "admit",
        "admit",
        "finish",
        "finish",
        "evict",
        "evict_host",
        "match",
    ]
    for seed in range(10):
        rng = random.Random(seed)
        run_stream(
            [(rng.choice(names), rng.randrange(10**6)) for _ in range(60)],
            page_size,
            policy,
            kind=kind,
        )


@pytest.mark.parametrize("cls", [HostEvictKeepsNode, DemoteKeepsDeviceSlots])
def test_the_two_tier_property_catches_buggy_variants(cls):
    @settings(
        max_examples=300,
        deadline=None,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
    )
    @given(steps=ops)
    def prop(steps):
        run_stream(steps, 1, "write_back", cls=cls, debug=False)

    with pytest.raises(AssertionError, match="is held by|reads the wrong KV|no owner"):
        prop()


def test_host_fields_live_in_the_hicache_node_only():
    """The base TreeNode holds device slots only; HiCache's node adds the host copy."""
    from memlab.sglang.hicache import HiTreeNode
    from memlab.sglang.radix_cache import TreeNode

    assert not {"host_value", "host_lock_ref"} & set(TreeNode.__slots__)
    assert {"host_value", "host_lock_ref"} <= set(HiTreeNode.__slots__)
    tree, *_ = make_tree()
    assert type(tree.root_node) is HiTreeNode
