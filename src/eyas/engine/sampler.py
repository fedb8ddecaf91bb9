"""Lossless tree rejection sampling on the device, for every row of a batch at once.

The algorithm is SGLang's ``tree_speculative_sampling_target_only`` (multi-candidate, tree-aware, a
residual bonus). At node ``n`` let ``p`` be the target's distribution there (``sampling.distribution``:
temperature, top-k, top-p, min-p). Its children ``c_1, c_2, ...`` are tried in column order: ``c_i`` is
accepted with probability ``p(c_i) / (1 - p(c_1) - ... - p(c_{i-1}))``, which is the sequential rule
"accept ``c_i`` with probability ``p(c_i)``, else remove its mass and renormalise" in closed form. If no
child is accepted, the bonus token is drawn from ``p`` with the rejected children's mass removed; at a
leaf, from ``p``. Every candidate is a point mass, so ``P(emit x) = p(x)`` at every node: the output
is exactly the target's distribution.

Every row walks at once (``ops.walk``, ``spec.rejection``: a gather over every node in torch, one Triton
program a row on a GPU), to the path's last node ``f``, which alone gets a residual for the bonus:
``ops.bonus`` draws by inverse CDF from that node's weights, its children's tokens (all rejected) zeroed,
at ``u`` times the remaining mass (``spec.bonus_kernel`` on a GPU). A root-only tree (the plain step, the
prefill's first token) takes the same op at the root. Greedy rows of the same batch walk the same way
with ``p`` the point mass at the argmax, so they get exactly ``accept_greedy_batch``'s result.

The draws come from ``rng.uniform`` keyed by the row's seed, its length at the step's start and a
lane: ``(depth, i)`` for the ``i``-th child of the path's node at that depth, ``(depth, K)`` for the
bonus. A node on the path is the only one of its depth that is, so no draw is used twice.
"""

from __future__ import annotations

import torch

from ..models import consts
from ..sample.penalties import penalize
from ..sample.sampling import FILTERED, GREEDY, PENALIZED
from ..spec.ops import TORCH
from ..spec.rejection import root_alone
from ..spec.tree import Tree
from ..spec.verify import accept_greedy_batch


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


def accept_rows(tree: Tree, logits: torch.Tensor, width: int, floats: torch.Tensor, ints: torch.Tensor,
                u: torch.Tensor, filtered: bool, ops=TORCH):
    """(cols [B, width], counts [B], bonus [B]) by rejection sampling for every row (see the module's
    doc), ``accept_greedy_batch``'s shapes and padding: ``cols[b, :counts[b]]`` the accepted path root
    first, 0 after it. ``logits`` [B, T, V] the target's over the tree; ``u`` [B, width, K + 1] the
    step's uniforms (``draws``), ``K`` the most children any node has; ``filtered``: some row uses top-k
    or top-p. Rows with temperature 0 are greedy. The distribution is ``ops.distribution`` (a kernel
    with no sort on a GPU), the bonus ``ops.bonus``."""
    b, t, v = logits.shape
    k = u.shape[-1] - 1
    greedy = floats[:, 0] <= 0  # [B]
    walks = k > 0 and t > 1  # the walk's per-node argmax and kept count, where the distribution reads them
    x, m, thr, z, *side = ops.distribution(logits.reshape(b * t, v), floats[:, None].expand(b, t, 3).reshape(b * t, 3),
                                           ints[:, None].expand(b, t, 2).reshape(b * t, 2), filtered, side=walks)
    x, m, thr, z = x.view(b, t, v), m.view(b, t), thr.view(b, t), z.view(b, t)
    if walks:
        side = None if side[0] is None else tuple(s.view(b, t) for s in side)
        path = ops.walk(tree.tokens, tree.parents, tree.depth, tree.mask, x, m, thr, z, greedy, u, width, side)
    else:
        path = root_alone(x, m, thr, u, width)
    bonus = ops.bonus(x, path.last, path.m, path.thr, path.rejected, path.valid, path.u)
    return path.cols, path.counts, torch.where(greedy, path.argmax, bonus)
