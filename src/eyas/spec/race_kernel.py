"""A sampled step's draws in one Triton launch: ``race.race`` (the reference) for
``verify_kernels.TritonVerifyOps.race``.

The reference builds ``[N, V]`` noise from about 90 integer torch ops, a log, a log, a where and an argmax
(``N`` = rows x tree nodes, ``V`` up to 152k): dozens of kernels over ``[N, V]`` inside the captured step. Here
program ``(r, s)`` reads chunk ``s`` of row ``r`` once, hashes each entry's lane from the row's key (the seed's
and the position's three mixes, made once a program), and keeps each lane's best score and its first index;
the chunk's best goes to ``[N, S]`` partials, and the row's draw is the first chunk's best among them (two
torch ops). A step has few rows and many tree nodes, or many rows: a row gets ``PROGRAMS // N`` chunks, 1 to
``CHUNKS``. The hash is the reference's to the bit (``verify_kernels._lowbias32``: uint32 products wrap by
themselves); the logs are the GPU's, so a draw differs from the reference's only where two scores are within
rounding of each other.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel

CHUNKS = 64  # the most chunks a row is cut into
PROGRAMS = 2048  # programs over all rows: a row gets PROGRAMS // rows chunks, 1 to CHUNKS
BLOCK = 512  # entries a program reads at a time; a chunk is a whole number of these
WARPS = 4


@triton.jit
def _lowbias32(x):
    """``rng._mix`` on uint32 values, whose products wrap modulo 2^32 by themselves."""
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _race_kernel(x, thr, greedy, seed, position, part_v, part_i, V, C, S, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program ``(r, s)``: of row ``r`` of ``x`` [N, V], entries ``[s * C, s * C + C)``, the best score (``x +
    gumbel`` where ``x >= thr[r]``; ``x`` for a ``greedy`` row) to ``part_v[r, s]`` and its first index to
    ``part_i[r, s]`` (a chunk of -inf alone: its first index)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    sd = tl.load(seed + r + offs * 0)  # [BLOCK] copies: the hash then runs on vectors alone
    pos = tl.load(position + r + offs * 0)
    h = _lowbias32((sd & 0xFFFFFFFF).to(tl.uint32) ^ tl.full([BLOCK], 0x9E3779B9, tl.uint32))
    h = _lowbias32(h ^ ((sd >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _lowbias32(h ^ (pos & 0xFFFFFFFF).to(tl.uint32))
    t = tl.load(thr + r)
    noisy = tl.load(greedy + r) == 0
    first = s * C
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    at = tl.minimum(first + offs, V - 1)
    for i in range(0, C, BLOCK):
        col = first + i + offs
        ok = (col < V) & (i + offs < C)
        xs = tl.load(x + r * V + col, mask=ok, other=float("-inf"))
        u = ((_lowbias32(h ^ col.to(tl.uint32)) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        score = tl.where(noisy, tl.where(xs >= t, xs - tl.log(-tl.log(u)), float("-inf")), xs)
        score = tl.where(ok, score, float("-inf"))
        at = tl.where(score > best, col, at)
        best = tl.maximum(best, score)
    top = tl.max(best, axis=0)
    tl.store(part_v + r * S + s, top)
    tl.store(part_i + r * S + s, tl.min(tl.where(best == top, at, V), axis=0))


def chunking(rows: int, vocab: int, chunks: int | None = None, block: int = BLOCK) -> tuple[int, int]:
    """(chunks a row, entries a chunk) for ``rows`` rows of ``vocab`` entries: ``chunks`` (default ``PROGRAMS //
    rows`` within 1..``CHUNKS``) of a whole number of ``block`` each, the last one short."""
    want = chunks or min(CHUNKS, max(1, PROGRAMS // max(rows, 1)))
    chunk = triton.cdiv(triton.cdiv(vocab, want), block) * block
    return triton.cdiv(vocab, chunk), chunk


def race(launch, x: torch.Tensor, thr: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor,
         position: torch.Tensor, chunks: int | None = None, block: int | None = None,
         warps: int | None = None) -> torch.Tensor:
    """``race.race(x [N, V], thr [N], greedy [N], seed [N], position [N])`` by ``_race_kernel`` through ``launch``
    (``TritonOps._launch``): [N] int64."""
    n, v = x.shape
    block = block or BLOCK
    s, chunk = chunking(n, v, chunks, block)
    part_v = torch.empty((n, s), dtype=torch.float32, device=x.device)
    part_i = torch.empty((n, s), dtype=torch.long, device=x.device)
    if n:
        launch(_race_kernel, (n, s), x.contiguous(), thr.contiguous(), greedy.contiguous().view(torch.uint8),
               seed.contiguous(), position.contiguous(), part_v, part_i, v, chunk, s, BLOCK=block,
               num_warps=warps or WARPS)
    return part_i.gather(1, part_v.argmax(dim=1, keepdim=True))[:, 0]
