"""A step on the native path's static caches as one CUDA graph, with a draft or without.

``Engine.step`` can build a step from parts (``by_parts.py``): the mask, the target's replay, the
acceptance, the commit and the gathers around it, each a launch from the host, which then waits for
the one read-back. At batch 1 that host work left the GPU idle for a measurable share of a
Llama-3.1-8B step (``benchmarks/decode_8b.py``). The whole step is a function of a few tensors (each
row's length and last token, the draft's last output, and the slots the new keys go to), so it is
captured whole (``step_static``, ``StaticStep``): a step is a few input copies (none when the same
batch steps again: the carry), one replay and the read-back. Plain decoding is the same function with
a tree of the root alone: the draft, if there is one, is still fed (an adaptive spec's plain steps), or its
feed is kept for later (``feed.py``: one extend every few plain steps).

Each setting is captured in four variants, by what the batch's rows need (``SamplingRows.kind``):
``greedy`` (the argmax, ``accept_greedy_batch``: no cost for greedy batches), ``sampled`` (draws
on the device, ``sampler.accept_rows``, temperature and min-p only), ``filtered`` (the same
with the thresholds top-k and top-p need) and ``penalized`` (penalties and logit bias along the tree
first, ``penalties.py``, then as ``filtered``). The sampled variants take the rows' settings as two
more inputs; the penalized one also the rows' ``Penalties`` and returns their token counts with the
step's tokens added (``penalties.record``), so the counts never leave the device. The penalized
variant is captured when first used, not at startup (``STARTUP_KINDS``): only batches with penalties
pay for it.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig
from ..models import consts
from ..models.graphs import BatchGraph, share_pool, window_buckets
from ..sample.penalties import Penalties, record
from ..sample.sampling import GREEDY, KINDS, PENALIZED
from ..spec.drafter import draft_extend_static, draft_tree_static
from ..spec.ops import ops_for
from ..spec.tree import Tree
from ..spec.verify import accepted_path, finite_rows
from .feed import Feed, append
from .sampler import accept

STARTUP_KINDS = KINDS[:-1]  # the variants ``Engine.warm_up`` captures; PENALIZED's on first use
PEN = ("pen_floats", "pen_bias", "pen_prompt", "pen_counts", "pen_stops")  # the penalized variant's extra inputs
FEED = ("feed_tokens", "feed_aux", "feed_n")  # a deferring plain step's extra inputs (``Feed``'s fields)


def kept(inputs: dict, value: torch.Tensor) -> torch.Tensor:
    """``value`` [R, ...] on the live rows, zeros on a bucket's padding (``BatchGraph``'s carry keeps those zero)."""
    live = inputs["live"] > 0
    return torch.where(live.view((-1,) + (1,) * (value.dim() - 1)), value, 0)


def variants(make) -> dict:
    """One ``BatchGraph`` per kind, ``make(kind)`` building it, in one memory pool (``share_pool``): a
    carried step's outputs (views the batch reads at its next step) are safe there because the kind only
    changes with the batch's rows, and a new batch (``Engine.filter``, ``merge``) copies them first."""
    graphs = {kind: make(kind) for kind in KINDS}
    share_pool(graphs.values())
    return graphs


def rows_example(kind: str, rows: int, device, vocab: int) -> dict:
    """The sampling inputs of a variant (none for greedy): greedy rows without penalties, as a bucket's padding
    is (zeros; a repetition penalty of 0 counts as off)."""
    if kind == GREEDY:
        return {}
    out = {"floats": torch.zeros((rows, 3), device=device), "ints": torch.zeros((rows, 2), dtype=torch.long,
                                                                                device=device)}
    if kind == PENALIZED:
        out.update(zip(PEN, Penalties.identity(rows, vocab, device).tensors()))
    return out


def rows_inputs(rows) -> dict:
    if rows.kind == GREEDY:
        return {}
    out = {"floats": rows.floats, "ints": rows.ints}
    return {**out, **dict(zip(PEN, rows.pen.tensors()))} if rows.kind == PENALIZED else out


def pen_of(inputs: dict) -> tuple | None:
    """The penalized variant's ``Penalties.tensors()`` among a graph's inputs; None in the others."""
    return tuple(inputs[n] for n in PEN) if PEN[0] in inputs else None


def vocab_of(native) -> int:
    return native.lm_head.weight.shape[0]


