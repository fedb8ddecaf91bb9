"""The sampling distribution's thresholds in Triton kernels, without a sort: ``distribution.distribution``
(the reference) for ``verify_kernels.TritonVerifyOps.distribution``.

The reference sorts every row ``[N, V]`` where a row uses top-k or top-p (``N`` = rows x tree nodes, ``V``
up to 152k), then a cumsum and gathers: dozens of kernels inside the captured step. Here the same
``(m, thr, z)`` come from searching the row's values, a few passes over the row each:

- top-k's threshold is the largest value ``v`` with ``count(x >= v) >= k`` (the k-th largest, ties kept);
- top-p's is the smallest ``v`` with ``mass(x > v) < top_p * Z_k`` (masses ``exp(x - m)`` of the tokens
  top-k keeps, ``Z_k`` their total): the last entry of the sorted prefix whose mass *before* each entry is
  below ``top_p * Z_k``, which is the reference's ``thr_p``.

Both are steps of a monotone function that change only at the row's values, so a search over float32's
order-preserving integer image (``_key``) lands exactly on a value of the row. Each pass tests ``R``
candidate keys at once (an ``R + 1``-way split of the interval), so 2^32 keys take 8 passes for ``R`` = 16;
a row whose filter is off skips its search (an empty interval). ``x`` is the reference's own (``scaled``,
in torch), and so is ``log(min_p)``: the kernels' only rounding apart from the reference is in their sums
of ``exp`` (a different order), which moves a threshold only where the boundary is within rounding.

Two ways to run it, chosen by the row count (``launch_config``):

- ``_distribution_kernel``: one program a row, every pass in it (many rows fill the GPU);
- the split (``_split_kernel``, few rows): each row in ``S`` chunks, one program each, one launch a pass.
  A program writes its chunk's partial counts or masses of the ``R`` candidates; the next launch's programs
  each re-read their row's ``S`` partials and narrow the interval the same way (the state a launch
  leaves is its program 0's), then count for their chunk. The number of launches is fixed (``passes``
  a search, with the row max fused into top-k's first pass, whose interval is then every key); a pass
  whose interval is already empty reads nothing. ``_split_sum_kernel`` adds the chunks' ``z``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel
from .distribution import scaled

NEG_INF_KEY = tl.constexpr(-2139095041)  # _key(-inf): the smallest key of a non-NaN float32
POS_INF_KEY = tl.constexpr(2139095040)  # _key(inf): the largest
KEYS = 2139095040 + 2139095041  # the widest interval a search narrows, [_key(-inf), _key(inf)], less one
FLOAT_MIN = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min: a -inf logit is never kept
SPLIT = 16  # candidate keys a search pass tests (R) by default
BLOCK = 512  # a row's entries a program reads at a time by default
# what a split launch's pass does (KIND) and the one before it did (PREV); ``.value`` on the host
NONE, MAX, TOP_K, TOP_P, Z = (tl.constexpr(i) for i in range(5))


class Config(NamedTuple):
    """How ``distribution`` runs: ``programs`` a row (1: ``_distribution_kernel``; more: the split, each
    row in that many chunks), ``candidates`` keys a search pass tests (R, a power of 2), ``block`` entries a
    read and ``warps`` a program."""

    programs: int
    candidates: int
    block: int
    warps: int


# (most rows, config), first match; None: the reference (a sort). Measured with ``kernel_profile.py
# --distribution`` (vocabulary 49,152, T 0.7, top-p 0.95; docs/engine.md, *Figures*): up to 32 rows the split,
# 64 programs a row, is fastest (0.06-0.17 ms at 1-32 rows on the H200, against the sort's 0.13-0.38 and one
# program a row's 0.37); it runs to 40 rows so that a 32-node tree's verify (33 rows) takes it. At 66 rows the
# split at 16 programs a row leads (0.177 ms on the H100); from 132 rows on, one program a row reading 1,024
# entries at a time with 16 warps does, by a third against that split and against one program at 512 x 8 warps
# (H100: 0.21 / 0.42 / 0.83 / 1.63 / 3.24 ms at 132 / 264 / 528 / 1,056 / 2,112 rows, against 0.32 / 0.65 /
# 1.19 / 2.46 / 4.98). More candidates a pass (fewer passes) cost more at every row count measured.
ROW_CONFIGS = ((40, Config(64, 16, 256, 4)), (100, Config(16, 16, 256, 4)), (1 << 62, Config(1, SPLIT, 1024, 16)))
# the same for rows without top-k and top-p (a max pass and a z pass): 0.022-0.024 ms split, 0.037 one program a row
UNFILTERED_CONFIGS = ((40, Config(32, 1, 1024, 4)), (1 << 62, Config(1, 1, BLOCK, 4)))


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
    col = offs[:, None]
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
            n = tl.zeros([BLOCK, R], tl.int32)  # summed across the block once, after the row (no sync a read)
            for start in range(0, V, BLOCK):  # read as a column: no layout change for the [BLOCK, R] tests
                xs = tl.load(row + start + col, mask=start + col < V, other=float("-inf"))
                n += (xs >= v[None, :]).to(tl.int32)  # v > -inf: padding never counts
            ok = tl.sum(n, axis=0) >= need
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
            g = tl.zeros([BLOCK, R], tl.float32)
            for start in range(0, V, BLOCK):
                xs = tl.load(row + start + col, mask=start + col < V, other=float("-inf"))
                g += tl.where(xs > v[None, :], tl.exp(xs - m), 0.0)  # v >= thr_k: top-k's; exp 0 for padding
            ok = tl.sum(g, axis=0) < target
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


@triton.jit
def _read(row, offs, V):
    """A row's entries at ``offs``, -inf past its ``V``."""
    return tl.load(row + offs, mask=offs < V, other=float("-inf"))


