"""Tree rejection sampling's walk as one Triton kernel: ``rejection.walk`` (the reference) for
``verify_kernels.TritonVerifyOps.walk``.

The reference decides every node of every row at once in about 80 small torch kernels (the children's
table, gathers, cumsums, the path from the ancestor mask), each a launch inside the captured step. Here
one program a row walks from the root: at node ``n`` (depth ``d``) its children, in column order, are
the lanes whose parent is ``n``; child ``i`` is taken when ``u(d, i) * (z - before) < w`` (``w`` its
weight ``exp(x - m)`` where kept, ``before`` its earlier siblings'), the first taken one is the next
node, and a node with none ends the path. The distribution's one-program kernel reads what the walk needs
of every node's entries on its way (``side``); elsewhere one pass over them goes before it
(``_argmax_kept_kernel``, in place of three torch kernels each reading them all): the argmax at every
node (a greedy row's choice; the first of equal maxima, as ``torch.argmax``) and the count of kept
tokens (when every kept token is a child, the last kept child takes what is left, exactly as in the
reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel
from .rejection import Path


@triton.jit
def _argmax_kept_kernel(x, thr, argmax, kept, V, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Row ``r`` of ``x`` [N, V] (program ``r``): ``argmax`` [N] its first largest entry's index, ``kept`` [N]
    its entries ``>= thr[r]``. Each lane keeps its own running best (the first, by a strict ``>``) and
    count; the lanes are combined once, after the row."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    row = x + r * V
    t = tl.load(thr + r)
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    at = tl.zeros([BLOCK], tl.int32)  # a row of -inf alone: index 0, as torch
    n = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        i = start + offs
        xs = tl.load(row + i, mask=i < V, other=float("-inf"))
        better = xs > best
        best = tl.where(better, xs, best)
        at = tl.where(better, i, at)
        n += ((xs >= t) & (i < V)).to(tl.int32)
    top = tl.max(best, axis=0)
    tl.store(argmax + r, tl.min(tl.where(best == top, at, V), axis=0).to(tl.int64))
    tl.store(kept + r, tl.sum(n, axis=0).to(tl.int64))


@triton.jit
def _walk_kernel(x, m, thr, z, kept, argmax, greedy, tokens, parents, u, cols, counts, last, m_f, thr_f, u_f,
                 rejected, valid, argmax_f, T, V, WIDTH, K, T_P2: tl.constexpr, W_P2: tl.constexpr,
                 K_P2: tl.constexpr, PDL: tl.constexpr):
    """Row ``b``'s path (program ``b``): ``x`` [B, T, V], ``m``, ``thr``, ``z``, ``kept`` (tokens kept) and
    ``argmax`` [B, T] per node, ``greedy`` [B], the tree's ``tokens`` and ``parents`` [B, T], ``u`` [B, WIDTH,
    K + 1]; writes ``Path``'s fields."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, T_P2)
    live = i < T
    tok = tl.load(tokens + b * T + i, mask=live, other=0)
    par = tl.load(parents + b * T + i, mask=live, other=-2)
    is_greedy = tl.load(greedy + b) != 0
    level = tl.arange(0, W_P2)
    path = tl.zeros([W_P2], tl.int32)
    cur = tl.zeros([], tl.int32)
    n = tl.full([], 1, tl.int32)
    going = tl.full([], 1, tl.int32)
    for d in range(0, WIDTH - 1):
        if going != 0:
            node = b * T + cur
            kid = live & (par == cur)
            rank = tl.cumsum(kid.to(tl.int32), axis=0) - 1  # earlier siblings
            kid = kid & (rank < K)
            if is_greedy:
                take = kid & (tok == tl.load(argmax + node))
            else:
                xk = tl.load(x + node * V + tok, mask=kid, other=float("-inf"))
                ok = kid & (xk >= tl.load(thr + node))
                w = tl.where(ok, tl.exp(xk - tl.load(m + node)), 0.0)
                uk = tl.load(u + (b * WIDTH + d) * (K + 1) + rank, mask=kid, other=1.0)
                take = ok & (uk * (tl.load(z + node) - (tl.cumsum(w, axis=0) - w)) < w) & (w > 0)
                n_ok = tl.sum(ok.to(tl.int32), axis=0)
                if tl.load(kept + node) == n_ok:  # every kept token a child: the last kept one takes the rest
                    take = take | (ok & (rank == tl.max(tl.where(ok, rank, -1), axis=0)))
            first = tl.min(tl.where(take, i, T_P2), axis=0)
            if first < T_P2:
                path = tl.where(level == n, first, path)
                n += 1
                cur = first
            else:
                going = going * 0
    node = b * T + cur
    kid = live & (par == cur)
    rank = tl.cumsum(kid.to(tl.int32), axis=0) - 1
    kid = kid & (rank < K)
    j = tl.arange(0, K_P2)
    at = kid[None, :] & (rank[None, :] == j[:, None])  # [K_P2, T_P2]: f's child of rank j
    tl.store(rejected + b * K + j, tl.sum(tl.where(at, tok[None, :], 0), axis=1), mask=j < K)
    tl.store(valid + b * K + j, (tl.sum(at.to(tl.int32), axis=1) > 0).to(tl.uint8), mask=j < K)
    tl.store(cols + b * WIDTH + level, path.to(tl.int64), mask=level < WIDTH)
    tl.store(counts + b, n.to(tl.int64))
    tl.store(last + b, cur.to(tl.int64))
    tl.store(m_f + b, tl.load(m + node))
    tl.store(thr_f + b, tl.load(thr + node))
    tl.store(u_f + b, tl.load(u + (b * WIDTH + n - 1) * (K + 1) + K))
    tl.store(argmax_f + b, tl.load(argmax + node).to(tl.int64))


