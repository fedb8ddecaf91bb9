"""A sampled step's draws in two Triton launches: ``draw.draw`` (the reference) for
``verify_kernels.TritonVerifyOps.draw``.

The reference weighs every row ``[N, V]`` (``N`` = rows x tree nodes, ``V`` up to 152k), then a cumsum, a
search, a clamp and a fallback: a dozen kernels over ``[N, V]`` inside the captured step. One program a row
would read its whole row alone when a step has few rows, so each row is cut into ``S`` chunks instead:

1. ``_draw_sums_kernel``, program ``(r, s)``: the sum of chunk ``s``'s weights ``w = exp(x - m)`` where
   ``x >= thr`` into ``sums`` ``[N, S]``, and the chunk's largest entry and its first index (a greedy row's);
2. ``_draw_pick_kernel``, program ``r``: a greedy row takes the first chunk's largest entry among the chunks';
   a sampled one the chunks' running sums (a scan of ``S`` values), the target ``u`` times their total, the
   first positive chunk whose running sum passes it, then a scan inside that chunk alone for the first
   positive-weight token whose running sum passes what is left.

The target comes from the same chunk sums the search walks, so the pick lands in a chunk with positive weight;
where rounding (the sums and the reference's cumsum add in other orders) leaves the target past the chunk's own
scan, the chunk's last positive-weight token is taken, and past the last chunk the row's: the reference's
fallback. A row with no positive weight gets 0, as there. The token differs from the reference's only where the
target is within rounding of a boundary between two tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel

CHUNKS = 64  # the most chunks a row is cut into (launch 1's programs a row)
PROGRAMS = 2048  # launch 1's programs over all rows: a row gets PROGRAMS // rows chunks, 1 to CHUNKS
BLOCK = 512  # entries a launch-1 program reads at a time; a chunk is a whole number of these
WARPS = 4  # launch 1's warps a program
SCAN_BLOCK = 512  # entries launch 2 scans at a time inside the chosen chunk
SCAN_WARPS = 4  # launch 2's warps a program


@triton.jit
def _weights(xs, m, thr):
    """The weights of entries ``xs`` (-inf past the row's end: below any threshold, ``thr >= FLOAT_MIN``)."""
    return tl.where(xs >= thr, tl.exp(xs - m), 0.0)


@triton.jit
def _draw_sums_kernel(x, m, thr, sums, maxv, maxi, V, CHUNK, S, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``sums[r, s]`` (program ``(r, s)``): the weights' sum over entries ``s * CHUNK ..`` of row ``r`` of ``x``;
    ``maxv[r, s]``, ``maxi[r, s]``: their largest entry and its first index (a chunk of -inf alone: its first)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)
    row = x + r * V
    mr, tr = tl.load(m + r), tl.load(thr + r)
    offs = tl.arange(0, BLOCK)
    lo = s * CHUNK
    end = tl.minimum(lo + CHUNK, V)
    acc = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    at = tl.minimum(lo + offs, V - 1)
    for start in range(lo, end, BLOCK):  # one read of each entry: its weight and the chunk's max
        idx = start + offs
        xs = tl.load(row + idx, mask=idx < end, other=float("-inf"))
        acc += _weights(xs, mr, tr)
        at = tl.where(xs > best, idx, at)
        best = tl.maximum(best, xs)
    top = tl.max(best, axis=0)
    tl.store(sums + r * S + s, tl.sum(acc, axis=0))
    tl.store(maxv + r * S + s, top)
    tl.store(maxi + r * S + s, tl.min(tl.where(best == top, at, V), axis=0))


@triton.jit
def _lowbias32(x):
    """``rng._mix`` on uint32 values, whose products wrap modulo 2^32 by themselves."""
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _uniform(seed, position, r):
    """``rng.uniform(seed[r], position[r], 0)``, the same bits (worked on two copies: the hash runs on vectors)."""
    two = tl.arange(0, 2)
    sd = tl.load(seed + r + two * 0)
    pos = tl.load(position + r + two * 0)
    h = _lowbias32((sd & 0xFFFFFFFF).to(tl.uint32) ^ tl.full([2], 0x9E3779B9, tl.uint32))
    h = _lowbias32(h ^ ((sd >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _lowbias32(h ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _lowbias32(h)  # lane 0
    return tl.max(((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0), axis=0)


@triton.jit
def _draw_pick_kernel(x, m, thr, greedy, seed, position, sums, maxv, maxi, out, V, CHUNK, S, S_P2: tl.constexpr,
                      BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``out[r]`` (program ``r``): a ``greedy`` row's first largest entry; else the first positive-weight token
    whose running weight passes ``rng.uniform(seed[r], position[r], 0)`` times the row's total, found through the
    chunk ``sums`` [N, S] and one chunk's scan (the module's doc)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, S_P2)
    mv = tl.load(maxv + r * S + j, mask=j < S, other=float("-inf"))
    top = tl.min(tl.where(mv == tl.max(mv, axis=0), j, S_P2), axis=0)
    argmax = tl.load(maxi + r * S + top)
    sm = tl.load(sums + r * S + j, mask=j < S, other=0.0)
    cum = tl.cumsum(sm, axis=0)
    target = _uniform(seed, position, r) * tl.sum(tl.where(j == S - 1, cum, 0.0), axis=0)
    first = tl.min(tl.where((cum > target) & (sm > 0), j, S_P2), axis=0)
    c = tl.where(first < S_P2, first, tl.max(tl.where(sm > 0, j, 0), axis=0))  # rounding past the end: the last
    left = target - tl.sum(tl.where(j == c - 1, cum, 0.0), axis=0)  # the target past the chunks before c
    row = x + r * V
    mr, tr = tl.load(m + r), tl.load(thr + r)
    offs = tl.arange(0, BLOCK)
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, V)
    run = tl.full([], 0.0, tl.float32)
    found = tl.full([], -1, tl.int32)
    last = tl.full([], -1, tl.int32)
    while (start < end) & (found < 0):
        idx = start + offs
        w = _weights(tl.load(row + idx, mask=idx < end, other=float("-inf")), mr, tr)
        hit = tl.min(tl.where((run + tl.cumsum(w, axis=0) > left) & (w > 0), idx, V), axis=0)
        found = tl.where(hit < V, hit, -1)
        last = tl.maximum(last, tl.max(tl.where(w > 0, idx, -1), axis=0))
        run += tl.sum(w, axis=0)
        start += BLOCK
    pick = tl.where(found >= 0, found, tl.maximum(last, 0)).to(tl.int64)  # past the chunk's scan: its last positive
    tl.store(out + r, tl.where(tl.load(greedy + r) != 0, argmax, pick))


def chunking(rows: int, vocab: int, chunks: int | None = None, block: int = BLOCK) -> tuple[int, int]:
    """(chunks a row, entries a chunk) for ``rows`` rows of ``vocab`` entries: ``chunks`` (default
    ``PROGRAMS // rows`` within 1..``CHUNKS``) of a whole number of ``block`` each, the last one short."""
    want = chunks or min(CHUNKS, max(1, PROGRAMS // max(rows, 1)))
    chunk = triton.cdiv(triton.cdiv(vocab, want), block) * block
    return triton.cdiv(vocab, chunk), chunk


def draw(launch, x: torch.Tensor, m: torch.Tensor, thr: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor,
         position: torch.Tensor, chunks: int | None = None, block: int | None = None, warps: int | None = None,
         scan_block: int | None = None, scan_warps: int | None = None) -> torch.Tensor:
    """``draw.draw(x [N, V], m [N], thr [N], greedy [N], seed [N], position [N])`` by ``_draw_sums_kernel`` and
    ``_draw_pick_kernel`` through ``launch`` (``TritonOps._launch``): [N] int64. ``chunks`` a row, ``block`` /
    ``warps`` (launch 1), ``scan_block`` / ``scan_warps`` (launch 2) default to the module's constants; the
    uniforms are hashed in the pick kernel, ``rng.uniform``'s bits."""
    n, v = x.shape
    x = x.contiguous()
    block = block or BLOCK
    s, chunk = chunking(n, v, chunks, block)
    sums, maxv = (torch.empty((n, s), dtype=torch.float32, device=x.device) for _ in range(2))
    maxi = torch.empty((n, s), dtype=torch.long, device=x.device)
    out = torch.empty(n, dtype=torch.long, device=x.device)
    if n:
        m, thr = m.contiguous(), thr.contiguous()
        launch(_draw_sums_kernel, (n, s), x, m, thr, sums, maxv, maxi, v, chunk, s, BLOCK=block,
               num_warps=warps or WARPS)
        launch(_draw_pick_kernel, (n,), x, m, thr, greedy.contiguous().view(torch.uint8), seed.contiguous(),
               position.contiguous(), sums, maxv, maxi, out, v, chunk, s, S_P2=max(2, triton.next_power_of_2(s)),
               BLOCK=scan_block or SCAN_BLOCK, num_warps=scan_warps or SCAN_WARPS)
    return out
