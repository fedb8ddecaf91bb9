"""Adaptive speculation (``--speculative-batch-schedule auto``): each step runs the setting that promises
the most tokens per second for the batch it has, no speculation included.

    tau(s, k)   expected tokens per row and step of rows of kind k (``kind_of``: greedy rows take the argmax,
                sampled rows draw, in bands of temperature: a draft's acceptance differs by far between them,
                tau 2.3 at T 0.7 and 1.6 at T 1.0 for the same tree): 1 + sum over depths i of P(the accepted path
                reaches i); 1 without speculation
    cost(s, B)  seconds of one step of setting s over B rows: measured per rows bucket at warm-up
                (``measure_step_costs``), or ``model_costs`` where nothing was measured (the CPU); then
                followed live: each step's own wall time moves its (setting, bucket) estimate (``observe``),
                one table for batches where every row is greedy, one for batches where some row draws
                (its step runs the sampling kernels: measured at warm-up on rows at temperature 0.7,
                top-p 0.95, or a copy of the first)
    rate(s, B)  (sum over the batch's kinds k of its rows of kind k x tau(s, k)) / cost(s, B); the step runs
                the argmax

P(reach i) is kept per tree shape and kind of row, from the live acceptance of that shape's own steps
on rows of that kind (a server that turns from greedy to sampled traffic starts from what sampled rows
accepted, not from what greedy ones did; one whose clients at temperature 0.7 give way to clients at 1.0
does not run, for hundreds of steps, the tree that paid at 0.7, and a batch of both weighs each row by its
own band). Each row a step verified is one observation: a running mean over
the first rows that becomes an exponential moving average (weight ``decay`` a row: a step of n rows weighs
1 - (1 - decay)^n) once it has ``1 / decay`` of them, starting from a prior worth ``prior_rows`` rows
(``prior_reach``: optimistic on purpose, so that every shape is tried once its cost can pay, and its own
figures then replace the guess). Counted per step instead, one row's luck at batch 1 would swing the
estimate (a 6-deep tree accepts 0 to 6 tokens a step): a run of bad steps would leave it low just when the
shape stops running, and a shape that does not run keeps its last estimate. A probe (a step of a shape that
is not the choice, below) is the only news of its shape: it weighs at least ``probe_weight`` whatever its
rows. While no speculation runs, nothing is learnt about acceptance: every
``probe_every`` such steps, one step runs the best speculative setting instead, so that a draft that has
become good again is noticed (the draft is fed on every step, so its cache never falls behind). A probe
costs a speculative step; one that finds speculation still losing doubles the gap to the next (up to
``max_probe_every``), one that finds it winning brings the gap back: a workload the draft cannot help
(sampled at temperature 1, say) pays for a probe every thousand steps, not every sixty-five. The other way
round, where costs are measured, every ``probe_every`` steps of a speculative choice ``refresh_steps`` steps of
another setting run (a refresh; while no speculation runs, the probes above are all that run besides it): they
emit tokens like any step, and keep that setting's cost (and acceptance) the live one. The setting refreshed is,
of those whose expected rate is at least ``refresh_floor`` of the choice's, the one refreshed longest ago: a
warm-up figure that came out high (one slow launch among three) or that the served batch has outgrown (longer
contexts, a host busy with HTTP; it weighs most on the plain step) is re-measured where it could matter, and a
setting far behind costs nothing to keep. A refresh's timed step moves its cost
by ``refresh_weight`` (news that comes rarely; the choice's own steps move it by ``cost_decay``).

Warm-up times short greedy prompts on an idle engine; a served batch has longer contexts, sampled rows and
a host that also serves HTTP. So each step's own seconds (from ``Engine.step`` to its read-back and
bookkeeping) move its setting's cost in its rows bucket, where the step is steady: the engine passes the
seconds only of a step whose setting both the step before and the one launched after it ran (steps launched
ahead overlap: the time between two read-backs holds the host's work on the step before and its launch of
the next, so the step between two of another setting would be charged theirs; hence a refresh's four
steps, the middle two timed), by an exponential moving average (``cost_decay``, or ``refresh_weight``)
of observations each clipped to within a factor of 2 of the estimate (one step stalled by the collector
must not swing it). A setting that stops running keeps its last cost (a probe, one step between plain
ones, is not steady). ``model_costs`` (relative units, the CPU) are not followed.

The current choice stays until another setting promises ``margin`` (3%) more: settings whose estimates are
nearly equal would otherwise take turns step after step.

The choice and its figures: ``choice``, ``steps`` per setting, ``observed`` (each setting's live steps that moved
a cost: their count and their seconds as measured, before the clip: the estimate beside what it follows), and
one log line when the choice changes.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import torch

from ..config import SpecConfig, setting_name
from ..sample.sampling import SamplingParams

log = logging.getLogger("eyas.engine")

PRIOR_LEVEL = 0.8  # a chain's acceptance per depth before any data (optimistic: see the module docstring)
GREEDY, SAMPLED = "greedy", "sampled"  # kinds of batch, each with its own step costs: every row greedy, or some draw
BANDS = (0.4, 0.8, 1.0)  # upper edges of the sampled rows' temperature bands: each band has its own acceptance
ROW_KINDS = (GREEDY,) + tuple(f"t<={t:g}" for t in BANDS) + (f"t>{BANDS[-1]:g}",)


def kind_of(params: SamplingParams) -> str:
    """The row's kind for acceptance: greedy, or its temperature's band (``ROW_KINDS``, e.g. "t<=1" for
    0.8 < T <= 1.0): the hotter the draw, the less of the draft's tree the target accepts."""
    if params.greedy:
        return GREEDY
    t = float(params.temperature)
    return next((k for k, edge in zip(ROW_KINDS[1:], BANDS) if t <= edge), ROW_KINDS[-1])


