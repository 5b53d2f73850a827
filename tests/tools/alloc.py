"""Shared test helpers: drive an allocator like a scheduler does, and check its books."""

import torch

from memlab.sglang.allocation import (
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
)


def extend(alloc, held: dict, rid, n: int):
    """Extend request ``rid`` (holding ``held[rid]`` slots) by ``n`` tokens; returns the new slots
    or None."""
    slots = held.get(rid, [])
    out = alloc_paged_token_slots_extend(
        alloc, [len(slots)], [len(slots) + n], [slots[-1] if slots else -1]
    )
    if out is not None:
        held[rid] = slots + out.tolist()
    return out


def decode(alloc, held: dict, rids):
    seqs = [len(held[r]) + 1 for r in rids]
    out = alloc_paged_token_slots_decode(alloc, seqs, [held[r][-1] for r in rids])
    if out is not None:
        for r, s in zip(rids, out.tolist()):
            held[r].append(s)
    return out


def check_books(alloc, held: dict):
    """No slot or page held twice, padding never held, free + held == capacity, layout per
    request."""
    ps = alloc.page_size
    owner = {}
    for rid, slots in held.items():
        for pos, s in enumerate(slots):
            assert s // ps != 0, f"request {rid} holds slot {s} on the padding page"
            assert s not in owner, (
                f"slot {s} was handed to requests {owner[s]} and {rid}"
            )
            owner[s] = rid
            if pos % ps:  # inside a page, a request's slots are consecutive
                assert s == slots[pos - 1] + 1, (
                    f"request {rid}: position {pos} at slot {s} breaks its page"
                )
    page_owner = {}
    for s, rid in owner.items():
        assert page_owner.setdefault(s // ps, rid) == rid, (
            f"page {s // ps} was handed to requests {page_owner[s // ps]} and {rid}"
        )
    free = alloc.get_all_free_pages().tolist()
    assert 0 not in free, "padding page 0 is on the free list"
    assert len(set(free)) == len(free), (
        f"a page is on the free list twice: {sorted(free)}"
    )
    assert not set(free) & set(page_owner), (
        f"pages {sorted(set(free) & set(page_owner))} are both free and held"
    )
    assert len(free) + len(page_owner) == alloc.num_pages, (
        f"{len(free)} free + {len(page_owner)} held != {alloc.num_pages} pages"
    )


def snapshot(alloc):
    return alloc.free_pages.clone(), alloc.get_all_free_pages()[
        len(alloc.free_pages) :
    ].clone()


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))
