"""The speculative engine: ``prefill`` new sequences, ``step`` a batch, and the batch bookkeeping around them.

A step replays the whole step as one CUDA graph where one fits (``decode.py``), else runs it by parts
(``by_parts.py``: draft a tree, verify it with the target, accept, commit, extend the draft); either way it ends in
one read-back, ``collect``, the host's share; ``launch`` queues the device's, so a caller can launch the next step
before it reads this one (the server's overlap schedule). With ``Algorithm.NONE`` the tree is the root alone, so
plain decoding is the same code path. A ``SpecConfig.schedule`` picks the settings per step from the batch size
(``for_batch``); its no-speculation entries verify the root alone but still feed the draft (draft extend), so it can
draft again when the batch shrinks. An adaptive spec (``--speculative-batch-schedule auto``) leaves the choice to
its ``Chooser`` (``adaptive.py``): step costs per rows bucket (``adaptive.measure_step_costs``, timed at warm-up on
the GPU) and the live acceptance of each setting. Prefill is ``prefill.py``; the native path's caches and graph
runners, ``pools.py``; the sequences and batches, ``batch.py``. Sequences join (``merge``) and leave (``filter``)
between steps: that is all continuous batching needs from the engine.

A fault confined to one row ends that row alone (``finish_reason`` "error", ``Sequence.error`` says why) and the
batch goes on: logits that are not finite (``finite_rows``, read back with the step's tokens, no extra wait on the
device). Such a row emits nothing more, and ``filter`` zeroes its slots in the preallocated caches
(``batch.scrub``).

Where plain steps run beside speculative ones (a schedule, ``auto``), a plain whole step does not feed the draft
itself: it keeps the feed (``feed.py``), and ``feed_draft`` gives the draft all of it at once, before the next
step that drafts or runs by parts, or when the feed is full.
"""

from __future__ import annotations

import time
from itertools import repeat

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..checks import check_room, check_spec
from ..config import Algorithm, SpecConfig
from ..engine_config import EngineConfig
from ..errors import EyasError
from ..models.graphs import buckets
from ..models.native import DraftSteps, NativeTarget
from ..sample.grammar import RowGrammar, constrained, grammars_for
from ..sample.logprobs import Pending
from ..sample.sampling import SamplingParams, SamplingRows
from ..spec.ops import TORCH
from .adaptive import Chooser, model_costs
from .batch import Batch, Launched, Output, Sequence, not_finite, scrub
from .by_parts import StepByParts
from .feed import Feed, feed_draft
from .generate import run_to_end
from .phases import phase
from .pools import native_pools
from .prefill import Prefilling, in_pieces, logprob_groups, prefill_chunk, prefill_eagerly, read_first_tokens, stacked
from .warmup import graph_runners, warm_up