def prior_reach(spec: SpecConfig, level: float = PRIOR_LEVEL) -> list[float]:
    """P(the accepted path reaches depth i + 1) before any data: each depth accepted with ``level`` by one
    candidate, and by any of the tree's candidates per depth (``num_draft_tokens - 1`` nodes spread over the
    depths, at most ``eagle_topk`` each) with 1 - (1 - level)^candidates."""
    depth = spec.path_width - 1
    per_depth = min(spec.eagle_topk, max(1.0, (spec.num_draft_tokens - 1) / depth))
    step = 1 - (1 - level) ** per_depth
    return [step ** (i + 1) for i in range(depth)]


def model_costs(options: list[SpecConfig], rows: list[int]) -> dict[SpecConfig, dict[int, float]]:
    """A rough cost of a step where none was measured (relative units, a compute-bound device): a fixed
    share per forward (the target's, each draft level's) plus a share per token the target verifies and
    per token the draft runs."""
    def cost(s: SpecConfig, b: int) -> float:
        if not s.speculative:
            return 1.0 + 0.02 * b
        draft_tokens = s.eagle_topk * s.num_steps
        return 1.0 + 0.2 * (s.num_steps + 1) + b * (0.02 * s.num_draft_tokens + 0.004 * (draft_tokens + s.path_width))
    return {s: {b: cost(s, b) for b in rows} for s in options}


