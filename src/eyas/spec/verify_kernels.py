"""Triton kernels of a verified tree's ops, and ``TritonVerifyOps``, which launches them: ``tree_ops.TreeOps``'s
acceptance, masks and draws in one launch each.

- ``accept_greedy``: greedy acceptance of a verified tree: each node checked against the target's
  choice at its parent and its ancestors', the deepest accepted path, its length and bonus token;
- ``tree_mask`` / ``block_mask`` (one kernel): the verify's and the draft extend's additive masks over
  a cache window, built from each row's length and the tree (or the accepted count);
- ``distribution``: a sampled step's distribution in threshold form without the reference's sort
  (``distribution_kernel``);
- ``draw``: each node's draw from it, in two launches, several programs a row (``draw_kernel``).

``TritonVerifyOps`` is a mixin over ``TritonOps`` (its ``_launch`` and ``_or_torch``); a kernel that
cannot run falls back to the ``TreeOps`` reference together with the forward's kernels (``failed``).
``tree_kernels.TritonTreeOps`` adds the drafting kernels to it. The kernels agree with ``TreeOps``
exactly (``tests/models/test_kernels.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..models.kernels.pdl import _after_previous_kernel
from . import distribution_kernel, draw_kernel
from .tree_ops import TreeOps


@triton.jit
def _accept_greedy_kernel(tokens, parents, depth, mask, choice, cols, counts, bonus, T, WIDTH,
                          T_P2: tl.constexpr, W_P2: tl.constexpr, PDL: tl.constexpr):
    """``TreeOps.accept_greedy`` for one row of trees (program ``b``): node ``i`` is accepted when it and
    every ancestor (``mask[b, i, :]``) carry the target's ``choice`` at their parent; the deepest
    accepted node (the first on a tie) ends the path, whose node at each depth goes to ``cols``."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, T_P2)
    live = i < T
    tok = tl.load(tokens + b * T + i, mask=live, other=-1)
    par = tl.load(parents + b * T + i, mask=live, other=-1)
    dep = tl.load(depth + b * T + i, mask=live, other=0)
    want = tl.load(choice + b * T + tl.maximum(par, 0), mask=live, other=-1)
    correct = (tok == want) | (par < 0)
    anc = tl.load(mask + (b * T + i[:, None]) * T + i[None, :], mask=live[:, None] & live[None, :], other=0) != 0
    wrong = tl.sum((anc & (correct == 0)[None, :]).to(tl.int32), axis=1)  # [T]: ancestors (or self) not correct
    score = tl.where(live & (wrong == 0), dep, -1)
    end = tl.min(tl.where(score == tl.max(score, axis=0), i, T_P2), axis=0)  # the deepest, the first on a tie
    path = tl.sum(tl.where(i[:, None] == end, anc.to(tl.int32), 0), axis=0) != 0  # [T] end's ancestors and itself
    level = tl.arange(0, W_P2)
    at = tl.sum(tl.where(path[None, :] & (dep[None, :] == level[:, None]), i[None, :], 0), axis=1)  # [W]
    tl.store(cols + b * WIDTH + level, at.to(tl.int64), mask=level < WIDTH)
    tl.store(counts + b, (tl.sum(tl.where(i == end, dep, 0), axis=0) + 1).to(tl.int64))
    tl.store(bonus + b, tl.load(choice + b * T + end).to(tl.int64))