@triton.jit
def _split_kernel(x, floats, log_min_p, ints, maxes, part_in, part_out, state_in, state_out, m_out, thr_out, V, C, S,
                  PREV: tl.constexpr, KIND: tl.constexpr, R: tl.constexpr, S_P2: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    """One launch of the split (program ``(r, s)``: entries ``[s * C, s * C + C)`` of row ``r`` of ``x`` [N, V]).
    Its prologue narrows the interval of the pass before (``PREV``) from that pass's partials ``part_in``
    [N, S, R + 1] of every chunk and its state ``state_in`` [N, 3] (lo, hi, _key(thr_k)); its pass
    (``KIND``) writes this chunk's partials to ``part_out`` and program 0 the new state to ``state_out``:
    ``MAX`` the chunk's max (to ``maxes`` [N, S]); ``TOP_K`` counts ``x >= v`` (and, first, the max);
    ``TOP_P`` masses ``x > v``, and ``Z_k``'s at ``R``; ``Z`` the chunk's ``z`` at 0, with program 0
    writing ``m`` and ``thr``. Counts are stored as float32's bits."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    row = x + r * V
    offs = s.to(tl.int64) * C + tl.arange(0, BLOCK)
    col = offs[:, None]
    parts = tl.arange(0, S_P2)
    j = tl.arange(0, R).to(tl.int64) + 1
    mine = part_out + (r * S + s) * (R + 1)
    if PREV != NONE:
        m = tl.max(tl.load(maxes + r * S + parts, mask=parts < S, other=float("-inf")), axis=0)
    if PREV == TOP_K or PREV == TOP_P:  # narrow the pass before's interval by every chunk's partials
        lo = tl.load(state_in + r * 3)
        hi = tl.load(state_in + r * 3 + 1)
        tile = part_in + (r * S + parts[:, None]) * (R + 1) + (j - 1)[None, :]
        if lo < hi:
            if PREV == TOP_K:
                c = hi - ((hi - lo) * j) // (R + 1)  # the candidates that pass tested
                n = tl.sum(tl.load(tile, mask=(parts < S)[:, None], other=0.0).to(tl.int32, bitcast=True), axis=0)
                ok = n >= tl.minimum(tl.load(ints + r * 2), V)
                lo, hi = tl.max(tl.where(ok, c, lo), axis=0), tl.min(tl.where(ok, hi, c - 1), axis=0)
            else:
                c = lo + ((hi - lo) * j) // (R + 1)
                g = tl.sum(tl.load(tile, mask=(parts < S)[:, None], other=0.0), axis=0)
                z_k = tl.sum(tl.load(part_in + (r * S + parts) * (R + 1) + R, mask=parts < S, other=0.0), axis=0)
                ok = g < tl.load(floats + r * 3 + 1) * z_k
                lo, hi = tl.max(tl.where(ok, lo, c + 1), axis=0), tl.min(tl.where(ok, c, hi), axis=0)
    if KIND == MAX:
        mx = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, C, BLOCK):
            mx = tl.maximum(mx, _read(row, offs + start, V))
        tl.store(maxes + r * S + s, tl.max(mx, axis=0))
    if KIND == TOP_K:
        if PREV == NONE:  # every key: m is not known yet
            lo = tl.full([], NEG_INF_KEY, tl.int64)
            hi = tl.where(tl.load(ints + r * 2) > 0, POS_INF_KEY, NEG_INF_KEY).to(tl.int64)
        mx = tl.full([BLOCK, 1], float("-inf"), tl.float32)
        if lo < hi:
            v = _value(hi - ((hi - lo) * j) // (R + 1))  # [R] in (lo, hi], descending: > -inf
            n = tl.zeros([BLOCK, R], tl.int32)  # summed across the block once, after the chunk
            for start in range(0, C, BLOCK):
                xs = _read(row, col + start, V)  # a column: no layout change for the [BLOCK, R] tests
                mx = tl.maximum(mx, xs)
                n += (xs >= v[None, :]).to(tl.int32)
            tl.store(mine + j - 1, tl.sum(n, axis=0).to(tl.float32, bitcast=True))
        elif PREV == NONE:
            for start in range(0, C, BLOCK):
                mx = tl.maximum(mx, _read(row, col + start, V))
        if PREV == NONE:
            tl.store(maxes + r * S + s, tl.max(mx))
        thr_k = tl.zeros([], tl.float32)
    if KIND == TOP_P:
        top_p = tl.load(floats + r * 3 + 1)
        if PREV == TOP_K:  # top-k's threshold found: top-p's search starts
            thr_k = tl.where(tl.load(ints + r * 2) > 0, _value(lo), float("-inf"))
            hi = _key(m).to(tl.int64)
            lo = tl.where(top_p < 1.0, _key(thr_k).to(tl.int64), hi)
        else:
            thr_k = _value(tl.load(state_in + r * 3 + 2))
        if lo < hi:
            v = _value(lo + ((hi - lo) * j) // (R + 1))  # [R] in [lo, hi), ascending: >= thr_k
            g = tl.zeros([BLOCK, R], tl.float32)
            z_k = tl.zeros([BLOCK, 1], tl.float32)
            for start in range(0, C, BLOCK):
                xs = _read(row, col + start, V)
                e = tl.exp(xs - m)  # 0 past V
                g += tl.where(xs > v[None, :], e, 0.0)
                z_k += tl.where(xs >= thr_k, e, 0.0)
            tl.store(mine + j - 1, tl.sum(g, axis=0))
            tl.store(mine + R, tl.sum(z_k))
    if KIND == TOP_K or KIND == TOP_P:
        if s == 0:
            tl.store(state_out + r * 3, lo)
            tl.store(state_out + r * 3 + 1, hi)
            tl.store(state_out + r * 3 + 2, _key(thr_k).to(tl.int64))
    if KIND == Z:
        thr = m + tl.load(log_min_p + r)  # min-p: -inf where it is off (log 0)
        if PREV == TOP_P:
            thr = tl.maximum(thr, tl.where(tl.load(floats + r * 3 + 1) < 1.0, _value(lo), float("-inf")))
            thr = tl.maximum(thr, _value(tl.load(state_in + r * 3 + 2)))  # thr_k
        thr = tl.maximum(thr, FLOAT_MIN)
        z = tl.zeros([BLOCK], tl.float32)
        for start in range(0, C, BLOCK):
            xs = _read(row, offs + start, V)
            z += tl.where(xs >= thr, tl.exp(xs - m), 0.0)
        tl.store(mine, tl.sum(z, axis=0))
        if s == 0:
            tl.store(m_out + r, m)
            tl.store(thr_out + r, thr)


@triton.jit
def _split_sum_kernel(part, z_out, S, W, S_P2: tl.constexpr, PDL: tl.constexpr):
    """``z`` of row ``r`` (program ``r``): the sum of its chunks' (``part`` [N, S, W] at 0)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    parts = tl.arange(0, S_P2)
    tl.store(z_out + r, tl.sum(tl.load(part + (r * S + parts) * W, mask=parts < S, other=0.0), axis=0))


def passes(candidates: int) -> int:
    """A search's passes at ``candidates`` keys a pass: each leaves at most 1 / (candidates + 1) of the
    interval, which starts at most ``KEYS`` wide; the split runs them all."""
    n = 1
    while (candidates + 1) ** n <= KEYS:
        n += 1
    return n


def launch_config(rows: int, filtered: bool) -> Config | None:
    """How ``distribution`` runs ``rows`` rows (``ROW_CONFIGS``, ``UNFILTERED_CONFIGS``), or None where the
    sort-based reference is faster."""
    return next(config for most, config in (ROW_CONFIGS if filtered else UNFILTERED_CONFIGS) if rows <= most)


def config_rows() -> list[int]:
    """A row count for each launch configuration (``ROW_CONFIGS``, ``UNFILTERED_CONFIGS``): what a warm-up draws
    at, so that each configuration's kernels compile then, not while a request waits."""
    return sorted({1} | {most + 1 for table in (ROW_CONFIGS, UNFILTERED_CONFIGS) for most, _ in table[:-1]})


def distribution(launch, logits: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool,
                 config: Config | None = None):
    """``distribution.distribution(logits [N, V], floats [N, 3], ints [N, 2], filtered)``: ``x`` by the
    reference's ``scaled``, ``(m, thr, z)`` [N] by the kernels through ``launch`` (``TritonOps._launch``) as
    ``config`` says (default ``launch_config``'s; where that is the sort, the one-program kernel's)."""
    x = scaled(logits, floats).contiguous()
    n, v = x.shape
    config = config or launch_config(n, filtered) or Config(1, SPLIT, BLOCK, 8)
    m, thr, z = (torch.empty(n, dtype=torch.float32, device=x.device) for _ in range(3))
    args = (x, floats.contiguous(), torch.log(floats[:, 2]), ints.contiguous())
    if n and config.programs == 1:
        launch(_distribution_kernel, (n,), *args, m, thr, z, v, FILTERED=filtered, BLOCK=config.block,
               R=config.candidates, num_warps=config.warps)
    elif n:
        _split(launch, args, m, thr, z, filtered, config)
    return x, m, thr, z


def _split(launch, args, m, thr, z, filtered: bool, config: Config) -> None:
    """The split's launches: ``passes`` of top-k then of top-p (or one of the max), the z pass, the sum."""
    n, v = args[0].shape
    chunk = triton.cdiv(triton.cdiv(v, config.programs), config.block) * config.block
    s, r = triton.cdiv(v, chunk), config.candidates if filtered else 1
    # a launch's in, the next's out: each its own allocation, not two halves of one, whose second half's address
    # is 16-byte aligned for some row counts only, and Triton compiles a variant for each (a request waited on it)
    part = [torch.empty((n, s, r + 1), dtype=torch.float32, device=m.device) for _ in range(2)]
    state = [torch.empty((n, 3), dtype=torch.int64, device=m.device) for _ in range(2)]
    maxes = torch.empty((n, s), dtype=torch.float32, device=m.device)
    kinds = [TOP_K.value] * passes(r) + [TOP_P.value] * passes(r) + [Z.value] if filtered else [MAX.value, Z.value]
    s_p2 = triton.next_power_of_2(s)
    for i, (prev, kind) in enumerate(zip([NONE.value, *kinds], kinds)):
        launch(_split_kernel, (n, s), *args, maxes, part[(i - 1) % 2], part[i % 2], state[(i - 1) % 2], state[i % 2],
               m, thr, v, chunk, s, PREV=prev, KIND=kind, R=r, S_P2=s_p2, BLOCK=config.block, num_warps=config.warps)
    launch(_split_sum_kernel, (n,), part[(len(kinds) - 1) % 2], z, s, r + 1, S_P2=s_p2, num_warps=1)
