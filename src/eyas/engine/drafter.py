"""EAGLE-2 dynamic-tree drafting with an EAGLE-3 draft (chains are the ``eagle_topk = 1`` case).

Step 1 takes the ``topk`` best tokens from the draft's last output (computed when the previous
step's accepted tokens were fed to the draft). Each later step feeds the current ``topk`` frontier
nodes to the draft in one forward, scores their ``topk`` children by cumulative log-probability,
keeps all ``topk * topk`` as candidates and the best ``topk`` as the next frontier. After
``num_steps`` levels the ``num_draft_tokens - 1`` best candidates form the tree. A child's score
never exceeds its parent's, and ties go to the earlier (shallower) candidate, so every chosen
node's parent is chosen too.

Draft positions: the draft cache holds ``P = lengths[b]`` committed entries; a node at depth ``d``
is fed at position ``P + d - 1`` and sees the committed prefix plus its own ancestors. The tree's
entries are dropped from the draft cache when drafting ends.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig
from ..models import kv_cache
from .tree import Tree


@torch.inference_mode()
def draft_tree(
    draft,
    cache,
    lengths: torch.Tensor,  # [B] committed draft entries (== target's)
    root: torch.Tensor,  # [B] root tokens (last emitted)
    logits0: torch.Tensor,  # [B, draft_vocab] draft output predicting depth 1
    hidden0: torch.Tensor,  # [B, H] pre-norm draft state that produced logits0
    spec: SpecConfig,
    steps_fn=None,  # (tokens, hidden, positions, cache, mask) -> (hidden, logits); eager by default
) -> Tree:
    """The tree on any cache: each level is appended to ``cache`` and dropped at the end."""
    if steps_fn is None:
        from ..models.native import DraftSteps
        steps_fn = DraftSteps(draft)
    prefix_slots = kv_cache.num_slots(cache)
    k, bsz, dev = spec.eagle_topk, root.shape[0], root.device
    rows = torch.arange(bsz, device=dev)[:, None]
    eye = torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k)
    seen = torch.zeros((bsz, k, 0), dtype=torch.bool, device=dev)  # frontier -> earlier fed slots

    def feed(step, tokens, hidden, parent):
        nonlocal seen
        if parent is not None:  # each new frontier node sees what its parent saw, and its parent
            seen = torch.cat([seen[rows, parent], eye[rows, parent]], dim=-1)
        visible = torch.cat([seen, eye], -1)
        mask = kv_cache.attention_mask(lengths, prefix_slots, visible, hidden.dtype)
        positions = (lengths + step - 1)[:, None].expand(len(tokens), k)
        return steps_fn(tokens, hidden, positions, cache, mask)

    try:
        return _grow(draft, root, logits0, hidden0, spec, feed)
    finally:
        kv_cache.crop(cache, prefix_slots)


def draft_tree_static(draft, pool, lengths, root, logits0, hidden0, spec: SpecConfig, prefix: torch.Tensor,
                      window: int) -> Tree:
    """The same tree on a ``StaticKV`` with only tensors varying between calls, so the whole function
    can be captured as one CUDA graph per (rows, window): level ``s`` writes its ``k`` keys at slots
    ``prefix + (s - 1) k ..`` (``prefix`` a 1-element tensor) and every mask is ``window`` wide."""
    k = spec.eagle_topk
    bsz, dev = root.shape[0], root.device
    rows = torch.arange(bsz, device=dev)[:, None]
    ks = torch.arange(k, device=dev)
    before = lengths - 1
    # allowed[b, i, s]: frontier node i of row b sees slot s. It starts as the committed prefix and is
    # carried down the tree: a new node takes its parent's row, then its own slot.
    allowed = (torch.arange(window, device=dev)[None, None, :] < lengths[:, None, None]).expand(bsz, k, window)
    yes = torch.ones((), dtype=torch.bool, device=dev)  # a device value: a Python True is copied from the host

    def feed(step, tokens, hidden, parent):
        nonlocal allowed
        allowed = allowed[rows, parent] if parent is not None else allowed.clone()
        pool.window, pool.write_slots = window, prefix + (step - 1) * k + ks
        allowed[:, ks, pool.write_slots] = yes
        mask = kv_cache.additive(allowed, pool.buf.dtype)
        positions = (before + step)[:, None].expand(bsz, k)
        out = draft.backbone(draft.embed(tokens), hidden, positions, pool, mask)
        return out, draft.logits(out)

    return _grow(draft, root, logits0, hidden0, spec, feed)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k)`` over the last axis (values descending). A long row (a draft vocabulary) goes in
    two stages: the top ``k`` of each of ``s`` slices, then the top ``k`` of those. The answer is the
    same (up to the order of ties), but one row no longer sits on one thread block: on the H200 the
    one-stage top-8 of 8 x 16k scores took 50-80 us, the longest kernel of a draft level. ``s`` keeps
    rows x slices near 1024 blocks (64 slices for 8 rows, 8 for 128): 8192 slices of 256 took 37 us."""
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
    part_ids = part_ids + torch.arange(0, v, v // slices, device=x.device)[:, None]
    values, at = part.flatten(-2).topk(k, dim=-1)
    return values, part_ids.flatten(-2).gather(-1, at)


def _deeper(scores: torch.Tensor, depth: int) -> torch.Tensor:
    """Scores that rank a node strictly below its ancestors even where the log-probabilities tie (a
    child scores <= its parent; equal when the draft is certain): scaled up by ``depth`` parts in 2^20
    (log-probabilities are <= 0) and lowered by ``depth`` x 1e-30 for the ties at 0. Only near-ties
    between unrelated nodes can swap."""
    return scores * (1 + depth * 2.0 ** -20) - depth * 1e-30


def _grow(draft, root, logits0, hidden0, spec: SpecConfig, feed) -> Tree:
    """EAGLE-2 expansion and selection; ``feed(step, tokens, hidden, parent)`` runs one draft level
    (``parent``: each frontier node's slot among the previous level's fed nodes, None at the first)."""
    k, steps, total = spec.eagle_topk, spec.num_steps, spec.num_draft_tokens
    bsz, dev = root.shape[0], root.device
    d2t = draft.d2t
    rows = torch.arange(bsz, device=dev)

    scores, ids = topk(torch.log_softmax(logits0, dim=-1, dtype=torch.float32), k)  # [B, k]
    tokens = ids + d2t[ids]
    cand_tokens, cand_scores = [tokens], [scores]
    cand_parents = [torch.full((bsz, k), -1, dtype=torch.long, device=dev)]
    frontier = torch.arange(k, device=dev).expand(bsz, k)  # candidate index of each frontier node
    hidden = hidden0[:, None, :].expand(bsz, k, hidden0.shape[-1])
    parent = None
    n_cand = k
    for step in range(1, steps):
        out, logits = feed(step, tokens, hidden, parent)  # [B, k, H], [B, k, draft_vocab]
        child_scores, child_ids = topk(torch.log_softmax(logits, dim=-1, dtype=torch.float32), k)  # [B, k, k]
        flat_scores = (child_scores + scores[..., None]).reshape(bsz, k * k)
        flat_tokens = (child_ids + d2t[child_ids]).reshape(bsz, k * k)
        cand_tokens.append(flat_tokens)
        cand_scores.append(_deeper(flat_scores, step))
        cand_parents.append(frontier[:, :, None].expand(bsz, k, k).reshape(bsz, k * k))
        scores, best = flat_scores.topk(k, dim=-1)  # [B, k]: the next frontier (any order)
        parent = best // k  # frontier slot of each new frontier node's parent
        tokens = flat_tokens.gather(1, best)
        hidden = out[rows[:, None], parent]
        frontier = n_cand + best
        n_cand += k * k

    all_tokens = torch.cat(cand_tokens, dim=1)  # [B, C]
    all_scores = torch.cat(cand_scores, dim=1)
    all_parents = torch.cat(cand_parents, dim=1)
    chosen = torch.zeros_like(all_scores).scatter_(1, all_scores.topk(total - 1, dim=-1).indices, 1.0)
    order = torch.arange(n_cand, 0, -1, device=dev, dtype=all_scores.dtype)  # earlier candidates rank higher
    keep = (chosen * order).topk(total - 1, dim=-1).indices  # the chosen, in candidate order: parents first
    column = torch.full((bsz, n_cand), -1, dtype=torch.long, device=dev)
    column.scatter_(1, keep, torch.arange(1, total, device=dev).expand(bsz, total - 1))
    cand_parent = all_parents.gather(1, keep)
    parent_col = torch.where(cand_parent < 0, torch.zeros_like(cand_parent), column.gather(1, cand_parent.clamp(min=0)))
    if not parent_col.is_cuda and bool((parent_col < 0).any()):  # an invariant; not worth a GPU sync
        raise RuntimeError("draft tree lost a parent: scores were not monotone along a path")
    tree_tokens = torch.cat([root[:, None], all_tokens.gather(1, keep)], dim=1)
    parents = torch.cat([torch.full((bsz, 1), -1, dtype=torch.long, device=dev), parent_col], dim=1)
    return Tree.from_parents(tree_tokens, parents, max_depth=steps)


class StaticDrafter:
    """Drafts trees on the native path's static draft cache: one graph replay per step."""

    def __init__(self, draft, pool, spec: SpecConfig, steps_fn, rows: list[int], enabled: bool):
        from ..models.graphs import BatchGraph, window_buckets

        self.draft, self.pool, self.spec, self.steps_fn = draft, pool, spec, steps_fn
        self.span = spec.num_steps * spec.eagle_topk  # slots a tree's levels take past the prefix
        self.graph = BatchGraph(self._fn, pool, rows, window_buckets(pool.capacity_slots), enabled,
                                name=f"drafter {spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens}",
                                example=self._example, top_slots=self.span)

    def _fn(self, inputs, window):
        tree = draft_tree_static(self.draft, self.pool, inputs["lengths"], inputs["root"], inputs["logits0"],
                                 inputs["hidden0"], self.spec, inputs["prefix"], window)
        return tree.tokens, tree.parents, tree.depth, tree.mask

    def _example(self, rows: int):
        """Inputs of ``rows`` rows shaped as ``__call__`` passes them (for warming a bucket up)."""
        w = self.draft.fc.weight
        ids = torch.zeros(rows, dtype=torch.long, device=w.device)
        logits = torch.zeros((rows, self.draft.draft_vocab_size), dtype=w.dtype, device=w.device)
        hidden = torch.zeros((rows, self.draft.config.hidden_size), dtype=w.dtype, device=w.device)
        return {"lengths": ids, "root": ids, "logits0": logits, "hidden0": hidden}, {"prefix": ids[:1]}

    @torch.inference_mode()
    def __call__(self, lengths, root, logits0, hidden0) -> Tree:
        prefix = self.pool.used
        out = self.graph({"lengths": lengths, "root": root, "logits0": logits0, "hidden0": hidden0},
                         {"prefix": torch.full((1,), prefix, device=root.device)}, prefix + self.span)
        if out is None:  # past the last window bucket: the level-by-level path
            return draft_tree(self.draft, self.pool, lengths, root, logits0, hidden0, self.spec, self.steps_fn)
        return Tree(*out)


def draft_extend_static(draft, pool, base, tokens, aux, counts, prefix: torch.Tensor, window: int):
    """``Engine._draft_extend`` on a ``StaticKV`` with only tensors varying between calls: feed
    ``tokens`` [B, W] with their aux states at positions ``base..``, write their keys at slots
    ``prefix..`` (``prefix`` a 1-element tensor), keep row b's first ``counts[b]`` at ``base[b]..``,
    and return the draft's (logits, hidden) after its last kept token. Every mask is ``window`` wide,
    so the whole function is one CUDA graph per (rows, window)."""
    bsz, width = tokens.shape
    dev = tokens.device
    i = torch.arange(width, device=dev)
    rel = torch.arange(window, device=dev)[None, :] - prefix  # [1, window]: index into the new block
    block = (rel >= 0) & (rel < width) & (rel <= i[:, None])  # [W, window] causal inside the block
    valid = (rel[None] < counts[:, None, None]) | (rel == i[:, None])[None]  # padding sees only itself
    committed = torch.arange(window, device=dev)[None, None, :] < base[:, None, None]  # [B, 1, window]
    allowed = committed | (block[None] & valid)  # [B, W, window]
    mask = kv_cache.additive(allowed, pool.buf.dtype)
    new = prefix + i
    pool.window, pool.write_slots = window, new
    h = draft.backbone(draft.embed(tokens), draft.project(aux), base[:, None] + i[None, :], pool, mask)
    # A row with nothing to keep (padding, or the zeros a graph is warmed up with) moves its block
    # onto itself, never over committed slots.
    pool.commit(torch.where(counts > 0, base, prefix), new.expand(bsz, width), counts)
    last = h[torch.arange(bsz, device=dev), (counts - 1).clamp(min=0)]  # [B, H]
    return draft.logits(last), last


class StaticExtender:
    """Feeds accepted tokens to the draft on the native path's static draft cache: one graph replay."""

    def __init__(self, draft, pool, width: int, rows: list[int], enabled: bool):
        from ..models.graphs import BatchGraph, window_buckets

        self.draft, self.pool, self.width = draft, pool, width
        self.graph = BatchGraph(self._fn, pool, rows, window_buckets(pool.capacity_slots), enabled,
                                name=f"draft extend {width}", example=self._example, top_slots=width)

    def _fn(self, inputs, window):
        return draft_extend_static(self.draft, self.pool, inputs["base"], inputs["tokens"], inputs["aux"],
                                   inputs["counts"], inputs["prefix"], window)

    def _example(self, rows: int):
        w = self.draft.fc.weight
        ids = torch.zeros((rows, self.width), dtype=torch.long, device=w.device)
        aux = torch.zeros((rows, self.width, w.shape[1]), dtype=w.dtype, device=w.device)
        return {"base": ids[:, 0], "tokens": ids, "aux": aux, "counts": ids[:, 0]}, {"prefix": ids[0, :1]}

    @torch.inference_mode()
    def __call__(self, base, tokens, aux, counts):
        """(logits [B, draft_vocab], hidden [B, H]), or None past the last bucket (run the eager path)."""
        prefix = self.pool.used
        out = self.graph({"base": base, "tokens": tokens, "aux": aux, "counts": counts},
                         {"prefix": torch.full((1,), prefix, device=tokens.device)}, prefix + self.width)
        if out is not None:
            self.pool.advance(self.width)
        return out
