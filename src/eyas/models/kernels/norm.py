"""Triton kernels of the block's norm and activation (``triton_ops.TritonOps`` launches them):

- ``rms_norm``: one program per row, the row in registers, float32 sums;
- ``silu_mul``: ``silu(gate) * up`` from the fused gate/up GEMM's output, one read, one write.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pdl import _after_previous_kernel


@triton.jit
def _rms_norm_kernel(x, x_row, w, out, out_row, n, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    keep = c < n
    v = tl.load(x + r * x_row + c, mask=keep, other=0.0).to(tl.float32)
    scale = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
    wt = tl.load(w + c, mask=keep, other=0.0).to(tl.float32)
    tl.store(out + r * out_row + c, (v * scale * wt).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _silu_mul_kernel(x, x_row, out, out_row, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = c < n
    g = tl.load(x + r * x_row + c, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(x + r * x_row + n + c, mask=keep, other=0.0).to(tl.float32)
    tl.store(out + r * out_row + c, (g * tl.sigmoid(g) * u).to(out.dtype.element_ty), mask=keep)