def step_static(native, tpool, aux_ids: tuple[int, ...], draft, dpool, spec: SpecConfig, lengths, root, logits0,
                hidden0, live, tprefix: torch.Tensor, dprefix: torch.Tensor | None, window: int, kind: str = GREEDY,
                floats=None, ints=None, pen=None, feed: tuple | None = None):
    """One step on the static caches with only tensors varying between calls, so it is one graph per
    (kind, rows, window): draft a tree (``spec``'s settings; the root alone when it drafts nothing) from the
    draft's last output (``logits0`` [B, draft_vocab], ``hidden0`` [B, H]), verify it with the target (its
    keys at slots ``tprefix..``), accept (greedily, or each node's draw under the rows' settings
    ``floats``/``ints``: ``sampler.accept``), commit the accepted path, and, with a ``draft``, feed it to the
    draft (keys at ``dprefix..``), or, given a ``feed`` (``Feed``'s tensors: a plain step that defers the
    draft's feed, ``feed.py``), append its token to the feed instead. Returns (``host`` [B, width + 4]: the
    emitted tokens padded to the path width, their count, the new length, the next root, whether the target's
    logits over the row's tree were finite (``finite_rows``: 0 ends that row alone); with a draft, its logits
    [B, draft_vocab] (not for a ``spec`` that drafts nothing) and hidden state [B, H] after the last kept
    token, or with a ``feed`` its three tensors after the append; with ``pen``, the penalized variant's, then
    the rows' token counts with the emitted tokens added). Rows with ``live`` 0 (a bucket's padding, or the
    zeros a graph is warmed up with) keep their keys where they were written."""
    dev = root.device
    if spec.speculative:
        tree = draft_tree_static(draft, dpool, lengths, root, logits0, hidden0, spec, dprefix, window)
    else:
        tree = Tree.root_only(root)
    size, width = tree.size, spec.path_width
    ops = ops_for(tpool, lengths, native.rope)
    mask = ops.tree_mask(lengths, tree.mask, tprefix, window, tpool.buf.dtype)  # [B, 1, T, window]
    tpool.aim(window, tprefix + consts.arange(size, dev))
    logits, aux = native(tree.tokens, lengths[:, None] + tree.depth, mask, tpool, aux_ids)
    cols, counts, bonus = accept(tree, logits, width, kind, floats, ints, lengths, ops, pen)
    kept = live > 0
    new_lengths = tpool.commit(torch.where(kept, lengths, tprefix), tprefix + cols, counts)
    new, path_aux = accepted_path(tree, aux, cols, counts, bonus)
    host = torch.cat([new, counts[:, None], new_lengths[:, None], bonus[:, None], finite_rows(logits).long()[:, None]],
                     dim=1)
    out = (host,)
    if feed is not None:  # the token at each row's old length: the position whose aux states the draft needs
        out = (host, *append(*feed, new[:, 0], path_aux[:, 0], kept & (counts > 0)))
    elif draft is not None:
        # Without speculation (an adaptive spec's plain steps) the draft is fed but its logits are left out: the
        # next speculative step computes them from the hidden state (``Engine.step``), so a plain step costs less.
        logits1, hidden1 = draft_extend_static(draft, dpool, lengths, new, path_aux, torch.where(kept, counts, 0),
                                               dprefix, window, with_logits=spec.speculative)
        out = (host, hidden1) if logits1 is None else (host, logits1, hidden1)
    return out if pen is None else (*out, record(pen[3], new, counts))


