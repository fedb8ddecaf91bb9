"""Lossless tree rejection sampling on the device, for every row of a batch at once.

The algorithm is SGLang's ``tree_speculative_sampling_target_only`` (multi-candidate, tree-aware, a
residual bonus). At node ``n`` let ``p`` be the target's distribution there (``sampling.distribution``:
temperature, top-k, top-p, min-p). Its children ``c_1, c_2, ...`` are tried in column order: ``c_i`` is
accepted with probability ``p(c_i) / (1 - p(c_1) - ... - p(c_{i-1}))``, which is the sequential rule
"accept ``c_i`` with probability ``p(c_i)``, else remove its mass and renormalise" in closed form. If no
child is accepted, the bonus token is drawn from ``p`` with the rejected children's mass removed; at a
leaf, from ``p``. Every candidate is a point mass, so ``P(emit x) = p(x)`` at every node: the output
is exactly the target's distribution.

Here every node's decision is made at once (``[B, T, K]`` gathers of the weights at the children's
tokens, ``K`` = the most children a node has), the accepted path follows from the tree's ancestor
mask, and only the path's last node ``f`` gets a residual for the bonus: ``ops.bonus`` draws by inverse
CDF from that node's weights, its children's tokens (all rejected) zeroed, at ``u`` times the remaining
mass (the reference: a cumsum and a search over ``[B, V]``; two Triton launches, ``spec.bonus_kernel``,
where its ``ROW_TABLE`` takes them: nowhere until a GPU has timed them). A root-only tree (the plain step,
the prefill's first token) takes the same op at the root. Greedy rows of the same batch walk the same way
with ``p`` the point mass at the argmax, so they get exactly ``accept_greedy_batch``'s result.

The draws come from ``rng.uniform`` keyed by the row's seed, its length at the step's start and a
lane: ``(depth, i)`` for the ``i``-th child of the path's node at that depth, ``(depth, K)`` for the
bonus. A node on the path is the only one of its depth that is, so no draw is used twice.
"""

from __future__ import annotations

import torch

from ..models import consts
from ..spec.ops import TORCH
from ..spec.tree import Tree
from ..spec.verify import accept_greedy_batch
from .penalties import penalize
from .sampling import FILTERED, GREEDY, PENALIZED


def draws(seed: torch.Tensor, lengths: torch.Tensor, width: int, k: int, ops=TORCH) -> torch.Tensor:
    """[B, width, k + 1] uniforms of a step whose rows start at ``lengths`` [B] (the seeds ``seed`` [B]):
    ``spec.rng.uniform`` at lane ``depth * (k + 1) + i``, one kernel on a GPU (``ops.uniform``)."""
    return ops.uniform(seed, lengths, width * (k + 1)).view(-1, width, k + 1)


def accept(tree: Tree, logits: torch.Tensor, width: int, kind: str, floats: torch.Tensor | None,
           ints: torch.Tensor | None, lengths: torch.Tensor, k: int, ops=TORCH, pen: tuple | None = None):
    """(cols [B, width], counts [B], bonus [B]) for a batch of ``kind`` (``SamplingRows.kind``) whose
    settings are ``floats`` [B, 3] and ``ints`` [B, 2] (``SamplingRows``' columns), rows starting at
    ``lengths`` [B], every node with at most ``k`` children: the engine's one acceptance, eager or
    inside a captured step. A greedy batch takes ``accept_greedy_batch`` (``ops``: one Triton kernel on
    a GPU). A PENALIZED batch's logits first go through ``penalties.penalize`` along the tree, ``pen``
    its (floats, bias, prompt, counts) (``SamplingRows.pen_tensors``). A sampled batch's distribution
    and draws are ``ops``' too."""
    if kind == GREEDY:
        return accept_greedy_batch(tree, logits.argmax(dim=-1), width, ops)
    if kind == PENALIZED:
        logits = penalize(logits, tree.tokens, tree.mask, *pen)
    u = draws(ints[:, 1], lengths, width, k if tree.size > 1 else 0, ops)
    return accept_rows(tree, logits, width, floats, ints, u, kind in (FILTERED, PENALIZED), ops)


def first_tokens(logits: torch.Tensor, kind: str, floats, ints, lengths: torch.Tensor,
                 pen: tuple | None = None, ops=TORCH) -> torch.Tensor:
    """[B] each row's first token from its prefill logits [B, V] (prompts of ``lengths`` [B]): the same
    acceptance on a tree of the root alone, keyed by the prompt's last position (the root's token is
    a placeholder: a root-only tree's penalties count the output alone, empty here)."""
    b = logits.shape[0]
    root = consts.full((b,), 0, torch.long, logits.device)
    return accept(Tree.root_only(root), logits[:, None], 1, kind, floats, ints, lengths - 1, 0, ops, pen)[2]


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


