"""What the engine works on: a ``Sequence`` (one request: its prompt, its output so far, why it ended), a
``Batch`` of them on the device (their caches, lengths and the draft's last output), a step of it in flight
(``Launched``), and ``Output``, what ``Engine.generate`` returns for each prompt.

A sequence takes its tokens through ``Sequence.emit``, which stops at the request's stop tokens, its
grammar's end, its token budget or the engine's context. A fault confined to one row ends that row alone
(``Sequence.fail``: ``finish_reason`` "error", ``error`` says why); ``scrub`` zeroes its slots in the
preallocated caches when it leaves the batch.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..config import SpecConfig
from ..sample.grammar import RowGrammar
from ..sample.logprobs import Pending, TokenLogprob
from ..sample.sampling import SamplingParams, SamplingRows
from .adaptive import GREEDY, kind_of
from .feed import Feed
from .stats import SpecStats

_ids = itertools.count()
_batches = itertools.count()


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    rid: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    seed: int | None = None  # what keys this row's draws (``rng.py``): the request's, or fresh at creation
    error: str | None = None  # with "error": what went wrong for this row (the others go on)
    grammar: RowGrammar | None = None  # with ``params.grammar``: its matcher over the output (``grammar.py``)
    logprobs: list[TokenLogprob] | None = None  # with params.logprobs: one per output token (``logprobs.py``)
    # with params.prompt_logprobs: one per prompt token, None for the first (nothing predicts it), filled by prefill
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def __post_init__(self):
        if self.seed is None:
            self.seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fail(self, message: str) -> None:
        """End this sequence alone with an error (a fault of its own row); a finished one stays as it is."""
        if not self.finished:
            self.finish_reason, self.error = "error", message

    def emit(self, tokens: list[int], eos: frozenset[int], context_limit: int,
             logprobs: list[TokenLogprob] | None = None) -> list[int]:
        """Append ``tokens`` up to a stop condition (and their ``logprobs``, where the row asks); return what
        was appended. ``eos``: the target's end tokens (ignored with ``ignore_eos``); ``context_limit``: the most
        tokens the row may hold, prompt and output (the context): there the row ends with "length"."""
        if self.finished:
            return []
        p = self.params
        if len(self.output_ids) >= p.max_new_tokens:  # max_new_tokens 0: the prompt alone, its first token unsaid
            self.finish_reason = "length"
            return []
        stops = p.stop_ids(eos)
        most = min(p.max_new_tokens, context_limit - len(self.prompt_ids))  # output tokens the row may hold
        out = []
        for t in tokens:
            out.append(t)
            if self.grammar is not None and not self.grammar.advance(t):
                self.fail(f"internal engine error: token {t} was emitted against the request's grammar")
                break
            if t in stops or self.grammar is not None and self.grammar.terminated:
                self.finish_reason = "stop"
                break
            if len(self.output_ids) + len(out) >= most:
                self.finish_reason = "length"
                break
        self.output_ids.extend(out)
        if self.logprobs is not None:
            self.logprobs.extend(logprobs[:len(out)])
        return out


@dataclass
class Batch:
    seqs: list[Sequence]
    target_cache: object
    draft_cache: object | None
    lengths: torch.Tensor  # [B] committed tokens in both caches (slot == position)
    root: torch.Tensor  # [B] last emitted token, not yet in the target cache
    # [B, draft_vocab] predicts the tree's depth 1; None after steps that drafted nothing, when the next speculative
    # step computes it from draft_hidden (Engine.step)
    draft_logits: torch.Tensor | None = None
    draft_hidden: torch.Tensor | None = None  # [B, H] the state that produced draft_logits
    rows: SamplingRows | None = None  # the rows' sampling settings on the device (built on membership changes)
    # (serial, steps) name what the tensors above hold: a step graph that left exactly that in its buffers
    # (``BatchGraph``'s carry) takes nothing from them. Membership changes make a new batch, a new serial.
    serial: int = field(default_factory=lambda: next(_batches))
    steps: int = 0  # steps launched (``Engine.launch``)
    feed: Feed | None = None  # what plain steps kept for the draft (``feed.py``), None before any did
    deferred: int = 0  # plain steps since the draft was last fed: no row's feed holds more
    feeds: int = 0  # times the draft took the feed: the feed's tensors changed outside a step graph

    def __len__(self) -> int:
        return len(self.seqs)

    @cached_property
    def drawing(self) -> int:
        """Rows that sample (the rest take the argmax); membership changes make a new batch."""
        return sum(not s.params.greedy for s in self.seqs)

    @cached_property
    def kinds(self) -> list[str]:
        """Each row's kind for adaptive speculation's acceptance (``adaptive.kind_of``: greedy or a band of
        temperature)."""
        return [kind_of(s.params) for s in self.seqs]

    @cached_property
    def mix(self) -> dict[str, int]:
        """{kind: rows} of the rows that sample (``kinds``)."""
        return dict(Counter(k for k in self.kinds if k != GREEDY))

    def state(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(what the batch holds now, what it holds after the next step): a step graph's ``state``."""
        return (self.serial, self.steps, self.feeds), (self.serial, self.steps + 1, self.feeds)


@dataclass
class Output:
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    stats: SpecStats
    seconds: float
    logprobs: list[TokenLogprob] | None = None


def not_finite(where: str) -> str:
    return (f"internal engine error: the target's logits for this request are not finite (NaN or infinity) {where}, "
            "a numerical fault of the model on this input; this request alone was ended, retry it or serve the "
            "model in another --dtype (float16 overflows where bfloat16 and float32 do not)")


def in_place(keep: list[int]) -> list[int]:
    """``keep`` (the rows a batch keeps, ascending) in the order that moves the fewest of them (``Engine.filter``
    copies the moved rows' caches): a kept row stays where it is, and rows past the kept count take the places
    of the rows that left. A batch of 64 that loses one row moves one, not all those after it."""
    count, out = len(keep), [-1] * len(keep)
    for r in keep:
        if r < count:
            out[r] = r
    for i, r in zip([i for i, r in enumerate(out) if r < 0], [r for r in keep if r >= count]):
        out[i] = r
    return out


def scrub(batch: Batch, rows: list[int]) -> None:
    """Zero ``rows`` of the batch's preallocated caches, every slot (a growing cache drops them instead): a
    later row in their place would otherwise attend over a NaN in a masked slot (0 x NaN is NaN)."""
    for cache in (batch.target_cache, batch.draft_cache):
        if cache is not None:
            cache.scrub(rows)


@dataclass
class Launched:
    """A step on the device (``Engine.launch``), its tokens on their way to the host (``Engine.collect``)."""

    batch: Batch
    spec: SpecConfig
    host: torch.Tensor  # [B, width + 4]: on the device until ``keep`` copies it out
    pending: Pending | None  # the asking rows' logprobs
    start: float  # when it was launched
    arrived: object = None  # after ``keep`` on a GPU: the CUDA event marking the copy's arrival in pinned memory

    def keep(self) -> None:
        """Copy the tokens out before the next step is launched ahead: a whole step's outputs are its graph's
        buffers, which that step overwrites. On a GPU the copy goes into pinned memory, queued behind this
        step and before the next, so ``collect`` waits for this step alone."""
        if self.host.is_cuda:
            pinned = torch.empty(self.host.shape, dtype=self.host.dtype, pin_memory=True)
            self.host, self.arrived = pinned.copy_(self.host, non_blocking=True), torch.cuda.Event()
            self.arrived.record()
        else:
            self.host = self.host.clone()
