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

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ..config import SpecConfig
from ..models import consts, kv_cache
from .ops import TORCH, ops_for
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
    prefix_slots = cache.num_slots()
    k, bsz, dev = spec.eagle_topk, root.shape[0], root.device
    rows = torch.arange(bsz, device=dev)[:, None]
    eye = torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k)
    seen = torch.zeros((bsz, k, 0), dtype=torch.bool, device=dev)  # frontier -> earlier fed slots

    def feed(step, tokens, hidden, parent, _mask):
        nonlocal seen
        if parent is not None:  # each new frontier node sees what its parent saw, and its parent
            seen = torch.cat([seen[rows, parent], eye[rows, parent]], dim=-1)
        visible = torch.cat([seen, eye], -1)
        mask = kv_cache.attention_mask(lengths, prefix_slots, visible, hidden.dtype)
        positions = (lengths + step - 1)[:, None].expand(len(tokens), k)
        return steps_fn(tokens, hidden, positions, cache, mask)

    try:
        return _grow(draft, root, logits0, hidden0, spec, feed, ops_for(cache, hidden0, getattr(draft, "rope", None)))
    finally:
        cache.crop(prefix_slots)


def draft_tree_static(draft, pool, lengths, root, logits0, hidden0, spec: SpecConfig, prefix: torch.Tensor,
                      window: int) -> Tree:
    """The same tree on a ``StaticKV`` with only tensors varying between calls, so the whole function
    can be captured as one CUDA graph per (rows, window): level ``s`` writes its ``k`` keys at slots
    ``prefix + (s - 1) k ..`` (``prefix`` a 1-element tensor) and every mask is ``window`` wide.

    The first level's mask is ``ops.tree_mask`` of a tree of ``k`` roots (the committed slots and each
    node's own); each later node's is its parent's row with its own slot opened, made by
    ``ops.next_frontier`` with the frontier itself."""
    k = spec.eagle_topk
    bsz, dev = root.shape[0], root.device
    c = _constants(spec, dev)
    ops = ops_for(pool, hidden0, draft.rope)
    slots = prefix + c.level_slots  # [(steps - 1) k]: where each level's keys go
    positions = (lengths - 1)[:, None] + c.levels  # [B, steps - 1]: level s is fed at position P + s - 1
    first = ops.tree_mask(lengths, consts.eye(k, torch.bool, dev).expand(bsz, k, k), prefix, window,
                          pool.buf.dtype)[:, 0]  # [B, k, W]

    def feed(step, tokens, hidden, parent, mask):
        pool.aim(window, slots[(step - 1) * k : step * k])
        out = draft.backbone(draft.embed(tokens), hidden, positions[:, step - 1 : step].expand(bsz, k), pool,
                             mask[:, None])
        return out, draft.logits(out, pool)

    return _grow(draft, root, logits0, hidden0, spec, feed, ops, first, slots)


def _deeper(scores: torch.Tensor, depth) -> torch.Tensor:
    """Scores that rank a node strictly below its ancestors even where the log-probabilities tie (a
    child scores <= its parent; equal when the draft is certain): scaled up by ``depth`` parts in 2^20
    (log-probabilities are <= 0) and lowered by ``depth`` x 1e-30 for the ties at 0. Only near-ties
    between unrelated nodes can swap. ``depth``: a number, or a tensor that broadcasts."""
    return scores * (1 + depth * 2.0 ** -20) - depth * 1e-30


@dataclass(frozen=True)
class _Constants:
    """Index tensors a tree's drafting needs, made once per (setting, device) instead of once per
    level inside every graph replay (each is a kernel there)."""

    levels: torch.Tensor  # [steps - 1]: 1, 2, .. (the depth each fed level drafts from)
    level_slots: torch.Tensor  # [(steps - 1) k]: 0, 1, ..: a fed node's slot past the prefix
    scale: torch.Tensor  # [C]: ``_deeper`` of every candidate, by its depth
    shift: torch.Tensor  # [C]


@functools.cache  # never evicted: captured graphs read these by address (see models/consts.py)
def _constants(spec: SpecConfig, device: torch.device) -> _Constants:
    k, steps = spec.eagle_topk, spec.num_steps
    with torch.inference_mode(False):  # kept across calls (and graph captures): plain tensors
        depth = torch.cat([torch.zeros(k), torch.arange(1, steps).repeat_interleave(k * k)]).double()
        made = _Constants(levels=torch.arange(1, steps), level_slots=torch.arange((steps - 1) * k),
                          scale=(1 + depth * 2.0 ** -20).float(), shift=(depth * 1e-30).float())
        return _Constants(*(t.to(device) for t in dataclasses.astuple(made)))


