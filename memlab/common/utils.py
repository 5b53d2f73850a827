"""Small arithmetic every layer shares (SGLang keeps these in ``sglang.srt.utils.common``).

One definition each: the allocators, the vLLM side (``cdiv`` there), the hybrid pools, the
sizing, the engine and the simulator all round up the same way.
"""

from __future__ import annotations


def ceil_div(a, b):
    """``ceil(a / b)`` for ints >= 0 and b > 0; works elementwise on integer tensors too."""
    # an int, or a NumPy or torch integer
    if not (type(a) is int or hasattr(a, "dtype")):
        raise TypeError(f"ceil_div: a must be an int or an integer tensor, got {a!r}")
    if type(b) is not int or b < 1:
        raise ValueError(f"ceil_div: b must be a positive int, got {b!r}")
    return -(-a // b)


def ceil_align(n, page_size):
    """``n`` rounded up to whole pages (a multiple of ``page_size``)."""
    return ceil_div(n, page_size) * page_size
