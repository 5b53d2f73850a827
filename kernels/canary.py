"""The canary: y = a * x + b. If this is wrong, no other kernel result can be trusted."""

import torch
import triton
import triton.language as tl


@triton.jit
def _axpb_kernel(x_ptr, y_ptr, n, a, b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, a * x + b, mask=mask)


def axpb(x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    y = torch.empty_like(x)
    _axpb_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), a, b, BLOCK=64)
    return y
