"""A step by parts, the route every step can take: each part its own launches (or graph replay).

``Engine.step`` replays the whole step as one graph where one fits (``decode.py``); the rest run here, as do
all steps whose rows ask for logprobs or follow a grammar, and all steps on the generic path:

    draft    num_steps draft forwards -> a tree of num_draft_tokens tokens per row (``spec/drafter.py``; on
             the native path one graph replay per setting)
    mask     the verify's attention mask (the committed slots, and the tree's own)
    verify   the target's forward over every tree (explicit positions, tree mask on the KV cache)
    accept   longest accepted path + one bonus token per row (greedy, or each node's draw)
    commit   copy the accepted path's KV entries into place, drop the rest; gather its tokens and states
    extend   feed the accepted tokens with their captured aux states to the draft, which leaves the
             logits that seed the next tree (on the native path one graph replay per path width)

With ``Algorithm.NONE`` the tree is the root alone, so plain decoding is the same code path. The step ends in
``host``, the one tensor ``Engine.collect`` reads back. Each part is a phase (``phases.py``), named for a
profiler.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig
from ..models import kv_cache
from ..sample.grammar import constrain, constrained
from ..sample.logprobs import Pending, path_logprobs
from ..sample.penalties import record
from ..spec.drafter import draft_extend_static, draft_tree
from ..spec.tree import Tree
from ..spec.verify import accepted_path, finite_rows
from .batch import Batch
from .phases import phase
from .sampler import accept


class StepByParts:
    """The step by parts over ``target`` (and the draft's ``draft_steps``). On the native path ``drafters``
    (one ``StaticDrafter`` per setting) draft the trees and ``extenders`` (one ``StaticExtender`` per path
    width) feed the draft; elsewhere both are empty and every part runs eagerly. ``ops``: the acceptance's
    and draws' kernels; ``capture``: whether the target's forwards keep the aux states (a draft follows)."""

    def __init__(self, target, draft_steps, drafters: dict, extenders: dict, ops, capture: bool):
        self.target, self.draft_steps, self.drafters, self.extenders = target, draft_steps, drafters, extenders
        self.ops, self.capture = ops, capture

    def __call__(self, batch: Batch, spec: SpecConfig, logprobs: bool) -> tuple[torch.Tensor, Pending | None]:
        """One step of ``spec``'s settings: ``(host [B, width + 4], the asking rows' logprobs)`` (``Engine.collect``
        reads them); ``logprobs``: whether any row asks for them. Updates the batch's draft output."""
        rows = batch.rows
        with phase("draft"):
            if spec.speculative and self.drafters:  # the native path
                tree = self.drafters[spec](batch.lengths, batch.root, batch.draft_logits, batch.draft_hidden)
            elif spec.speculative:
                tree = draft_tree(self.draft_steps.net, batch.draft_cache, batch.lengths, batch.root,
                                  batch.draft_logits, batch.draft_hidden, spec, self.draft_steps)
            else:
                tree = Tree.root_only(batch.root)
        cache = batch.target_cache
        with phase("mask"):
            slots = cache.num_slots()
            mask = kv_cache.attention_mask(batch.lengths, slots, tree.mask, self.target.dtype)
        with phase("verify"):
            positions = batch.lengths[:, None] + tree.depth
            logits, aux = self.target.forward(tree.tokens, positions, mask, cache, capture=self.capture)
            if constrained(batch.seqs):  # the grammar's mask at every node of each constrained row's tree
                logits = constrain(batch.seqs, tree.tokens, tree.parents, logits)

        width = spec.path_width  # static, so no shape waits on the device
        with phase("accept"):
            finite = finite_rows(logits)  # [B]: read back with the tokens
            cols, counts, bonus = accept(tree, logits, width, rows.kind, rows.floats, rows.ints, batch.lengths,
                                         self.ops, rows.pen_tensors())  # [B, width], [B], [B]
        old = batch.lengths
        with phase("commit"):
            lengths = cache.commit(old, slots + cols, counts)
            new, path_aux = accepted_path(tree, aux, cols, counts, bonus)  # aux: None without a draft
            pending = None
            if logprobs:
                pending = path_logprobs(logits, tree.tokens.gather(1, cols), cols, new, rows, self.ops)
            if rows.pen is not None:
                rows.pen.counts = record(rows.pen.counts, new, counts)
        if self.capture:
            batch.draft_logits, batch.draft_hidden = self.draft_extend(batch.draft_cache, old, new, path_aux, counts)
        host = torch.cat([new, counts[:, None], lengths[:, None], bonus[:, None], finite.long()[:, None]], dim=1)
        return host, pending

    def draft_extend(self, cache, base, tokens, aux, counts):
        """Feed ``tokens`` [B, K] with aux states [B, K, n*H] at positions base..; keep counts[b]. Returns the
        draft's (logits [B, draft_vocab], hidden [B, H]) after each row's last kept token: on the native path
        one graph replay per path width, elsewhere (and past the last bucket) the same function eagerly, its
        keys at the cache's end."""
        with phase("extend"):
            width = tokens.shape[1]
            if cache is self.draft_steps.pool and width in self.extenders:
                out = self.extenders[width](base, tokens, aux, counts)
                if out is not None:
                    return out
            slots = cache.num_slots()
            cache.begin(width)  # room for the block, on a static cache
            prefix = torch.full((1,), slots, dtype=torch.long, device=tokens.device)
            out = draft_extend_static(self.draft_steps.net, cache, base, tokens, aux, counts, prefix, slots + width)
            cache.advance(width)
            return out
