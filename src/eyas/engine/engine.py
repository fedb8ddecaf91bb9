"""The speculative engine: prefill, step, and the batch bookkeeping around them.

One ``step`` on a batch of running sequences:

    draft_tree      num_steps draft forwards -> a tree of num_draft_tokens tokens per row
    target.forward  one forward over every tree (explicit positions, tree mask on the KV cache)
    accept          longest accepted path + one bonus token per row (greedy or rejection sampling)
    commit          copy the accepted path's KV entries into place, drop the rest
    draft extend    feed the accepted tokens with their captured aux states to the draft, which
                    leaves the logits that seed the next tree

With ``Algorithm.NONE`` the tree is the root alone, so plain decoding is the same code path. A
``SpecConfig.schedule`` picks the settings per step from the batch size (``for_batch``); its
no-speculation entries verify the root alone but still feed the draft (draft extend), so it can
draft again when the batch shrinks. An adaptive spec (``--speculative-batch-schedule auto``) leaves the
choice to its ``Chooser`` (``adaptive.py``): step costs per rows bucket (``adaptive.measure_step_costs``, timed at
warm-up on the GPU) and the live acceptance of each setting.
Sequences join (``merge``) and leave (``filter``) between steps: that is all continuous batching
needs from the engine.

A fault confined to one row ends that row alone (``finish_reason`` "error", ``Sequence.error`` says
why) and the batch goes on: logits that are not finite (``finite_rows``, read back with the step's
tokens, no extra wait on the device). Such a row emits nothing more, and
``filter`` zeroes its slots in the preallocated caches, where a later row in its place would
otherwise attend over a NaN in a masked slot (0 x NaN is NaN).
"""

from __future__ import annotations

import gc
import itertools
import random
import time
from dataclasses import dataclass, field

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..checks import check_spec
from ..config import Algorithm, SpecConfig
from ..engine_config import EngineConfig
from ..errors import EyasError
from ..models import kv_cache
from ..models.graphs import buckets
from ..models.native import DraftSteps, NativeTarget, kv_budget, plan_pool
from ..models.static_cache import StaticKV
from ..spec.drafter import StaticDrafter, StaticExtender, draft_tree
from ..spec.ops import TORCH, ops_for
from ..spec.tree import Tree
from ..spec.verify import accepted_path, finite_rows
from .adaptive import Chooser, measure_step_costs, model_costs
from .decode import STARTUP_KINDS, StaticDecoder, StaticSpeculator
from .grammar import RowGrammar, constrain, constrained, grammars_for
from .logprobs import Pending, TokenLogprob, first_logprobs, path_logprobs
from .penalties import record
from .prefill import StaticPrefill
from .sampler import accept, first_tokens
from .sampling import SamplingParams, SamplingRows
from .stats import SpecStats

_ids = itertools.count()


PREFILL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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

    def __post_init__(self):
        if self.seed is None:
            self.seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fail(self, message: str) -> None:
        """End this sequence alone with an error (a fault of its own row); a finished one stays as it is."""
        if not self.finished:
            self.finish_reason, self.error = "error", message


