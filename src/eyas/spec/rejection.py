"""The walk of tree rejection sampling: which drafted nodes a sampled step accepts (the torch reference).

``engine.sampler`` states the algorithm. Here every node's decision is made at once (``[B, T, K]``
gathers of the weights at the children's tokens, ``K`` = the most children a node has), and the
accepted path follows from the tree's ancestor mask; ``rejection_kernel`` walks the same path node by
node, one program a row, for ``TritonVerifyOps.walk``. The walk ends at the path's last node ``f``,
whose children (all rejected) the bonus draw removes from ``f``'s distribution (``TreeOps.bonus``);
``Path`` carries what that draw needs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..models import consts


class Path(NamedTuple):
    """A sampled step's accepted path and what its bonus draw needs, per row."""

    cols: torch.Tensor  # [B, width] the path's columns, root first, 0 after it
    counts: torch.Tensor  # [B] its length
    last: torch.Tensor  # [B] its last node f
    m: torch.Tensor  # [B] f's largest value (the distribution's m)
    thr: torch.Tensor  # [B] f's threshold
    rejected: torch.Tensor | None  # [B, K] f's children's tokens (all rejected); None: f has none (the root alone)
    valid: torch.Tensor | None  # [B, K] which of them are children
    u: torch.Tensor  # [B] the bonus's uniform: lane (depth of f, K)
    argmax: torch.Tensor  # [B] the target's argmax at f: a greedy row's bonus


def children(parents: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kids [B, T, k] the children's columns of each node in column order, valid [B, T, k]) from the
    parent pointers [B, T]; padding is column 0 with ``valid`` False."""
    b, t = parents.shape
    dev = parents.device
    i = consts.arange(t, dev)
    rank = ((parents[:, :, None] == parents[:, None, :]) & (i[:, None] > i[None, :])).sum(-1)  # earlier siblings
    ok = (parents >= 0) & (rank < k)
    slot = torch.where(ok, parents * k + rank, t * k)  # t * k: a junk slot for the root (and overflow)
    kids = torch.zeros((b, t * k + 1), dtype=torch.long, device=dev).scatter_(1, slot, i.expand(b, t))
    valid = torch.zeros((b, t * k + 1), dtype=torch.bool, device=dev).scatter_(1, slot, ok)
    return kids[:, : t * k].view(b, t, k), valid[:, : t * k].view(b, t, k)


def accepts(u: torch.Tensor, w: torch.Tensor, before: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Child i (weight ``w``, its earlier siblings' weights summing to ``before``, the node's total ``z``) is
    accepted when ``u < p(c_i) / (1 - p(c_1) - ... - p(c_{i-1}))``: the sequential rule, renormalised."""
    return (u * (z - before) < w) & (w > 0)


def walk(tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, x: torch.Tensor,
         m: torch.Tensor, thr: torch.Tensor, z: torch.Tensor, greedy: torch.Tensor, u: torch.Tensor,
         width: int) -> Path:
    """The accepted path of each row's tree (``tokens``, ``parents``, ``depth`` [B, T], ``mask`` [B, T, T]
    ancestor-or-self) under the target's distribution at each node (``x`` [B, T, V], ``m``, ``thr``, ``z``
    [B, T]: ``distribution``'s), the step's uniforms ``u`` [B, width, K + 1]; ``greedy`` [B] rows take the
    argmax instead, as ``accept_greedy_batch`` does."""
    b, t, _ = x.shape
    k, dev = u.shape[-1] - 1, x.device
    argmax = x.argmax(dim=-1)  # [B, T]
    kids, valid = children(parents, k)  # [B, T, K]
    tok = tokens.gather(1, kids.view(b, t * k)).view(b, t, k)
    xk = x.gather(2, tok)
    kept = valid & (xk >= thr[..., None])
    w = torch.exp(xk - m[..., None]) * kept  # the children's weights (p times z)
    uk = u[:, :, :k].gather(1, depth[..., None].expand(b, t, k))  # lane (depth of the node, i)
    # every kept token a child: once the others are rejected the last kept one holds all the mass
    # (counted exactly, so rounding in z - before cannot leave an empty residual)
    empty = (x >= thr[..., None]).sum(-1) == kept.sum(-1)
    last = kept & (kept.flip(-1).cumsum(-1).flip(-1) == 1)
    take = accepts(uk, w, w.cumsum(-1) - w, z[..., None]) | (empty[..., None] & last)
    take = torch.where(greedy[:, None, None], tok == argmax[..., None], take) & valid
    first = kids.gather(2, take.long().argmax(-1, keepdim=True))[..., 0]
    choice = torch.where(take.any(-1), first, -1)  # [B, T] the accepted child's column, -1: none
    i = consts.arange(t, dev)
    chosen = (parents < 0) | (choice.gather(1, parents.clamp(min=0)) == i)
    on_path = ~(mask & ~chosen[:, None, :]).any(-1)  # every ancestor-or-self chosen by its parent
    slot = torch.where(on_path, depth, width)
    cols = torch.zeros((b, width + 1), dtype=torch.long, device=dev).scatter_(1, slot, i.expand(b, t))[:, :width]
    counts = on_path.sum(-1)
    f = cols.gather(1, (counts - 1)[:, None])[:, 0]  # [B] the path's last node
    at_f = f[:, None, None].expand(b, 1, k)
    mf, thrf, af = (a.gather(1, f[:, None])[:, 0] for a in (m, thr, argmax))
    return Path(cols, counts, f, mf, thrf, tok.gather(1, at_f)[:, 0], valid.gather(1, at_f)[:, 0],
                u[:, :, k].gather(1, (counts - 1)[:, None])[:, 0], af)


def root_alone(x: torch.Tensor, m: torch.Tensor, thr: torch.Tensor, u: torch.Tensor, width: int) -> Path:
    """The path of a tree of the root alone (the plain step, the prefill's first token): views, no gathers."""
    b, dev = x.shape[0], x.device
    return Path(consts.full((b, width), 0, torch.long, dev), consts.full((b,), 1, torch.long, dev),
                consts.full((b,), 0, torch.long, dev), m[:, 0], thr[:, 0], None, None, u[:, 0, -1],
                x[:, 0].argmax(dim=-1))
