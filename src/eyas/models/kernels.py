"""Triton kernels for the static-cache path: ``TritonOps``, ``ops.TorchOps`` in fewer launches.

On the H200 a Llama-3.1-8B-shaped decode step at batch 1 ran 20 kernels a layer, of which only
four are GEMMs and one is attention; the rest (RMSNorm at 6 us each, rotary as five elementwise
kernels, two ``index_copy`` into the cache, silu and the product) cost as much again in launches
and gaps as the attention. Three kernels replace them:

- ``rms_norm``: one program per row, the row in registers, float32 sums;
- ``silu_mul``: ``silu(gate) * up`` from the fused gate/up GEMM's output, one read, one write;
- ``rope_store``: one program per (token, head) of the fused q/k/v projection. Query heads are
  (optionally normed, for Qwen3) rotated into the folded query tensor, key heads are rotated and
  written straight into the static cache at the step's slots, value heads copied there. Cos and sin
  come from the ``RopeTable`` at each token's position, read in the kernel.

The arithmetic is float32 with one rounding to the model's dtype at the end, where the torch ops
round after each op; the two agree to that rounding (``tests/core/test_kernels.py``). Without a
GPU, the same kernels run in Triton's interpreter, which is how the CPU tests check them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import EyasError
from .ops import TorchOps


@triton.jit
def _rms_norm_kernel(x, x_row, w, out, out_row, n, eps, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    keep = c < n
    v = tl.load(x + r * x_row + c, mask=keep, other=0.0).to(tl.float32)
    scale = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
    wt = tl.load(w + c, mask=keep, other=0.0).to(tl.float32)
    tl.store(out + r * out_row + c, (v * scale * wt).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _silu_mul_kernel(x, x_row, out, out_row, n, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = c < n
    g = tl.load(x + r * x_row + c, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(x + r * x_row + n + c, mask=keep, other=0.0).to(tl.float32)
    tl.store(out + r * out_row + c, (g * tl.sigmoid(g) * u).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _rope_store_kernel(qkv, s_qb, s_qt, pos, s_pb, s_pt, table, q_out, s_ob, s_oh, s_ot,
                       kb, vb, s_cb, s_ch, s_cs, slots, qw, kw, eps, T,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                       HALF_P2: tl.constexpr, HAS_NORM: tl.constexpr):
    bt = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    b = bt // T
    t = bt - b * T
    c = tl.arange(0, HALF_P2)
    keep = c < HALF
    src = qkv + b * s_qb + t * s_qt + h * D
    x1 = tl.load(src + c, mask=keep, other=0.0)
    x2 = tl.load(src + HALF + c, mask=keep, other=0.0)
    if h >= HQ + HKV:  # a value head: into the cache as it is
        dst = vb + b * s_cb + (h - HQ - HKV) * s_ch + tl.load(slots + t) * s_cs
        tl.store(dst + c, x1, mask=keep)
        tl.store(dst + HALF + c, x2, mask=keep)
    else:
        a1 = x1.to(tl.float32)
        a2 = x2.to(tl.float32)
        if HAS_NORM:  # Qwen3: RMSNorm over the head, with the q or k norm's weights
            is_q = h < HQ
            w1 = tl.where(is_q, tl.load(qw + c, mask=keep, other=0.0), tl.load(kw + c, mask=keep, other=0.0))
            w2 = tl.where(is_q, tl.load(qw + HALF + c, mask=keep, other=0.0),
                          tl.load(kw + HALF + c, mask=keep, other=0.0))
            scale = tl.rsqrt((tl.sum(a1 * a1, axis=0) + tl.sum(a2 * a2, axis=0)) / D + eps)
            a1 = a1 * scale * w1.to(tl.float32)
            a2 = a2 * scale * w2.to(tl.float32)
        row = table + tl.load(pos + b * s_pb + t * s_pt) * (2 * D)  # [cos | sin] of this position
        cos1 = tl.load(row + c, mask=keep, other=0.0).to(tl.float32)
        cos2 = tl.load(row + HALF + c, mask=keep, other=0.0).to(tl.float32)
        sin1 = tl.load(row + D + c, mask=keep, other=0.0).to(tl.float32)
        sin2 = tl.load(row + D + HALF + c, mask=keep, other=0.0).to(tl.float32)
        o1 = a1 * cos1 - a2 * sin1  # rotate-half: [x1, x2] * cos + [-x2, x1] * sin
        o2 = a2 * cos2 + a1 * sin2
        if h < HQ:
            dst = q_out + b * s_ob + h * s_oh + t * s_ot
        else:
            dst = kb + b * s_cb + (h - HQ) * s_ch + tl.load(slots + t) * s_cs
        tl.store(dst + c, o1.to(x1.dtype), mask=keep)
        tl.store(dst + HALF + c, o2.to(x1.dtype), mask=keep)


def _launch(kernel, grid, x: torch.Tensor, *args, **kwargs) -> None:
    """``kernel[grid](x, *args)``; off the GPU only in Triton's interpreter."""
    if not x.is_cuda and type(kernel).__name__ != "InterpretedFunction":  # defined without TRITON_INTERPRET
        raise EyasError("the Triton kernels run on a GPU, or on the CPU under TRITON_INTERPRET=1",
                        "unset EYAS_KERNELS (the torch ops then run on the CPU), or set TRITON_INTERPRET=1")
    kernel[grid](x, *args, **kwargs)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, last]`` with a unit last stride (a copy only for expanded or strided input)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonOps(TorchOps):
    name = "triton"

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        return rope.table, positions

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        n = x.shape[-1]
        rows = _rows(x)
        out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
        block = triton.next_power_of_2(n)
        _launch(_rms_norm_kernel, (rows.shape[0],), rows, rows.stride(0), weight, out, out.stride(0), n, float(eps),
                BLOCK=block, num_warps=min(16, max(1, block // 256)))
        return out.view(x.shape)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1] // 2
        rows = _rows(x)
        out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
        block = 1024
        _launch(_silu_mul_kernel, (rows.shape[0], triton.cdiv(n, block)), rows, rows.stride(0), out, out.stride(0), n,
                BLOCK=block, num_warps=4)
        return out.view(*x.shape[:-1], n)

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        table, positions = rot
        bsz, t = qkv.shape[:2]
        hq, hkv, d = heads
        if qkv.stride(-1) != 1:
            qkv = qkv.contiguous()
        q = torch.empty((bsz, hq, t, d), dtype=qkv.dtype, device=qkv.device)
        kb, vb = cache.layer_buffers(layer, bsz)  # [B, Hkv, slots, D] each, the same strides
        qw, kw, eps = (norms[0].weight, norms[1].weight, float(norms[0].variance_epsilon)) if norms else (qkv, qkv, 0.0)
        _launch(_rope_store_kernel, (bsz * t, hq + 2 * hkv), qkv, qkv.stride(0), qkv.stride(1), positions,
                positions.stride(0), positions.stride(1), table, q, q.stride(0), q.stride(1), q.stride(2), kb, vb,
                kb.stride(0), kb.stride(1), kb.stride(2), cache.write_slots, qw, kw, eps, t, HQ=hq, HKV=hkv, D=d,
                HALF=d // 2, HALF_P2=triton.next_power_of_2(d // 2), HAS_NORM=norms is not None, num_warps=1)
        keys, values = cache.window_of(layer, bsz)
        return q.view(bsz, hkv, hq // hkv * t, d), keys, values


TRITON = TritonOps()
