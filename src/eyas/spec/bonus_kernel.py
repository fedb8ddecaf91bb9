"""A sampled step's bonus draw in two Triton launches: ``tree_ops.TreeOps.bonus`` (the reference) for
``verify_kernels.TritonVerifyOps.bonus``.

The reference gathers the node's row of ``x`` ``[B, V]`` (``V`` up to 152k), weighs it, zeroes the
rejected children's tokens, then a cumsum, a search, a clamp and a fallback: a dozen kernels over
``[B, V]`` inside the captured step. One program a row would read its whole row alone, and a step
has few rows (1 to 16 most often), so the row is cut into ``S`` chunks instead:

1. ``_bonus_sums_kernel``, program ``(b, s)``: the sum of chunk ``s``'s weights ``w = exp(x - m)`` where
   ``x >= thr``, 0 at the rejected tokens, into ``sums`` ``[B, S]``;
2. ``_bonus_pick_kernel``, program ``b``: the chunks' running sums (a scan of ``S`` values), the target
   ``u`` times their total, the first positive chunk whose running sum passes it, then a scan inside
   that chunk alone for the first positive-weight token whose running sum passes what is left.

The target comes from the same chunk sums the search walks, so the pick lands in a chunk with positive
weight; where rounding (the sums and the reference's cumsum add in other orders) leaves the target past
the chunk's own scan, the chunk's last positive-weight token is taken, and past the last chunk the
row's: the reference's fallback. A row with no positive weight gets 0, as there. The token differs from
the reference's only where the target is within rounding of a boundary between two tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel

# (most rows, the kernel runs), first match. On the H200 (vocabulary 49,152; ``kernel_profile.py --bonus``,
# benchmarks/results/bonus-op-h200.json) the kernel took 0.017-0.035 ms at 1-64 rows against the reference's
# 0.05-0.19 ms, so it runs at every row count.
ROW_TABLE = ((1 << 62, True),)
CHUNKS = 64  # the most chunks a row is cut into (launch 1's programs a row)
PROGRAMS = 2048  # launch 1's programs over all rows: a row gets PROGRAMS // rows chunks, 1 to CHUNKS
BLOCK = 512  # entries a launch-1 program reads at a time; a chunk is a whole number of these
WARPS = 4  # launch 1's warps a program
SCAN_BLOCK = 512  # entries launch 2 scans at a time inside the chosen chunk
SCAN_WARPS = 4  # launch 2's warps a program


@triton.jit
def _rejected(rejected, valid, b, K, REJECTED: tl.constexpr, K_P2: tl.constexpr):
    """[K_P2] row ``b``'s rejected tokens (``rejected`` [B, K] where ``valid`` [B, K] uint8), -1 elsewhere."""
    kk = tl.arange(0, K_P2)
    if REJECTED:
        tok = tl.load(rejected + b * K + kk, mask=kk < K, other=-1)
        ok = tl.load(valid + b * K + kk, mask=kk < K, other=0) != 0
        return tl.where(ok, tok, -1)
    return tl.full([K_P2], -1, tl.int64)


@triton.jit
def _node(x, f, m, thr, rejected, valid, b, s_b, s_t, K, REJECTED: tl.constexpr, K_P2: tl.constexpr):
    """Row ``b``'s node: its logits' start in ``x``, its ``m`` and ``thr``, its rejected tokens (``_rejected``)."""
    row = x + b * s_b + tl.load(f + b) * s_t
    return row, tl.load(m + b), tl.load(thr + b), _rejected(rejected, valid, b, K, REJECTED, K_P2)


@triton.jit
def _weights(row, idx, end, m, thr, rej, REJECTED: tl.constexpr):
    """[BLOCK] the bonus's weights at entries ``idx`` of ``row`` (0 at ``end`` and past it)."""
    live = idx < end
    xs = tl.load(row + idx, mask=live, other=float("-inf"))
    keep = live & (xs >= thr)
    if REJECTED:
        keep = keep & (tl.sum((idx[:, None] == rej[None, :]).to(tl.int32), axis=1) == 0)
    return tl.where(keep, tl.exp(xs - m), 0.0)