PREFILL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Engine:
    """Generation over a target (and a draft): ``prefill`` new sequences, ``step`` a batch. How it runs is one
    ``EngineConfig`` (``config``, or its fields as keyword arguments: ``Engine(target, max_batch=4)``)."""

    def __init__(self, target, draft=None, spec: SpecConfig | None = None, draft_path: str | None = None,
                 config: EngineConfig | None = None, **settings):
        spec = spec or SpecConfig(Algorithm.NONE if draft is None else Algorithm.EAGLE3)
        config = (config or EngineConfig()).with_(**settings)
        if draft is not None and (draft.aux_layer_ids is not None or target.aux_layer_ids is None):
            target.set_aux_layers(draft.aux_layer_ids)  # None on a shallow target: the error names the fix
        if draft is not None and draft_path is None:
            draft_path = "<in-memory draft>"
        check_spec(spec, target.info, draft, draft_path, target.aux_layer_ids)
        self.target, self.draft, self.spec, self.draft_path, self.config = target, draft, spec, draft_path, config
        self.device = target.device
        self.tree_size = max(spec.verify_sizes)  # the largest tree any step verifies
        self.max_context = target.info.max_context or 1 << 30
        check_room(self.max_context, self.tree_size)  # before any pool is allocated
        self.draft_steps = DraftSteps(draft) if draft is not None else None
        self._eos = frozenset(target.eos_token_ids)
        self.static = isinstance(target, NativeTarget)
        # The native path's caches and runners (``pools.py``); the generic path has none.
        self.whole_steps, self.drafters, self.extenders, self.prefiller = {}, {}, {}, None
        self.ops = TORCH  # the acceptance's and draws' ops outside the graphs: the target pool's kernels, if any
        self.layout = "generic Hugging Face forward, growing KV cache"
        if self.static:
            (self.target_pool, self.target_runner, self.whole_steps, self.drafters, self.extenders, self.prefiller,
             self.ops, self.max_context, self.layout) = native_pools(target, self.draft_steps, spec, config,
                                                                     self.tree_size, self.max_context)
        check_room(self.max_context, self.tree_size)  # the KV pool may hold less than the model takes
        self.by_parts = StepByParts(target, self.draft_steps, self.drafters, self.extenders, self.ops,
                                    spec.speculative)
        rows = buckets(config.graph_rows)
        self.chooser = Chooser(spec.options, model_costs(spec.options, rows)) if spec.adaptive else None
        self._collected = 0.0  # when the last step's tokens were collected
        self._last_setting: SpecConfig | None = None  # the setting of the step collected last
        self._uncollected: Launched | None = None  # the step launched last, until collected or kept
        self._chosen: tuple = (None, None)  # ((batch serial, steps, rows), its next step's setting)

    @property
    def launches_ahead(self) -> bool:
        """Whether ``launch(ahead=True)`` can run a step: the native path's whole steps (not rows by parts)."""
        return bool(self.whole_steps)

    @property
    def context_limit(self) -> int:
        """The most tokens a row may hold, prompt and output: the context (the KV pool has slots past it for
        the largest tree and its bonus, ``native_pools``' slack)."""
        return self.max_context

    def graph_runners(self) -> list:
        """The native path's graph runners (``warmup.graph_runners``)."""
        return graph_runners(self)

    @torch.inference_mode()
    def warm_up(self, progress: bool = True, on_cpu: bool = False) -> str:
        """Capture every CUDA graph the engine can replay now, not on first use (``warmup.warm_up``)."""
        return warm_up(self, progress, on_cpu)

    def _reset_pools(self) -> None:
        """Empty the preallocated caches (after warm-up's work): generation starts from nothing."""
        self.target_pool.reset()
        if self.spec.speculative:
            self.draft_steps.pool.reset()
        if self.prefiller:
            self.prefiller.reset()

    def _own(self, batch: Batch) -> None:
        """Native path: move a freshly prefilled batch's rows into the preallocated caches."""
        if self.static and batch.target_cache is not self.target_pool:
            batch.target_cache = self.target_pool.adopt(batch.target_cache)
            if batch.draft_cache is not None:
                batch.draft_cache = self.draft_steps.pool.adopt(batch.draft_cache)

    # -- batch membership ---------------------------------------------------------------------
    def new_sequence(self, prompt_ids: list[int], params: SamplingParams, compiled=None) -> Sequence:
        if not prompt_ids:
            raise EyasError("the prompt is empty", "send at least one token")
        vocab = self.target.info.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise EyasError(f"prompt token ids must be in 0..{vocab - 1} (the target's vocabulary)",
                            "encode the prompt with the target's own tokenizer")
        wrong = [t for t in params.logit_bias if t >= vocab]
        if wrong:
            raise EyasError(f"logit_bias names token {wrong[0]}, outside the target's vocabulary (0..{vocab - 1})",
                            "use token ids of the target's own tokenizer")
        limit = self.context_limit - 1  # room for the first output token
        if len(prompt_ids) > limit:
            model = self.target.info.max_context
            if model and self.max_context < model:  # the KV pool, not the model, set the context
                raise EyasError(
                    f"the prompt has {len(prompt_ids)} tokens; the KV cache holds {self.max_context} a row for "
                    f"{self.config.max_batch} rows in the memory it was given (the model takes {model}), so at "
                    f"most {limit} fit with room for the answer",
                    "lower --max-running-requests, raise --mem-fraction-static, or free GPU memory",
                )
            raise EyasError(
                f"the prompt has {len(prompt_ids)} tokens; this context length ({self.max_context}) holds at most "
                f"{limit} with room for the answer", "shorten the prompt or raise --context-length")
        grammar = None
        if params.grammar is not None:  # ``compiled``: the server's (its preparer compiled it), else an LRU's
            grammar = RowGrammar(compiled or grammars_for(self.target).compile(params.grammar), vocab)
        return Sequence(list(prompt_ids), params, grammar=grammar)

    def filter(self, batch: Batch, keep: list[int]) -> Batch:
        self._settled(batch)
        kept_rows = set(keep)
        failed = [i for i, s in enumerate(batch.seqs) if s.error is not None and i not in kept_rows]
        if failed:
            scrub(batch, failed)
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        lengths = batch.lengths[rows]
        slots = int(lengths.max()) if keep else 0
        batch.target_cache.select_rows(keep, slots)
        if batch.draft_cache is not None:
            batch.draft_cache.select_rows(keep, slots)
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        seqs = [batch.seqs[i] for i in keep]
        kept = Batch(seqs, batch.target_cache, batch.draft_cache, lengths, batch.root[rows], pick(batch.draft_logits),
                     pick(batch.draft_hidden), batch.rows.select(rows, [s.params for s in seqs]),
                     feed=batch.feed and batch.feed.select(rows), deferred=batch.deferred)
        if self.prefiller and batch.target_cache is self.prefiller.target_cache:
            self.prefiller.lend(kept)  # still the prefill's caches: lent to the kept rows now
        return kept

    def merge(self, a: Batch | None, b: Batch) -> Batch:
        self._settled(a)
        if a is None or len(a) == 0:
            self._own(b)
            return b
        self._own(a)
        cat = lambda x, y: None if x is None or y is None else torch.cat([x, y])  # noqa: E731
        return Batch(
            a.seqs + b.seqs,
            a.target_cache.concat_rows(b.target_cache),
            None if a.draft_cache is None else a.draft_cache.concat_rows(b.draft_cache),
            torch.cat([a.lengths, b.lengths]), torch.cat([a.root, b.root]),
            cat(a.draft_logits, b.draft_logits), cat(a.draft_hidden, b.draft_hidden), a.rows.concat(b.rows),
            feed=Feed.concat(a.feed, len(a), b.feed, len(b)), deferred=max(a.deferred, b.deferred),
        )

    def kv_usage(self, batch: Batch | None) -> float:
        """The share of the KV cache's token capacity (``max_batch`` rows x ``max_context``) that the
        rows of ``batch`` hold: prompt plus output, less the root not yet in the cache. Host lists
        only, no device read."""
        held = sum(len(s.prompt_ids) + len(s.output_ids) - 1 for s in batch.seqs) if batch is not None else 0
        return held / (self.config.max_batch * self.max_context)

    # -- the two forward kinds ----------------------------------------------------------------
    def prefill_groups(self, seqs: list[Sequence]) -> list[list[int]]:
        """Indices of ``seqs`` (prompts that arrive together) in the groups to prefill one after the
        other, each then merged: graph-sized groups on the native path (``StaticPrefill.groups``), else
        all of them at once; prompts that ask for their logprobs in groups of their own, last (``logprob_groups``)."""
        rest = [i for i, s in enumerate(seqs) if s.prompt_logprobs is None]
        asks = [i for i, s in enumerate(seqs) if s.prompt_logprobs is not None]
        asking = [[asks[i] for i in g] for g in logprob_groups([len(seqs[i].prompt_ids) for i in asks])]
        if not rest or self.prefiller is None:
            return ([rest] if rest else []) + asking
        return [[rest[i] for i in g] for g in self.prefiller.groups([len(seqs[i].prompt_ids) for i in rest])] + asking

    def prefill_all(self, seqs: list[Sequence]) -> Batch:
        """``prefill`` of prompts that arrive together, group by group (``prefill_groups``), as one batch."""
        batch = None
        for group in self.prefill_groups(seqs):
            batch = self.merge(batch, self.prefill([seqs[i] for i in group]))
        return batch

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> Batch:
        """Run the prompts, emit each row's first token, and prime the draft. Prompts that ask for their logprobs
        run together eagerly where they make one of ``logprob_groups``' groups, else each alone in pieces."""
        if in_pieces(seqs):
            return stacked([self.prefill_chunk(Prefilling(s), len(s.prompt_ids)) for s in seqs])
        # Prompts come in every length. cuDNN's attention builds an execution plan for each new shape
        # it meets; the other SDPA kernels need none, so prefill leaves cuDNN out.
        with sdpa_kernel(PREFILL_ATTENTION), phase("prefill"):
            return self._prefill(seqs)

    @torch.inference_mode()
    def prefill_chunk(self, part: Prefilling, chunk: int) -> Batch | None:
        """The next ``chunk`` tokens of one long prompt (``Prefilling``, ``prefill.prefill_chunk``), so that a
        server steps its running batch between them; on the prompt's last chunk, ``prefill``'s batch."""
        with sdpa_kernel(PREFILL_ATTENTION), phase("prefill"):
            made = {}  # the rows' sampling settings, built on the last chunk only (the one that draws)

            def first_of(logits):
                made["rows"], pick, made["logprobs"] = self._first_tokens([part.seq])
                return pick(logits)

            out = prefill_chunk(self.target, part, chunk, first_of, self._extend())
            return None if out is None else self._started(out[0], made["rows"], out[1], made["logprobs"])

    def _first_tokens(self, seqs: list[Sequence]):
        """(the rows' ``SamplingRows``, ``first_of(logits)`` -> their first tokens read back, the first tokens'
        logprobs: filled by ``first_of`` where a row asks)."""
        rows = SamplingRows.build([s.params for s in seqs], [s.seed for s in seqs], self.device,
                                  [s.prompt_ids for s in seqs], self.target.info.vocab_size, self._eos)
        lens = torch.tensor([len(s.prompt_ids) for s in seqs], device=self.device)
        logprobs = []
        return rows, lambda logits: read_first_tokens(seqs, rows, lens, logits, logprobs, self.ops), logprobs

    def _extend(self):
        return self.by_parts.draft_extend if self.spec.speculative else None

    def _started(self, batch: Batch, rows: SamplingRows, firsts: list[int], logprobs: list) -> Batch:
        """``batch`` of freshly prefilled rows, each having emitted its first token."""
        batch.rows = rows
        for s, t, lp in zip(batch.seqs, firsts, logprobs or [None] * len(batch.seqs)):
            s.emit([t], self._eos, self.context_limit, lp)
        return batch

    def _prefill(self, seqs: list[Sequence]) -> Batch:
        rows, first_of, logprobs = self._first_tokens(seqs)
        p = self.prefiller
        out = p([s.prompt_ids for s in seqs], first_of) if p and seqs[0].prompt_logprobs is None else None
        if out is not None:
            firsts, draft_logits, draft_hidden = out
            lens = torch.tensor([len(s.prompt_ids) for s in seqs], device=self.device)
            batch = Batch(seqs, p.target_cache, p.draft_cache, lens, torch.tensor(firsts, device=self.device),
                          draft_logits, draft_hidden)
            p.lend(batch)
        else:
            batch, firsts = prefill_eagerly(self.target, seqs, first_of, self._extend())
        return self._started(batch, rows, firsts, logprobs)

    def step(self, batch: Batch, setting: SpecConfig | None = None) -> list[list[int]]:
        """One verify step for every row; returns the tokens each row emitted. ``setting``: one of the
        spec's ``options`` instead of the one the batch size (or the chooser) picks."""
        return self.collect(self.launch(batch, setting))

    @torch.inference_mode()
    def launch(self, batch: Batch, setting: SpecConfig | None = None, ahead: bool = False) -> Launched | None:
        """The device's share of a step, queued: its tokens are on their way to the host (``collect`` takes
        them). ``ahead``: the batch's previous step is launched but not collected yet (the overlapped
        scheduler); only a whole-step graph can run so (it reads its inputs on the device), else None."""
        with phase("step"):
            start = time.perf_counter()
            rows = batch.rows
            # The whole-step graphs return the tokens alone (their outputs are fixed at capture, and a logprobs
            # variant per top-N would multiply them): a step where some row asks for logprobs runs by parts.
            whole = rows.logprobs is None
            graphs = whole and not constrained(batch.seqs)  # a grammar's mask is made on the host (grammar.py)
            if ahead and not (graphs and self.launches_ahead):
                return None
            self._own(batch)
            spec = setting or self._choose(batch)
            runner = self.whole_steps.get(spec) if graphs else None  # the whole step in one replay, where one fits
            defers = runner is not None and runner.defers
            if batch.deferred and (not defers or batch.deferred >= runner.feed_width):
                if not feed_draft(batch, self.extenders, self.by_parts.draft_extend, self.tree_size + 1, ahead):
                    return None
            if spec.speculative and batch.draft_logits is None:  # the steps before drafted nothing
                batch.draft_logits = self.draft_steps.net.logits(batch.draft_hidden, batch.draft_cache)
            if runner is not None:
                if ahead and self._uncollected is not None:
                    self._uncollected.keep()
                    self._uncollected = None
                if defers and batch.feed is None:
                    batch.feed = runner.new_feed(len(batch))
                out = runner(batch.lengths, batch.root, batch.draft_logits, batch.draft_hidden, rows, batch.state(),
                             ahead, batch.feed if defers else None)
                if out is not None:
                    if defers:
                        host, batch.feed, batch.deferred = out[0], out[3], batch.deferred + 1
                    else:
                        host, batch.draft_logits, batch.draft_hidden = out[:3]
                    return self._launched(batch, spec, host, None, start)
            if ahead:
                return None
            if batch.deferred:  # the step by parts feeds the draft itself: it takes the deferred feed first
                feed_draft(batch, self.extenders, self.by_parts.draft_extend)
            host, pending = self.by_parts(batch, spec, logprobs=not whole)
            return self._launched(batch, spec, host, pending, start)

    def _settled(self, batch: Batch | None) -> None:
        """A batch changes rows only as its last step left it (a step in flight's tokens would go astray)."""
        if batch is not None and self._uncollected is not None and self._uncollected.batch is batch:
            raise EyasError("the batch's rows change while a step launched for them is not collected",
                            "collect it first (Engine.collect), then filter or merge")

    def _choose(self, batch: Batch) -> SpecConfig:
        """The batch's next step's setting, chosen once (a launch ahead that ran nothing leaves it to the next)."""
        key = (batch.serial, batch.steps, len(batch))
        if self._chosen[0] != key:
            self._chosen = key, (self.chooser.choose(len(batch), batch.mix) if self.chooser
                                 else self.spec.for_batch(len(batch)))
        return self._chosen[1]

    def _launched(self, batch: Batch, spec: SpecConfig, host: torch.Tensor, pending: Pending | None,
                  start: float) -> Launched:
        """The step, launched: the batch's tensors now name what it leaves."""
        width = spec.path_width
        batch.lengths, batch.root = host[:, width + 1], host[:, width + 2]
        batch.steps += 1  # the tensors now hold what this step left (a step graph may have carried it)
        self._uncollected = Launched(batch, spec, host, pending, start)
        return self._uncollected

    @torch.inference_mode()
    def collect(self, step: Launched) -> list[list[int]]:
        """The host's share of a step: ``step.host`` [B, width + 4] holds each row's emitted tokens (padded to
        the path width), their count, the new length, the next root and whether its logits were finite.
        Waits for it to arrive; then the caches' slot count and the tokens. A row whose logits were not
        finite emits nothing and ends with an error. ``step.pending``: the asking rows' logprobs (arrived
        with the tokens). The chooser learns the step's cost from the time since its launch or the last
        collect, whichever is later (with a step launched ahead, the device ran it meanwhile), where the step
        is steady: the step collected before it and any launched after it ran its setting too (``adaptive``)."""
        with phase("finish"):
            if step is self._uncollected:
                self._uncollected = None
            if step.arrived is not None:
                step.arrived.synchronize()
            batch, spec, width = step.batch, step.spec, step.spec.path_width
            rows = step.host.tolist()
            logprobs = step.pending.unpack([h[width] for h in rows]) if step.pending is not None else [None] * len(rows)
            used = max((h[width + 1] for h in rows), default=0)
            batch.target_cache.crop(used)
            if batch.draft_cache is not None:
                batch.draft_cache.crop(used)
            drawing = self.chooser is not None and batch.drawing  # rows' kinds only where the chooser weighs them
            emitted, accepted, kinds = [], [], []
            for s, kind, h, lp in zip(batch.seqs, batch.kinds if drawing else repeat(None), rows, logprobs):
                n = h[width]
                if not h[width + 3]:
                    s.fail(not_finite(f"at output token {len(s.output_ids) + 1}"))
                if not s.finished and spec.speculative:
                    s.stats.record(spec.num_draft_tokens - 1, n - 1)
                    accepted.append(n - 1)
                    if drawing:
                        kinds.append(kind)
                emitted.append(s.emit(h[:n], self._eos, self.context_limit, lp))
            now = time.perf_counter()
            if self.chooser:
                after = self._uncollected
                steady = self._last_setting == spec and (after is None or after.spec == spec)
                self.chooser.observe(spec, accepted, now - max(step.start, self._collected) if steady else None,
                                     len(batch), kinds or None, batch.drawing)
            self._collected, self._last_setting = now, spec
            return emitted

    # -- the simple static-batch loop ---------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 overlap: bool = True) -> list[Output]:
        """Every prompt to its end (``run_to_end``)."""
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        return run_to_end(self, [self.new_sequence(p, sp) for p, sp in zip(prompts, params)], overlap)
