"""Prefill: run new prompts, pick each row's first token, prime the draft (``Engine.prefill``).

Two routes. ``prefill_eagerly`` runs the prompts right-padded through the target on a growing cache, then
the draft over them, for any prompts on any path; it launches every op of every layer from the host, so
its time is the host's, not the GPU's. On the native path ``StaticPrefill`` does a prefill of at most 4
prompts, padded to a token bucket T (32, 64, ... ``PREFILL_TOKENS``), on preallocated caches of its own in
two graph replays around the one readback a prefill needs anyway:

1. ``prefill_static``: the target over the right-padded prompts: each row's causal mask
   (``ops.block_mask``), the forward, the logits at each row's last token, and the aux states (one
   graph per (rows, T));
2. the first token, drawn on the device (greedy or sampled, ``sampler.first_tokens``) and read back
   (``read_first_tokens``, on both routes);
3. the draft over the prompt shifted by one with the first token last (``draft_extend_static``, one
   graph per (rows, T)), which leaves the draft's output for the first tree.

The batch then holds these caches until it joins the running batch (``Engine.merge``, or its first
step: ``StaticKV.append_rows``, one copy); a second prefill before that runs eagerly, as do longer
prompts and larger prefill batches. Without a draft only the target's graph runs.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from dataclasses import dataclass, field

import torch

from ..models import consts, kv_cache
from ..models.graphs import BatchGraph, buckets, share_pool
from ..models.kernel_settings import KernelSettings
from ..sample.grammar import constrain, constrained
from ..sample.logprobs import Pending, first_logprobs, prompt_logprobs
from ..sample.penalties import record
from ..sample.sampling import SamplingRows
from ..spec.drafter import StaticExtender
from ..spec.ops import TORCH, ops_for
from ..spec.verify import finite_rows
from .batch import Batch, Sequence, not_finite
from .sampler import first_tokens

PREFILL_TOKENS = 1024  # the longest prompt a graph prefills
PREFILL_ROWS = 4  # the most prompts one graph prefills
PREFILL_CELLS = 2048  # rows x T of the largest bucket (the 1024-token bucket has 2 rows)
PREFILL_GROUPS = 4  # prompts arriving together take up to this many graph prefills in a row; more, eager ones
EAGER_CELLS = 16384  # rows x longest prompt of one eager prefill (its rows are padded to the longest)
PROMPT_LOGPROBS_TOKENS = 512  # the longest piece of a prompt whose logprobs are asked for, its logits all kept
PROMPT_LOGPROBS_CELLS = 1024  # rows x longest prompt of prompts asking for logprobs prefilled together, all logits kept


def prefill_static(native, pool, ids: torch.Tensor, lens: torch.Tensor, aux_ids: tuple[int, ...], window: int):
    """The target over prompts ``ids`` [B, T] (row b's first ``lens[b]`` tokens are real) at positions
    ``0..T-1`` of an empty ``pool`` (T == ``window``): ``(logits [B, vocab] at each row's last token,)``
    plus the aux states [B, T, n * hidden] when ``aux_ids`` names layers. One graph per (rows, T)."""
    bsz, t = ids.shape
    dev = ids.device
    i = consts.arange(t, dev)
    start = consts.full((1,), 0, torch.long, dev)
    none = consts.full((bsz,), 0, torch.long, dev)  # no committed slots before the prompt
    mask = ops_for(pool, lens, native.rope).block_mask(none, lens, start, t, window, pool.buf.dtype)
    pool.aim(window, i)
    logits, aux = native(ids, i.expand(bsz, t), mask, pool, aux_ids, last=(lens - 1).clamp(min=0))
    return (logits[:, 0],) if aux is None else (logits[:, 0], aux)


def by_cells(order: list[int], lengths: list[int], cells: int = EAGER_CELLS) -> list[list[int]]:
    """``order`` (indices of ``lengths``, ascending by length) cut into prefills of at most ``cells`` rows x
    longest length each (a prompt longer than that alone)."""
    out, group = [], []
    for i in order:
        if group and (len(group) + 1) * lengths[i] > cells:
            out.append(group)
            group = []
        group.append(i)
    return out + ([group] if group else [])


class StaticPrefill:
    """Graph-replayed prefill for the native path (see the module's doc). ``__call__`` returns None
    where it does not apply; the engine then prefills eagerly."""

    def __init__(self, target, draft_steps, max_batch: int, max_context: int, aux_ids: tuple[int, ...],
                 enabled: bool, kernels: KernelSettings):
        self.native, self.aux_ids = target.native, aux_ids
        self.tokens = buckets(max(1, min(PREFILL_TOKENS, max_context)), 32)
        self.rows = buckets(max(1, min(PREFILL_ROWS, max_batch)))
        self.target_cache = target.static_cache(self.rows[-1], self.tokens[-1], kernels)
        self.draft_cache = draft_steps.static_cache(self.rows[-1], self.tokens[-1], kernels) if draft_steps else None
        self.targets, self.drafts = {}, {}
        for t in self.tokens:
            rows = [r for r in self.rows if r * t <= PREFILL_CELLS] or [1]
            self.targets[t] = BatchGraph(self._target_fn(t), self.target_cache, rows, [t], enabled,
                                         name=f"prefill {t}", example=self._example(t), top_slots=t)
            if draft_steps is not None:
                self.drafts[t] = StaticExtender(draft_steps.net, self.draft_cache, t, rows, enabled, windows=[t],
                                                name="prefill draft")
        share_pool(self.graphs())  # they never run at once, and each one's outputs are copied out before the next runs
        self._holder = None  # the batch the caches are lent to, until it joins the running batch

    def _target_fn(self, t: int):
        return lambda inputs, window: prefill_static(self.native, self.target_cache, inputs["ids"], inputs["lens"],
                                                     self.aux_ids, window)

    def _example(self, t: int):
        def example(rows: int, window: int = 0):
            ids = torch.zeros((rows, t), dtype=torch.long, device=self.target_cache.buf.device)
            return {"ids": ids, "lens": ids[:, 0]}, {}
        return example

    def groups(self, lengths: list[int]) -> list[list[int]]:
        """How prompts of ``lengths`` that arrive together are prefilled: lists of their indices, each
        list one prefill. Those that fit a bucket go in graph-sized groups (by length, each group within
        its longest prompt's bucket's rows), then the rest eagerly; past ``PREFILL_GROUPS`` groups all of
        them eagerly (a 2 ms replay each then costs more than a batched eager forward). Eager prefills pad
        their rows to the longest, so they take prompts of like length, ``EAGER_CELLS`` padded tokens at
        most each (``by_cells``): 64 chat prompts of 20 to 2,000 tokens padded to one forward would run
        64 x 2,000 tokens."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        fit = [i for i in order if lengths[i] <= self.tokens[-1]]
        groups, group = [], []
        for i in fit:  # ascending: the prompt joining a group is its longest
            if len(group) == self.targets[self.tokens[bisect_left(self.tokens, lengths[i])]].rows[-1]:
                groups.append(group)
                group = []
            group.append(i)
        groups += [group] if group else []
        if len(groups) > PREFILL_GROUPS:
            return by_cells(order, lengths)
        return groups + by_cells(order[len(fit):], lengths)

    def graphs(self) -> list:
        return list(self.targets.values()) + [d.graph for d in self.drafts.values()]

    def reset(self) -> None:
        for cache in (self.target_cache, self.draft_cache):
            if cache is not None:
                cache.reset()
        self._holder = None

    def lend(self, batch) -> None:
        """``batch`` now holds the prefill caches (the prefill's own batch, or ``Engine.filter``'s of it)."""
        self._holder = weakref.ref(batch)

    def lent(self) -> bool:
        batch = self._holder() if self._holder is not None else None
        return batch is not None and batch.target_cache is self.target_cache

    @torch.inference_mode()
    def __call__(self, prompts: list[list[int]], first_of):
        """``(first tokens as a host list, draft_logits, draft_hidden)`` for ``prompts``, their keys in
        ``target_cache`` (and ``draft_cache``); ``first_of(logits [B, vocab])`` picks each row's first token.
        None when the prompts do not fit a bucket or the caches are still lent."""
        b, width = len(prompts), max(len(p) for p in prompts)
        i = bisect_left(self.tokens, width)
        if i == len(self.tokens) or self.lent():
            return None
        t = self.tokens[i]
        if b > self.targets[t].rows[-1]:
            return None
        host = torch.zeros((b, t + 1), dtype=torch.long)  # one column more: the draft's input, shifted by one
        for r, p in enumerate(prompts):
            host[r, : len(p)] = torch.tensor(p)
        dev = self.target_cache.buf.device
        ids, lens = host[:, :t].to(dev), torch.tensor([len(p) for p in prompts], device=dev)
        self.target_cache.hold()
        out = self.targets[t]({"ids": ids, "lens": lens}, {}, t)
        if out is None:
            return None
        firsts = first_of(out[0])
        self.target_cache.hold(b, width)
        if self.draft_cache is None:
            return firsts, None, None
        for r, p in enumerate(prompts):
            host[r, len(p)] = firsts[r]
        self.draft_cache.hold()
        logits, hidden = self.drafts[t](consts.full((b,), 0, torch.long, dev), host[:, 1:].to(dev), out[1], lens)
        self.draft_cache.hold(b, width)
        return firsts, logits, hidden


def logprob_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of prompts that ask for their logprobs, in groups prefilled together (``prefill_eagerly``, every
    position's logits kept): shortest first, each group's rows x longest prompt within ``PROMPT_LOGPROBS_CELLS``;
    a prompt longer than ``PROMPT_LOGPROBS_TOKENS`` alone (``prefill_chunk`` takes it in pieces)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):  # a group's last prompt is its longest
        n = lengths[i]
        last = groups[-1] if groups and n <= PROMPT_LOGPROBS_TOKENS else None
        if last is not None and (len(last) + 1) * n <= PROMPT_LOGPROBS_CELLS:
            last.append(i)
        else:
            groups.append([i])
    return groups


def in_pieces(seqs: list[Sequence]) -> bool:
    """Whether ``seqs`` are prefilled each alone, in pieces (``prefill_chunk``, then ``stacked``): some ask for their
    prompts' logprobs and the prompts are not one group of ``logprob_groups``."""
    asking = [len(s.prompt_ids) for s in seqs if s.prompt_logprobs is not None]
    return bool(asking) and (len(asking) < len(seqs) or len(logprob_groups(asking)) > 1
                             or max(asking) > PROMPT_LOGPROBS_TOKENS)


def prefill_eagerly(target, seqs: list[Sequence], first_of, extend=None) -> tuple[Batch, list[int]]:
    """The prompts of ``seqs`` right-padded through ``target`` on a growing cache: the batch and each row's
    first token (``first_of(logits [B, vocab])`` picks them). ``extend``: the draft extend
    (``StepByParts.draft_extend``) that feeds the prompts, shifted by one with the first token last, to the
    draft on a cache of its own; None without a draft. Where the rows ask for their prompts' logprobs
    (``logprob_groups``' groups: all or none of them), every position's logits are kept and reduced to them
    (``logprobs.prompt_logprobs``), read back with the first tokens."""
    dev = target.device
    lens = torch.tensor([len(s.prompt_ids) for s in seqs], device=dev)
    width = int(lens.max())
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=dev)
    for i, s in enumerate(seqs):
        ids[i, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids, device=dev)
    positions = torch.arange(width, device=dev).expand(len(seqs), width)
    visible = causal(lens, width)
    mask = kv_cache.attention_mask(torch.zeros_like(lens), 0, visible, target.dtype)
    last = lens - 1
    asks = seqs[0].prompt_logprobs is not None
    keep = None if asks else torch.unique(last)  # the logits kept: at every position where the rows ask
    cache = kv_cache.new_cache()
    logits, aux = target.forward(ids, positions, mask, cache, capture=extend is not None, logits_at=keep)
    pending = [prompt_logprobs(logits[i, : len(s.prompt_ids) - 1], ids[i, 1 : len(s.prompt_ids)],
                               s.params.prompt_logprobs) if asks and len(s.prompt_ids) > 1 else None
               for i, s in enumerate(seqs)]
    logits = logits[torch.arange(len(seqs), device=dev), last if asks else torch.searchsorted(keep, last)]  # [B, V]
    firsts = first_of(logits)
    for s, p in zip(seqs, pending):  # the first tokens' readback waited on the device: these are on the host
        if p is not None:
            s.prompt_logprobs += p.row()
    first = torch.tensor(firsts, device=dev)
    batch = Batch(seqs, cache, None, lens.clone(), first)
    if extend is not None:
        batch.draft_cache = kv_cache.new_cache()
        shifted = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
        shifted[torch.arange(len(seqs), device=dev), last] = first
        batch.draft_logits, batch.draft_hidden = extend(batch.draft_cache, torch.zeros_like(lens), shifted, aux, lens)
    return batch, firsts


@dataclass
class Prefilling:
    """One prompt prefilled a chunk at a time (``prefill_chunk``), on growing caches of its own: how far it got."""

    seq: Sequence
    cache: object = field(default_factory=kv_cache.new_cache)
    draft_cache: object = field(default_factory=kv_cache.new_cache)
    done: int = 0  # prompt tokens in the caches
    pending: list[Pending] = field(default_factory=list)  # with prompt logprobs: each piece's, not yet unpacked


def prefill_chunk(target, part: Prefilling, chunk: int, first_of, extend=None) -> tuple[Batch, list[int]] | None:
    """The next ``chunk`` tokens of ``part``'s prompt through ``target`` on top of the ones before them, and the
    same tokens shifted by one through the draft (``extend``, as ``prefill_eagerly``'s). None until the prompt's
    last chunk; then ``prefill_eagerly``'s (batch, first token) for the one row: ``first_of`` picks the first
    token from the logits at the prompt's last token, which ends the draft's input.

    A row that asks for its prompt's logprobs (``Sequence.prompt_logprobs``) keeps the logits at every position
    and runs its chunk in pieces of at most ``PROMPT_LOGPROBS_TOKENS``, each piece's logits reduced to the
    prompt tokens' logprobs and top N at once (``logprobs.prompt_logprobs``): never a [prompt, vocab] tensor.
    They reach ``Sequence.prompt_logprobs`` with the first token's readback."""
    if part.seq.prompt_logprobs is not None:
        end = min(part.done + chunk, len(part.seq.prompt_ids))
        while end - part.done > PROMPT_LOGPROBS_TOKENS:
            _piece(target, part, PROMPT_LOGPROBS_TOKENS, first_of, extend)
        chunk = end - part.done
    return _piece(target, part, chunk, first_of, extend)


def _piece(target, part: Prefilling, chunk: int, first_of, extend) -> tuple[Batch, list[int]] | None:
    seq, dev = part.seq, target.device
    prompt, asks = seq.prompt_ids, seq.prompt_logprobs is not None
    start, end = part.done, min(part.done + chunk, len(prompt))
    width, last = end - start, end == len(prompt)
    base = torch.full((1,), start, dtype=torch.long, device=dev)
    visible = torch.ones((1, width, width), dtype=torch.bool, device=dev).tril()
    mask = kv_cache.attention_mask(base, start, visible, target.dtype)  # [1, 1, width, start + width]
    ids = torch.tensor([prompt[start:end]], device=dev)
    logits, aux = target.forward(ids, base[:, None] + torch.arange(width, device=dev), mask, part.cache,
                                 capture=extend is not None,
                                 logits_at=None if asks else torch.tensor([width - 1], device=dev))
    part.done = end
    if asks and start + 1 < len(prompt):  # position i predicts prompt token i + 1 (the last, the first output token)
        after = torch.tensor(prompt[start + 1 : end + 1], device=dev)
        part.pending.append(prompt_logprobs(logits[0, : len(after)], after, seq.params.prompt_logprobs))
    firsts = first_of(logits[:, -1]) if last else None
    if last and asks:  # the first tokens' readback waited on the device: the pieces' logprobs are on the host
        for p in part.pending:
            seq.prompt_logprobs += p.row()
        part.pending.clear()
    batch = Batch([seq], part.cache, None, torch.tensor([end], device=dev), None) if last else None
    if extend is not None:
        shifted = prompt[start + 1 : end] + (firsts if last else prompt[end : end + 1])
        out = extend(part.draft_cache, base, torch.tensor([shifted], device=dev), aux, base.new_full((1,), width))
        if batch is not None:
            batch.draft_cache, (batch.draft_logits, batch.draft_hidden) = part.draft_cache, out
    if batch is None:
        return None
    batch.root = torch.tensor(firsts, device=dev)
    return batch, firsts


def stacked(batches: list[Batch]) -> Batch:
    """Batches of one row each on growing caches of their own (``prefill_chunk``'s, their rows' settings set) as
    one batch, rows in order: ``Engine.prefill`` where rows ask for their prompts' logprobs and are not one group
    (``in_pieces``), which runs every prompt alone, in pieces with the logits at every position
    (``prefill_chunk``), never from the graphs."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]

    def cat(name):
        return None if getattr(first, name) is None else torch.cat([getattr(b, name) for b in batches])

    caches = [first.target_cache, first.draft_cache]
    for b in batches[1:]:
        caches = [None if c is None else c.concat_rows(o) for c, o in zip(caches, (b.target_cache, b.draft_cache))]
    rows = first.rows
    for b in batches[1:]:
        rows = rows.concat(b.rows)
    return Batch([s for b in batches for s in b.seqs], caches[0], caches[1], cat("lengths"), cat("root"),
                 cat("draft_logits"), cat("draft_hidden"), rows)


def read_first_tokens(seqs: list[Sequence], rows: SamplingRows, lens: torch.Tensor, logits: torch.Tensor,
                      logprobs: list, ops=TORCH) -> list[int]:
    """Each row's first token from its prefill logits [B, vocab], greedy or drawn on the device
    (``sampler.first_tokens``), read back once with each row's ``finite_rows`` flag. A row whose logits
    are not finite ends with an error (its token a placeholder the batch carries until it is filtered out).
    With penalties, the first tokens start the rows' output counts. Where a row asks, ``logprobs`` gets
    each row's entries (``Pending.unpack``), read back with the tokens."""
    if constrained(seqs):  # the grammar's mask before the first token
        zeros = torch.zeros((len(seqs), 1), dtype=torch.long, device=logits.device)
        logits = constrain(seqs, zeros, zeros - 1, logits[:, None])[:, 0]
    firsts = first_tokens(logits, rows.kind, rows.floats, rows.ints, lens, rows.pen_tensors(), ops)
    pending = first_logprobs(logits, firsts, rows, ops) if rows.logprobs is not None else None
    if rows.pen is not None:
        rows.pen.counts = record(rows.pen.counts, firsts[:, None], torch.ones_like(firsts))
    tokens, finite = torch.stack([firsts, finite_rows(logits).long()]).tolist()
    if pending is not None:
        logprobs[:] = pending.unpack([1] * len(seqs))
    for s, ok in zip(seqs, finite):
        if not ok:
            s.fail(not_finite("after its prompt"))
    return tokens


def causal(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, W, W] causal visibility for right-padded rows; padding sees only itself."""
    i = torch.arange(width, device=lengths.device)
    see = i[None, :, None] >= i[None, None, :]
    valid = i[None, None, :] < lengths[:, None, None]
    return see & (valid | (i[None, :, None] == i[None, None, :]))
