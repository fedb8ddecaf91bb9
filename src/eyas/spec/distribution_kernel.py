"""The sampling distribution's thresholds in one Triton kernel, without a sort: ``distribution.distribution``
(the reference) for ``verify_kernels.TritonVerifyOps.distribution``.

The reference sorts every row ``[N, V]`` where a row uses top-k or top-p (``N`` = rows x tree nodes, ``V``
up to 152k), then a cumsum and gathers: dozens of kernels inside the captured step. Here one program a
row finds the same ``(m, thr, z)`` by searching the row's values, a few passes over the row each:

- top-k's threshold is the largest value ``v`` with ``count(x >= v) >= k`` (the k-th largest, ties kept);
- top-p's is the smallest ``v`` with ``mass(x > v) < top_p * Z_k`` (masses ``exp(x - m)`` of the tokens
  top-k keeps, ``Z_k`` their total): the last entry of the sorted prefix whose mass *before* each entry is
  below ``top_p * Z_k``, which is the reference's ``thr_p``.

Both are steps of a monotone function that change only at the row's values, so a search over float32's
order-preserving integer image (``_key``) lands exactly on a value of the row. Each pass tests ``R``
candidate keys at once (an ``R + 1``-way split of the interval), so 2^32 keys take 8 passes for ``R`` = 16;
a row whose filter is off skips its search (an empty interval). ``x`` is the reference's own (``scaled``,
in torch), and so is ``log(min_p)``: the kernel's only rounding apart from the reference is in its sums
of ``exp`` (a different order), which moves a threshold only where the boundary is within rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel
from .distribution import scaled

NEG_INF_KEY = tl.constexpr(-2139095041)  # _key(-inf): the smallest key of a non-NaN float32
FLOAT_MIN = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min: a -inf logit is never kept
SPLIT = 16  # candidate keys a search pass tests (R)
BLOCK = 512  # a row's entries a program reads at a time
# (most rows, block, warps), first match: few rows read wide with many warps, many rows fill the GPU as they are;
# block 0: the reference (a sort) is faster there
ROW_CONFIGS = ((17, 0, 0), (132, 4096, 32), (264, 2048, 16), (1 << 62, BLOCK, 8))


@triton.jit
def _key(v):
    """float32 -> int32 in the same order (negative floats' bits but the sign flipped); its own inverse
    on the bits (``_value``)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _value(k):
    """The float32 whose ``_key`` is ``k`` (int64, within int32's range)."""
    b = k.to(tl.int32)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _distribution_kernel(x, floats, log_min_p, ints, m_out, thr_out, z_out, V, FILTERED: tl.constexpr,
                         BLOCK: tl.constexpr, R: tl.constexpr, PDL: tl.constexpr):
    """``(m, thr, z)`` of row ``r`` of ``x`` [N, V] (program ``r``) under ``floats`` [N, 3] (its top_p),
    ``log_min_p`` [N] (-inf: no min-p) and ``ints`` [N, 2] (its top_k); ``FILTERED``: top-k and top-p apply."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    row = x + r * V
    offs = tl.arange(0, BLOCK)
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        acc = tl.maximum(acc, tl.load(row + start + offs, mask=start + offs < V, other=float("-inf")))
    m = tl.max(acc, axis=0)
    thr = m + tl.load(log_min_p + r)  # min-p: -inf where it is off (log 0)
    if FILTERED:
        top_p = tl.load(floats + r * 3 + 1)
        top_k = tl.load(ints + r * 2)
        need = tl.minimum(top_k, V)
        j = tl.arange(0, R).to(tl.int64) + 1
        hi = _key(m).to(tl.int64)
        lo = tl.where(top_k > 0, tl.full([], NEG_INF_KEY, tl.int64), hi)
        while lo < hi:  # top-k: the largest key with count(x >= its value) >= k, in [lo, hi]
            c = hi - ((hi - lo) * j) // (R + 1)  # [R] in (lo, hi], descending
            v = _value(c)
            n = tl.zeros([R], tl.int32)
            for start in range(0, V, BLOCK):
                xs = tl.load(row + start + offs, mask=start + offs < V, other=float("-inf"))
                n += tl.sum((xs[:, None] >= v[None, :]).to(tl.int32), axis=0)  # v > -inf: padding never counts
            ok = n >= need
            lo = tl.max(tl.where(ok, c, lo), axis=0)
            hi = tl.min(tl.where(ok, hi, c - 1), axis=0)
        thr_k = tl.where(top_k > 0, _value(lo), float("-inf"))
        hi = _key(m).to(tl.int64)
        lo = tl.where(top_p < 1.0, _key(thr_k).to(tl.int64), hi)
        mass = tl.zeros([BLOCK], tl.float32)
        if lo < hi:
            for start in range(0, V, BLOCK):
                xs = tl.load(row + start + offs, mask=start + offs < V, other=float("-inf"))
                mass += tl.where(xs >= thr_k, tl.exp(xs - m), 0.0)
        target = top_p * tl.sum(mass, axis=0)  # top_p * Z_k
        while lo < hi:  # top-p: the smallest key with mass(x > its value) < target, in [lo, hi]
            c = lo + ((hi - lo) * j) // (R + 1)  # [R] in [lo, hi), ascending
            v = _value(c)
            g = tl.zeros([R], tl.float32)
            for start in range(0, V, BLOCK):
                xs = tl.load(row + start + offs, mask=start + offs < V, other=float("-inf"))
                e = tl.exp(xs - m)  # 0 for padding
                g += tl.sum(tl.where(xs[:, None] > v[None, :], e[:, None], 0.0), axis=0)  # v >= thr_k: top-k's
            ok = g < target
            hi = tl.min(tl.where(ok, c, hi), axis=0)
            lo = tl.max(tl.where(ok, lo, c + 1), axis=0)
        thr = tl.maximum(thr, tl.where(top_p < 1.0, _value(lo), float("-inf")))
        thr = tl.maximum(thr, thr_k)
    thr = tl.maximum(thr, FLOAT_MIN)
    z = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        xs = tl.load(row + start + offs, mask=start + offs < V, other=float("-inf"))
        z += tl.where(xs >= thr, tl.exp(xs - m), 0.0)
    tl.store(m_out + r, m)
    tl.store(thr_out + r, thr)
    tl.store(z_out + r, tl.sum(z, axis=0))


def launch_config(rows: int, filtered: bool) -> tuple[int, int] | None:
    """(entries a read, warps) for ``rows`` rows, or None where the sort-based reference is faster: one
    program a row, so a few rows leave most of the GPU idle; a wider read with more warps then does each
    pass in fewer iterations (``ROW_CONFIGS``)."""
    if not filtered:
        return BLOCK, 4
    block, warps = next((block, warps) for most, block, warps in ROW_CONFIGS if rows <= most)
    return (block, warps) if block else None


def distribution(launch, logits: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool,
                 split: int = SPLIT, block: int | None = None, warps: int | None = None):
    """``distribution.distribution(logits [N, V], floats [N, 3], ints [N, 2], filtered)``: ``x`` by the
    reference's ``scaled``, ``(m, thr, z)`` [N] by ``_distribution_kernel`` through ``launch``
    (``TritonOps._launch``); ``split`` candidates a pass (a power of 2), ``block`` entries a read and
    ``warps`` (default ``launch_config``'s)."""
    x = scaled(logits, floats).contiguous()
    n, v = x.shape
    default_block, default_warps = launch_config(n, filtered) or (BLOCK, 8)
    m, thr, z = (torch.empty(n, dtype=torch.float32, device=x.device) for _ in range(3))
    if n:
        launch(_distribution_kernel, (n,), x, floats.contiguous(), torch.log(floats[:, 2]), ints.contiguous(),
               m, thr, z, v, FILTERED=filtered, BLOCK=block or default_block, R=split,
               num_warps=warps or default_warps)
    return x, m, thr, z