@dataclass
class Batch:
    seqs: list[Sequence]
    target_cache: object
    draft_cache: object | None
    lengths: torch.Tensor  # [B] committed tokens in both caches (slot == position)
    root: torch.Tensor  # [B] last emitted token, not yet in the target cache
    draft_logits: torch.Tensor | None = None  # [B, draft_vocab] predicts the tree's depth 1
    draft_hidden: torch.Tensor | None = None  # [B, H] the state that produced draft_logits
    rows: SamplingRows | None = None  # the rows' sampling settings on the device (built on membership changes)

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass
class Output:
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    stats: SpecStats
    seconds: float
    logprobs: list[TokenLogprob] | None = None


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
        self.target, self.draft, self.spec, self.draft_path = target, draft, spec, draft_path
        self.config = config
        self.device = target.device
        self.tree_size = max(spec.verify_sizes)  # the largest tree any step verifies
        self.max_context = target.info.max_context or 1 << 30
        self.draft_steps = DraftSteps(draft) if draft is not None else None
        self.decoder = None
        self.speculators = {}
        self.prefiller = None
        self._eos = frozenset(target.eos_token_ids)
        self.static = isinstance(target, NativeTarget)
        self.ops = TORCH  # the acceptance's and draws' ops outside the graphs: the target pool's kernels, if any
        self.layout = "generic Hugging Face forward, growing KV cache"
        if self.static:
            self._attach_pools()
        rows = buckets(config.graph_rows)
        self.chooser = Chooser(spec.options, model_costs(spec.options, rows)) if spec.adaptive else None

    def _attach_pools(self) -> None:
        """Preallocate the target's and the draft's KV caches and their graph runners, sized for the
        largest setting of the schedule, with graph buckets for every setting's shapes."""
        spec, c = self.spec, self.config
        max_batch, cuda_graphs = c.max_batch, c.cuda_graphs
        drafting = [s for s in spec.options if s.speculative]
        draft_tokens = buckets(max(max(s.eagle_topk, s.num_steps + 1) for s in drafting)) if drafting else []
        spans = [s.num_steps * s.eagle_topk for s in drafting]  # draft slots a tree's levels take
        slack = max([self.tree_size] + draft_tokens + spans) + 1
        context = min(self.max_context, 1 << 20)
        per_slot = self.target.bytes_per_slot() + (self.draft_steps.bytes_per_slot() if spec.speculative else 0)
        budget = kv_budget(self.device, c.mem_fraction_static)  # --mem-fraction-static
        plan = plan_pool(max_batch, context, slack, per_slot, budget)
        if plan.slots - slack < context:
            self.max_context = plan.slots - slack
        graphs = cuda_graphs and self.device.type == "cuda"
        rows = buckets(c.graph_rows)
        like = torch.zeros(1, dtype=self.target.dtype, device=self.device)
        self.target_pool = self.target.new_pool(plan, rows, spec.verify_sizes, cuda_graphs,
                                                capture_aux=spec.speculative, kernels=c.kernels)
        if not spec.speculative and c.whole_step_graphs:
            self.decoder = StaticDecoder(self.target.native, self.target_pool, rows, cuda_graphs)
        if spec.speculative:
            pool = self.draft_steps.attach_pool(plan, rows, draft_tokens, cuda_graphs, c.kernels)
            self.drafters = {s: StaticDrafter(self.draft_steps.net, pool, s, self.draft_steps, rows, cuda_graphs)
                             for s in drafting}
            widths = sorted({s.path_width for s in spec.options})
            self.extenders = {w: StaticExtender(self.draft_steps.net, pool, w, rows, cuda_graphs) for w in widths}
            if c.whole_step_graphs:
                aux = tuple(self.target.aux_layer_ids)
                self.speculators = {s: StaticSpeculator(self.target.native, self.target_pool, aux, self.draft_steps.net,
                                                        pool, s, rows, cuda_graphs) for s in spec.options}
        if cuda_graphs and c.prefill_graphs:  # on the CPU its buckets run eagerly, as every runner's do
            aux = tuple(self.target.aux_layer_ids) if spec.speculative else ()
            self.prefiller = StaticPrefill(self.target, self.draft_steps if spec.speculative else None, max_batch,
                                           self.max_context, aux, cuda_graphs, c.kernels)
        self.ops = ops_for(self.target_pool, like, self.target.native.rope)
        kernels = self.ops.name
        self.layout = (f"native Llama forward, static KV cache {plan.describe()}, context {self.max_context}, "
                       f"CUDA graphs {'on' if graphs else 'off' if self.device.type == 'cuda' else 'n/a (CPU)'}, "
                       f"{kernels} kernels")

    def graph_runners(self) -> list:
        """The native path's graph runners: target forward, the whole step (one per setting with a draft,
        one without; each in its greedy, sampled and filtered variants), and, when steps run by parts,
        one tree drafter per setting and one draft extend per path width."""
        if not self.static:
            return []
        # The draft's own per-forward runner only serves the fallbacks past the last window bucket
        # (level-by-level drafting, eager extend): captured when first used, not at startup. So do the
        # drafters and extenders beside whole-step graphs: a step that no whole-step bucket fits fits none
        # of theirs either (the same rows and window buckets).
        extra = ([d.graph for d in self.drafters.values()] + [e.graph for e in self.extenders.values()]
                 if self.spec.speculative and not self.config.whole_step_graphs else [])
        whole = [g for w in ([self.decoder] if self.decoder else self.speculators.values())
                 for kind, g in w.graphs.items() if kind in STARTUP_KINDS]  # the penalized ones: on first use
        prefill = self.prefiller.graphs() if self.prefiller else []
        return [self.target_pool.runner] + whole + extra + prefill

    @torch.inference_mode()
    def warm_up(self, progress: bool = True, on_cpu: bool = False) -> str:
        """Capture every CUDA graph the engine can replay (each runner's ``plan()``: rows buckets up to
        the graph max batch x token buckets x every window bucket) now, not on first use; return a
        one-line summary. The caches are emptied afterwards, so generation is unchanged. On the CPU
        there is nothing to capture: skipped, unless ``on_cpu`` (tests) runs each bucket once eagerly."""
        runners = [r for r in self.graph_runners() if r.enabled]
        if not runners:
            return "CUDA graphs: none to capture (" + ("disabled)" if self.static else "generic path)")
        cuda = self.device.type == "cuda"
        if not (cuda and any(r.capture for r in runners)) and not on_cpu:
            return "CUDA graphs: n/a on the CPU, nothing captured"
        from tqdm.auto import tqdm

        work = [(r, key) for r in runners for key in r.plan()]
        if cuda:  # capture empties the allocator's cache; do it first, so the delta below is the graphs' own
            gc.collect()
            torch.cuda.empty_cache()
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device) if cuda else 0
        bar = tqdm(work, desc="capturing CUDA graphs" if cuda else "warming up graph buckets", disable=not progress,
                   unit="", bar_format="{desc}: {n_fmt}/{total_fmt} {unit}")  # {postfix} starts with ", "
        for runner, key in bar:
            bar.unit = f"[{runner.name}, rows {key[0]}, window {key[-1]}]"
            runner.warm(key)
        bar.close()
        self._reset_pools()
        if cuda and self.chooser:
            self.chooser.set_costs(measure_step_costs(self))
        seconds = time.perf_counter() - start
        if not cuda:
            return f"graph buckets: {len(work)} warmed up eagerly in {seconds:.1f} s (no CUDA graphs on the CPU)"
        torch.cuda.synchronize(self.device)
        pool = (torch.cuda.memory_reserved(self.device) - reserved) / 2**20
        captured = sum(1 for r in runners for g in r.graphs.values() if g.graph is not None)
        return f"CUDA graphs: {captured} of {len(work)} captured in {seconds:.1f} s, graph memory {pool:.0f} MiB"

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
    def new_sequence(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
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
        limit = self.max_context - self.tree_size - 1
        if len(prompt_ids) > limit:
            raise EyasError(
                f"the prompt has {len(prompt_ids)} tokens; with this context length ({self.max_context}) "
                f"and tree size ({self.tree_size}) at most {limit} fit",
                "shorten the prompt or raise --context-length",
            )
        grammar = None
        if params.grammar is not None:  # compiled once per spec (an LRU): the server has compiled it already
            grammar = RowGrammar(grammars_for(self.target).compile(params.grammar), vocab)
        return Sequence(list(prompt_ids), params, grammar=grammar)

    def filter(self, batch: Batch, keep: list[int]) -> Batch:
        kept_rows = set(keep)
        failed = [i for i, s in enumerate(batch.seqs) if s.error is not None and i not in kept_rows]
        if failed:
            _scrub(batch, failed)
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        lengths = batch.lengths[rows]
        slots = int(lengths.max()) if keep else 0
        kv_cache.select_rows(batch.target_cache, rows, slots)
        if batch.draft_cache is not None:
            kv_cache.select_rows(batch.draft_cache, rows, slots)
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        seqs = [batch.seqs[i] for i in keep]
        kept = Batch(seqs, batch.target_cache, batch.draft_cache, lengths, batch.root[rows], pick(batch.draft_logits),
                     pick(batch.draft_hidden), batch.rows.select(rows, [s.params for s in seqs]))
        if self.prefiller and batch.target_cache is self.prefiller.target_cache:
            self.prefiller.lend(kept)  # still the prefill's caches: lent to the kept rows now
        return kept

    def merge(self, a: Batch | None, b: Batch) -> Batch:
        if a is None or len(a) == 0:
            self._own(b)
            return b
        self._own(a)
        cat = lambda x, y: None if x is None else torch.cat([x, y])  # noqa: E731
        return Batch(
            a.seqs + b.seqs,
            kv_cache.concat_rows(a.target_cache, b.target_cache),
            None if a.draft_cache is None else kv_cache.concat_rows(a.draft_cache, b.draft_cache),
            torch.cat([a.lengths, b.lengths]), torch.cat([a.root, b.root]),
            cat(a.draft_logits, b.draft_logits), cat(a.draft_hidden, b.draft_hidden), a.rows.concat(b.rows),
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
        all of them at once."""
        if not seqs:
            return []
        if self.prefiller is None:
            return [list(range(len(seqs)))]
        return self.prefiller.groups([len(s.prompt_ids) for s in seqs])

    def prefill_all(self, seqs: list[Sequence]) -> Batch:
        """``prefill`` of prompts that arrive together, group by group (``prefill_groups``), as one batch."""
        batch = None
        for group in self.prefill_groups(seqs):
            batch = self.merge(batch, self.prefill([seqs[i] for i in group]))
        return batch

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> Batch:
        """Run the prompts, emit each row's first token, and prime the draft."""
        # Prompts come in every length. cuDNN's attention builds an execution plan for each new shape
        # it meets; the other SDPA kernels need none, so prefill leaves cuDNN out.
        with sdpa_kernel(PREFILL_ATTENTION):
            return self._prefill(seqs)

    def _prefill(self, seqs: list[Sequence]) -> Batch:
        rows = SamplingRows.build([s.params for s in seqs], [s.seed for s in seqs], self.device,
                                  [s.prompt_ids for s in seqs], self.target.info.vocab_size)
        lens = torch.tensor([len(s.prompt_ids) for s in seqs], device=self.device)
        logprobs = []  # the first tokens' (``_first_tokens``), where a row asks
        first_of = lambda logits: _first_tokens(seqs, rows, lens, logits, logprobs, self.ops)
        p = self.prefiller
        out = p([s.prompt_ids for s in seqs], first_of) if p else None
        if out is not None:
            firsts, draft_logits, draft_hidden = out
            batch = Batch(seqs, p.target_cache, p.draft_cache, lens, torch.tensor(firsts, device=self.device),
                          draft_logits, draft_hidden)
            p.lend(batch)
        else:
            batch, firsts = self._prefill_eagerly(seqs, first_of)
        batch.rows = rows
        for s, t, lp in zip(seqs, firsts, logprobs or [None] * len(seqs)):
            self._emit(s, [t], len(s.prompt_ids), lp)
        return batch

    def _prefill_eagerly(self, seqs: list[Sequence], first_of) -> tuple[Batch, list[int]]:
        dev = self.device
        lens = torch.tensor([len(s.prompt_ids) for s in seqs], device=dev)
        width = int(lens.max())
        ids = torch.zeros((len(seqs), width), dtype=torch.long, device=dev)
        for i, s in enumerate(seqs):
            ids[i, : len(s.prompt_ids)] = torch.tensor(s.prompt_ids, device=dev)
        positions = torch.arange(width, device=dev).expand(len(seqs), width)
        visible = _causal(lens, width)
        mask = kv_cache.attention_mask(torch.zeros_like(lens), 0, visible, self.target.dtype)
        last = lens - 1
        keep = torch.unique(last)
        cache = kv_cache.new_cache()
        logits, aux = self.target.forward(ids, positions, mask, cache, capture=self.spec.speculative, logits_at=keep)
        logits = logits[torch.arange(len(seqs), device=dev), torch.searchsorted(keep, last)]  # [B, V]
        firsts = first_of(logits)
        first = torch.tensor(firsts, device=dev)
        batch = Batch(seqs, cache, None, lens.clone(), first)
        if self.spec.speculative:
            batch.draft_cache = kv_cache.new_cache()
            shifted = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
            shifted[torch.arange(len(seqs), device=dev), last] = first
            batch.draft_logits, batch.draft_hidden = self._draft_extend(
                batch.draft_cache, torch.zeros_like(lens), shifted, aux, lens)
        return batch, firsts

    @torch.inference_mode()
    def step(self, batch: Batch, setting: SpecConfig | None = None) -> list[list[int]]:
        """One verify step for every row; returns the tokens each row emitted. ``setting``: one of the
        spec's ``options`` instead of the one the batch size (or the chooser) picks."""
        self._own(batch)
        spec = setting or (self.chooser.choose(len(batch)) if self.chooser else self.spec.for_batch(len(batch)))
        rows = batch.rows
        # The whole-step graphs return the tokens alone (their outputs are fixed at capture, and a logprobs
        # variant per top-N would multiply them): a step where some row asks for logprobs runs by parts.
        whole = rows.logprobs is None
        graphs = whole and not constrained(batch.seqs)  # a grammar's mask is made on the host (grammar.py)
        if graphs and self.decoder is not None:  # the whole step in one graph replay, where one fits
            host = self.decoder(batch.lengths, batch.root, rows)
            if host is not None:
                return self._finish(batch, spec, host)
        elif graphs and spec in self.speculators:
            out = self.speculators[spec](batch.lengths, batch.root, batch.draft_logits, batch.draft_hidden, rows)
            if out is not None:
                host, batch.draft_logits, batch.draft_hidden = out
                return self._finish(batch, spec, host)
        if spec.speculative and self.static:
            tree = self.drafters[spec](batch.lengths, batch.root, batch.draft_logits, batch.draft_hidden)
        elif spec.speculative:
            tree = draft_tree(self.draft_steps.net, batch.draft_cache, batch.lengths, batch.root,
                              batch.draft_logits, batch.draft_hidden, spec, self.draft_steps)
        else:
            tree = Tree.root_only(batch.root)
        cache = batch.target_cache
        slots = kv_cache.num_slots(cache)
        mask = kv_cache.attention_mask(batch.lengths, slots, tree.mask, self.target.dtype)
        positions = batch.lengths[:, None] + tree.depth
        logits, aux = self.target.forward(tree.tokens, positions, mask, cache, capture=self.spec.speculative)
        if constrained(batch.seqs):  # the grammar's mask at every node of each constrained row's tree
            logits = constrain(batch.seqs, tree.tokens, tree.parents, logits)

        width = spec.path_width  # static, so no shape waits on the device
        finite = finite_rows(logits)  # [B]: read back with the tokens
        cols, counts, bonus = accept(tree, logits, width, rows.kind, rows.floats, rows.ints, batch.lengths,
                                     spec.eagle_topk, self.ops, rows.pen_tensors())  # [B, width], [B], [B]
        old = batch.lengths
        lengths = kv_cache.commit(cache, old, slots + cols, counts)
        new, path_aux = accepted_path(tree, aux, cols, counts, bonus)  # aux: None without a draft
        pending = None if whole else path_logprobs(logits, tree.tokens.gather(1, cols), cols, new, rows)
        if rows.pen is not None:
            rows.pen.counts = record(rows.pen.counts, new, counts)
        if self.spec.speculative:
            batch.draft_logits, batch.draft_hidden = self._draft_extend(batch.draft_cache, old, new, path_aux, counts)
        host = torch.cat([new, counts[:, None], lengths[:, None], bonus[:, None], finite.long()[:, None]], dim=1)
        return self._finish(batch, spec, host, pending)

    def _finish(self, batch: Batch, spec: SpecConfig, host: torch.Tensor,
                pending: Pending | None = None) -> list[list[int]]:
        """The host's share of a step: ``host`` [B, width + 4] holds each row's emitted tokens (padded to
        the path width), their count, the new length, the next root and whether its logits were finite.
        The step's one device-to-host copy, queued behind everything the step launched (the batch moves
        on only once it has arrived); then the caches' slot count and the tokens. A row whose logits were
        not finite emits nothing and ends with an error. ``pending``: the asking rows' logprobs (arrived
        with the tokens)."""
        width = spec.path_width
        rows = host.tolist()
        logprobs = pending.unpack([h[width] for h in rows]) if pending is not None else [None] * len(rows)
        batch.lengths, batch.root = host[:, width + 1], host[:, width + 2]
        used = max((h[width + 1] for h in rows), default=0)
        kv_cache.crop(batch.target_cache, used)
        if batch.draft_cache is not None:
            kv_cache.crop(batch.draft_cache, used)
        emitted, accepted = [], []
        for s, h, lp in zip(batch.seqs, rows, logprobs):
            n, length = h[width], h[width + 1]
            if not h[width + 3]:
                s.fail(not_finite(f"at output token {len(s.output_ids) + 1}"))
            if not s.finished and spec.speculative:
                s.stats.record(spec.num_draft_tokens - 1, n - 1)
                accepted.append(n - 1)
            emitted.append(self._emit(s, h[:n], length, lp))
        if self.chooser:
            self.chooser.observe(spec, accepted)
        return emitted

    def _draft_extend(self, cache, base, tokens, aux, counts):
        """Feed ``tokens`` [B, K] with aux states [B, K, n*H] at positions base..; keep counts[b]."""
        draft = self.draft_steps.net
        width = tokens.shape[1]
        if self.static and cache is self.draft_steps.pool and width in self.extenders:
            out = self.extenders[width](base, tokens, aux, counts)  # the whole function, one graph replay
            if out is not None:
                return out
        slots = kv_cache.num_slots(cache)
        positions = base[:, None] + torch.arange(width, device=self.device)[None, :]
        mask = kv_cache.attention_mask(base, slots, _causal(counts, width), self.target.dtype)
        h, logits = self.draft_steps(tokens, draft.project(aux), positions, cache, mask)
        src = slots + torch.arange(width, device=self.device).expand(len(tokens), width)
        kv_cache.commit(cache, base, src, counts)
        rows = torch.arange(len(tokens), device=self.device)
        return logits[rows, counts - 1], h[rows, counts - 1]  # [B, draft_vocab], [B, H]

    # -- tokens ---------------------------------------------------------------------------------
    def _emit(self, seq: Sequence, tokens: list[int], context_used: int,
              logprobs: list[TokenLogprob] | None = None) -> list[int]:
        """Append tokens up to a stop condition (and their ``logprobs``, where the row asks); return what was
        appended."""
        if seq.finished:
            return []
        p = seq.params
        stops = set(p.stop_token_ids) | (frozenset() if p.ignore_eos else self._eos)
        out = []
        for t in tokens:
            out.append(t)
            if seq.grammar is not None and not seq.grammar.advance(t):
                seq.fail(f"internal engine error: token {t} was emitted against the request's grammar")
                break
            if t in stops or seq.grammar is not None and seq.grammar.terminated:
                seq.finish_reason = "stop"
                break
            if len(seq.output_ids) + len(out) >= p.max_new_tokens:
                seq.finish_reason = "length"
                break
        seq.output_ids.extend(out)
        if seq.logprobs is not None:
            seq.logprobs.extend(logprobs[:len(out)])
        if not seq.finished and context_used + self.tree_size + 1 > self.max_context:
            seq.finish_reason = "length"
        return out

    # -- the simple static-batch loop ---------------------------------------------------------
    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[Output]:
        if not prompts:
            return []
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.new_sequence(p, sp) for p, sp in zip(prompts, params)]
        start = time.perf_counter()
        batch = self.prefill_all(seqs)
        while True:
            alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
            if not alive:
                break
            if len(alive) < len(batch):
                batch = self.filter(batch, alive)
            self.step(batch)
        seconds = time.perf_counter() - start
        return [Output(s.prompt_ids, s.output_ids, s.finish_reason, s.stats, seconds, s.logprobs) for s in seqs]


def _first_tokens(seqs: list[Sequence], rows: SamplingRows, lens: torch.Tensor, logits: torch.Tensor,
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
    pending = first_logprobs(logits, firsts, rows) if rows.logprobs is not None else None
    if rows.pen is not None:
        rows.pen.counts = record(rows.pen.counts, firsts[:, None], torch.ones_like(firsts))
    tokens, finite = torch.stack([firsts, finite_rows(logits).long()]).tolist()
    if pending is not None:
        logprobs[:] = pending.unpack([1] * len(seqs))
    for s, ok in zip(seqs, finite):
        if not ok:
            s.fail(not_finite("after its prompt"))
    return tokens


def not_finite(where: str) -> str:
    return (f"internal engine error: the target's logits for this request are not finite (NaN or infinity) {where}, "
            "a numerical fault of the model on this input; this request alone was ended, retry it or serve the "
            "model in another --dtype (float16 overflows where bfloat16 and float32 do not)")


def _scrub(batch: Batch, rows: list[int]) -> None:
    """Zero ``rows`` of the batch's preallocated caches, every slot (a growing cache drops them instead)."""
    for cache in (batch.target_cache, batch.draft_cache):
        if isinstance(cache, StaticKV):
            cache.buf[:, :, torch.tensor(rows, device=cache.buf.device)] = 0


def _causal(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, W, W] causal visibility for right-padded rows; padding sees only itself."""
    i = torch.arange(width, device=lengths.device)
    causal = i[None, :, None] >= i[None, None, :]
    valid = i[None, None, :] < lengths[:, None, None]
    return causal & (valid | (i[None, :, None] == i[None, None, :]))
