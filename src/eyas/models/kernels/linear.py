"""Triton kernels of the block's projections, and their block shapes (``triton_ops.TritonOps``
launches them):

- ``linear`` / ``linear_silu`` / ``linear_add`` (``_linear_kernel``): a projection of one row (decode
  at batch 1) as a GEMV with what surrounds it inside: the RMSNorm before q/k/v, gate/up and the LM
  head, ``silu(gate) * up`` after gate/up (a program takes matching gate and up rows), the bias, and
  the residual add after o and down (cuBLAS needed a norm or silu kernel, split-K reductions and a
  copy around each; measured in docs/log/engine.md, "One-row projections in one kernel");
- ``_linear_rows_kernel``: the same for 2 to ``ROWS_MAX`` rows (a tree's verify, a draft level) on
  the tensor cores. More rows stay on cuBLAS.

``linear_config``, ``linear_rows_config`` and ``linear_candidates`` give each kernel's block shapes
for a weight; ``LINEAR_CONFIGS`` and ``LINEAR_ROWS_CONFIGS`` hold the benchmarks' overrides.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .pdl import _after_previous_kernel


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