@triton.jit
def _bonus_sums_kernel(x, f, m, thr, rejected, valid, sums, s_b, s_t, V, K, CHUNK, S, REJECTED: tl.constexpr,
                       K_P2: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``sums[b, s]`` (program ``(b, s)``): the weights' sum over entries ``s * CHUNK ..`` of row ``b``'s
    node ``f[b]`` in ``x`` (strides ``s_b``, ``s_t``; ``m``, ``thr`` [B] that node's)."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    row, mb, tb, rej = _node(x, f, m, thr, rejected, valid, b, s_b, s_t, K, REJECTED, K_P2)
    offs = tl.arange(0, BLOCK)
    lo = s * CHUNK
    end = tl.minimum(lo + CHUNK, V)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(lo, end, BLOCK):
        acc += _weights(row, start + offs, end, mb, tb, rej, REJECTED)
    tl.store(sums + b * S + s, tl.sum(acc, axis=0))


@triton.jit
def _bonus_pick_kernel(x, f, m, thr, rejected, valid, u, s_u, sums, out, s_b, s_t, V, K, CHUNK, S,
                       REJECTED: tl.constexpr, K_P2: tl.constexpr, S_P2: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
    """``out[b]`` (program ``b``): the first positive-weight token whose running weight passes ``u[b * s_u]``
    times the row's total, found through the chunk ``sums`` [B, S] and one chunk's scan (the module's doc)."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, S_P2)
    sm = tl.load(sums + b * S + j, mask=j < S, other=0.0)
    cum = tl.cumsum(sm, axis=0)
    target = tl.load(u + b * s_u) * tl.sum(tl.where(j == S - 1, cum, 0.0), axis=0)
    first = tl.min(tl.where((cum > target) & (sm > 0), j, S_P2), axis=0)
    c = tl.where(first < S_P2, first, tl.max(tl.where(sm > 0, j, 0), axis=0))  # rounding past the end: the last
    left = target - tl.sum(tl.where(j == c - 1, cum, 0.0), axis=0)  # the target past the chunks before c
    row, mb, tb, rej = _node(x, f, m, thr, rejected, valid, b, s_b, s_t, K, REJECTED, K_P2)
    offs = tl.arange(0, BLOCK)
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, V)
    run = tl.full([], 0.0, tl.float32)
    found = tl.full([], -1, tl.int32)
    last = tl.full([], -1, tl.int32)
    while (start < end) & (found < 0):
        idx = start + offs
        w = _weights(row, idx, end, mb, tb, rej, REJECTED)
        hit = tl.min(tl.where((run + tl.cumsum(w, axis=0) > left) & (w > 0), idx, V), axis=0)
        found = tl.where(hit < V, hit, -1)
        last = tl.maximum(last, tl.max(tl.where(w > 0, idx, -1), axis=0))
        run += tl.sum(w, axis=0)
        start += BLOCK
    pick = tl.where(found >= 0, found, tl.maximum(last, 0))  # past the chunk's scan: its last positive
    tl.store(out + b, pick.to(tl.int64))


def chosen(rows: int) -> bool:
    """Whether the kernel, not the reference, draws the bonus of ``rows`` rows (``ROW_TABLE``)."""
    return next(on for most, on in ROW_TABLE if rows <= most)


def launch_config(rows: int, vocab: int, chunks: int | None = None, block: int = BLOCK) -> tuple[int, int]:
    """(chunks a row, entries a chunk) for ``rows`` rows of ``vocab`` entries: ``chunks`` (default
    ``PROGRAMS // rows`` within 1..``CHUNKS``) of a whole number of ``block`` each, the last one short."""
    want = chunks or min(CHUNKS, max(1, PROGRAMS // max(rows, 1)))
    chunk = triton.cdiv(triton.cdiv(vocab, want), block) * block
    return triton.cdiv(vocab, chunk), chunk


def bonus(launch, x: torch.Tensor, f: torch.Tensor, m: torch.Tensor, thr: torch.Tensor, rejected: torch.Tensor | None,
          valid: torch.Tensor | None, u: torch.Tensor, chunks: int | None = None, block: int | None = None,
          warps: int | None = None, scan_block: int | None = None, scan_warps: int | None = None) -> torch.Tensor:
    """``TreeOps.bonus(x [B, T, V], f [B], m [B], thr [B], rejected [B, K] | None, valid [B, K] | None, u [B])``
    by ``_bonus_sums_kernel`` and ``_bonus_pick_kernel`` through ``launch`` (``TritonOps._launch``): [B] int64.
    ``x`` is read in place (any batch and node strides); ``chunks`` a row, ``block`` / ``warps`` (launch 1),
    ``scan_block`` / ``scan_warps`` (launch 2) default to the module's constants."""
    b, _, v = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    block = block or BLOCK
    s, chunk = launch_config(b, v, chunks, block)
    has = rejected is not None and rejected.shape[1] > 0
    k = rejected.shape[1] if has else 0
    f, m, thr = f.contiguous(), m.contiguous(), thr.contiguous()
    rej = rejected.contiguous() if has else f
    ok = valid.contiguous().view(torch.uint8) if has else f
    sums = torch.empty((b, s), dtype=torch.float32, device=x.device)
    out = torch.empty(b, dtype=torch.long, device=x.device)
    if b:
        common = dict(REJECTED=has, K_P2=max(2, triton.next_power_of_2(k)))
        launch(_bonus_sums_kernel, (b, s), x, f, m, thr, rej, ok, sums, x.stride(0), x.stride(1), v, k, chunk, s,
               **common, BLOCK=block, num_warps=warps or WARPS)
        launch(_bonus_pick_kernel, (b,), x, f, m, thr, rej, ok, u, u.stride(0), sums, out, x.stride(0), x.stride(1),
               v, k, chunk, s, **common, S_P2=max(2, triton.next_power_of_2(s)), BLOCK=scan_block or SCAN_BLOCK,
               num_warps=scan_warps or SCAN_WARPS)
    return out
