"""Plain-Python references the graded tests compare against (written for the tests, on purpose
independent of memlab's own layers and of the solutions)."""

from memlab.grading.checks import as_list


def ceil_div(a, b):
    return -(-a // b)


def split_by_request(out, prefix_lens, seq_lens):
    """Cut a batch's flat output into one list per request (None stays None)."""
    out = as_list(out)
    if out is None:
        return None
    pieces, i = [], 0
    for p, s in zip(prefix_lens, seq_lens):
        pieces.append(out[i:i + s - p])
        i += s - p
    if i != len(out):
        pieces.append(out[i:])  # extra values: the caller's length check reports them
    return pieces


def alloc_extend_python(prefix_lens, seq_lens, last_loc, free_pages, page_size):
    free_pages = as_list(free_pages)
    out, nxt = [], 0
    for pre, seq, last in zip(prefix_lens, seq_lens, last_loc):
        for pos in range(pre, seq):
            if pos < ceil_div(pre, page_size) * page_size:
                out.append(last + 1 + pos - pre)
            else:
                if pos % page_size == 0:
                    page = free_pages[nxt]
                    nxt += 1
                out.append(page * page_size + pos % page_size)
    return out


def alloc_decode_python(seq_lens, last_loc, free_pages, page_size):
    free_pages = as_list(free_pages)
    out, nxt = [], 0
    for seq, last in zip(seq_lens, last_loc):
        if (seq - 1) % page_size == 0:
            out.append(free_pages[nxt] * page_size)
            nxt += 1
        else:
            out.append(last + 1)
    return out


def i64(*values):
    """An int64 tensor of these values: what the docstrings promise (``i64()`` is empty)."""
    import torch

    return torch.tensor(values, dtype=torch.int64)


# -- fenced tensors: a load or store one element past the end crashes ---------------------------
# The Triton interpreter does not check bounds, and a GPU reads a few elements past a tensor
# without a fault. A tensor placed at the very end of a readable memory region, right before a
# page that may not be touched (mprotect PROT_NONE), turns such an access into a segfault, which
# the grader reports. Where this cannot be set up (no mmap/mprotect, a CUDA device) a plain
# tensor is returned and the test relies on its other checks.
def fenced(values, dtype, device=None):
    import ctypes
    import mmap

    import torch

    t = torch.as_tensor(values, dtype=dtype)
    if device is not None and torch.device(device).type != "cpu":
        return t.to(device)
    try:
        page = mmap.PAGESIZE
        nbytes = t.numel() * t.element_size()
        npages = -(-nbytes // page) + 1
        region = mmap.mmap(-1, npages * page)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        if libc.mprotect(base + (npages - 1) * page, page, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
        raw = torch.frombuffer(region, dtype=torch.uint8)
        start = (npages - 1) * page - nbytes
        out = raw[start:start + nbytes].view(dtype).view(t.shape)
        out.copy_(t)
    except Exception:  # not Linux or macOS: no fence here
        return t
    return out  # the tensor keeps the mapping alive
