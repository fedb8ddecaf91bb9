"""The operations of a Llama-family block other than its GEMMs, behind one interface.

``TorchOps`` is the reference: plain PyTorch, any device, autograd-safe. ``models.kernels`` holds
``TritonOps``, the same operations as fused Triton kernels for the GPU's static-cache path, where
at batch 1 a forward costs its kernel count more than its arithmetic. ``NativeLlama`` and
``NativeEagle3`` ask ``ops_for`` which one a forward uses; both compute the same maths in
float32 and round once or twice to the model's dtype, so they agree to a rounding.

    rotation(rope, x, positions)   -> what ``qkv_to_cache`` needs to rotate q and k at ``positions``
    rms_norm(x, weight, eps)       -> weight * x / rms(x)
    rms_norm_cat(parts)            -> the rms_norm of each (x, weight, eps), concatenated (last axis)
    linear(x, w, b, norm)          -> F.linear of x, RMS-normed first when norm = (weight, eps)
    linear_silu(x, w, b, norm)     -> silu_mul(linear(x, w, b, norm)), w = the MLP's [gate; up]
    linear_add(res, x, w, b)       -> res + F.linear(x, w, b)
    silu_mul(x)                    -> silu(gate) * up, for x = [gate | up]
    qkv_to_cache(qkv, heads, rot, cache, layer, norms)
                                   -> (q folded for GQA, the cache's keys, its values)
    fold_mask(mask, rep)           -> the additive mask as ``attend`` takes it
    attend(q, keys, values, mask, scale, heads)
                                   -> attention output [B, T, Hq * D]
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
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F

from ..errors import EyasError
from . import consts, kv_cache
from .static_cache import StaticKV


class TorchOps:
    name = "torch"

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        cos, sin = rope(x, positions)  # [B, T, D] each
        return cos[:, None], sin[:, None]  # broadcast over heads

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def rms_norm_cat(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
        """``cat([rms_norm(x, weight, eps) for each part], -1)``: an EAGLE-3 draft's input (the token's
        embedding and the hidden state, each normed)."""
        return torch.cat([self.rms_norm(*part) for part in parts], dim=-1)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, of ``rms_norm(x, *norm)`` when ``norm`` is given."""
        return F.linear(x if norm is None else self.rms_norm(x, *norm), weight, bias)

    def linear_silu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``silu_mul(linear(x, weight, bias, norm))``: the MLP's fused gate/up ``[gate; up]``, activated."""
        return self.silu_mul(self.linear(x, weight, bias, norm))

    def linear_add(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + F.linear(x, weight, bias)``; without a bias in one GEMM, the residual riding in
        as the accumulator."""
        if bias is not None:
            return residual + F.linear(x, weight, bias)
        shape = residual.shape
        return torch.addmm(residual.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), weight.t()).view(shape)

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        """From the fused projection ``[B, T, (Hq + 2 Hkv) D]``: Qwen3's per-head norms (``norms``, a
        pair of RMSNorm modules), rotary on q and k in one pass, keys and values into ``cache`` as
        ``layer``. Returns q as ``[B, Hkv, rep * T, D]`` (the query heads that share a KV head along
        the query axis, so SDPA reads each key once) and the keys and values to attend to."""
        bsz, t = qkv.shape[:2]
        hq, hkv, d = heads
        nq, nkv = hq * d, hkv * d
        if norms is not None:
            qk = torch.cat([self.rms_norm(qkv[..., :nq].view(bsz, t, hq, d), norms[0].weight, norms[0].variance_epsilon),
                            self.rms_norm(qkv[..., nq : nq + nkv].view(bsz, t, hkv, d), norms[1].weight,
                                          norms[1].variance_epsilon)], dim=2)
        else:
            qk = qkv[..., : nq + nkv].view(bsz, t, hq + hkv, d)
        qk = rope_rotate(qk.transpose(1, 2), *rot)  # [B, Hq + Hkv, T, D]
        v = qkv[..., nq + nkv :].view(bsz, t, hkv, d).transpose(1, 2)
        keys, values = cache.update(qk[:, hq:], v, layer)
        return qk[:, :hq].reshape(bsz, hkv, hq // hkv * t, d), keys, values

    def fold_mask(self, mask: torch.Tensor, rep: int) -> torch.Tensor:
        """``[B, 1, T, W]`` -> ``[B, 1, rep * T, W]``: one mask row per folded query row."""
        if rep == 1:
            return mask
        bsz, _, t, w = mask.shape
        return mask[:, :, None].expand(bsz, 1, rep, t, w).reshape(bsz, 1, rep * t, w)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
               heads: tuple[int, int, int]) -> torch.Tensor:
        """SDPA of the folded queries (``mask`` from ``fold_mask``), as ``[B, T, Hq * D]``."""
        hq, _, d = heads
        bsz, t = q.shape[0], q.shape[2] * q.shape[1] // hq
        # PyTorch picks cuDNN's attention here; its memory-efficient kernel avoids the strided K/V copies
        # cuDNN makes but measured slower (docs/log/engine.md, "Before the kernels").
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return o.reshape(bsz, hq, t, d).transpose(1, 2).reshape(bsz, t, hq * d)


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
        """A drafted tree of ``size`` nodes from its candidates (``engine.drafter`` numbers them): the
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
        """Greedy acceptance of a token tree per row (``engine.verify.accept_greedy_batch`` says what it
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


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF's rotate-half convention, on q and k heads at once."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat([-x[..., half:], x[..., :half]], dim=-1), sin)


TORCH = TorchOps()
KERNELS = ("auto", "torch", "triton")


def ops_for(cache, x: torch.Tensor, rope) -> TorchOps:
    """The ops a forward of ``x`` over ``cache`` uses. ``EYAS_KERNELS`` picks: ``auto`` (the default)
    takes the Triton kernels on a GPU's static cache (the CUDA-graph path) and the torch ops
    everywhere else (prefill, the CPU, training, a rope table not yet built); ``torch`` never takes
    the kernels; ``triton`` takes them on the CPU too, in Triton's interpreter (for tests)."""
    mode = os.environ.get("EYAS_KERNELS", "auto").lower()
    if mode not in KERNELS:
        raise EyasError(f"EYAS_KERNELS={mode!r} is not one of {', '.join(KERNELS)}",
                        "unset it (auto), or set torch to run without the Triton kernels")
    if (mode == "torch" or not isinstance(cache, StaticKV) or getattr(rope, "table", None) is None
            or (torch.is_grad_enabled() and x.requires_grad) or (mode == "auto" and not x.is_cuda)):
        return TORCH
    triton_ops = triton_kernels()
    if triton_ops is None and mode == "triton":
        raise EyasError("EYAS_KERNELS=triton but Triton is not installed", "pip install triton, or unset EYAS_KERNELS")
    if triton_ops is None or (triton_ops.failed and mode == "auto"):  # a kernel failed earlier: see kernels.TritonOps
        return TORCH
    return triton_ops


def triton_kernels() -> TorchOps | None:
    """``kernels.TRITON``, or None where Triton is not installed."""
    try:
        from .kernels import TRITON
    except ImportError:
        return None
    return TRITON