@triton.jit
def _new_block_mask_kernel(lengths, tree, s_tb, counts, prefix, out, T, W, low, TREE: tl.constexpr,
                           BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``TreeOps.tree_mask`` (``TREE``) or ``block_mask`` for row ``b`` and new token ``t`` (program
    ``b * T + t``), ``BLOCK`` columns of the window per program: 0 where the token sees the slot, ``low``
    (the dtype's min) elsewhere. It sees the row's committed slots and, of the ``T`` new ones written at
    ``prefix..``, with ``TREE`` itself and its ancestors (``tree[b, t]``), else the first ``counts[b]``
    up to itself (a token past them, padding, sees those and itself). ``s_tb``: ``tree``'s batch stride
    (0 for one tree shared by every row)."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    b = r // T
    t = r % T
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rel = c - tl.load(prefix)
    inside = (rel >= 0) & (rel < T) & (c < W)
    if TREE:
        seen = tl.load(tree + b * s_tb + t * T + rel, mask=inside, other=0) != 0
    else:
        seen = inside & (rel <= t) & ((rel < tl.load(counts + b)) | (rel == t))
    visible = (c < tl.load(lengths + b)) | seen
    tl.store(out + r * W + c, tl.where(visible, 0.0, low).to(out.dtype.element_ty), mask=c < W)


class TritonVerifyOps(TreeOps):
    """The verified tree's ops as Triton kernels, a mixin over ``TritonOps`` (its ``_or_torch``):
    ``accept_greedy``, the masks, the distribution and the draws fall back to the ``TreeOps``
    reference with the forward's kernels (``failed``)."""

    def accept_greedy(self, tokens, parents, depth, mask, choice, width: int):
        return self._or_torch(lambda: self._accept_greedy(tokens, parents, depth, mask, choice, width),
                              lambda: TreeOps.accept_greedy(self, tokens, parents, depth, mask, choice, width))

    def tree_mask(self, lengths, tree_mask, prefix, window: int, dtype: torch.dtype):
        return self._or_torch(lambda: self._tree_mask(lengths, tree_mask, prefix, window, dtype),
                              lambda: TreeOps.tree_mask(self, lengths, tree_mask, prefix, window, dtype))

    def block_mask(self, lengths, counts, prefix, width: int, window: int, dtype: torch.dtype):
        return self._or_torch(lambda: self._block_mask(lengths, counts, prefix, width, window, dtype),
                              lambda: TreeOps.block_mask(self, lengths, counts, prefix, width, window, dtype))

    def distribution(self, logits: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool):
        if distribution_kernel.launch_config(logits.shape[0], filtered) is None:  # measured: the sort is faster
            return TreeOps.distribution(self, logits, floats, ints, filtered)
        return self._or_torch(lambda: distribution_kernel.distribution(self._launch, logits, floats, ints, filtered),
                              lambda: TreeOps.distribution(self, logits, floats, ints, filtered))

    def draw(self, x, m, thr, greedy, seed, position):
        return self._or_torch(lambda: draw_kernel.draw(self._launch, x, m, thr, greedy, seed, position),
                              lambda: TreeOps.draw(self, x, m, thr, greedy, seed, position))

    def _accept_greedy(self, tokens, parents, depth, mask, choice, width):
        bsz, t = tokens.shape
        dev = tokens.device
        cols = torch.empty((bsz, width), dtype=torch.long, device=dev)
        counts = torch.empty(bsz, dtype=torch.long, device=dev)
        bonus = torch.empty(bsz, dtype=torch.long, device=dev)
        self._launch(_accept_greedy_kernel, (bsz,), tokens.contiguous(), parents.contiguous(), depth.contiguous(),
                     mask.contiguous().view(torch.uint8), choice.contiguous(), cols, counts, bonus, t, width,
                     T_P2=max(2, triton.next_power_of_2(t)), W_P2=max(2, triton.next_power_of_2(width)), num_warps=4)
        return cols, counts, bonus

    def _tree_mask(self, lengths, tree_mask, prefix, window, dtype):
        if not tree_mask[0].is_contiguous():  # each row's [T, T] in place; rows apart, or one shared (stride 0)
            tree_mask = tree_mask.contiguous()
        return self._new_block_mask(lengths, tree_mask.view(torch.uint8), lengths, prefix, tree_mask.shape[1], window,
                                    dtype)

    def _block_mask(self, lengths, counts, prefix, width, window, dtype):
        return self._new_block_mask(lengths, None, counts, prefix, width, window, dtype)

    def _new_block_mask(self, lengths, tree, counts, prefix, t, window, dtype):
        bsz = lengths.shape[0]
        out = torch.empty((bsz, 1, t, window), dtype=dtype, device=lengths.device)
        block = min(1024, triton.next_power_of_2(window))
        self._launch(_new_block_mask_kernel, (bsz * t, triton.cdiv(window, block)), lengths.contiguous(),
                     lengths if tree is None else tree, 0 if tree is None else tree.stride(0), counts.contiguous(),
                     prefix.reshape(1), out, t, window, torch.finfo(dtype).min, TREE=tree is not None, BLOCK=block,
                     num_warps=4)
        return out