def _grow(draft, root, logits0, hidden0, spec: SpecConfig, feed, ops=TORCH, mask=None, slots=None) -> Tree:
    """EAGLE-2 expansion and selection; ``feed(step, tokens, hidden, parent, mask)`` runs one draft level
    (``parent``: each frontier node's slot among the previous level's fed nodes, None at the first).
    ``mask`` is the static path's: the first level's additive mask ``[B, k, W]``; each later level's
    comes from ``ops.next_frontier``, which opens node ``j``'s slot ``slots[level k + j]``. (None on the
    eager path, whose ``feed`` builds its masks from ``parent``.)

    Candidates are numbered level by level: the first ``k`` (depth 1), then ``k * k`` per level, the
    children of frontier node ``i`` at ``i * k ..``; each level's scores and tokens are written into
    two ``[B, C]`` buffers as they are made, and ``ops.select_tree`` picks the tree from them at the
    end. The last level only scores its children."""
    k, steps, total = spec.eagle_topk, spec.num_steps, spec.num_draft_tokens
    bsz, dev = root.shape[0], root.device
    c = _constants(spec, dev)
    to_target = getattr(draft, "to_target", None)
    if to_target is None:
        to_target = draft.d2t + torch.arange(len(draft.d2t), device=draft.d2t.device)
    size = k + (steps - 1) * k * k
    cand_scores = torch.empty((bsz, size), dtype=torch.float32, device=dev)
    cand_tokens = torch.empty((bsz, size), dtype=torch.long, device=dev)
    frontiers = torch.empty((bsz, max(steps - 2, 0), k), dtype=torch.long, device=dev)  # levels 2..: candidates

    scores, tokens = ops.top_children(logits0, k, to_target, out=(cand_scores[:, :k], cand_tokens[:, :k]))
    hidden = hidden0[:, None, :].expand(bsz, k, hidden0.shape[-1])
    parent = None
    for step in range(1, steps):
        out, logits = feed(step, tokens, hidden, parent, mask)  # [B, k, H], [B, k, draft_vocab]
        lo = k + (step - 1) * k * k
        level_scores, level_tokens = cand_scores[:, lo : lo + k * k], cand_tokens[:, lo : lo + k * k]
        ops.top_children(logits, k, to_target, scores, out=(level_scores.view(bsz, k, k), level_tokens.view(bsz, k, k)))
        if step == steps - 1:
            break
        opened = None if slots is None else slots[step * k : (step + 1) * k]
        scores, parent, tokens, hidden, mask = ops.next_frontier(level_scores, level_tokens, out, k, lo,
                                                                 frontiers[:, step - 1], mask, opened)
    return Tree(*ops.select_tree(cand_scores, cand_tokens, frontiers, root, c.scale, c.shift, total, k))


class StaticDrafter:
    """Drafts trees on the native path's static draft cache: one graph replay per step."""

    def __init__(self, draft, pool, spec: SpecConfig, rows: list[int], enabled: bool):
        from ..models.graphs import BatchGraph, window_buckets

        self.draft, self.pool, self.spec = draft, pool, spec
        self.span = spec.num_steps * spec.eagle_topk  # slots a tree's levels take past the prefix
        self.graph = BatchGraph(self._fn, pool, rows, window_buckets(pool.capacity_slots), enabled,
                                name=f"drafter {spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens}",
                                example=self._example, top_slots=self.span)

    def _fn(self, inputs, window):
        tree = draft_tree_static(self.draft, self.pool, inputs["lengths"], inputs["root"], inputs["logits0"],
                                 inputs["hidden0"], self.spec, inputs["prefix"], window)
        return tree.tokens, tree.parents, tree.depth, tree.mask

    def _example(self, rows: int, window: int = 0):
        """Inputs of ``rows`` rows shaped as ``__call__`` passes them (for warming a bucket up)."""
        w = self.draft.fc.weight
        ids = torch.zeros(rows, dtype=torch.long, device=w.device)
        logits = torch.zeros((rows, self.draft.draft_vocab_size), dtype=w.dtype, device=w.device)
        hidden = torch.zeros((rows, self.draft.config.hidden_size), dtype=w.dtype, device=w.device)
        return {"lengths": ids, "root": ids, "logits0": logits, "hidden0": hidden}, {"prefix": 0}

    @torch.inference_mode()
    def __call__(self, lengths, root, logits0, hidden0) -> Tree:
        prefix = self.pool.used
        out = self.graph({"lengths": lengths, "root": root, "logits0": logits0, "hidden0": hidden0},
                         {"prefix": prefix}, prefix + self.span)
        if out is None:  # past the graphs' buckets: the same function, eagerly
            self.pool.begin(self.span)  # room for the tree's levels (they are dropped after: nothing advances)
            start = torch.full((1,), prefix, dtype=torch.long, device=root.device)
            return draft_tree_static(self.draft, self.pool, lengths, root, logits0, hidden0, self.spec, start,
                                     prefix + self.span)
        return Tree(*out)