def walk(launch, tokens: torch.Tensor, parents: torch.Tensor, x: torch.Tensor, m: torch.Tensor, thr: torch.Tensor,
         z: torch.Tensor, greedy: torch.Tensor, u: torch.Tensor, width: int, side: tuple | None = None) -> Path:
    """``rejection.walk`` through ``launch`` (``TritonOps._launch``): the argmax and kept count of every node
    (``side`` [B, T] each, where the distribution's kernel read them already), then the walk."""
    b, t, v = x.shape
    k, dev = u.shape[-1] - 1, x.device
    x, thr = x.contiguous(), thr.contiguous()
    if side is not None:
        argmax, kept = side
    else:
        argmax, kept = (torch.empty((b, t), dtype=torch.long, device=dev) for _ in range(2))
        launch(_argmax_kept_kernel, (b * t,), x, thr, argmax, kept, v, BLOCK=4096, num_warps=8)
    cols = torch.empty((b, width), dtype=torch.long, device=dev)
    counts, last, argmax_f = (torch.empty(b, dtype=torch.long, device=dev) for _ in range(3))
    m_f, thr_f, u_f = (torch.empty(b, dtype=torch.float32, device=dev) for _ in range(3))
    rejected = torch.empty((b, k), dtype=torch.long, device=dev)
    valid = torch.empty((b, k), dtype=torch.uint8, device=dev)
    launch(_walk_kernel, (b,), x, m.contiguous(), thr, z.contiguous(), kept, argmax,
           greedy.contiguous().view(torch.uint8), tokens.contiguous(), parents.contiguous(), u.contiguous(), cols,
           counts, last, m_f, thr_f, u_f, rejected, valid, argmax_f, t, v, width, k,
           T_P2=max(2, triton.next_power_of_2(t)), W_P2=max(2, triton.next_power_of_2(width)),
           K_P2=max(2, triton.next_power_of_2(k)), num_warps=1)
    return Path(cols, counts, last, m_f, thr_f, rejected, valid.view(torch.bool), u_f, argmax_f)
