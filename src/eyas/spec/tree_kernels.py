"""Triton kernels of drafting the token tree, and ``TritonTreeOps``, which launches them and the verified
tree's (``verify_kernels``): ``tree_ops.TreeOps`` in fewer launches.

- ``top_children`` (two kernels): a draft tree level's expansion. The first splits each row of
  draft logits into blocks and takes, per block, its max, its sum of exponentials and its ``k``
  best entries (``k`` rounds of argmax in registers); the second combines a row's blocks into the
  log-softmax normaliser and the row's ``k`` best, adds the parent's score and maps the draft ids
  to target ids. It replaces a log-softmax, a two-stage ``topk`` (sort-based kernels) and three
  small kernels. It writes straight into the tree's candidate buffers;
- ``next_frontier`` and ``select_tree``: the rest of a draft tree's bookkeeping. One kernel a level
  picks the next frontier and gathers its tokens, hidden rows and mask rows (a ``topk``, a division,
  three gathers and a ``maximum`` before); one at the end picks the tree from all candidates and
  writes its tokens, parents, depths and ancestor mask (about 30 torch kernels before: ``cat``s,
  ``topk``, ``sort``, ``searchsorted``, and the ancestor closure's batched matmuls).

The verified tree's kernels (``accept_greedy``, ``tree_mask`` / ``block_mask``, ``distribution``, ``draw``) are in
``verify_kernels``; ``TritonTreeOps`` is its ``TritonVerifyOps`` with the kernels above. All launch through
``TritonOps._launch`` and fall back through ``TritonOps._or_torch``, under the instance's
``KernelSettings`` and the process's ``triton_ops.FAILURES`` (``top_children_failed`` is the drafting
kernels'). ``SpecTritonOps`` at the end is the block's kernels and the tree's together: the engine's
ops on the GPU (``spec.ops.ops_for``). It is composed here, not in ``models``,
because ``models`` never imports ``spec``; and not in ``spec.ops``, which must import without Triton.
The kernels agree with ``TreeOps`` exactly (``tests/models/test_kernels.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import EyasError
from ..models.kernels.pdl import _after_previous_kernel
from ..models.kernels.triton_ops import TritonOps, _rows
from .tree_ops import TreeOps
from .verify_kernels import TritonVerifyOps


@triton.jit
def _top_children_kernel(x, x_row, n, part_v, part_i, part_ml, SPLITS: tl.constexpr, K: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    c = tl.arange(0, BLOCK)
    at_ = s * BLOCK + c
    v = tl.load(x + r * x_row + at_, mask=at_ < n, other=float("-inf")).to(tl.float32)
    m = tl.max(v, axis=0)  # every block holds at least one real entry: m is finite
    out = r * SPLITS + s
    tl.store(part_ml + out * 2, m)
    tl.store(part_ml + out * 2 + 1, tl.sum(tl.exp(v - m), axis=0))
    for j in tl.static_range(K):
        best = tl.max(v, axis=0)
        pick = tl.argmax(v, axis=0)  # the first of equal entries
        tl.store(part_v + out * K + j, best)
        tl.store(part_i + out * K + j, s * BLOCK + pick)
        v = tl.where(c == pick, float("-inf"), v)


@triton.jit
def _top_children_combine_kernel(part_v, part_i, part_ml, base, s_bb, to_target, scores, tokens, s_ob, R,
                                 SPLITS: tl.constexpr, K: tl.constexpr, SPLITS_P2: tl.constexpr,
                                 CAND_P2: tl.constexpr, HAS_BASE: tl.constexpr, PDL: tl.constexpr):
    """Row ``r`` is row ``r % R`` of batch row ``r // R``: its parent's score is at ``base + (r // R) *
    s_bb + r % R``, its ``K`` results at ``scores`` / ``tokens + (r // R) * s_ob + (r % R) * K``."""
    _after_previous_kernel(PDL)
    r = tl.program_id(0).to(tl.int64)
    si = tl.arange(0, SPLITS_P2)
    m = tl.load(part_ml + (r * SPLITS + si) * 2, mask=si < SPLITS, other=float("-inf"))
    l = tl.load(part_ml + (r * SPLITS + si) * 2 + 1, mask=si < SPLITS, other=0.0)  # noqa: E741
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(l * tl.exp(m - top), axis=0))
    ci = tl.arange(0, CAND_P2)
    live = ci < SPLITS * K
    v = tl.load(part_v + r * SPLITS * K + ci, mask=live, other=float("-inf"))
    ids = tl.load(part_i + r * SPLITS * K + ci, mask=live, other=0)
    at = (r // R) * s_ob + (r % R) * K
    for j in tl.static_range(K):
        best = tl.max(v, axis=0)
        pick = tl.argmax(v, axis=0)  # the first: the lower block, so the lower id, of equal entries
        score = best - lse
        if HAS_BASE:
            score = score + tl.load(base + (r // R) * s_bb + r % R)
        tl.store(scores + at + j, score)
        tl.store(tokens + at + j, tl.load(to_target + tl.sum(tl.where(ci == pick, ids, 0), axis=0)))
        v = tl.where(ci == pick, float("-inf"), v)


@triton.jit
def _next_frontier_kernel(scores, tokens, s_c, hidden, s_hb, s_hk, mask, s_mb, s_mk, slots, out_scores, out_parent,
                          out_tokens, out_hidden, out_mask, frontier, s_fb, offset, H, W, K: tl.constexpr,
                          KK_P2: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, HAS_MASK: tl.constexpr,
                          PDL: tl.constexpr):
    """``TreeOps.next_frontier`` for batch row ``b`` and frontier node ``j`` (program ``(b, j)``): the
    ``j``-th best of the row's ``K * K`` candidates (ties: the lower index first), its score, parent,
    token and candidate number, its parent's row of ``hidden`` and, with ``HAS_MASK``, its parent's
    mask row with column ``slots[j]`` opened."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    c = tl.arange(0, KK_P2)
    v = tl.load(scores + b * s_c + c, mask=c < K * K, other=float("-inf"))
    for _ in range(j):  # take out the j better ones
        v = tl.where(c == tl.argmax(v, axis=0), float("-inf"), v)
    best = tl.max(v, axis=0)
    pick = tl.argmax(v, axis=0)
    parent = pick // K
    out = b * K + j
    tl.store(out_scores + out, best)
    tl.store(out_parent + out, parent.to(tl.int64))
    tl.store(out_tokens + out, tl.load(tokens + b * s_c + pick))
    tl.store(frontier + b * s_fb + j, (pick + offset).to(tl.int64))
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        row = tl.load(hidden + b * s_hb + parent * s_hk + h, mask=h < H)
        tl.store(out_hidden + out * H + h, row, mask=h < H)
    if HAS_MASK:
        slot = tl.load(slots + j)
        for w0 in range(0, W, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            row = tl.load(mask + b * s_mb + parent * s_mk + w, mask=w < W)
            tl.store(out_mask + out * W + w, tl.where(w == slot, 0.0, row).to(out_mask.dtype.element_ty), mask=w < W)


@triton.jit
def _select_tree_kernel(scores, tokens, s_c, frontiers, s_fb, root, scale, shift, out_tokens, out_parents, out_depth,
                        out_mask, C, T, K: tl.constexpr, STEPS: tl.constexpr, C_P2: tl.constexpr, T_P2: tl.constexpr,
                        PDL: tl.constexpr):
    """``TreeOps.select_tree`` for batch row ``b`` (program ``b``): the ``T - 1`` best candidates by
    ``scores * scale - shift`` (ties: the lower number first), numbered in candidate order after the
    root; each one's parent column (its parent candidate's place among the chosen), depth (from its
    candidate number), token, and ancestor-or-self row (``STEPS`` hops up the parents)."""
    _after_previous_kernel(PDL)
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, C_P2)
    live = c < C
    v = tl.load(scores + b * s_c + c, mask=live, other=0.0) * tl.load(scale + c, mask=live, other=1.0) \
        - tl.load(shift + c, mask=live, other=0.0)
    v = tl.where(live, v, float("-inf"))
    chosen = c < 0
    for _ in range(T - 1):
        pick = tl.argmax(v, axis=0)
        chosen = chosen | (c == pick)
        v = tl.where(c == pick, float("-inf"), v)
    col = tl.cumsum(chosen.to(tl.int32), axis=0)  # a chosen candidate's column (the root is 0)
    i = tl.arange(0, T_P2)
    node = (i >= 1) & (i < T)
    keep = tl.sum(tl.where(chosen[None, :] & (col[None, :] == i[:, None]), c[None, :], 0), axis=1)  # [T_P2]
    level = (keep - K) // (K * K)  # the fed level a candidate past the first K was drafted at
    f = ((keep - K) % (K * K)) // K  # its parent's slot in that level's frontier
    later = tl.load(frontiers + b * s_fb + (level - 1) * K + f, mask=node & (keep >= K + K * K), other=0)
    pc = tl.where(keep < K, -1, tl.where(level == 0, f, later))  # the parent's candidate number
    before = tl.sum(((keep[None, :] < pc[:, None]) & node[None, :]).to(tl.int32), axis=1)
    parents = tl.where(i == 0, -1, tl.where(pc < 0, 0, before + 1))
    depth = tl.where(i == 0, 0, tl.where(keep < K, 1, level + 2))
    tok = tl.where(i == 0, tl.load(root + b), tl.load(tokens + b * s_c + keep, mask=node, other=0))
    t = i < T
    tl.store(out_tokens + b * T + i, tok.to(tl.int64), mask=t)
    tl.store(out_parents + b * T + i, parents.to(tl.int64), mask=t)
    tl.store(out_depth + b * T + i, depth.to(tl.int64), mask=t)
    jj = tl.arange(0, T_P2)
    anc = i
    seen = jj[None, :] == i[:, None]
    for _ in tl.static_range(STEPS):  # one hop up a round
        up = tl.sum(tl.where(jj[None, :] == anc[:, None], parents[None, :], 0), axis=1)
        anc = tl.where(anc >= 0, up, -1)
        seen = seen | (jj[None, :] == anc[:, None])
    tl.store(out_mask + (b * T + i[:, None]) * T + jj[None, :], seen.to(tl.uint8), mask=t[:, None] & (jj < T)[None, :])


def _batch_rows(t: torch.Tensor) -> bool:
    """Whether the top-children kernels can address ``t`` in place: batch row ``b`` at ``b *
    t.stride(0)``, its entries back to back (any batch stride: slices of a tree's candidate buffers)."""
    return t.dim() <= 1 or t[0].is_contiguous()


class TritonTreeOps(TritonVerifyOps):
    """The tree's ops as Triton kernels, a mixin over ``TritonOps`` (its ``_or_torch``): a kernel that
    cannot run falls back to the ``TreeOps`` reference; ``top_children``, ``next_frontier`` and
    ``select_tree`` alone (``top_children_failed``), ``accept_greedy``, the masks, the distribution and the draws
    (``TritonVerifyOps``) with the forward's kernels (``failed``)."""

    def top_children(self, logits: torch.Tensor, k: int, to_target: torch.Tensor,
                     base: torch.Tensor | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's op, not the forward's: if it cannot run, only it falls back to torch."""
        return self._or_torch(lambda: self._top_children(logits, k, to_target, base, out),
                              lambda: TreeOps.top_children(self, logits, k, to_target, base, out),
                              "top_children_failed", "tree levels use log_softmax + topk")

    def next_frontier(self, scores, tokens, hidden, k: int, offset: int, frontier, mask=None, slots=None):
        return self._or_torch(lambda: self._next_frontier(scores, tokens, hidden, k, offset, frontier, mask, slots),
                              lambda: TreeOps.next_frontier(self, scores, tokens, hidden, k, offset, frontier, mask,
                                                             slots), "top_children_failed",
                              "tree levels use log_softmax + topk")

    def select_tree(self, scores, tokens, frontiers, root, scale, shift, size: int, k: int):
        return self._or_torch(lambda: self._select_tree(scores, tokens, frontiers, root, scale, shift, size, k),
                              lambda: TreeOps.select_tree(self, scores, tokens, frontiers, root, scale, shift, size, k),
                              "top_children_failed", "tree levels use log_softmax + topk")

    def _top_children(self, logits, k, to_target, base, out):
        n = logits.shape[-1]
        if n < k:
            raise EyasError(f"a draft vocabulary of {n} tokens has no {k} best", "lower --speculative-eagle-topk")
        x = _rows(logits)
        rows = x.shape[0]
        lead = logits.shape[:-1]
        per = rows // lead[0] if lead and lead[0] else 1  # rows of one batch row ([B, R, V] logits: R)
        block = min(1024, max(16, triton.next_power_of_2(n)))
        splits = triton.cdiv(n, block)
        dev = x.device
        part_v = torch.empty((rows, splits, k), dtype=torch.float32, device=dev)
        part_i = torch.empty((rows, splits, k), dtype=torch.int32, device=dev)
        part_ml = torch.empty((rows, splits, 2), dtype=torch.float32, device=dev)
        if out is not None and _batch_rows(out[0]) and _batch_rows(out[1]):
            scores, tokens = out
        else:
            scores = torch.empty((*lead, k), dtype=torch.float32, device=dev)
            tokens = torch.empty((*lead, k), dtype=torch.long, device=dev)
        if base is not None:
            base = base if base.dtype == torch.float32 and _batch_rows(base) else base.float().contiguous()
        flat_base = scores if base is None else base
        self._launch(_top_children_kernel, (rows, splits), x, x.stride(0), n, part_v, part_i, part_ml, SPLITS=splits,
                     K=k, BLOCK=block, num_warps=4)
        self._launch(_top_children_combine_kernel, (rows,), part_v, part_i, part_ml, flat_base,
                     flat_base.stride(0) if flat_base.dim() else 0, to_target, scores, tokens,
                     scores.stride(0) if len(lead) else k, per, SPLITS=splits, K=k,
                     SPLITS_P2=triton.next_power_of_2(splits), CAND_P2=triton.next_power_of_2(splits * k),
                     HAS_BASE=base is not None, num_warps=1)
        if out is not None and scores is not out[0]:  # views the kernel cannot write in place
            out[0].copy_(scores)
            out[1].copy_(tokens)
            return out
        return scores, tokens

    def _next_frontier(self, scores, tokens, hidden, k, offset, frontier, mask, slots):
        bsz = scores.shape[0]
        dev = scores.device
        if scores.stride(-1) != 1 or tokens.stride() != scores.stride():
            scores, tokens = scores.contiguous(), tokens.contiguous()
        h = hidden.shape[-1]
        if hidden.stride(-1) != 1:
            hidden = hidden.contiguous()
        if frontier.stride(-1) != 1:
            raise ValueError("next_frontier: the frontier's candidate numbers must be written with a unit last stride")
        out_scores = torch.empty((bsz, k), dtype=torch.float32, device=dev)
        out_parent = torch.empty((bsz, k), dtype=torch.long, device=dev)
        out_tokens = torch.empty((bsz, k), dtype=tokens.dtype, device=dev)
        out_hidden = torch.empty((bsz, k, h), dtype=hidden.dtype, device=dev)
        if mask is not None:
            if mask.stride(-1) != 1:
                mask = mask.contiguous()
            out_mask = torch.empty(mask.shape, dtype=mask.dtype, device=dev)
            w = mask.shape[-1]
        else:
            out_mask, w = out_hidden, 0
        self._launch(_next_frontier_kernel, (bsz, k), scores, tokens, scores.stride(0), hidden, hidden.stride(0),
                     hidden.stride(1), out_mask if mask is None else mask, 0 if mask is None else mask.stride(0),
                     0 if mask is None else mask.stride(1), frontier if slots is None else slots.contiguous(),
                     out_scores, out_parent, out_tokens, out_hidden, out_mask, frontier, frontier.stride(0), offset, h,
                     w, K=k, KK_P2=max(2, triton.next_power_of_2(k * k)), BLOCK_H=min(1024, triton.next_power_of_2(h)),
                     BLOCK_W=min(1024, max(16, triton.next_power_of_2(max(w, 1)))), HAS_MASK=mask is not None,
                     num_warps=4)
        return out_scores, out_parent, out_tokens, out_hidden, None if mask is None else out_mask

    def _select_tree(self, scores, tokens, frontiers, root, scale, shift, size, k):
        bsz, c = scores.shape
        dev = scores.device
        if scores.stride(-1) != 1 or tokens.stride() != scores.stride():
            scores, tokens = scores.contiguous(), tokens.contiguous()
        if size - 1 > c:
            raise EyasError(f"a tree of {size} nodes needs {size - 1} candidates; the drafting made {c}",
                            "lower --speculative-num-draft-tokens")
        frontiers = frontiers.contiguous()
        out_tokens = torch.empty((bsz, size), dtype=torch.long, device=dev)
        parents = torch.empty((bsz, size), dtype=torch.long, device=dev)
        depth = torch.empty((bsz, size), dtype=torch.long, device=dev)
        mask = torch.empty((bsz, size, size), dtype=torch.bool, device=dev)
        steps = 1 + (c - k) // (k * k)
        self._launch(_select_tree_kernel, (bsz,), scores, tokens, scores.stride(0),
                     frontiers if frontiers.numel() else parents, frontiers.stride(0) if frontiers.numel() else 0,
                     root.contiguous(), scale, shift, out_tokens, parents, depth, mask.view(torch.uint8), c, size, K=k,
                     STEPS=steps, C_P2=max(2, triton.next_power_of_2(c)), T_P2=max(2, triton.next_power_of_2(size)),
                     num_warps=4)
        return out_tokens, parents, depth, mask


class SpecTritonOps(TritonTreeOps, TritonOps):
    """The engine's ops on the kernels: the block's (``TritonOps``) and the tree's, under one
    ``KernelSettings`` (``TritonOps.__init__``)."""

