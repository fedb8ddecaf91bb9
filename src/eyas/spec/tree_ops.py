"""The token tree's operations as plain PyTorch: ``TreeOps``, the reference of drafting and verifying.

``tree_kernels.TritonTreeOps`` is the same operations as Triton kernels; ``spec.ops`` adds either to
the transformer block's ops (``models.torch_ops``, ``models.kernels``) as the engine's ``ops``.

    accept_greedy(tokens, parents, depth, mask, choice, width)
                                   -> greedy acceptance of a token tree: (cols, counts, bonus)
    tree_mask(lengths, tree_mask, prefix, window, dtype)
                                   -> the additive mask of a tree's verify over a cache window
    block_mask(lengths, counts, prefix, width, window, dtype)
                                   -> the same for a causal block of new tokens (the draft extend)
    top_children(logits, k, to_target, base, out)
                                   -> a draft tree level's k best children of each row: their
                                      log-probabilities (+ the parent's score) and target ids
    next_frontier(scores, tokens, hidden, k, offset, frontier, mask, slots)
                                   -> a tree level's k best candidates, the next level's input
    select_tree(scores, tokens, frontiers, root, scale, shift, size, k)
                                   -> the drafted tree: the best candidates, their parents, depths
                                      and ancestor mask
    distribution(logits, floats, ints, filtered)
                                   -> each row's sampling distribution in threshold form, (x, m, thr, z)
                                      (``distribution.distribution``)
    draw(x, m, thr, greedy, seed, position)
                                   -> each node's draw from that distribution at a uniform keyed by the row's
                                      seed and the node's position (``draw.draw``): a sampled step's choice
"""

from __future__ import annotations

import functools
import math

import torch

from ..models import consts, kv_cache
from .distribution import distribution
from .draw import draw


