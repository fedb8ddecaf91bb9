"""Triton kernels for the static-cache path: ``TritonOps``, ``ops.TorchOps`` in fewer launches.

With the torch ops a Llama-3.1-8B-shaped decode step at batch 1 ran 20 kernels a layer, of which
only four are GEMMs; the rest (RMSNorm, rotary as five elementwise kernels, two ``index_copy`` into
the cache, cuDNN's attention plus two copies of the cache window, silu and the product) and the gaps
between them cost a large share of a token. These kernels replace them (what each change measured:
docs/log/engine.md; what the engine measures now: docs/engine.md, "What it measures now"):

- ``rms_norm``: one program per row, the row in registers, float32 sums;
- ``silu_mul``: ``silu(gate) * up`` from the fused gate/up GEMM's output, one read, one write;
- ``rope_store``: one program per (token, head) of the fused q/k/v projection. Query heads are
  (optionally normed, for Qwen3) rotated into the query tensor, key heads are rotated and written
  straight into the static cache at the step's slots, value heads copied there. Cos and sin come
  from the ``RopeTable`` at each token's position, read in the kernel;
- ``attend`` (two kernels): the query heads that share a KV head as one block of rows, each with
  its own row of the unfolded mask, over the cache window read in place; the window is split
  across programs and the splits combined (flash-decoding).
- ``linear`` / ``linear_silu`` / ``linear_add`` (``_linear_kernel``): a projection of one row (decode
  at batch 1) as a GEMV with what surrounds it inside: the RMSNorm before q/k/v, gate/up and the LM
  head, ``silu(gate) * up`` after gate/up (a program takes matching gate and up rows), the bias, and
  the residual add after o and down (cuBLAS needed a norm or silu kernel, split-K reductions and a
  copy around each; measured in docs/log/engine.md, "One-row projections in one kernel"). More rows
  stay on cuBLAS;
- ``top_children`` (two kernels): a draft tree level's expansion. The first splits each row of
  draft logits into blocks and takes, per block, its max, its sum of exponentials and its ``k``
  best entries (``k`` rounds of argmax in registers); the second combines a row's blocks into the
  log-softmax normaliser and the row's ``k`` best, adds the parent's score and maps the draft ids
  to target ids. It replaces a log-softmax, a two-stage ``topk`` (sort-based kernels) and three
  small kernels. It writes straight into the tree's candidate buffers;
- ``next_frontier`` and ``select_tree``: the rest of a draft tree's bookkeeping. One kernel a level
  picks the next frontier and gathers its tokens, hidden rows and mask rows (a ``topk``, a division,
  three gathers and a ``maximum`` before); one at the end picks the tree from all candidates and
  writes its tokens, parents, depths and ancestor mask (about 30 torch kernels before: ``cat``s,
  ``topk``, ``sort``, ``searchsorted``, and the ancestor closure's batched matmuls);
- ``accept_greedy``, ``tree_mask`` / ``block_mask``: greedy acceptance of a verified tree, and the
  verify's and the draft extend's additive masks, one kernel each.

The arithmetic is float32 with one rounding to the model's dtype at the end, where the torch ops
round after each op; the two agree to that rounding (``tests/core/test_kernels.py``). Without a
GPU, the same kernels run in Triton's interpreter, which is how the CPU tests check them.
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl

from ..errors import EyasError
from .kernel_choice import CHOICES, shape_key
from .ops import TorchOps

log = logging.getLogger("eyas.kernels")

try:  # grid dependency control (Triton 3.4 on); without it the kernels launch the plain way
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _after_previous_kernel(PDL: tl.constexpr):
    """With ``PDL`` (programmatic dependent launch, Hopper on) a kernel's programs may start while
    the kernel before it in the stream still runs its last programs: each waits here, before it
    reads or writes anything, until that kernel has finished and its writes are visible, then lets
    the next kernel start the same way. Every kernel here calls it first, so the order of effects
    is the stream's; what is gained is the launch gap between kernels (measured in docs/log/engine.md,
    "The plain step as one graph, dependent launch, silu after gate/up")."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


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


@triton.jit
def _rope_store_kernel(qkv, s_qb, s_qt, pos, s_pb, s_pt, table, q_out, s_ob, s_oh, s_ot,
                       kb, vb, s_cb, s_ch, s_cs, slots, qw, kw, eps, T,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                       HALF_P2: tl.constexpr, HAS_NORM: tl.constexpr, PDL: tl.constexpr):
    _after_previous_kernel(PDL)
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