class Chooser:
    """Picks the setting of every step from ``costs`` {setting: {rows bucket: seconds}} and the live
    acceptance (``observe``). ``options`` are the engine's (``SpecConfig.options`` of an adaptive spec)."""

    def __init__(self, options: list[SpecConfig], costs: dict[SpecConfig, dict[int, float]], decay: float = 1 / 256,
                 prior_rows: int = 4, probe_every: int = 64, margin: float = 0.03, cost_decay: float = 0.05,
                 max_probe_every: int = 1024, probe_weight: float = 1 / 16, refresh_steps: int = 4,
                 refresh_floor: float = 0.7, refresh_weight: float = 0.3):
        self.options = list(options)
        self.plain = next((s for s in self.options if not s.speculative), None)  # NONE, where it is an option
        self.decay, self.prior_rows, self.probe_every, self.margin = decay, prior_rows, probe_every, margin
        self.probe_weight, self.refresh_steps = probe_weight, refresh_steps
        self.refresh_floor, self.refresh_weight = refresh_floor, refresh_weight
        self.max_probe_every = max(max_probe_every, probe_every)
        self.probe_gap = probe_every  # quiet steps before the next probe (doubles while probes find nothing)
        self._probed = False  # the last step was a probe: the next choice says whether it found anything
        self.cost_decay = cost_decay
        self.measured = False  # costs in seconds (``set_costs(..., measured=True)``): only those follow live steps
        self.reach = {k: {s: prior_reach(s) for s in self.options if s.speculative} for k in ROW_KINDS}
        self.seen = {k: dict.fromkeys(self.reach[k], 0) for k in self.reach}  # rows observed per kind and shape
        self.steps = {s: 0 for s in self.options}  # steps run per setting
        # what live steps measured, before the clip and the average: {kind: {(setting, bucket): [steps, seconds]}}
        self.observed: dict[str, dict[tuple[SpecConfig, int], list[float]]] = {GREEDY: {}, SAMPLED: {}}
        self.choice: SpecConfig | None = None
        self._quiet = 0  # steps in a row without speculation
        self._busy = 0  # speculative steps of the choice since the last refresh (measured costs only)
        self._refresh = 0  # steps of a refresh still to run, of the setting ``_refreshing``
        self._refreshing: SpecConfig | None = None
        self._refreshes = 0
        self._refreshed = dict.fromkeys(self.options, -1)  # the refresh count when each setting last had one
        self.set_costs(costs)

    def set_costs(self, costs: dict[SpecConfig, dict[int, float]], measured: bool = False,
                  sampled: dict[SpecConfig, dict[int, float]] | None = None) -> None:
        """``costs`` {setting: {rows bucket: cost}} of all-greedy batches, ``sampled`` the same of batches where
        rows draw (None: ``costs`` again); ``measured``: seconds (``measure_step_costs``), which live steps then
        refine, rather than ``model_costs``' relative units."""
        tables = {GREEDY: costs, SAMPLED: sampled or costs}
        missing = sorted({setting_name(s) for t in tables.values() for s in self.options if not t.get(s)})
        if missing:
            raise ValueError(f"no step cost for the settings {missing}")
        self.costs = {k: {s: dict(sorted(t[s].items())) for s in self.options} for k, t in tables.items()}
        self._buckets = {s: list(self.costs[GREEDY][s]) for s in self.options}  # sorted, for ``bucket``
        self.measured = measured

    def tau(self, spec: SpecConfig, kind: str = GREEDY) -> float:
        """Expected tokens per row and step, for rows of ``kind``."""
        return 1.0 + sum(self.reach[kind].get(spec, ()))

    def bucket(self, spec: SpecConfig, rows: int) -> int | None:
        """The smallest rows bucket of ``spec``'s costs that holds ``rows``; None past the largest."""
        buckets = self._buckets[spec]
        i = bisect_left(buckets, rows)
        return buckets[i] if i < len(buckets) else None

    def cost(self, spec: SpecConfig, rows: int, sampled: int = 0) -> float:
        """Seconds of a step over ``rows``, ``sampled`` of which draw: its bucket's (``bucket``); past the
        largest, that one's cost scaled by the rows (those steps run eagerly)."""
        table, bucket = self.costs[SAMPLED if sampled else GREEDY][spec], self.bucket(spec, rows)
        if bucket is None:
            bucket = max(table)
            return table[bucket] * rows / bucket
        return table[bucket]

    def rates(self, rows: int, mix: Mapping[str, int] | None = None) -> list[tuple[float, SpecConfig]]:
        """(expected tokens per second, setting) for ``rows`` rows, ``mix`` {kind: rows} of which draw (the
        rest greedy; ``kind_of``), best first (ties: the earlier option, so NONE)."""
        mix = mix or {}
        sampled = sum(mix.values())

        def tokens(s: SpecConfig) -> float:
            return (rows - sampled) * self.tau(s, GREEDY) + sum(n * self.tau(s, k) for k, n in mix.items())
        ranked = [(tokens(s) / self.cost(s, rows, sampled), -i, s) for i, s in enumerate(self.options)]
        return [(rate, s) for rate, _, s in sorted(ranked, key=lambda r: r[:2], reverse=True)]

    def choose(self, rows: int, mix: Mapping[str, int] | None = None) -> SpecConfig:
        """The setting of the next step over ``rows`` rows, ``mix`` {kind: rows} of which draw (``rates``;
        counted in ``steps``)."""
        if self._refresh:
            self._refresh -= 1
            self.steps[self._refreshing] += 1
            return self._refreshing
        ranked = self.rates(rows, mix)
        best = ranked[0][1]
        current = next((r for r, s in ranked if s == self.choice), 0.0)
        if current * (1 + self.margin) >= ranked[0][0]:
            best = self.choice
        if self._probed:  # what the probe's acceptance (``observe``) made of the ranking sets the next gap
            self._probed = False
            self.probe_gap = self.probe_every if best.speculative else min(2 * self.probe_gap, self.max_probe_every)
        if best.speculative:
            self._quiet = 0
        else:
            self._quiet += 1
            if self._quiet > self.probe_gap:  # a probe: acceptance is only learnt while drafting
                self._quiet = 0
                self._probed = True
                probe = next(s for _, s in ranked if s.speculative)
                self.steps[probe] += 1
                return probe
        if best != self.choice:
            others = ", then ".join(f"{setting_name(s)} at {r:.4g}" for r, s in ranked[1:2])
            sampled = sum((mix or {}).values())
            kinds = ([GREEDY] if rows > sampled else []) + [k for k in ROW_KINDS if (mix or {}).get(k)]
            taus = ", ".join(f"{self.tau(best, k):.2f} {k}" for k in kinds)
            log.info("adaptive speculation: %d rows (%d sampled) -> setting %s (expected %.4g tok/s, tau %s; %s)",
                     rows, sampled, setting_name(best), ranked[0][0], taus, others)
            self.choice = best
        self._busy = self._busy + 1 if best.speculative and self.measured else 0
        if self._busy > self.probe_every:
            other = self._refresh_target(ranked, best)
            if other is not None:
                self._busy, self._refresh, self._refreshing = 0, self.refresh_steps - 1, other
                self._refreshes += 1
                self._refreshed[other] = self._refreshes
                self.steps[other] += 1
                return other
        self.steps[best] += 1
        return best

    def _refresh_target(self, ranked: list[tuple[float, SpecConfig]], best: SpecConfig) -> SpecConfig | None:
        """The setting a refresh re-measures: of those other than ``best`` expected at ``refresh_floor`` of its
        rate or more, the one refreshed longest ago (ties: the better ranked); None where no other is close."""
        top = next(r for r, s in ranked if s == best)
        close = [s for r, s in ranked if s != best and r >= self.refresh_floor * top]
        return min(close, key=lambda s: self._refreshed[s], default=None)

    def observe(self, spec: SpecConfig, accepted: list[int], seconds: float | None = None, rows: int = 0,
                kinds: list[str] | None = None, sampled: int | None = None) -> None:
        """One step of ``spec`` over ``rows`` rows that took ``seconds`` (None: not a steady step, no time to
        learn): the draft tokens each live row accepted, ``kinds[i]`` the kind of the row of ``accepted[i]``
        (``kind_of``; None: every row greedy), ``sampled`` the rows of the batch that draw (None: those of
        ``kinds``; any picks the sampled cost table)."""
        kinds = kinds or [GREEDY] * len(accepted)
        sampled = sum(k != GREEDY for k in kinds) if sampled is None else sampled
        bucket = self.bucket(spec, rows) if seconds is not None and self.measured else None
        if bucket is not None:  # past the largest bucket the cost is scaled, not kept: nothing to move
            kind = SAMPLED if sampled else GREEDY
            tally = self.observed[kind].setdefault((spec, bucket), [0, 0.0])
            tally[0], tally[1] = tally[0] + 1, tally[1] + seconds
            table = self.costs[kind][spec]
            old = table[bucket]
            weight = self.cost_decay if spec == self.choice else max(self.cost_decay, self.refresh_weight)
            table[bucket] = old + weight * (min(max(seconds, old / 2), old * 2) - old)
        if not spec.speculative:
            return
        probe = self.probe_weight if spec != self.choice else 0.0
        rows_of: dict[str, list[int]] = {}
        for a, k in zip(accepted, kinds):
            rows_of.setdefault(k, []).append(a)
        for kind, counts in rows_of.items():
            n = len(counts)
            self.seen[kind][spec] += n
            weight = max(1 - (1 - self.decay) ** n, n / (self.seen[kind][spec] + self.prior_rows), probe)
            reach = self.reach[kind][spec]
            beyond = n  # rows that accepted more than i draft tokens
            at = Counter(counts)
            for i in range(len(reach)):
                beyond -= at[i]
                reach[i] += weight * (beyond / n - reach[i])