def _accepts(u: torch.Tensor, w: torch.Tensor, before: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Child i (weight ``w``, its earlier siblings' weights summing to ``before``, the node's total ``z``) is
    accepted when ``u < p(c_i) / (1 - p(c_1) - ... - p(c_{i-1}))``: the sequential rule, renormalised."""
    return (u * (z - before) < w) & (w > 0)


def accept_rows(tree: Tree, logits: torch.Tensor, width: int, floats: torch.Tensor, ints: torch.Tensor,
                u: torch.Tensor, filtered: bool, ops=TORCH):
    """(cols [B, width], counts [B], bonus [B]) by rejection sampling for every row (see the module's
    doc), ``accept_greedy_batch``'s shapes and padding: ``cols[b, :counts[b]]`` the accepted path root
    first, 0 after it. ``logits`` [B, T, V] the target's over the tree; ``u`` [B, width, K + 1] the
    step's uniforms (``draws``), ``K`` the most children any node has; ``filtered``: some row uses top-k
    or top-p. Rows with temperature 0 are greedy. The distribution is ``ops.distribution`` (a kernel
    with no sort on a GPU), the bonus ``ops.bonus``."""
    b, t, v = logits.shape
    k, dev = u.shape[-1] - 1, logits.device
    argmax = logits.argmax(dim=-1)  # [B, T]
    greedy = floats[:, 0] <= 0  # [B]
    x, m, thr, z = ops.distribution(logits.reshape(b * t, v), floats[:, None].expand(b, t, 3).reshape(b * t, 3),
                                ints[:, None].expand(b, t, 2).reshape(b * t, 2), filtered)
    x, m, thr, z = x.view(b, t, v), m.view(b, t), thr.view(b, t), z.view(b, t)
    if k > 0 and t > 1:
        kids, valid = children(tree.parents, k)  # [B, T, K]
        tok = tree.tokens.gather(1, kids.view(b, t * k)).view(b, t, k)
        xk = x.gather(2, tok)
        kept = valid & (xk >= thr[..., None])
        w = torch.exp(xk - m[..., None]) * kept  # the children's weights (p times z)
        uk = u[:, :, :k].gather(1, tree.depth[..., None].expand(b, t, k))  # lane (depth of the node, i)
        # every kept token a child: once the others are rejected the last kept one holds all the mass
        # (counted exactly, so rounding in rem cannot leave an empty residual)
        empty = (x >= thr[..., None]).sum(-1) == kept.sum(-1)
        last = kept & (kept.flip(-1).cumsum(-1).flip(-1) == 1)
        take = _accepts(uk, w, w.cumsum(-1) - w, z[..., None]) | (empty[..., None] & last)
        take = torch.where(greedy[:, None, None], tok == argmax[..., None], take) & valid
        first = kids.gather(2, take.long().argmax(-1, keepdim=True))[..., 0]
        choice = torch.where(take.any(-1), first, -1)  # [B, T] the accepted child's column, -1: none
        i = consts.arange(t, dev)
        chosen = (tree.parents < 0) | (choice.gather(1, tree.parents.clamp(min=0)) == i)
        on_path = ~(tree.mask & ~chosen[:, None, :]).any(-1)  # every ancestor-or-self chosen by its parent
        slot = torch.where(on_path, tree.depth, width)
        cols = torch.zeros((b, width + 1), dtype=torch.long, device=dev).scatter_(1, slot, i.expand(b, t))[:, :width]
        counts = on_path.sum(-1)
        f = cols.gather(1, (counts - 1)[:, None])[:, 0]  # [B] the path's last node
        at_f = f[:, None, None].expand(b, 1, k)
        rejected, rvalid = tok.gather(1, at_f)[:, 0], valid.gather(1, at_f)[:, 0]  # its children: all rejected
        mf, thrf, af = (a.gather(1, f[:, None])[:, 0] for a in (m, thr, argmax))
        ub = u[:, :, k].gather(1, (counts - 1)[:, None])[:, 0]  # lane (depth of the last node, K)
    else:  # the root alone: views, no gathers
        cols = consts.full((b, width), 0, torch.long, dev)
        counts = consts.full((b,), 1, torch.long, dev)
        f = consts.full((b,), 0, torch.long, dev)
        rejected = rvalid = None
        mf, thrf, af, ub = m[:, 0], thr[:, 0], argmax[:, 0], u[:, 0, k]
    bonus = torch.where(greedy, af, ops.bonus(x, f, mf, thrf, rejected, rvalid, ub))
    return cols, counts, bonus