@triton.jit
def _attend_kernel(q, s_qb, s_qh, s_qt, k, v, s_kb, s_kh, s_ks, mask, s_mb, s_mt, s_mn, out, s_ob, s_ot, s_oh,
                   part_o, part_ml, W, T, per_split, scale, HKV, SPLITS, M_PAD,
                   REP: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, M_BLOCKS: tl.constexpr, DIRECT: tl.constexpr, EXACT: tl.constexpr,
                   UPCAST: tl.constexpr, PDL: tl.constexpr):
    """Attention of the ``REP * T`` query rows that share KV head ``g`` (row ``r`` is query head
    ``g * REP + r // T`` at token ``r % T``) over slots ``[split * per_split, ..)`` of the cache,
    with the additive mask ``[B, 1, T, W]``. One split writes the output; several write their
    unnormalised partials for ``_attend_combine_kernel`` (flash-decoding). ``EXACT``: dot products
    without TF32 (float32 models); ``UPCAST``: 16-bit operands taken to float32 first (for the
    interpreter, whose bfloat16 ``dot`` is wrong in Triton 3.9)."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    z = tl.program_id(2)
    split = z // M_BLOCKS
    rows = (z % M_BLOCKS) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < REP * T
    head = g * REP + rows // T
    t = rows % T
    d = tl.arange(0, D_P2)
    dv = d < D
    qv = tl.load(q + b * s_qb + head[:, None] * s_qh + t[:, None] * s_qt + d[None, :],
                 mask=live[:, None] & dv[None, :], other=0.0)
    if UPCAST:
        qv = qv.to(tl.float32)
    kv_base = b * s_kb + g * s_kh
    lo = split * per_split
    hi = tl.minimum(lo + per_split, W)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_P2], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nv = n < hi
        kt = tl.load(k + kv_base + n[None, :] * s_ks + d[:, None], mask=dv[:, None] & nv[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        if EXACT:
            sc = tl.dot(qv, kt, input_precision="ieee")
        else:
            sc = tl.dot(qv, kt)
        add = tl.load(mask + b * s_mb + t[:, None] * s_mt + n[None, :] * s_mn, mask=live[:, None] & nv[None, :],
                      other=0.0).to(tl.float32)
        sc = tl.maximum(sc * scale + add, -1e30)  # a hidden slot (dtype-min) weighs 0, never NaN
        sc = tl.where(nv[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vb = tl.load(v + kv_base + n[:, None] * s_ks + d[None, :], mask=nv[:, None] & dv[None, :], other=0.0)
        if UPCAST:
            vb = vb.to(tl.float32)
        if EXACT:
            pv = tl.dot(p.to(vb.dtype), vb, input_precision="ieee")
        else:
            pv = tl.dot(p.to(vb.dtype), vb)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if DIRECT:
        dst = out + b * s_ob + t[:, None] * s_ot + head[:, None] * s_oh + d[None, :]
        tl.store(dst, (acc / l_i[:, None]).to(out.dtype.element_ty), mask=live[:, None] & dv[None, :])
    else:
        at = ((b * HKV + g) * SPLITS + split) * M_PAD + rows  # into [B, Hkv, splits, M_PAD]
        tl.store(part_o + at[:, None] * D_P2 + d[None, :], acc, mask=live[:, None])
        tl.store(part_ml + at * 2, m_i, mask=live)
        tl.store(part_ml + at * 2 + 1, l_i, mask=live)


@triton.jit
def _attend_combine_kernel(part_o, part_ml, out, s_ob, s_ot, s_oh, T, SPLITS, HKV, M_PAD,
                           REP: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr, SPLITS_P2: tl.constexpr,
                           PDL: tl.constexpr):
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    r = tl.program_id(2)
    sp = tl.arange(0, SPLITS_P2)
    spv = sp < SPLITS
    d = tl.arange(0, D_P2)
    at = ((b * HKV + g) * SPLITS + sp) * M_PAD + r
    m = tl.load(part_ml + at * 2, mask=spv, other=-1e30)
    l = tl.load(part_ml + at * 2 + 1, mask=spv, other=0.0)
    w = tl.exp(m - tl.max(m, axis=0))
    o = tl.load(part_o + at[:, None] * D_P2 + d[None, :], mask=spv[:, None], other=0.0)
    res = tl.sum(o * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    head = g * REP + r // T
    t = r % T
    tl.store(out + b * s_ob + t * s_ot + head * s_oh + d, res.to(out.dtype.element_ty), mask=d < D)


@triton.jit
def _linear_kernel(x, w, s_w, bias, res, nw, out, N, K, eps, NORM: tl.constexpr, SILU: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   ROW_P2: tl.constexpr, PDL: tl.constexpr):
    """``out[n] = res[n] + bias[n] + x . w[n]`` for one row ``x`` and this program's ``BLOCK_N``
    output columns ``n`` (a decode step at batch 1: each weight is read once, at the bandwidth).
    ``NORM``: ``x`` RMS-normed with the weights ``nw`` on the way in (each program sums the row's
    squares first, in one load when the row has at most 16k entries, ``ROW_P2``), rounded to the
    model's dtype as the norm kernel does. ``SILU``: the weight is gate/up's ``[gate; up]``, ``2N``
    rows; a program takes ``BLOCK_N / 2`` gate rows and the matching up rows and writes ``silu(gate)
    * up`` of the two (each rounded first, as the GEMM's output is). The products accumulate in
    float32 in registers and are summed once at the end."""
    _after_previous_kernel(PDL)
    if SILU:
        half: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        col = tl.program_id(0) * half + j % half
        n = tl.where(j < half, col, N + col)  # [gate rows | the same up rows]
        nv = col < N
    else:
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nv = n < N
    if NORM:
        if ROW_P2 > 0:  # one memory latency before the weights stream, not K / BLOCK_K of them
            kr = tl.arange(0, ROW_P2)
            xr = tl.load(x + kr, mask=kr < K, other=0.0).to(tl.float32)
            ss = tl.sum(xr * xr, axis=0)
        else:
            ss = 0.0
            for r0 in range(0, K, BLOCK_K):
                kr = r0 + tl.arange(0, BLOCK_K)
                xr = tl.load(x + kr, mask=kr < K, other=0.0).to(tl.float32)
                ss += tl.sum(xr * xr, axis=0)
        rstd = tl.rsqrt(ss / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    wrow = w + n[:, None].to(tl.int64) * s_w
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kv = kk < K
        if NORM:
            g = tl.load(x + kk, mask=kv, other=0.0).to(tl.float32)
            wn = tl.load(nw + kk, mask=kv, other=0.0).to(tl.float32)
            xv = (g * rstd * wn).to(x.dtype.element_ty)
        else:
            xv = tl.load(x + kk, mask=kv, other=0.0)
        wv = tl.load(wrow + kk[None, :], mask=nv[:, None] & kv[None, :], other=0.0)
        acc += wv.to(tl.float32) * xv.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias + n, mask=nv, other=0.0).to(tl.float32)
    if SILU:
        y = tl.reshape(y.to(out.dtype.element_ty).to(tl.float32), [2, half])
        first = (tl.arange(0, 2) == 0)[:, None]
        g = tl.sum(tl.where(first, y, 0.0), axis=0)
        u = tl.sum(tl.where(first, 0.0, y), axis=0)
        c = tl.program_id(0) * half + tl.arange(0, half)
        tl.store(out + c, (g * tl.sigmoid(g) * u).to(out.dtype.element_ty), mask=c < N)
    else:
        if HAS_RES:
            y += tl.load(res + n, mask=nv, other=0.0).to(tl.float32)
        tl.store(out + n, y.to(out.dtype.element_ty), mask=nv)

@triton.jit
def _dot_weights(acc, xv, w_ptrs, w_mask, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + xv @ w.T`` for a tile of weight rows ``w`` loaded at ``w_ptrs``."""
    wv = tl.load(w_ptrs, mask=w_mask, other=0.0)
    if UPCAST:
        wv = wv.to(tl.float32)
    if EXACT:
        acc = tl.dot(xv, tl.trans(wv), acc, input_precision="ieee")
    else:
        acc = tl.dot(xv, tl.trans(wv), acc)
    return acc


@triton.jit
def _linear_rows_kernel(x, s_x, w, s_w, bias, res, s_r, nw, out, s_o, M, N, K, eps, NORM: tl.constexpr,
                        SILU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr,
                        PDL: tl.constexpr):
    """``_linear_kernel`` for a few rows (a tree's verify, a draft level, the draft extend: 2 to 64):
    ``out[m, n] = res[m, n] + bias[n] + x[m] . w[n]`` for this program's ``BLOCK_M`` rows and
    ``BLOCK_N`` columns, on the tensor cores (``tl.dot``). ``NORM``: each row RMS-normed with ``nw``
    on the way in, in one pass: the row's scale ``rstd`` is one number per row, so it leaves the dot
    (``(x * rstd * nw) . w = rstd * ((x * nw) . w)``); the squares are summed from the same tiles
    the dot reads and the scale applied to the accumulator at the end. ``x * nw`` is rounded to the
    model's dtype for the tensor cores, as the norm kernel rounds its output. ``SILU``: the weight
    is ``[gate; up]`` (``2N`` rows): gate's and up's columns ``n`` accumulate side by side and the
    program writes ``silu(gate) * up`` (each rounded first, as the GEMM's output is). ``EXACT``: no
    TF32 (float32 models); ``UPCAST``: 16-bit operands taken to float32 first (the interpreter's
    bfloat16 ``dot`` is wrong)."""
    _after_previous_kernel(PDL)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mv = m < M
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nv = n < N
    xrow = x + m[:, None].to(tl.int64) * s_x
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    wrow = w + n[:, None].to(tl.int64) * s_w
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kv = kk < K
        xv = tl.load(xrow + kk[None, :], mask=mv[:, None] & kv[None, :], other=0.0)
        if NORM:
            xf = xv.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            xv = (xf * tl.load(nw + kk, mask=kv, other=0.0).to(tl.float32)[None, :]).to(x.dtype.element_ty)
        if UPCAST:
            xv = xv.to(tl.float32)
        wmask = nv[:, None] & kv[None, :]
        acc = _dot_weights(acc, xv, wrow + kk[None, :], wmask, EXACT, UPCAST)
        if SILU:
            acc_up = _dot_weights(acc_up, xv, wrow + N * s_w + kk[None, :], wmask, EXACT, UPCAST)
    if NORM:
        rstd = tl.rsqrt(ss / K + eps)[:, None]
        acc *= rstd
        if SILU:
            acc_up *= rstd
    if HAS_BIAS:
        acc += tl.load(bias + n, mask=nv, other=0.0).to(tl.float32)[None, :]
        if SILU:
            acc_up += tl.load(bias + N + n, mask=nv, other=0.0).to(tl.float32)[None, :]
    if SILU:
        g = acc.to(out.dtype.element_ty).to(tl.float32)
        u = acc_up.to(out.dtype.element_ty).to(tl.float32)
        acc = g * tl.sigmoid(g) * u
    if HAS_RES:
        acc += tl.load(res + m[:, None].to(tl.int64) * s_r + n[None, :], mask=mv[:, None] & nv[None, :],
                       other=0.0).to(tl.float32)
    tl.store(out + m[:, None].to(tl.int64) * s_o + n[None, :], acc.to(out.dtype.element_ty),
             mask=mv[:, None] & nv[None, :])


_INTERPRETED = type(_rms_norm_kernel).__name__ == "InterpretedFunction"  # defined under TRITON_INTERPRET=1


@triton.jit
def _top_children_kernel(x, x_row, n, part_v, part_i, part_ml, SPLITS: tl.constexpr, K: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    c = tl.arange(0, BLOCK)
    at_ = s * BLOCK + c
    v = tl.load(x + r * x_row + at_, mask=at_ < n, other=float("-inf")).to(tl.float32)
    m = tl.max(v, axis=0)  # every block holds at least one real entry: m is finite
    out = r * SPLITS + s
    tl.store(part_ml + out * 2, m)
    tl.store(part_ml + out * 2 + 1, tl.sum(tl.exp(v - m), axis=0))
    for j in tl.static_range(K):
        best = tl.max(v, axis=0)
        pick = tl.argmax(v, axis=0)  # the first of equal entries
        tl.store(part_v + out * K + j, best)
        tl.store(part_i + out * K + j, s * BLOCK + pick)
        v = tl.where(c == pick, float("-inf"), v)


@triton.jit
def _top_children_combine_kernel(part_v, part_i, part_ml, base, s_bb, to_target, scores, tokens, s_ob, R,
                                 SPLITS: tl.constexpr, K: tl.constexpr, SPLITS_P2: tl.constexpr,
                                 CAND_P2: tl.constexpr, HAS_BASE: tl.constexpr, PDL: tl.constexpr):
    """Row ``r`` is row ``r % R`` of batch row ``r // R``: its parent's score is at ``base + (r // R) *
    s_bb + r % R``, its ``K`` results at ``scores`` / ``tokens + (r // R) * s_ob + (r % R) * K``."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    si = tl.arange(0, SPLITS_P2)
    m = tl.load(part_ml + (r * SPLITS + si) * 2, mask=si < SPLITS, other=float("-inf"))
    l = tl.load(part_ml + (r * SPLITS + si) * 2 + 1, mask=si < SPLITS, other=0.0)
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(l * tl.exp(m - top), axis=0))
    ci = tl.arange(0, CAND_P2)
    live = ci < SPLITS * K
    v = tl.load(part_v + r * SPLITS * K + ci, mask=live, other=float("-inf"))
    ids = tl.load(part_i + r * SPLITS * K + ci, mask=live, other=0)
    at = (r // R) * s_ob + (r % R) * K
    for j in tl.static_range(K):
        best = tl.max(v, axis=0)
        pick = tl.argmax(v, axis=0)  # the first: the lower block, so the lower id, of equal entries
        score = best - lse
        if HAS_BASE:
            score = score + tl.load(base + (r // R) * s_bb + r % R)
        tl.store(scores + at + j, score)
        tl.store(tokens + at + j, tl.load(to_target + tl.sum(tl.where(ci == pick, ids, 0), axis=0)))
        v = tl.where(ci == pick, float("-inf"), v)


@triton.jit
def _next_frontier_kernel(scores, tokens, s_c, hidden, s_hb, s_hk, mask, s_mb, s_mk, slots, out_scores, out_parent,
                          out_tokens, out_hidden, out_mask, frontier, s_fb, offset, H, W, K: tl.constexpr,
                          KK_P2: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, HAS_MASK: tl.constexpr,
                          PDL: tl.constexpr):
    """``TorchOps.next_frontier`` for batch row ``b`` and frontier node ``j`` (program ``(b, j)``): the
    ``j``-th best of the row's ``K * K`` candidates (ties: the lower index first), its score, parent,
    token and candidate number, its parent's row of ``hidden`` and, with ``HAS_MASK``, its parent's
    mask row with column ``slots[j]`` opened."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    c = tl.arange(0, KK_P2)
    v = tl.load(scores + b * s_c + c, mask=c < K * K, other=float("-inf"))
    for _ in range(j):  # take out the j better ones
        v = tl.where(c == tl.argmax(v, axis=0), float("-inf"), v)
    best = tl.max(v, axis=0)
    pick = tl.argmax(v, axis=0)
    parent = pick // K
    out = b * K + j
    tl.store(out_scores + out, best)
    tl.store(out_parent + out, parent.to(tl.int64))
    tl.store(out_tokens + out, tl.load(tokens + b * s_c + pick))
    tl.store(frontier + b * s_fb + j, (pick + offset).to(tl.int64))
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        row = tl.load(hidden + b * s_hb + parent * s_hk + h, mask=h < H)
        tl.store(out_hidden + out * H + h, row, mask=h < H)
    if HAS_MASK:
        slot = tl.load(slots + j)
        for w0 in range(0, W, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            row = tl.load(mask + b * s_mb + parent * s_mk + w, mask=w < W)
            tl.store(out_mask + out * W + w, tl.where(w == slot, 0.0, row).to(out_mask.dtype.element_ty), mask=w < W)


@triton.jit
def _select_tree_kernel(scores, tokens, s_c, frontiers, s_fb, root, scale, shift, out_tokens, out_parents, out_depth,
                        out_mask, C, T, K: tl.constexpr, STEPS: tl.constexpr, C_P2: tl.constexpr, T_P2: tl.constexpr,
                        PDL: tl.constexpr):
    """``TorchOps.select_tree`` for batch row ``b`` (program ``b``): the ``T - 1`` best candidates by
    ``scores * scale - shift`` (ties: the lower number first), numbered in candidate order after the
    root; each one's parent column (its parent candidate's place among the chosen), depth (from its
    candidate number), token, and ancestor-or-self row (``STEPS`` hops up the parents)."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, C_P2)
    live = c < C
    v = tl.load(scores + b * s_c + c, mask=live, other=0.0) * tl.load(scale + c, mask=live, other=1.0) \
        - tl.load(shift + c, mask=live, other=0.0)
    v = tl.where(live, v, float("-inf"))
    chosen = c < 0
    for _ in range(T - 1):
        pick = tl.argmax(v, axis=0)
        chosen = chosen | (c == pick)
        v = tl.where(c == pick, float("-inf"), v)
    col = tl.cumsum(chosen.to(tl.int32), axis=0)  # a chosen candidate's column (the root is 0)
    i = tl.arange(0, T_P2)
    node = (i >= 1) & (i < T)
    keep = tl.sum(tl.where(chosen[None, :] & (col[None, :] == i[:, None]), c[None, :], 0), axis=1)  # [T_P2]
    level = (keep - K) // (K * K)  # the fed level a candidate past the first K was drafted at
    f = ((keep - K) % (K * K)) // K  # its parent's slot in that level's frontier
    later = tl.load(frontiers + b * s_fb + (level - 1) * K + f, mask=node & (keep >= K + K * K), other=0)
    pc = tl.where(keep < K, -1, tl.where(level == 0, f, later))  # the parent's candidate number
    before = tl.sum(((keep[None, :] < pc[:, None]) & node[None, :]).to(tl.int32), axis=1)
    parents = tl.where(i == 0, -1, tl.where(pc < 0, 0, before + 1))
    depth = tl.where(i == 0, 0, tl.where(keep < K, 1, level + 2))
    tok = tl.where(i == 0, tl.load(root + b), tl.load(tokens + b * s_c + keep, mask=node, other=0))
    t = i < T
    tl.store(out_tokens + b * T + i, tok.to(tl.int64), mask=t)
    tl.store(out_parents + b * T + i, parents.to(tl.int64), mask=t)
    tl.store(out_depth + b * T + i, depth.to(tl.int64), mask=t)
    jj = tl.arange(0, T_P2)
    anc = i
    seen = jj[None, :] == i[:, None]
    for _ in tl.static_range(STEPS):  # one hop up a round
        up = tl.sum(tl.where(jj[None, :] == anc[:, None], parents[None, :], 0), axis=1)
        anc = tl.where(anc >= 0, up, -1)
        seen = seen | (jj[None, :] == anc[:, None])
    tl.store(out_mask + (b * T + i[:, None]) * T + jj[None, :], seen.to(tl.uint8), mask=t[:, None] & (jj < T)[None, :])


@triton.jit
def _accept_greedy_kernel(tokens, parents, depth, mask, choice, cols, counts, bonus, T, WIDTH,
                          T_P2: tl.constexpr, W_P2: tl.constexpr, PDL: tl.constexpr):
    """``TorchOps.accept_greedy`` for one row of trees (program ``b``): node ``i`` is accepted when it and
    every ancestor (``mask[b, i, :]``) carry the target's ``choice`` at their parent; the deepest
    accepted node (the first on a tie) ends the path, whose node at each depth goes to ``cols``."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, T_P2)
    live = i < T
    tok = tl.load(tokens + b * T + i, mask=live, other=-1)
    par = tl.load(parents + b * T + i, mask=live, other=-1)
    dep = tl.load(depth + b * T + i, mask=live, other=0)
    want = tl.load(choice + b * T + tl.maximum(par, 0), mask=live, other=-1)
    correct = (tok == want) | (par < 0)
    anc = tl.load(mask + (b * T + i[:, None]) * T + i[None, :], mask=live[:, None] & live[None, :], other=0) != 0
    wrong = tl.sum((anc & (correct == 0)[None, :]).to(tl.int32), axis=1)  # [T]: ancestors (or self) not correct
    score = tl.where(live & (wrong == 0), dep, -1)
    end = tl.min(tl.where(score == tl.max(score, axis=0), i, T_P2), axis=0)  # the deepest, the first on a tie
    path = tl.sum(tl.where(i[:, None] == end, anc.to(tl.int32), 0), axis=0) != 0  # [T] end's ancestors and itself
    level = tl.arange(0, W_P2)
    at = tl.sum(tl.where(path[None, :] & (dep[None, :] == level[:, None]), i[None, :], 0), axis=1)  # [W]
    tl.store(cols + b * WIDTH + level, at.to(tl.int64), mask=level < WIDTH)
    tl.store(counts + b, (tl.sum(tl.where(i == end, dep, 0), axis=0) + 1).to(tl.int64))
    tl.store(bonus + b, tl.load(choice + b * T + end).to(tl.int64))


@triton.jit
def _new_block_mask_kernel(lengths, tree, s_tb, counts, prefix, out, T, W, low, TREE: tl.constexpr,
                           BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``TorchOps.tree_mask`` (``TREE``) or ``block_mask`` for row ``b`` and new token ``t`` (program
    ``b * T + t``), ``BLOCK`` columns of the window per program: 0 where the token sees the slot, ``low``
    (the dtype's min) elsewhere. It sees the row's committed slots and, of the ``T`` new ones written at
    ``prefix..``, with ``TREE`` itself and its ancestors (``tree[b, t]``), else the first ``counts[b]``
    up to itself (a token past them, padding, sees those and itself). ``s_tb``: ``tree``'s batch stride
    (0 for one tree shared by every row)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    b = r // T
    t = r % T
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rel = c - tl.load(prefix)
    inside = (rel >= 0) & (rel < T) & (c < W)
    if TREE:
        seen = tl.load(tree + b * s_tb + t * T + rel, mask=inside, other=0) != 0
    else:
        seen = inside & (rel <= t) & ((rel < tl.load(counts + b)) | (rel == t))
    visible = (c < tl.load(lengths + b)) | seen
    tl.store(out + r * W + c, tl.where(visible, 0.0, low).to(out.dtype.element_ty), mask=c < W)


def _launch(kernel, grid, x: torch.Tensor, *args, **kwargs) -> None:
    """``kernel[grid](x, *args)``; off the GPU only in Triton's interpreter. On Hopper and later
    with programmatic dependent launch (``_after_previous_kernel``) unless ``TritonOps.pdl`` is off;
    if such a launch fails where the plain one runs, the plain launch from then on (``pdl_failed`` says
    why); a kernel that fails both ways raises, and leaves the other kernels' launches as they were."""
    if not x.is_cuda and not _INTERPRETED:
        raise EyasError("the Triton kernels run on a GPU, or on the CPU under TRITON_INTERPRET=1",
                        "unset EYAS_KERNELS (the torch ops then run on the CPU), or set TRITON_INTERPRET=1")
    if _pdl(x.device):
        try:
            return kernel[grid](x, *args, **kwargs, PDL=True, launch_pdl=True)
        except Exception as e:  # noqa: BLE001 - an older Triton or driver: the plain launch still works
            if _forced():
                raise
            kernel[grid](x, *args, **kwargs, PDL=False)  # a kernel that cannot run at all raises here: not PDL's fault
            TritonOps.pdl_failed = f"{type(e).__name__}: {e}"
            log.warning("programmatic dependent launch failed (%s); kernels launch the plain way from now on",
                        TritonOps.pdl_failed)
            return
    kernel[grid](x, *args, **kwargs, PDL=False)


_PDL_DEVICES: dict[int, bool] = {}


def _pdl(device: torch.device) -> bool:
    if not TritonOps.pdl or TritonOps.pdl_failed or device.type != "cuda" or gdc_wait is None:
        return False
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _PDL_DEVICES:
        _PDL_DEVICES[i] = torch.cuda.get_device_capability(i) >= (9, 0)
    return _PDL_DEVICES[i]


def _forced() -> bool:
    return os.environ.get("EYAS_KERNELS", "auto").lower() == "triton"


def _batch_rows(t: torch.Tensor) -> bool:
    """Whether the top-children kernels can address ``t`` in place: batch row ``b`` at ``b *
    t.stride(0)``, its entries back to back (any batch stride: slices of a tree's candidate buffers)."""
    return t.dim() <= 1 or t[0].is_contiguous()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, last]`` with a unit last stride (a copy only for expanded or strided input)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonOps(TorchOps):
    """The ops as Triton kernels. If a kernel fails (Triton cannot compile it for this GPU, say), the
    call runs the torch op instead, a warning says why once, and ``failed`` keeps the process on the
    torch ops (``ops_for``); under ``EYAS_KERNELS=triton`` the error stands instead."""

    name = "triton"
    failed: str | None = None
    top_children_failed: str | None = None
    linear_failed: str | None = None
    fused_linears = True  # one-row projections as ``_linear_kernel`` (False: cuBLAS always)
    row_linears = True  # and projections of 2..ROWS_MAX rows as ``_linear_rows_kernel`` (False: cuBLAS)
    # ... also those with a norm or silu(gate) * up inside. Off: measured slower than the norm kernel +
    # cuBLAS (docs/log/engine.md, "Draft v6, the norm inside the rows kernel in one pass")
    row_prologues = False
    # With row_prologues off, a norm before a projection of 2..ROWS_MAX rows runs as the norm kernel and
    # the projection as _linear_rows_kernel (silu(gate) * up in its epilogue: no silu kernel). Off: the
    # norm kernel, cuBLAS, and the silu kernel, measured slower (docs/log/engine.md, "Fewer kernels a
    # speculative step"); pair.py flips it.
    row_norm_apart = True
    pdl = True  # programmatic dependent launch where the GPU has it (``_after_previous_kernel``)
    pdl_failed: str | None = None

    @classmethod
    def failures(cls) -> dict[str, str]:
        """Each kernel family that fell back in this process, and why (benchmarks record it)."""
        return {f: getattr(cls, f) for f in ("failed", "top_children_failed", "linear_failed", "pdl_failed")
                if getattr(cls, f)}

    def _or_torch(self, kernel_path, torch_path, flag: str = "failed", instead: str = "running the torch ops"):
        """``kernel_path()``, or ``torch_path()`` once it has failed. ``flag`` names the class attribute
        that keeps the failure: ``failed`` for the forward's kernels (then ``ops_for`` takes the torch
        ops everywhere); the drafter's ``top_children`` and the one-row ``linear`` keep their own, so
        that only they fall back."""
        if getattr(TritonOps, flag) is None or _forced():  # the environment is read only once a kernel has failed
            try:
                return kernel_path()
            except EyasError:
                raise
            except Exception as e:  # noqa: BLE001 - a kernel that cannot run must not take a server down
                if _forced():
                    raise
                setattr(TritonOps, flag, f"{type(e).__name__}: {e}")
                log.warning("the Triton %s failed (%s); %s from now on (EYAS_KERNELS=torch skips the kernels "
                            "from the start)", "kernels" if flag == "failed" else flag[: -len("_failed")] + " kernel",
                            getattr(TritonOps, flag), instead)
        return torch_path()

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        return rope.table, positions

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._or_torch(lambda: self._rms_norm(x, weight, eps), lambda: TorchOps.rms_norm(self, x, weight, eps))

    def rms_norm_cat(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
        return self._or_torch(lambda: self._rms_norm_cat(parts), lambda: TorchOps.rms_norm_cat(self, parts))

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        return self._or_torch(lambda: self._silu_mul(x), lambda: TorchOps.silu_mul(self, x))

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        x, norm = self._norm_apart(x, norm)
        return self._fused_or_cublas(x, weight, weight.shape[1], None,
                                     lambda cfg: self._linear(x, weight, bias, norm, cfg),
                                     lambda: TorchOps.linear(self, x, weight, bias, norm), prologue=norm is not None,
                                     variant=_variant("linear", bias, norm))

    def linear_silu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        x, norm = self._norm_apart(x, norm)
        return self._fused_or_cublas(x, weight, weight.shape[1], None,
                                     lambda cfg: self._linear(x, weight, bias, norm, cfg, silu=True),
                                     lambda: self.silu_mul(TorchOps.linear(self, x, weight, bias, norm)),
                                     prologue=norm is not None or not self.row_norm_apart,
                                     variant=_variant("silu", bias, norm))

    def _norm_apart(self, x: torch.Tensor, norm):
        """``(x, norm)`` as the projection takes them: for 2 to ``ROWS_MAX`` rows with ``row_norm_apart``
        (and not ``row_prologues``), ``x`` normed by the norm kernel and no norm left, so that the
        projection runs as ``_linear_rows_kernel`` instead of cuBLAS."""
        rows = x.numel() // max(1, x.shape[-1])
        if (norm is None or not 1 < rows <= ROWS_MAX or self.row_prologues or not self.row_norm_apart
                or not (self.row_linears and self.fused_linears)):
            return x, norm
        return self.rms_norm(x, *norm), None

    def linear_add(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._fused_or_cublas(x, weight, weight.shape[1], residual,
                                     lambda cfg: self._linear(x, weight, bias, None, cfg, residual=residual),
                                     lambda: TorchOps.linear_add(self, residual, x, weight, bias),
                                     variant=_variant("add", bias, None))

    def _fused_or_cublas(self, x: torch.Tensor, weight: torch.Tensor, width: int, residual, kernel_path, cublas_path,
                         prologue: bool = False, variant: str = "linear"):
        """``kernel_path(config)`` or ``cublas_path()``, whichever ``CHOICES`` measured faster for this
        shape on this GPU (``kernel_choice``). The kernels take one row of ``width`` for ``weight`` (a
        decode step at batch 1: ``_linear_kernel``, its norm, activation and residual inside) or a few
        rows (up to ``ROWS_MAX``: a tree's verify, a draft level; ``_linear_rows_kernel`` in the tile
        shapes of ``ROWS_TILES``, without a norm or activation inside unless ``row_prologues``). More
        rows (prefill, large batches) stay cuBLAS's, and a mismatched input meets torch's shape error.
        Without timing (the CPU, a capture) the first candidate runs: the kernel with its built-in
        configuration, or cuBLAS where ``linear_config`` says so."""
        rows = x.numel() // max(1, x.shape[-1])
        several = 1 < rows <= ROWS_MAX and self.row_linears and (self.row_prologues or not prologue)
        fits = (self.fused_linears and x.shape[-1] == width and (rows == 1 or several)
                and weight.dtype == x.dtype and weight.stride(-1) == 1
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
                and (residual is None or residual.numel() == rows * weight.shape[0]))
        if not fits:
            return cublas_path()
        n, k = weight.shape
        configs = linear_candidates(rows, n, k, x.dtype.itemsize)
        if not configs:
            return cublas_path()
        runs = {name: (lambda cfg=cfg: kernel_path(cfg)) if cfg else cublas_path for name, cfg in configs.items()}
        choice = CHOICES.pick(shape_key(rows, n, k, x.dtype, variant), runs, x.device)
        if configs[choice] is None:
            return cublas_path()
        return self._or_torch(lambda: kernel_path(configs[choice]), cublas_path, "linear_failed",
                              "projections use cuBLAS")

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        def torch_path():
            table, positions = rot
            cos, sin = table[positions].chunk(2, dim=-1)
            return TorchOps.qkv_to_cache(self, qkv, heads, (cos[:, None], sin[:, None]), cache, layer, norms)

        return self._or_torch(lambda: self._qkv_to_cache(qkv, heads, rot, cache, layer, norms), torch_path)

    def fold_mask(self, mask: torch.Tensor, rep: int) -> torch.Tensor:
        return mask  # ``attend`` reads each folded row's mask row in place

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
               heads: tuple[int, int, int]) -> torch.Tensor:
        return self._or_torch(lambda: self._attend(q, keys, values, mask, scale, heads),
                              lambda: TorchOps.attend(self, q, keys, values,
                                                      TorchOps.fold_mask(self, mask, heads[0] // heads[1]), scale, heads))

    def top_children(self, logits: torch.Tensor, k: int, to_target: torch.Tensor,
                     base: torch.Tensor | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's op, not the forward's: if it cannot run, only it falls back to torch."""
        return self._or_torch(lambda: self._top_children(logits, k, to_target, base, out),
                              lambda: TorchOps.top_children(self, logits, k, to_target, base, out), "top_children_failed",
                              "tree levels use log_softmax + topk")

    def next_frontier(self, scores, tokens, hidden, k: int, offset: int, frontier, mask=None, slots=None):
        return self._or_torch(lambda: self._next_frontier(scores, tokens, hidden, k, offset, frontier, mask, slots),
                              lambda: TorchOps.next_frontier(self, scores, tokens, hidden, k, offset, frontier, mask,
                                                             slots), "top_children_failed",
                              "tree levels use log_softmax + topk")

    def select_tree(self, scores, tokens, frontiers, root, scale, shift, size: int, k: int):
        return self._or_torch(lambda: self._select_tree(scores, tokens, frontiers, root, scale, shift, size, k),
                              lambda: TorchOps.select_tree(self, scores, tokens, frontiers, root, scale, shift, size, k),
                              "top_children_failed", "tree levels use log_softmax + topk")

    def accept_greedy(self, tokens, parents, depth, mask, choice, width: int):
        return self._or_torch(lambda: self._accept_greedy(tokens, parents, depth, mask, choice, width),
                              lambda: TorchOps.accept_greedy(self, tokens, parents, depth, mask, choice, width))

    def tree_mask(self, lengths, tree_mask, prefix, window: int, dtype: torch.dtype):
        return self._or_torch(lambda: self._tree_mask(lengths, tree_mask, prefix, window, dtype),
                              lambda: TorchOps.tree_mask(self, lengths, tree_mask, prefix, window, dtype))

    def block_mask(self, lengths, counts, prefix, width: int, window: int, dtype: torch.dtype):
        return self._or_torch(lambda: self._block_mask(lengths, counts, prefix, width, window, dtype),
                              lambda: TorchOps.block_mask(self, lengths, counts, prefix, width, window, dtype))

    def _accept_greedy(self, tokens, parents, depth, mask, choice, width):
        bsz, t = tokens.shape
        dev = tokens.device
        cols = torch.empty((bsz, width), dtype=torch.long, device=dev)
        counts = torch.empty(bsz, dtype=torch.long, device=dev)
        bonus = torch.empty(bsz, dtype=torch.long, device=dev)
        _launch(_accept_greedy_kernel, (bsz,), tokens.contiguous(), parents.contiguous(), depth.contiguous(),
                mask.contiguous().view(torch.uint8), choice.contiguous(), cols, counts, bonus, t, width,
                T_P2=max(2, triton.next_power_of_2(t)), W_P2=max(2, triton.next_power_of_2(width)), num_warps=4)
        return cols, counts, bonus

    def _tree_mask(self, lengths, tree_mask, prefix, window, dtype):
        if not tree_mask[0].is_contiguous():  # each row's [T, T] in place; rows apart, or one shared (stride 0)
            tree_mask = tree_mask.contiguous()
        return self._new_block_mask(lengths, tree_mask.view(torch.uint8), lengths, prefix, tree_mask.shape[1], window,
                                    dtype)

    def _block_mask(self, lengths, counts, prefix, width, window, dtype):
        return self._new_block_mask(lengths, None, counts, prefix, width, window, dtype)

    def _new_block_mask(self, lengths, tree, counts, prefix, t, window, dtype):
        bsz = lengths.shape[0]
        out = torch.empty((bsz, 1, t, window), dtype=dtype, device=lengths.device)
        block = min(1024, triton.next_power_of_2(window))
        _launch(_new_block_mask_kernel, (bsz * t, triton.cdiv(window, block)), lengths.contiguous(),
                lengths if tree is None else tree, 0 if tree is None else tree.stride(0), counts.contiguous(),
                prefix.reshape(1), out, t, window, torch.finfo(dtype).min, TREE=tree is not None, BLOCK=block,
                num_warps=4)
        return out

    def _top_children(self, logits, k, to_target, base, out):
        n = logits.shape[-1]
        if n < k:
            raise EyasError(f"a draft vocabulary of {n} tokens has no {k} best", "lower --speculative-eagle-topk")
        x = _rows(logits)
        rows = x.shape[0]
        lead = logits.shape[:-1]
        per = rows // lead[0] if lead and lead[0] else 1  # rows of one batch row ([B, R, V] logits: R)
        block = min(1024, max(16, triton.next_power_of_2(n)))
        splits = triton.cdiv(n, block)
        dev = x.device
        part_v = torch.empty((rows, splits, k), dtype=torch.float32, device=dev)
        part_i = torch.empty((rows, splits, k), dtype=torch.int32, device=dev)
        part_ml = torch.empty((rows, splits, 2), dtype=torch.float32, device=dev)
        if out is not None and _batch_rows(out[0]) and _batch_rows(out[1]):
            scores, tokens = out
        else:
            scores = torch.empty((*lead, k), dtype=torch.float32, device=dev)
            tokens = torch.empty((*lead, k), dtype=torch.long, device=dev)
        if base is not None:
            base = base if base.dtype == torch.float32 and _batch_rows(base) else base.float().contiguous()
        flat_base = scores if base is None else base
        _launch(_top_children_kernel, (rows, splits), x, x.stride(0), n, part_v, part_i, part_ml, SPLITS=splits, K=k,
                BLOCK=block, num_warps=4)
        _launch(_top_children_combine_kernel, (rows,), part_v, part_i, part_ml, flat_base,
                flat_base.stride(0) if flat_base.dim() else 0, to_target, scores, tokens,
                scores.stride(0) if len(lead) else k, per, SPLITS=splits, K=k,
                SPLITS_P2=triton.next_power_of_2(splits), CAND_P2=triton.next_power_of_2(splits * k),
                HAS_BASE=base is not None, num_warps=1)
        if out is not None and scores is not out[0]:  # views the kernel cannot write in place
            out[0].copy_(scores)
            out[1].copy_(tokens)
            return out
        return scores, tokens

    def _next_frontier(self, scores, tokens, hidden, k, offset, frontier, mask, slots):
        bsz = scores.shape[0]
        dev = scores.device
        if scores.stride(-1) != 1 or tokens.stride() != scores.stride():
            scores, tokens = scores.contiguous(), tokens.contiguous()
        h = hidden.shape[-1]
        if hidden.stride(-1) != 1:
            hidden = hidden.contiguous()
        if frontier.stride(-1) != 1:
            raise ValueError("next_frontier: the frontier's candidate numbers must be written with a unit last stride")
        out_scores = torch.empty((bsz, k), dtype=torch.float32, device=dev)
        out_parent = torch.empty((bsz, k), dtype=torch.long, device=dev)
        out_tokens = torch.empty((bsz, k), dtype=tokens.dtype, device=dev)
        out_hidden = torch.empty((bsz, k, h), dtype=hidden.dtype, device=dev)
        if mask is not None:
            if mask.stride(-1) != 1:
                mask = mask.contiguous()
            out_mask = torch.empty(mask.shape, dtype=mask.dtype, device=dev)
            w = mask.shape[-1]
        else:
            out_mask, w = out_hidden, 0
        _launch(_next_frontier_kernel, (bsz, k), scores, tokens, scores.stride(0), hidden, hidden.stride(0),
                hidden.stride(1), out_mask if mask is None else mask, 0 if mask is None else mask.stride(0),
                0 if mask is None else mask.stride(1), frontier if slots is None else slots.contiguous(), out_scores,
                out_parent, out_tokens, out_hidden, out_mask, frontier, frontier.stride(0), offset, h, w, K=k,
                KK_P2=max(2, triton.next_power_of_2(k * k)), BLOCK_H=min(1024, triton.next_power_of_2(h)),
                BLOCK_W=min(1024, max(16, triton.next_power_of_2(max(w, 1)))), HAS_MASK=mask is not None, num_warps=4)
        return out_scores, out_parent, out_tokens, out_hidden, None if mask is None else out_mask

    def _select_tree(self, scores, tokens, frontiers, root, scale, shift, size, k):
        bsz, c = scores.shape
        dev = scores.device
        if scores.stride(-1) != 1 or tokens.stride() != scores.stride():
            scores, tokens = scores.contiguous(), tokens.contiguous()
        if size - 1 > c:
            raise EyasError(f"a tree of {size} nodes needs {size - 1} candidates; the drafting made {c}",
                            "lower --speculative-num-draft-tokens")
        frontiers = frontiers.contiguous()
        out_tokens = torch.empty((bsz, size), dtype=torch.long, device=dev)
        parents = torch.empty((bsz, size), dtype=torch.long, device=dev)
        depth = torch.empty((bsz, size), dtype=torch.long, device=dev)
        mask = torch.empty((bsz, size, size), dtype=torch.bool, device=dev)
        steps = 1 + (c - k) // (k * k)
        _launch(_select_tree_kernel, (bsz,), scores, tokens, scores.stride(0),
                frontiers if frontiers.numel() else parents, frontiers.stride(0) if frontiers.numel() else 0,
                root.contiguous(), scale, shift, out_tokens, parents, depth, mask.view(torch.uint8), c, size, K=k,
                STEPS=steps, C_P2=max(2, triton.next_power_of_2(c)), T_P2=max(2, triton.next_power_of_2(size)),
                num_warps=4)
        return out_tokens, parents, depth, mask

    def _linear(self, x, weight, bias, norm, cfg, residual=None, silu: bool = False) -> torch.Tensor:
        n, k = weight.shape
        n = n // 2 if silu else n  # gate/up: the kernel writes silu(gate) * up
        if x.numel() != k:
            return self._linear_rows(x, weight, bias, norm, n, residual, silu, cfg)
        out = torch.empty(n, dtype=x.dtype, device=x.device)
        res = out if residual is None else _rows(residual)
        block_n, block_k, warps, stages = cfg
        if not x.is_cuda:  # Triton's interpreter runs programs one by one: fewer, wider ones (same code path)
            block_n = max(block_n, min(128, triton.next_power_of_2(n)))
        _launch(_linear_kernel, (triton.cdiv(n, block_n // 2 if silu else block_n),), _rows(x), weight,
                weight.stride(0), out if bias is None else bias, res, out if norm is None else norm[0], out, n, k,
                float(norm[1]) if norm else 0.0, NORM=norm is not None, SILU=silu, HAS_BIAS=bias is not None,
                HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k,
                ROW_P2=triton.next_power_of_2(k) if norm is not None and k <= 16384 else 0,
                num_warps=warps, num_stages=stages)
        return out.view(*x.shape[:-1], n)

    def _linear_rows(self, x, weight, bias, norm, n, residual, silu, cfg=None) -> torch.Tensor:
        """``cfg``: (BLOCK_N, BLOCK_K, num_warps, num_stages), else ``linear_rows_config``'s."""
        k = weight.shape[1]
        xr = _rows(x)
        m = xr.shape[0]
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        res = out if residual is None else _rows(residual)
        block_m, block_n, block_k, warps, stages = linear_rows_config(m, n, k, x.dtype.itemsize)
        if cfg is not None:
            block_n, block_k, warps, stages = cfg
        _launch(_linear_rows_kernel, (triton.cdiv(n, block_n), triton.cdiv(m, block_m)), xr, xr.stride(0), weight,
                weight.stride(0), out if bias is None else bias, res, res.stride(0), out if norm is None else norm[0],
                out, out.stride(0), m, n, k, float(norm[1]) if norm else 0.0, NORM=norm is not None, SILU=silu,
                HAS_BIAS=bias is not None, HAS_RES=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_K=block_k, EXACT=x.dtype.itemsize > 2 or not x.is_cuda,
                UPCAST=x.dtype.itemsize == 2 and not x.is_cuda, num_warps=warps, num_stages=stages)
        return out.view(*x.shape[:-1], n)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """The norm of ``x``'s rows, written to ``out`` when given (``[rows, n]``, unit last stride: a
        slice of a wider tensor, as ``_rms_norm_cat`` passes it)."""
        n = x.shape[-1]
        rows = _rows(x)
        dest = torch.empty(rows.shape, dtype=x.dtype, device=x.device) if out is None else out
        block = triton.next_power_of_2(n)
        _launch(_rms_norm_kernel, (rows.shape[0],), rows, rows.stride(0), weight, dest, dest.stride(0), n, float(eps),
                BLOCK=block, num_warps=min(16, max(1, block // 256)))
        return dest.view(x.shape) if out is None else out

    def _rms_norm_cat(self, parts) -> torch.Tensor:
        """Each part's norm written into its columns of one output: no ``cat`` kernel."""
        first = parts[0][0]
        total = sum(x.shape[-1] for x, _, _ in parts)
        out = torch.empty((*first.shape[:-1], total), dtype=first.dtype, device=first.device)
        flat, start = out.view(-1, total), 0
        for x, weight, eps in parts:
            if x.shape[:-1] != first.shape[:-1] or x.dtype != first.dtype:
                raise ValueError(f"rms_norm_cat: parts of shapes {[tuple(p[0].shape) for p in parts]}, dtypes "
                                 f"{[p[0].dtype for p in parts]} (the leading shape and dtype must match)")
            self._rms_norm(x, weight, eps, out=flat[:, start : start + x.shape[-1]])
            start += x.shape[-1]
        return out

    def _silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1] // 2
        rows = _rows(x)
        out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
        block = 1024
        _launch(_silu_mul_kernel, (rows.shape[0], triton.cdiv(n, block)), rows, rows.stride(0), out, out.stride(0), n,
                BLOCK=block, num_warps=4)
        return out.view(*x.shape[:-1], n)

    def _qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
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

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                heads: tuple[int, int, int]) -> torch.Tensor:
        """Grouped-query attention straight from the cache window (no K/V copies), the mask unfolded,
        written as ``[B, T, Hq * D]`` for the o projection. The window is split over enough programs
        to fill the GPU (flash-decoding); with more than one split a second kernel combines them."""
        hq, hkv, d = heads
        bsz, _, w, _ = keys.shape
        t = mask.shape[2]
        rep = hq // hkv
        q = q.view(bsz, hq, t, d)  # qkv_to_cache's contiguous [B, Hq, T, D]
        out = torch.empty((bsz, t, hq, d), dtype=q.dtype, device=q.device)
        rows = rep * t
        block_m = max(16, min(64, triton.next_power_of_2(rows)))
        m_blocks = triton.cdiv(rows, block_m)
        block_n = 64 if d <= 128 else 32
        chunks = triton.cdiv(w, block_n)
        splits = max(1, min(chunks, triton.cdiv(256, bsz * hkv * m_blocks)))
        per_split = triton.cdiv(chunks, splits) * block_n
        splits = triton.cdiv(w, per_split)
        d_p2 = max(16, triton.next_power_of_2(d))
        m_pad = m_blocks * block_m
        direct = splits == 1
        if direct:
            part_o = part_ml = out
        else:
            part_o = torch.empty((bsz, hkv, splits, m_pad, d_p2), dtype=torch.float32, device=q.device)
            part_ml = torch.empty((bsz, hkv, splits, m_pad, 2), dtype=torch.float32, device=q.device)
        _launch(_attend_kernel, (bsz, hkv, splits * m_blocks), q, q.stride(0), q.stride(1), q.stride(2), keys, values,
                keys.stride(0), keys.stride(1), keys.stride(2), mask, mask.stride(0), mask.stride(2), mask.stride(3),
                out, out.stride(0), out.stride(1), out.stride(2), part_o, part_ml, w, t, per_split, float(scale), hkv,
                splits, m_pad, REP=rep, D=d, D_P2=d_p2, BLOCK_M=block_m, BLOCK_N=block_n, M_BLOCKS=m_blocks, DIRECT=direct,
                EXACT=q.dtype.itemsize > 2 or not q.is_cuda, UPCAST=q.dtype.itemsize == 2 and not q.is_cuda,
                num_warps=4)
        if not direct:
            _launch(_attend_combine_kernel, (bsz, hkv, rows), part_o, part_ml, out, out.stride(0), out.stride(1),
                    out.stride(2), t, splits, hkv, m_pad, REP=rep, D=d, D_P2=d_p2,
                    SPLITS_P2=triton.next_power_of_2(splits), num_warps=1)
        return out.view(bsz, t, hq * d)


LINEAR_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int] | None] = {}
"""Overrides of ``linear_config`` by (N, K, bytes per element); ``benchmarks/linear_cost.py`` sweeps them."""


def linear_config(n: int, k: int, itemsize: int) -> tuple[int, int, int, int] | None:
    """``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` of ``_linear_kernel`` for an ``[n, k]`` weight, or
    None where cuBLAS (with the norm as its own kernel) measured faster. From the sweeps of
    ``benchmarks/linear_cost.py --sweep`` (docs/log/engine.md): 8 weight rows a program, unpipelined, the whole row
    (up to 1024) a step for short rows; 16 rows of 1024 for a square one (o), three stages for a
    long one (down), 8 of 512 between (q/k/v); for wide outputs (gate/up, an LM head) 16 rows of
    256, two stages; a wide output over short rows (SmolLM2's LM heads: 49152 x 576) stays cuBLAS's."""
    if (n, k, itemsize) in LINEAR_CONFIGS:
        return LINEAR_CONFIGS[n, k, itemsize]
    scale = max(1, itemsize // 2)  # float32: half the entries a step, the same bytes
    if n >= 16384:
        return None if k < 2048 else (16, 256 // scale, 4, 2)
    if k <= 2048:
        return 8, max(16, min(1024 // scale, triton.next_power_of_2(k))), 8, 1
    if k >= 8192:
        return 16, 1024 // scale, 8, 3
    return (16, 1024 // scale, 8, 1) if n <= k else (8, 512 // scale, 4, 1)


ROWS_MAX = 64
"""Most rows ``_linear_rows_kernel`` takes: a verify of 64 tokens at batch 1, a draft level of 8 x 8."""


LINEAR_ROWS_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}
"""Overrides of ``linear_rows_config``'s (BLOCK_N, BLOCK_K, num_warps, num_stages) by (N, K, bytes per
element); ``benchmarks/linear_cost.py --rows M --sweep`` sweeps them."""


def linear_rows_config(m: int, n: int, k: int, itemsize: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` of ``_linear_rows_kernel``: every row in
    one block (16 to 64, the tensor cores' smallest), 16 output columns and 256 of K a step, three
    stages: the best of a sweep at 32 rows for SmolLM2's o, down and its draft's q/k/v, ahead of
    cuBLAS and of a first configuration of 32 columns and 128 of K (docs/log/engine.md, "The
    speculative step as one graph, several-row projections in a kernel"). Half the K step for float32
    (the same bytes). Not swept for the 8B shape."""
    block_m = max(16, triton.next_power_of_2(m))
    if (n, k, itemsize) in LINEAR_ROWS_CONFIGS:
        return (block_m, *LINEAR_ROWS_CONFIGS[n, k, itemsize])
    return block_m, 16, 256 // max(1, itemsize // 2), 4, 3


ROWS_TILES = ((32, 128, 4, 3), (64, 128, 4, 3), (64, 64, 4, 4))
"""(BLOCK_N, BLOCK_K, num_warps, num_stages) of ``_linear_rows_kernel`` timed beside ``linear_rows_config``'s
and cuBLAS for each shape: wider tiles read the rows ``x`` fewer times, which a large ``K`` needs (Llama-3.1-8B's
projections measured 1.5-2x slower than cuBLAS with the 16-column default); halved ``BLOCK_K`` for float32."""


def linear_candidates(rows: int, n: int, k: int, itemsize: int) -> dict[str, tuple[int, int, int, int] | None]:
    """The named configurations a projection of ``rows`` x ``k`` by an ``[n, k]`` weight may run, the
    default first (None: cuBLAS). One row: ``linear_config``'s choice alone, not timed: timed apart, cuBLAS
    won shapes where inside the step's graph, each kernel launched dependent on the one before,
    ``_linear_kernel`` decodes faster (docs/engine.md, "What it measures now", the 8B shape). 2 to
    ``ROWS_MAX`` rows: the rows kernel's default tile, the tiles of
    ``ROWS_TILES``, and cuBLAS, timed."""
    scale = max(1, itemsize // 2)
    if rows == 1:
        cfg = linear_config(n, k, itemsize)
        return {"cublas": None} if cfg is None else {f"kernel:{cfg[0]}x{cfg[1]}": cfg}
    default = linear_rows_config(rows, n, k, itemsize)[1:]
    tiles = [default] + [(bn, bk // scale, w, st) for bn, bk, w, st in ROWS_TILES]
    out = {f"rows:{bn}x{bk}x{w}x{st}": (bn, bk, w, st) for bn, bk, w, st in dict.fromkeys(tiles)}
    return {**out, "cublas": None}


def _variant(op: str, bias, norm) -> str:
    """What a projection does besides the product, for ``shape_key``: ``linear+norm+bias``, ``silu``, ``add``."""
    return op + ("+norm" if norm is not None else "") + ("+bias" if bias is not None else "")


TRITON = TritonOps()
