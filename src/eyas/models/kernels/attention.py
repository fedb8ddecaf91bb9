"""Triton kernels of the block's attention (``triton_ops.TritonOps`` launches them):

- ``rope_store``: one program per (token, head) of the fused q/k/v projection. Query heads are
  (optionally normed, for Qwen3) rotated into the query tensor, key heads are rotated and written
  straight into the static cache at the step's slots, value heads copied there. Cos and sin come
  from the ``RopeTable`` at each token's position, read in the kernel;
- ``attend`` (two kernels): the query heads that share a KV head as one block of rows, each with
  its own row of the unfolded mask, over the cache window read in place; the window is split
  across programs and the splits combined (flash-decoding).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pdl import _after_previous_kernel


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
                   part_o, part_ml, W, T, per_split, scale, hidden, HKV, SPLITS, M_PAD,
                   REP: tl.constexpr, D: tl.constexpr, D_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, M_BLOCKS: tl.constexpr, DIRECT: tl.constexpr, EXACT: tl.constexpr,
                   UPCAST: tl.constexpr, PDL: tl.constexpr):
    """Attention of the ``REP * T`` query rows that share KV head ``g`` (row ``r`` is query head
    ``g * REP + r // T`` at token ``r % T``) over slots ``[split * per_split, ..)`` of the cache,
    with the additive mask ``[B, 1, T, W]``. One split writes the output; several write their
    unnormalised partials for ``_attend_combine_kernel`` (flash-decoding). ``EXACT``: dot products
    without TF32 (float32 models); ``UPCAST``: 16-bit operands taken to float32 first (for the
    interpreter, whose bfloat16 ``dot`` is wrong in Triton 3.9). A hidden slot (a mask entry below ``hidden``:
    the dtype's minimum) weighs exactly 0, so the blocks past the last one that any of these rows sees (a
    window bucket's room beyond the longest row) are not read at all: a decode step at 350 tokens in a window
    of 1,024 reads a third of it. Where no row here sees a slot of this split, l stays 0, which the output and
    ``_attend_combine_kernel`` take as no contribution (zeros for a row that sees nothing at all)."""
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
    last = lo + ((hi - lo - 1) // BLOCK_N) * BLOCK_N  # the last block's first slot (lo - BLOCK_N: none)
    looking = last >= lo
    while looking:  # from the end: blocks no row here sees are skipped, their mask read instead of K and V
        n = last + tl.arange(0, BLOCK_N)
        add = tl.load(mask + b * s_mb + t[:, None] * s_mt + n[None, :] * s_mn, mask=live[:, None] & (n < hi)[None, :],
                      other=-float("inf")).to(tl.float32)
        looking = tl.max(tl.max(add, axis=1), axis=0) < hidden
        last = tl.where(looking, last - BLOCK_N, last)
        looking = looking & (last >= lo)
    for start in range(lo, last + BLOCK_N, BLOCK_N):
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
        seen = tl.where(l_i > 0, l_i, 1.0)
        tl.store(dst, (acc / seen[:, None]).to(out.dtype.element_ty), mask=live[:, None] & dv[None, :])
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
    l = tl.load(part_ml + at * 2 + 1, mask=spv, other=0.0)  # noqa: E741
    w = tl.exp(m - tl.max(m, axis=0))
    o = tl.load(part_o + at[:, None] * D_P2 + d[None, :], mask=spv[:, None], other=0.0)
    total = tl.sum(l * w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    head = g * REP + r // T
    t = r % T
    tl.store(out + b * s_ob + t * s_ot + head * s_oh + d, res.to(out.dtype.element_ty), mask=d < D)