@torch.inference_mode()
def measure_step_costs(engine, rows: list[int] | None = None, repeats: int = 3,
                       params: SamplingParams | None = None) -> dict[SpecConfig, dict[int, float]]:
    """Seconds of one step of every setting ``engine`` may run, per batch size (``rows``: its chooser's
    buckets), each setting on a fresh batch of short prompts (greedy, or sampled with ``params``' settings):
    where whole steps launch ahead, the median time between read-backs of steps each launched before the last
    is collected (``_overlapped_seconds``: the overlap schedule's steady state, the device's work with the
    host's hidden behind it); elsewhere the median of ``repeats`` steps one at a time, wall time around
    ``Engine.step`` (device and host both). These steps teach the chooser nothing (it is set aside
    meanwhile); the preallocated caches are emptied after each batch."""
    rows = rows or list(engine.chooser.costs[GREEDY][engine.spec.options[0]])
    seconds = _overlapped_seconds if engine.launches_ahead else _sequential_seconds
    chooser, engine.chooser = engine.chooser, None
    prompt = [i % engine.target.info.vocab_size for i in range(1, 9)]
    params = replace(params or SamplingParams(), max_new_tokens=1 << 20, ignore_eos=True)
    costs = {}
    try:
        for spec in engine.spec.options:
            costs[spec] = {}
            for b in rows:
                batch = engine.prefill_all([engine.new_sequence(prompt, params) for _ in range(b)])
                costs[spec][b] = seconds(engine, batch, spec, repeats)
                if engine.static:
                    engine._reset_pools()
    finally:
        engine.chooser = chooser
    return costs


def _sequential_seconds(engine, batch, spec: SpecConfig, repeats: int) -> float:
    """The median of ``repeats`` steps one at a time, after one untimed."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        engine.step(batch, spec)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[repeats // 2]


def _overlapped_seconds(engine, batch, spec: SpecConfig, repeats: int) -> float:
    """The median time between the read-backs of ``repeats + 1`` steps, each launched before the last is
    collected, as the server's overlap schedule runs them (the host's work for a step hides behind the device's
    for the one before): what ``Chooser.observe`` then sees of each step."""
    step, marks = engine.launch(batch, spec), []
    for _ in range(repeats + 1):
        ahead = engine.launch(batch, spec, ahead=True)
        engine.collect(step)
        marks.append(time.perf_counter())
        step = ahead if ahead is not None else engine.launch(batch, spec)
    engine.collect(step)
    gaps = sorted(b - a for a, b in zip(marks, marks[1:]))
    return gaps[len(gaps) // 2]
