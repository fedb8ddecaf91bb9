"""Lossless sampling on the device, speculative or not, for every row of a batch at once.

A sampled step is a greedy step whose "argmax" is a draw: at each node of the verified tree the target's
distribution (``ops.distribution``: temperature, top-k, top-p, min-p, after penalties and grammar masks) is
drawn from by inverse CDF (``ops.draw``, ``spec.draw``) at a uniform keyed by the row's seed and the node's
position; then ``accept_greedy_batch`` accepts the path that carries each node's draw and emits the draw
at its last node. Every emitted token is a draw from the target's distribution at its prefix, so the output is
exactly the target's distribution, and a seeded row's text does not depend on the tree (nor on the batch):
speculative or not, any tree, the same tokens. Greedy rows of the same batch take the argmax, as a greedy
batch does; the prefill's first token is the same acceptance on a tree of the root alone.
"""

from __future__ import annotations

import torch

from ..models import consts
from ..sample.penalties import penalize
from ..sample.sampling import FILTERED, GREEDY, PENALIZED
from ..spec.ops import TORCH
from ..spec.tree import Tree
from ..spec.verify import accept_greedy_batch


def accept(tree: Tree, logits: torch.Tensor, width: int, kind: str, floats: torch.Tensor | None,
           ints: torch.Tensor | None, lengths: torch.Tensor, ops=TORCH, pen: tuple | None = None):
    """(cols [B, width], counts [B], bonus [B]) for a batch of ``kind`` (``SamplingRows.kind``) whose
    settings are ``floats`` [B, 3] and ``ints`` [B, 2] (``SamplingRows``' columns), each row's root at
    position ``lengths`` [B]: the engine's one acceptance, eager or
    inside a captured step. A greedy batch takes ``accept_greedy_batch`` (``ops``: one Triton kernel on
    a GPU). A PENALIZED batch's logits first go through ``penalties.penalize`` along the tree, ``pen``
    its (floats, bias, prompt, counts) (``SamplingRows.pen_tensors``). A sampled batch's distribution
    and draws are ``ops``' too."""
    if kind == GREEDY:
        return accept_greedy_batch(tree, logits.argmax(dim=-1), width, ops)
    if kind == PENALIZED:
        logits = penalize(logits, tree.tokens, tree.mask, *pen)
    return accept_rows(tree, logits, width, floats, ints, lengths, kind in (FILTERED, PENALIZED), ops)


def first_tokens(logits: torch.Tensor, kind: str, floats, ints, lengths: torch.Tensor,
                 pen: tuple | None = None, ops=TORCH) -> torch.Tensor:
    """[B] each row's first token from its prefill logits [B, V] (prompts of ``lengths`` [B]): the same
    acceptance on a tree of the root alone, keyed by the prompt's last position (the root's token is
    a placeholder: a root-only tree's penalties count the output alone, empty here)."""
    b = logits.shape[0]
    root = consts.full((b,), 0, torch.long, logits.device)
    return accept(Tree.root_only(root), logits[:, None], 1, kind, floats, ints, lengths - 1, ops, pen)[2]


def accept_rows(tree: Tree, logits: torch.Tensor, width: int, floats: torch.Tensor, ints: torch.Tensor,
                lengths: torch.Tensor, filtered: bool, ops=TORCH):
    """(cols [B, width], counts [B], bonus [B]) by a draw at every node (see the module's doc),
    ``accept_greedy_batch``'s shapes and padding: ``cols[b, :counts[b]]`` the accepted path root first, 0 after
    it. ``logits`` [B, T, V] the target's over the tree, each row's root at position ``lengths`` [B] (a node's
    draw is keyed by its position, the root's plus its depth); ``filtered``: some row uses top-k or top-p.
    Rows with temperature 0 are greedy."""
    b, t, v = logits.shape
    x, m, thr, _ = ops.distribution(logits.reshape(b * t, v), floats[:, None].expand(b, t, 3).reshape(b * t, 3),
                                    ints[:, None].expand(b, t, 2).reshape(b * t, 2), filtered)
    greedy = (floats[:, 0] <= 0)[:, None].expand(b, t).reshape(b * t)
    seed = ints[:, 1, None].expand(b, t).reshape(b * t)
    position = (lengths[:, None] + tree.depth).reshape(b * t)
    return accept_greedy_batch(tree, ops.draw(x, m, thr, greedy, seed, position).view(b, t), width, ops)