class TreeOps:
    """The tree's ops on any device; a mixin over the block's ops (``spec.ops``)."""

    def distribution(self, logits: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool):
        """Each row of ``logits`` [N, V]'s distribution under ``floats`` [N, 3], ``ints`` [N, 2]:
        ``(x [N, V], m [N], thr [N], z [N])``, ``distribution.distribution`` (the reference, a sort
        where ``filtered``)."""
        return distribution(logits, floats, ints, filtered)

    def draw(self, x: torch.Tensor, m: torch.Tensor, thr: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor,
             position: torch.Tensor) -> torch.Tensor:
        """[N] each row's draw (``draw.draw``): of ``x`` [N, V] (with ``m``, ``thr`` [N]) by inverse CDF at the
        uniform of ``seed`` [N] at ``position`` [N]; ``greedy`` [N] rows take the argmax."""
        return draw(x, m, thr, greedy, seed, position)

    def top_children(self, logits: torch.Tensor, k: int, to_target: torch.Tensor,
                     base: torch.Tensor | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` likeliest draft tokens of each row of ``logits`` ``[..., draft_vocab]``, best first:
        (their log-probabilities in float32, plus ``base[...]`` (the parent's score) when given, and
        their target ids, ``to_target[draft id]``), each ``[..., k]``; written into ``out`` (float32 and
        int64 views of that shape, such as slices of a tree's candidate buffers) when given."""
        scores, ids = topk(torch.log_softmax(logits, dim=-1, dtype=torch.float32), k)
        scores, tokens = (scores if base is None else scores + base[..., None]), to_target[ids]
        if out is None:
            return scores, tokens
        out[0].copy_(scores)
        out[1].copy_(tokens)
        return out

    def next_frontier(self, scores: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor, k: int, offset: int,
                      frontier: torch.Tensor, mask: torch.Tensor | None = None, slots: torch.Tensor | None = None):
        """One step of a draft tree's growth: of a level's ``k * k`` candidates (``scores``, ``tokens``
        ``[B, k * k]``, the children of frontier node ``i`` at ``i * k ..``), the ``k`` best become the
        next frontier, best first. Writes their candidate numbers (``offset`` + index) into
        ``frontier`` ``[B, k]`` and returns (their scores ``[B, k]`` float32, their parents' frontier
        slots ``[B, k]``, their tokens, their parents' rows of ``hidden`` ``[B, k, H]``, and with
        ``mask`` ``[B, k, W]`` (additive) their parents' mask rows with column ``slots[j]`` opened for
        node ``j``, else None)."""
        best_scores, best = scores.topk(k, dim=-1)
        parent = best // k
        rows = consts.arange(scores.shape[0], scores.device)[:, None]
        frontier.copy_(best + offset)
        if mask is not None:
            column = consts.arange(mask.shape[-1], mask.device)
            mask = torch.where(column[None, None, :] == slots[None, :, None], 0.0, mask[rows, parent])
        return best_scores, parent, tokens.gather(1, best), hidden[rows, parent], mask

    def select_tree(self, scores: torch.Tensor, tokens: torch.Tensor, frontiers: torch.Tensor, root: torch.Tensor,
                    scale: torch.Tensor, shift: torch.Tensor, size: int, k: int):
        """A drafted tree of ``size`` nodes from its candidates (``spec.drafter`` numbers them): the
        root, then the ``size - 1`` best by ``scores * scale - shift`` (``[B, C]``: the cumulative
        log-probabilities ranked deeper-below-shallower), in candidate order, so parents come first.
        Candidate ``c < k`` hangs off the root; one of the first fed level (``c < k + k * k``) off
        candidate ``(c - k) // k``; one of a later fed level ``l`` off ``frontiers[b, l - 1, f]``
        (``[B, L, k]``, the candidate numbers of each later level's frontier), ``f = (c - k) % (k * k)
        // k``. Returns (tokens, parents, depth ``[B, size]``, ancestor-or-self mask ``[B, size, size]``)."""
        bsz, dev = scores.shape[0], scores.device
        parts = [consts.full((bsz, k), -1, torch.long, dev)]
        if scores.shape[1] > k:
            levels = torch.cat([consts.arange(k, dev).expand(bsz, 1, k), frontiers], dim=1)  # [B, L + 1, k]
            parts.append(levels[..., None].expand(-1, -1, -1, k).reshape(bsz, -1))
        all_parents = torch.cat(parts, dim=1)  # [B, C]
        ranked = scores * scale - shift
        keep = ranked.topk(size - 1, dim=-1).indices.sort(dim=-1).values  # the chosen, in candidate order
        cand_parent = all_parents.gather(1, keep)
        at = torch.searchsorted(keep, cand_parent)  # each chosen node's parent among the chosen
        parent_col = torch.where(cand_parent < 0, 0, at + 1)
        if not keep.is_cuda:  # an invariant; not worth a GPU sync
            found = keep.gather(1, at.clamp(max=size - 2)) == cand_parent
            if bool(((cand_parent >= 0) & ~found).any()):
                raise RuntimeError("draft tree lost a parent: scores were not monotone along a path")
        tree_tokens = torch.cat([root[:, None], tokens.gather(1, keep)], dim=1)
        parents = torch.cat([consts.full((bsz, 1), -1, torch.long, dev), parent_col], dim=1)
        steps = 1 + (scores.shape[1] - k) // (k * k)
        depth, mask = ancestors(parents, steps)
        return tree_tokens, parents, depth, mask

    def accept_greedy(self, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor,
                      choice: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Greedy acceptance of a token tree per row (``spec.verify.accept_greedy_batch`` says what it
        means): ``tokens``, ``parents``, ``depth`` ``[B, T]``, ``mask`` ``[B, T, T]`` ancestor-or-self,
        ``choice`` ``[B, T]`` the target's greedy token after each node. Returns (cols ``[B, width]``,
        counts ``[B]``, bonus ``[B]``)."""
        correct = (tokens == choice.gather(1, parents.clamp(min=0))) | (parents < 0)  # [B, T]
        accepted = ~(mask & ~correct[:, None, :]).any(dim=-1)  # [B, T] self and every ancestor correct
        end = torch.where(accepted, depth, -1).argmax(dim=1)  # [B] deepest; argmax takes the first
        rows = consts.arange(tokens.shape[0], tokens.device)
        on_path = mask[rows, end]  # [B, T] the end node's ancestors and itself
        level = consts.arange(width, tokens.device)
        cols = (on_path[:, None, :] & (depth[:, None, :] == level[None, :, None])).long().argmax(dim=-1)
        return cols, depth[rows, end] + 1, choice[rows, end]

    def tree_mask(self, lengths: torch.Tensor, tree_mask: torch.Tensor, prefix: torch.Tensor, window: int,
                  dtype: torch.dtype) -> torch.Tensor:
        """The additive mask ``[B, 1, T, window]`` of a tree's verify: node ``t`` of row ``b`` sees the
        committed slots (``< lengths[b]``) and, of the tree written at slots ``prefix..`` (a 1-element
        tensor), itself and its ancestors (``tree_mask`` ``[B, T, T]``)."""
        bsz, size = tree_mask.shape[:2]
        column = consts.arange(window, tree_mask.device)
        rel = column - prefix  # [window]: a slot's column in the tree
        in_tree = (rel >= 0) & (rel < size)
        nodes = tree_mask.gather(2, rel.clamp(0, size - 1).expand(bsz, size, window)) & in_tree  # [B, T, window]
        return kv_cache.additive((column[None, None, :] < lengths[:, None, None]) | nodes, dtype)

    def block_mask(self, lengths: torch.Tensor, counts: torch.Tensor, prefix: torch.Tensor, width: int, window: int,
                   dtype: torch.dtype) -> torch.Tensor:
        """The additive mask ``[B, 1, width, window]`` of ``width`` new tokens a row written at slots
        ``prefix..`` (a 1-element tensor) of which row ``b`` keeps the first ``counts[b]``: token ``i``
        sees the committed slots (``< lengths[b]``) and the kept new ones up to itself, causally; a
        token past the kept ones (padding) sees them and itself, nothing between. (The draft extend's.)"""
        i = consts.arange(width, lengths.device)
        column = consts.arange(window, lengths.device)
        rel = column[None, :] - prefix  # [1, window]: index into the new block
        block = (rel >= 0) & (rel < width) & (rel <= i[:, None])  # [W, window] causal inside the block
        valid = (rel[None] < counts[:, None, None]) | (rel == i[:, None])[None]  # the kept ones, and itself
        committed = column[None, None, :] < lengths[:, None, None]  # [B, 1, window]
        return kv_cache.additive(committed | (block[None] & valid), dtype)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k)`` over the last axis (values descending). A long row (a draft vocabulary) goes in
    two stages: the top ``k`` of each of ``s`` slices, then the top ``k`` of those. The answer is the
    same (up to the order of ties), but one row no longer sits on one thread block: the one-stage
    top-k of a draft level's scores was the level's longest kernel (docs/log/engine.md, "Before the
    kernels"). ``s`` keeps rows x slices near 1024 blocks (64 slices for 8 rows, 8 for 128)."""
    v = x.shape[-1]
    if k == 1:
        return x.max(dim=-1, keepdim=True)
    rows = max(1, x.numel() // max(v, 1))
    slices = 1
    while slices < 64 and rows * slices * 2 <= 1024 and v % (slices * 2) == 0 and v // (slices * 2) >= 4 * k:
        slices *= 2
    if slices == 1:
        return x.topk(k, dim=-1)
    part, part_ids = x.unflatten(-1, (slices, v // slices)).topk(k, dim=-1)  # [..., slices, k]
    values, at = part.flatten(-2).topk(k, dim=-1)
    return values, (part_ids + _slice_starts(v, slices, x.device)).flatten(-2).gather(-1, at)


@functools.cache  # never evicted: captured graphs read these by address (see consts.py)
def _slice_starts(v: int, slices: int, device: torch.device) -> torch.Tensor:
    """``[slices, 1]``: the first index of each slice (made once, not in every graph replay)."""
    with torch.inference_mode(False):
        return torch.arange(0, v, v // slices, device=device)[:, None]


def ancestors(parents: torch.Tensor, max_depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth ``[B, T]``, ancestor-or-self mask ``[B, T, T]`` bool) of trees given by parent columns
    (``[B, T]``, -1 for the root; parents before children; at most ``max_depth`` deep when given).

    The closure of "is my parent" by squaring the one-hop matrix: ``ceil(log2(max_depth + 1))``
    batched matmuls (3 for a 6-level tree), a fixed count that never asks the device anything."""
    b, t = parents.shape
    dev = parents.device
    live = (parents >= 0)[..., None].float()
    reach = consts.eye(t, torch.float32, dev).expand(b, t, t).clone()  # float: bmm on every device
    reach.scatter_add_(2, parents.clamp(min=0)[..., None], live)  # self + parent
    rounds = math.ceil(math.log2((t if max_depth is None else max_depth) + 1))
    for _ in range(rounds):  # paths of <= 2^r hops; counts of paths, clamped back to 0 / 1
        reach = torch.bmm(reach, reach).clamp_(max=1)
    return (reach.sum(-1) - 1).long(), reach > 0