class StaticStep:
    """``step_static`` for one setting, as one graph replay per (kind, rows, window): ``graphs[kind]``.
    ``draft`` and ``dpool`` are None for an engine without a draft (its one setting drafts nothing). With a
    draft, a setting that drafts nothing and ``feed_width`` > 0 defers the draft's feed (``defers``): each step
    appends to the batch's ``Feed`` of that width, which the engine feeds to the draft later."""

    def __init__(self, native, tpool, aux_ids, draft, dpool, spec: SpecConfig, rows: list[int], enabled: bool,
                 feed_width: int = 0):
        self.native, self.tpool, self.aux_ids = native, tpool, aux_ids
        self.draft, self.dpool, self.spec = draft, dpool, spec
        self.feed_width = feed_width if draft is not None and not spec.speculative else 0
        self.defers = self.feed_width > 0
        self.steps = 0  # steps run whole (the rest ran by parts)
        self._live = None
        # the most slots past a prefix any part writes: the tree's levels or the verified tree (the extend's
        # path is never longer than the tree)
        self.span = max(spec.num_steps * spec.eagle_topk, spec.num_draft_tokens) if spec.speculative else 1
        setting = f"{spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens}" if spec.speculative else "0"
        self.graphs = variants(lambda kind: BatchGraph(
            lambda inputs, window: self._fn(inputs, window, kind), tpool, rows, window_buckets(tpool.capacity_slots),
            enabled, name=f"step {setting} {kind}", example=lambda r, _w: self._example(r, kind),
            top_slots=self.span, carry=None if kind == PENALIZED else self._carry))
        self.graph = self.graphs[GREEDY]

    def _carry(self, inputs, outputs):
        """What a step leaves for the next: the new lengths and root (``host``'s columns), the draft's output, and
        the caches' next slot."""
        host, width = outputs[0], self.spec.path_width
        lengths = kept(inputs, host[:, width + 1])
        used = lengths.max().view(1)  # the caches' next prefix: ``Engine.collect`` crops them to the longest row
        out = {"lengths": lengths, "root": kept(inputs, host[:, width + 2]), "tprefix": used}
        if self.draft is not None and not self.defers:  # a deferring step's feed is written in its inputs
            out.update(hidden0=kept(inputs, outputs[-1]), dprefix=used)
        if self.spec.speculative:
            out["logits0"] = kept(inputs, outputs[1])
        return out

    def _fn(self, inputs, window, kind):
        return step_static(self.native, self.tpool, self.aux_ids, self.draft, self.dpool, self.spec,
                           inputs["lengths"], inputs["root"], inputs.get("logits0"), inputs.get("hidden0"),
                           inputs["live"], inputs["tprefix"], inputs.get("dprefix"), window, kind,
                           inputs.get("floats"), inputs.get("ints"), pen_of(inputs),
                           tuple(inputs[n] for n in FEED) if self.defers else None)

    def _drafts(self, logits0, hidden0) -> dict:
        """The draft's last output among the inputs: none without a draft, no logits for a setting that drafts
        nothing (after plain steps they are None, ``Engine.step``); none for a step that defers the feed."""
        if self.draft is None or self.defers:
            return {}
        return {"logits0": logits0, "hidden0": hidden0} if self.spec.speculative else {"hidden0": hidden0}

    def _example(self, rows: int, kind: str):
        dev = self.tpool.buf.device
        ids = torch.zeros(rows, dtype=torch.long, device=dev)
        fixed = {"tprefix": 0}
        drafts = {}
        if self.defers:
            drafts = dict(zip(FEED, vars(self.new_feed(rows)).values()))
        elif self.draft is not None:
            w = self.draft.fc.weight
            drafts = self._drafts(torch.zeros((rows, self.draft.draft_vocab_size), dtype=w.dtype, device=dev),
                                  torch.zeros((rows, self.draft.config.hidden_size), dtype=w.dtype, device=dev))
            fixed["dprefix"] = 0
        return ({"lengths": ids, "root": ids, **drafts, "live": ids,
                 **rows_example(kind, rows, dev, vocab_of(self.native))}, fixed)

    def new_feed(self, rows: int) -> Feed:
        """An empty ``Feed`` for a batch of ``rows`` that this step defers for."""
        w = self.draft.fc.weight
        return Feed.empty(rows, self.feed_width, w.shape[1], w.dtype, w.device)

    @torch.inference_mode()
    def __call__(self, lengths, root, logits0, hidden0, rows, state: tuple | None = None, ahead: bool = False,
                 feed: Feed | None = None):
        """(host [B, width + 4], draft logits, draft hidden, feed) as ``step_static`` returns them for a batch
        of sampling settings ``rows`` (``SamplingRows``, whose penalty counts it updates), or None past the
        last bucket (run the step by parts). The logits are None for a setting that drafts nothing, both
        without a draft or where the step ``defers`` the feed; ``feed``: the batch's ``Feed`` where it defers
        (the one returned then holds this step's token too), else None. ``state``: ``BatchGraph``'s (the
        inputs' token, the next one). ``ahead``: the step before is not read back, so the caches' slot counts on
        the host are one step old: the prefix is the longest row's length, read on the device, and the window
        leaves room for one more step's tokens."""
        fixed = {"tprefix": self.tpool.used}
        if self.dpool is not None and not self.defers:
            fixed["dprefix"] = self.dpool.used
        need = max(fixed.values()) + self.span
        if ahead:
            prefix = lengths.max()  # what ``Engine.collect`` crops both caches to, once it has read it
            fixed = dict.fromkeys(fixed, prefix)
            need += self.spec.path_width
        if self._live is None or len(self._live) != len(root):
            self._live = torch.ones_like(root)
        inputs = {"lengths": lengths, "root": root, **self._drafts(logits0, hidden0), "live": self._live,
                  **rows_inputs(rows), **(dict(zip(FEED, vars(feed).values())) if self.defers else {})}
        out = self.graphs[rows.kind](inputs, fixed, need, state)
        if out is None:
            return None
        self.steps += 1
        if rows.pen is not None:
            rows.pen.counts, out = out[-1], out[:-1]
        if self.defers:
            return out[0], None, None, Feed(*out[1:4])
        if self.spec.speculative:
            return (*out, None)
        return out[0], None, out[-1] if self.draft is not None else None, None
