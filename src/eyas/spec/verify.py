"""Lossless verification of a draft tree against the target's logits.

Greedy: walk from the root; at each node the target's argmax must equal one child's token to go
on. The bonus token is the target's argmax at the last accepted node. ``accept_greedy_batch`` does
the same for every row at once with tensor operations only (no host sync, static shapes): it is
what the engine runs; ``accept_greedy`` is the plain walk it is tested against.

Sampling is the same acceptance with each node's draw (``draw.py``) in place of the argmax
(``engine/sampler.py``), greedy rows of the batch included.

``finite_rows`` is the guard around all of it: a row whose logits hold a NaN or an infinity (a
numerical fault of the model on that row's input) is ended alone by the engine, never verified.
"""

from __future__ import annotations

import torch

from ..models import consts
from .ops import TORCH
from .tree import Tree


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """[B] bool on the device: row b's logits (``[B, vocab]`` or ``[B, T, vocab]``) are usable.

    One reduction over what the forward wrote: each position's largest logit is finite. ``amax``
    propagates NaN, so a NaN anywhere, a +inf anywhere, or a position of -inf alone clears the flag;
    a -inf among finite logits (a masked token) is a valid distribution and keeps it."""
    return torch.isfinite(logits.amax(dim=-1)).reshape(len(logits), -1).all(dim=1)


def accept_greedy(tree: Tree, argmax: torch.Tensor, row: int) -> tuple[list[int], int]:
    """(accepted columns starting with the root 0, bonus token) for one row; argmax is [T]."""
    kids = tree.children(row)
    tokens = tree.tokens[row].tolist()
    best = argmax.tolist()
    path, node = [0], 0
    while True:
        nxt = next((c for c in kids[node] if tokens[c] == best[node]), None)
        if nxt is None:
            return path, best[node]
        path.append(nxt)
        node = nxt


def accept_greedy_batch(
    tree: Tree,
    argmax: torch.Tensor,  # [B, T] the target's choice after each node
    width: int,  # >= the tree's depth + 1 (num_steps + 1): the static width of the result
    ops=TORCH,  # ``ops_for`` the target's forward: on a GPU's static cache one Triton kernel
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cols [B, width], counts [B], bonus [B]): ``accept_greedy`` for every row, on the device.

    A node is accepted when it and all its ancestors carry the target's choice at their parent.
    Siblings carry distinct tokens, so the accepted nodes form one path; its deepest node (the
    first column on a tie, as the walk finds it) ends it. ``cols[b, :counts[b]]`` is that path
    root first; the rest is 0, the root's column, which the commit and gathers read harmlessly.
    ``ops.accept_greedy`` computes it: about 15 torch kernels, or one Triton kernel."""
    if tree.size == 1:  # plain decoding: the root alone, the bonus its argmax (no kernel but a view)
        b = argmax.shape[0]
        return (consts.full((b, width), 0, torch.long, argmax.device), consts.full((b,), 1, torch.long, argmax.device),
                argmax[:, 0])
    return ops.accept_greedy(tree.tokens, tree.parents, tree.depth, tree.mask, argmax, width)


def accepted_path(tree: Tree, aux: torch.Tensor | None, cols: torch.Tensor, counts: torch.Tensor,
                  bonus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What an acceptance emits and feeds to the draft: ``new`` [B, width], row b's accepted tokens past
    the root then its bonus token in ``new[b, :counts[b]]``, and the aux states of the accepted nodes
    (root first) [B, width, n * H] (None without ``aux``)."""
    path = tree.tokens.gather(1, cols)
    new = torch.cat([path[:, 1:], consts.full((path.shape[0], 1), 0, path.dtype, path.device)], dim=1)
    new.scatter_(1, (counts - 1)[:, None], bonus[:, None])
    return new, None if aux is None else aux.gather(1, cols[..., None].expand(-1, -1, aux.shape[-1]))
