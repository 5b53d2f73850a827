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
