"""The paged allocator (sglang/srt/mem_cache/allocator/paged.py): slot = page * ps + offset."""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.sglang.allocator import reference as ref
from memlab.sglang.allocator.base import BaseTokenToKVPoolAllocator

BACKENDS = ("torch", "triton", "python")


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Pages of ``page_size`` slots. ``free_pages`` holds page ids; with ``need_sort`` freed pages
    wait in ``staged_pages`` (a list of tensors, ``num_staged_pages`` of them in all) until an
    allocation runs short, as in SGLang.

    ``backend`` picks how a batch's slots are computed: SGLang's Triton kernel, or (SGLang's
    fallback is ``alloc_extend_naive``, a loop over requests) memlab's torch reference, which
    computes every token at once and is faster on the CPU, or a plain Python loop to read.

    The caller's contract, as in SGLang: ``last_loc`` is each request's last slot (-1 for an
    empty prefix) inside a page the request holds, and the device lengths equal their CPU copies.
    The engine trusts both; memlab checks on the CPU (free) that ``last_loc`` ends the prefix, and
    in debug mode that its page is held and that the device lengths agree with the CPU copies.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype=torch.float16,
        device="cpu",
        kvcache=None,
        need_sort: bool = False,
        debug_mode: bool = False,
        backend: str = "torch",
    ):
        _check_backend(backend, BACKENDS, device)
        self.backend = backend
        super().__init__(size, page_size, dtype, device, kvcache, need_sort, debug_mode)
        self.clear()

    def available_size(self) -> int:
        return (len(self.free_pages) + self.num_staged_pages) * self.page_size

    def get_all_free_pages(self) -> torch.Tensor:
        return torch.cat((self.free_pages, *self.staged_pages))

    def merge_and_sort_free(self) -> None:
        """Fold the staged pages into the free list and sort it: later runs are contiguous."""
        if not self.staged_pages:
            return
        self.free_pages = torch.sort(self.get_all_free_pages()).values
        self.staged_pages = []
        self.num_staged_pages = 0

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots in whole pages from the head of the free list, or None when short."""
        need_size = _checks.alloc(self, need_size)
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if num_pages > len(self.free_pages):
            return None
        out_pages = self._take(num_pages)
        offs = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (out_pages[:, None] * self.page_size + offs).reshape(-1)

    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Slots for ``seq_lens - prefix_lens`` new tokens per request, or None when pages are
        short. Capacity is settled on the host from the CPU copies before anything is taken or
        launched. ``num_new_pages``: the batch's new pages when the caller counted them."""
        _checks.alloc_extend(
            self,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
            num_new_pages,
        )
        bs, ps = len(prefix_lens), self.page_size
        # A strict upper bound on the new pages (a request grows by fewer than extend_len // ps + 1)
        # proves room in the common case from numbers at hand. When it fails, staged pages are
        # merged first (SGLang merges even when the call is then refused), and the exact count is
        # paid for before the launch: launching first would read past the end of the free list.
        max_new_pages = extend_num_tokens // ps + bs + 1
        if max_new_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if max_new_pages > len(self.free_pages):
            if num_new_pages is None:
                num_new_pages = ref.num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
            if num_new_pages > len(self.free_pages):
                return None
        if self.backend == "triton":
            from memlab.kernels import alloc_extend

            out_indices = alloc_extend.alloc_extend(
                prefix_lens, seq_lens, last_loc, self.free_pages, ps, extend_num_tokens
            )
        elif self.backend == "torch":
            # it sizes the page-level arrays: on the host, no sync
            if num_new_pages is None:
                num_new_pages = ref.num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
            out_indices = ref.alloc_extend_torch(
                prefix_lens,
                seq_lens,
                last_loc,
                self.free_pages,
                ps,
                extend_num_tokens,
                num_new_pages,
            )
        else:
            out_indices = torch.tensor(
                ref.alloc_extend_python(
                    prefix_lens.tolist(),
                    seq_lens.tolist(),
                    last_loc.tolist(),
                    self.free_pages.tolist(),
                    ps,
                ),
                dtype=torch.int64,
                device=self.device,
            )
        if self.debug_mode:
            assert len(torch.unique(out_indices)) == len(out_indices), (
                "alloc_extend handed out a slot twice"
            )
        # the fast path counts after the launch, while the device works
        if num_new_pages is None:
            num_new_pages = ref.num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
        self._take(num_new_pages)
        return out_indices

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        """One slot per request for its new token; ``seq_lens`` already count that token."""
        _checks.alloc_decode(self, seq_lens, seq_lens_cpu, last_loc)
        bs, ps = len(seq_lens), self.page_size
        # the cheap bound: at most one new page per request
        if bs > len(self.free_pages):
            self.merge_and_sort_free()
        num_new_pages = ref.num_new_pages_decode(seq_lens_cpu, ps)
        if num_new_pages > len(self.free_pages):
            return None
        if self.backend == "triton":
            from memlab.kernels import alloc_decode

            out_indices = alloc_decode.alloc_decode(
                seq_lens, last_loc, self.free_pages, ps
            )
        elif self.backend == "torch":
            out_indices = ref.alloc_decode_torch(
                seq_lens, last_loc, self.free_pages, ps
            )
        else:
            out_indices = torch.tensor(
                ref.alloc_decode_python(
                    seq_lens.tolist(), last_loc.tolist(), self.free_pages.tolist(), ps
                ),
                dtype=torch.int64,
                device=self.device,
            )
        if self.debug_mode:
            assert len(torch.unique(out_indices)) == len(out_indices), (
                "alloc_decode handed out a slot twice"
            )
        self._take(num_new_pages)
        return out_indices

    def _take(self, num_pages: int) -> torch.Tensor:
        """Cut the head of the free list (SGLang does it inline; memlab's sub-pool allocator binds
        the pages here, and debug mode enters them in the ledger)."""
        out_pages = self.free_pages[:num_pages]
        if self.debug_mode:
            # before the cut: a ledger built now must see these pages free
            self._debug_take(out_pages)
        self.free_pages = self.free_pages[num_pages:]
        return out_pages

    def free(self, free_index: torch.Tensor) -> None:
        """Give back the pages under these slots; inside a free group, only queue the slots (the
        group's end dedups them once: a request freed in two pieces may touch one page twice).

        A page freed twice is the caller's error, as in SGLang, which asserts it in debug mode
        only: so does memlab (the ledger names the page, before anything changes); without debug
        mode the page is listed twice and later handed out twice. The same holds for
        ``free_segment`` and ``free_page_ids``."""
        _checks.free(self, free_index)
        if free_index.numel() == 0:
            return
        if self.free_group is None:
            # A request's slots share pages: without the dedup a page would be freed page_size
            # times and later handed to several requests at once. unique sorts (a device sync).
            self._release_page_ids(
                torch.unique(free_index.to(torch.int64) // self.page_size)
            )
        else:
            # a page already free is refused now, not at the group's end
            if self.debug_mode:
                self._debug_release(
                    torch.unique(free_index.cpu() // self.page_size), False
                )
            # the caller may reuse its buffer before the end
            self.free_group.append(free_index.clone())

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """A run of a request's slots that starts on a page boundary, freed without the unique:
        aligned and contiguous, every page_size-th slot is the first of a distinct page."""
        _checks.free_segment(self, free_index, start_pos)
        if free_index.numel() == 0:
            return
        ps = self.page_size
        # debug mode checked the run (every page_size-th slot starts one page of it)
        self.free_page_ids(free_index[::ps].to(torch.int64) // ps)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Free exactly these pages: no page twice, no dedup; queued inside a group."""
        _check_free_page_ids(self, page_ids)
        if page_ids.numel() == 0:
            return
        if self.free_group is None:
            self._release_page_ids(page_ids.to(torch.int64))
        else:
            if self.debug_mode:  # refused now, not at the group's end
                self._debug_release(page_ids.cpu(), False)
            self.free_page_ids_group.append(page_ids.to(torch.int64).clone())

    def _release_page_ids(self, page_ids: torch.Tensor) -> None:
        # Freed pages go to the head (LIFO): the pages just released are the next handed out, so the
        # live set stays on few, recently touched pages.
        if self.debug_mode:
            # refuses a double free before anything changes
            self._debug_release(page_ids)
        if self.need_sort:
            self.staged_pages.append(page_ids)
            self.num_staged_pages += page_ids.numel()
        else:
            self.free_pages = torch.cat((page_ids, self.free_pages))
        if self.debug_mode:
            self.check_books()

    def free_group_begin(self) -> None:
        super().free_group_begin()
        self.free_page_ids_group = []

    def free_group_end(self) -> None:
        """Release the group: its slots' pages (deduplicated once over the whole group), then the
        page ids queued by ``free_page_ids``/``free_segment``."""
        page_ids, self.free_page_ids_group = self.free_page_ids_group, []
        super().free_group_end()
        if page_ids:
            self._release_page_ids(torch.cat(page_ids))

    def clear(self) -> None:
        # The padded page 0 is used for writing dummy outputs from padded tokens.
        self.free_pages = torch.arange(
            1, self.num_pages + 1, dtype=torch.int64, device=self.device
        )
        self.free_group = None
        self.free_page_ids_group = []
        # need_sort only: freed pages wait here, unsorted
        self.staged_pages: list[torch.Tensor] = []
        self.num_staged_pages = 0
        self._held = None


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_backend(backend: str, choices, device) -> None:
    if backend not in choices:
        raise ValueError(f"backend must be one of {choices}, got {backend!r}")
    if backend == "triton":
        _checks.on_kernel_device("backend", device)


def _check_free_page_ids(alloc, page_ids) -> None:
    _checks.index_tensor("page_ids", page_ids, alloc.device, ndim=1)
    if _checks.can_read_values(alloc.debug_mode, page_ids):
        _checks._page_range(alloc, int(page_ids.min()), int(page_ids.max()))