def draft_extend_static(draft, pool, base, tokens, aux, counts, prefix: torch.Tensor, window: int,
                        with_logits: bool = True):
    """``StepByParts.draft_extend`` (``engine/by_parts.py``) on a ``StaticKV`` with only tensors varying
    between calls: feed ``tokens`` [B, W] with their aux states at positions ``base..``, write their keys at
    slots ``prefix..`` (``prefix`` a 1-element tensor), keep row b's first ``counts[b]`` at ``base[b]..``,
    and return the draft's (logits, hidden) after its last kept token (logits None without ``with_logits``:
    a step that will not draft next skips the draft's vocabulary projection). Every mask is ``window``
    wide, so the whole function is one CUDA graph per (rows, window)."""
    bsz, width = tokens.shape
    dev = tokens.device
    i = consts.arange(width, dev)
    mask = ops_for(pool, aux, draft.rope).block_mask(base, counts, prefix, width, window, draft.fc.weight.dtype)
    new = prefix + i
    pool.aim(window, new)
    h = draft.backbone(draft.embed(tokens), draft.project(aux), base[:, None] + i[None, :], pool, mask)
    # A row with nothing to keep (padding, or the zeros a graph is warmed up with) moves its block
    # onto itself, never over committed slots.
    pool.commit(torch.where(counts > 0, base, prefix), new.expand(bsz, width), counts)
    last = h[consts.arange(bsz, dev), (counts - 1).clamp(min=0)]  # [B, H]
    return (draft.logits(last, pool) if with_logits else None), last


class StaticExtender:
    """Feeds accepted tokens to the draft on the native path's static draft cache: one graph replay."""

    def __init__(self, draft, pool, width: int, rows: list[int], enabled: bool, windows: list[int] | None = None,
                 name: str = "draft extend"):
        from ..models.graphs import BatchGraph, window_buckets

        self.draft, self.pool, self.width = draft, pool, width
        windows = window_buckets(pool.capacity_slots) if windows is None else windows
        self.graph = BatchGraph(self._fn, pool, rows, windows, enabled, name=f"{name} {width}", example=self._example,
                                top_slots=width)

    def _fn(self, inputs, window):
        return draft_extend_static(self.draft, self.pool, inputs["base"], inputs["tokens"], inputs["aux"],
                                   inputs["counts"], inputs["prefix"], window)

    def _example(self, rows: int, window: int = 0):
        w = self.draft.fc.weight
        ids = torch.zeros((rows, self.width), dtype=torch.long, device=w.device)
        aux = torch.zeros((rows, self.width, w.shape[1]), dtype=w.dtype, device=w.device)
        return {"base": ids[:, 0], "tokens": ids, "aux": aux, "counts": ids[:, 0]}, {"prefix": 0}

    @torch.inference_mode()
    def __call__(self, base, tokens, aux, counts, prefix: torch.Tensor | None = None, ahead: int = 0):
        """(logits [B, draft_vocab], hidden [B, H]), or None past the last bucket (run the eager path).
        ``prefix``: where the block's keys go, a 1-element tensor on the device, for a call made while a step
        is in flight (its rows up to ``ahead`` slots past the pool's count on the host); the pool's count
        then stays. Without it, the pool's count, advanced past the block."""
        used = self.pool.used
        out = self.graph({"base": base, "tokens": tokens, "aux": aux, "counts": counts},
                         {"prefix": used if prefix is None else prefix}, used + ahead + self.width)
        if out is not None and prefix is None:
            self.pool.advance(self.width)
        return out
