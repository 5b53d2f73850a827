"""What the graded tests share: plain-Python references for the hand cases (written for the
tests, on purpose independent of memlab's own layers and of the solutions), the sizes and helpers
of the random differential tests (each compares the learner with memlab's own layer, or with the
docstring's rules written in its test module, never with the solution), and the one check that
reads a learner's source (chapter 09's 64-bit addresses)."""

import ast
import re
import textwrap

from memlab.course.grading.checks import as_list


def ceil_div(a, b):
    return -(-a // b)


def split_by_request(out, prefix_lens, seq_lens):
    """Cut a batch's flat output into one list per request (None stays None)."""
    out = as_list(out)
    if out is None:
        return None
    pieces, i = [], 0
    for p, s in zip(prefix_lens, seq_lens):
        pieces.append(out[i : i + s - p])
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
        out = raw[start : start + nbytes].view(dtype).view(t.shape)
        out.copy_(t)
    except Exception:  # not Linux or macOS: no fence here
        return t
    return out  # the tensor keeps the mapping alive


# -- chapter 09: 32-bit address arithmetic, read from the source ----------------------------------

GATHER_SECTION = re.compile(
    r"# =+ EXERCISE 09: gather.*?\n(.*?)# =+ END EXERCISE 09", re.DOTALL
)

STRIDES = ("stride_ks", "stride_vs")


def _latest(assigned: dict, name: str, line: int):
    """The value last assigned to ``name`` before ``line``, with its line (None when never)."""
    before = [(ln, v) for ln, v in assigned.get(name, ()) if ln < line]
    return max(before, key=lambda lv: lv[0]) if before else None


def _is_int64(node, assigned, line: int) -> bool:
    """Whether an expression used at ``line`` is int64 for sure: a cast to tl.int64, a tl.where
    with an int64 branch, or built from one; a name stands for its latest value before ``line``."""
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("to", "cast"):
            text = [ast.unparse(a) for a in node.args] + [
                ast.unparse(k.value) for k in node.keywords
            ]
            return "tl.int64" in text
        if ast.unparse(f) == "tl.where":
            return any(_is_int64(a, assigned, line) for a in node.args[1:])
        return False
    if isinstance(node, ast.Subscript):
        return _is_int64(node.value, assigned, line)
    if isinstance(node, ast.Name):
        latest = _latest(assigned, node.id, line)
        return latest is not None and _is_int64(latest[1], assigned, latest[0])
    if isinstance(node, ast.BinOp):
        return _is_int64(node.left, assigned, line) or _is_int64(
            node.right, assigned, line
        )
    return False


def _is_stride(node, assigned, line: int) -> bool:
    """``stride_ks`` / ``stride_vs``, or a name that holds one of them (an alias)."""
    if not isinstance(node, ast.Name):
        return False
    if node.id in STRIDES:
        return True
    latest = _latest(assigned, node.id, line)
    return latest is not None and _is_stride(latest[1], assigned, latest[0])


def narrow_products(source: str) -> list[str]:
    """What is wrong with the gather's address arithmetic: each product ``x * stride_ks`` /
    ``x * stride_vs`` (or of an alias of a stride) where neither side is certainly int64 at that
    line; or a line saying the check found nothing to look at. Empty when every product is int64."""
    m = GATHER_SECTION.search(source)
    if m is None:
        return [
            "(nothing: the EXERCISE 09 markers around the gather are gone; put them back)"
        ]
    try:
        tree = ast.parse(textwrap.dedent(m.group(1)))
    except SyntaxError:
        return ["(nothing: the gather section does not parse)"]
    assigned: dict[str, list] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault(t.id, []).append((n.lineno, n.value))
    products = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.BinOp)
        and isinstance(n.op, ast.Mult)
        and any(_is_stride(s, assigned, n.lineno) for s in (n.left, n.right))
    ]
    if not products:
        return [
            "(nothing: no product of a slot and stride_ks / stride_vs was found; address the rows "
            "as "
            "k_ptr + slot * stride_ks + ..., as the comments say)"
        ]
    return [
        ast.unparse(n)
        for n in products
        if not any(_is_int64(s, assigned, n.lineno) for s in (n.left, n.right))
    ]


# -- random cases for the differential tests (memlab.course.grading.fuzz draws them) --------------

# Page, block and window sizes: powers of two and not (a bitmask such as k & (page_size - 1) or
# x & -page_size is right for 2, 4, 16 and wrong for 3, 5, 6, 7). The simplest comes first: a
# shrunk case uses the smallest size that still shows the difference.
SIZES = (1, 2, 3, 4, 5, 6, 7, 16, 64)
# ids and lengths up to here where no pool is needed (float32 is exact below 2**24)
INT31 = 2**31 - 1


def tensor(values, strided=False):
    """An int64 tensor; ``strided``: a view of every other entry of a wider one (not contiguous)."""
    import torch

    if strided:
        return torch.tensor([v for x in values for v in (x, -99)], dtype=torch.int64)[
            ::2
        ]
    return torch.tensor(values, dtype=torch.int64)


def scribble(*tensors):
    """The caller reuses its buffers after a call: overwrite them in place (an allocator that kept
    one instead of a copy now holds garbage)."""
    for t in tensors:
        if t is not None and t.numel():
            t.fill_(-3)
