"""Prometheus metrics under the ``eyas:`` prefix (``curl -s :30000/metrics | grep accept``).

Speculation (vLLM's counter names, SGLang's gauge names):

    eyas:spec_decode_num_drafts_total                verify steps (one per running request per step)
    eyas:spec_decode_num_draft_tokens_total          draft tokens proposed
    eyas:spec_decode_num_accepted_tokens_total       draft tokens accepted
    eyas:spec_decode_num_accepted_tokens_per_pos_total{position}  steps whose accepted path
                                                     reached depth position + 1 (0-based, as vLLM)
    eyas:spec_accept_length   gauge: 1 + accepted / drafts over the last ``window`` engine steps
    eyas:spec_accept_rate     gauge: accepted / draft tokens over the same window
    eyas:spec_accept_length_per_step  histogram of 1 + accepted for each verify step
    eyas:spec_info{...}       algorithm, draft path, captured layers, tree settings

Adaptive speculation (``--speculative-batch-schedule auto``), read from the engine's chooser at each scrape:

    eyas:spec_active_setting{setting}         1 for the setting the last step chose ("6,8,32"; "0" = none), else 0
    eyas:spec_setting_steps_total{setting}    engine steps run with each setting
    eyas:spec_expected_accept_length{setting,rows}  the chooser's tau estimate per setting, for greedy rows and
                                              for sampled ones per band of temperature (rows="t<=1": 0.8 < T <= 1;
                                              its reason, with the step costs)
    eyas:spec_step_cost_seconds{setting,rows,bucket}  its step cost estimate per setting, kind of batch and rows
                                              bucket (only where timed: a GPU; the CPU's are relative units)
    eyas:spec_step_observed_seconds_total{setting,rows,bucket}  the live steps that moved that estimate: their
    eyas:spec_step_observations_total{setting,rows,bucket}      seconds as measured (before the estimate's clip
                                              and average) and their count; rate(sum) / rate(count) is what the
                                              estimate follows

PromQL for the lifetime figures (exactly what the gauges hold while the window covers everything):

    1 + eyas:spec_decode_num_accepted_tokens_total / eyas:spec_decode_num_drafts_total
    eyas:spec_decode_num_accepted_tokens_total / eyas:spec_decode_num_draft_tokens_total

Serving: prompt/generation token counters, ``requests_total{outcome}``, time-to-first-token,
time-per-output-token and end-to-end latency histograms, running and queued request gauges, the
KV cache's usage (``kv_cache_usage_perc``, a fraction as vLLM's; SGLang calls it ``token_usage``) and
engine steps with their wall time and batch size (speculation that pays at batch 1 can lose at
large batches: compare ``engine_step_seconds`` across ``engine_step_batch_size``), and where the engine
thread's time goes (``engine_thread_seconds_total{activity}``: ``idle`` waiting for work, ``prefill``
prompts, ``step`` launching steps and waiting for their tokens, ``host`` the rest of each turn: admitting,
emitting, retiring rows, handing results to the event loop; a busy server's ``host`` share is the time
its GPU may sit waiting), and what was built after warm-up while requests waited
(``engine_first_use_total{kind}`` and ``engine_first_use_seconds_total{kind}``: Triton kernel variants compiled
and projection shapes whose kernels were timed, ``kind="kernel"``, and CUDA graphs captured, ``kind="graph"``;
each is logged too).

Every series carries ``model_name`` (the served model name) and ``engine`` ("0"), the labels vLLM
puts on its series (SGLang's carry ``model_name`` too), so their Grafana dashboards and multi-model
scrapes select eyas's series the same way. The metrics themselves are unlabelled in code; one
collector adds the two labels to every sample at exposition (``ConstantLabels``).
Every server owns its own ``CollectorRegistry``, so several can live in one process (tests).
Without a draft (``NONE``) the ``spec_*`` series are not exported at all: an accept length of 1.00
is the symptom of a broken pair and must never appear where nothing was drafted. The gauges read
0 until the first verify step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..models.first_use import FIRST_USE

log = logging.getLogger("eyas.serve")

try:  # the *_created series only add noise to a grep for acceptance
    from prometheus_client import disable_created_metrics

    disable_created_metrics()
except ImportError:  # older prometheus_client
    pass

PREFIX = "eyas:"
OUTCOMES = ("stop", "length", "abort", "timeout", "rejected", "invalid", "error")
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
THREAD_ACTIVITIES = ("idle", "prefill", "step", "host")
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)


class ConstantLabels(Collector):
    """The samples of ``inner`` with ``labels`` added to each (prometheus_client's Python metrics take
    no constant labels; this is the one place eyas's ``model_name`` and ``engine`` are attached)."""

    def __init__(self, inner: CollectorRegistry, labels: dict[str, str]):
        self.inner, self.labels = inner, labels

    def collect(self):
        for family in self.inner.collect():  # fresh Metric objects on every collect
            family.samples = [s._replace(labels={**self.labels, **s.labels}) for s in family.samples]
            yield family


class ServeMetrics:
    def __init__(self, num_steps: int, num_draft_tokens: int, window: int = 1000, speculative: bool = True,
                 model_name: str = "eyas", engine: str = "0"):
        r = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": engine}
        self.registry = CollectorRegistry()
        self.registry.register(ConstantLabels(r, self.labels))
        self._families = r
        p = PREFIX
        self.speculative = speculative
        self._window: deque[tuple[int, int, int]] = deque(maxlen=max(1, window))
        self._sums = [0, 0, 0]
        self.window_accept_length, self.window_accept_rate = 0.0, 0.0  # 0: no verify step yet
        self.info = Info(p + "spec", "Speculative decoding configuration", registry=r)
        if speculative:  # without a draft there is no acceptance to report, not even a 1.00
            self._spec_metrics(r, p, num_steps, num_draft_tokens, window)
        self._serving_metrics(r, p)

    def _spec_metrics(self, r, p: str, num_steps: int, num_draft_tokens: int, window: int) -> None:
        self.drafts = Counter(p + "spec_decode_num_drafts", "Verify steps (target forwards that checked a draft), "
                              "one per running request per engine step", registry=r)
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter(p + "spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                        "Verify steps whose accepted path reached depth position + 1 "
                                        "(position is 0-based)", ["position"], registry=r)
        for i in range(max(num_steps, 0)):
            self.accepted_per_pos.labels(position=str(i))
        self.accept_length = Gauge(p + "spec_accept_length", "Mean acceptance length tau = 1 + accepted / drafts "
                                   f"over the last {window} engine steps", registry=r)
        self.accept_rate = Gauge(p + "spec_accept_rate", "accepted / draft tokens over the last "
                                 f"{window} engine steps", registry=r)
        self.step_accept_length = AcceptLengths(p + "spec_accept_length_per_step", max(num_draft_tokens, 2))
        r.register(self.step_accept_length)

    def _serving_metrics(self, r, p: str) -> None:
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens returned to clients", registry=r)
        self.requests = Counter(p + "requests", "Finished requests by outcome: stop, length, abort (client "
                                "gone or shutdown), timeout (408), rejected (503, 429), invalid (4xx), error (5xx)",
                                ["outcome"], registry=r)
        for o in OUTCOMES:
            self.requests.labels(outcome=o)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Mean time between output tokens of a request "
                              "(after the first)", buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.running = Gauge(p + "num_requests_running", "Sequences in the running batch", registry=r)
        self.queued = Gauge(p + "num_requests_waiting", "Admitted requests waiting for a batch slot", registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "Fraction (0 to 1) of the KV cache's token capacity "
                              "(rows x context length) that the running requests' committed tokens hold", registry=r)
        self.steps = Counter(p + "engine_steps", "Engine steps (one speculative step for the whole batch)", registry=r)
        self.step_seconds = Histogram(p + "engine_step_seconds", "Wall time of one engine step (draft + verify + "
                                      "commit for every running row)", buckets=STEP_BUCKETS, registry=r)
        self.batch_size = Histogram(p + "engine_step_batch_size", "Running requests per engine step",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.thread = ThreadSeconds()
        r.register(self.thread)
        r.register(FirstUseCollector())

    def follow_chooser(self, chooser) -> None:
        """Export the adaptive chooser's state (``engine.chooser``; None: a fixed setting, nothing to export)."""
        if chooser is not None:
            self._families.register(ChooserCollector(chooser))

    def engine_step(self, batch_size: int, seconds: float) -> None:
        self.steps.inc()
        self.step_seconds.observe(seconds)
        self.batch_size.observe(batch_size)

    def set_info(self, labels: dict[str, str]) -> None:
        self.info.info({k: str(v) for k, v in labels.items()})

    def record_step(self, per_row: list[tuple[int, int, int]]) -> None:
        """One engine step: ``(drafts, draft_tokens, accepted)`` added to each row's stats."""
        if not self.speculative:
            return
        verified = [row for row in per_row if row[0]]
        if not verified:
            return
        total = [sum(row[i] for row in verified) for i in range(3)]
        by_accepted = self.step_accept_length.add([accepted for _, _, accepted in verified])
        reached = 0  # rows whose accepted path reached depth i + 1: those that accepted more than i
        for i in range(len(by_accepted) - 1, 0, -1):
            reached += by_accepted[i]
            if reached:
                self.accepted_per_pos.labels(position=str(i - 1)).inc(reached)
        self.drafts.inc(total[0])
        self.draft_tokens.inc(total[1])
        self.accepted.inc(total[2])
        if len(self._window) == self._window.maxlen:
            old = self._window[0]
            self._sums = [s - o for s, o in zip(self._sums, old)]
        self._window.append(tuple(total))
        self._sums = [s + t for s, t in zip(self._sums, total)]
        d, t, a = self._sums
        self.window_accept_length = 1 + a / d
        self.window_accept_rate = a / t if t else 0.0
        self.accept_length.set(self.window_accept_length)
        self.accept_rate.set(self.window_accept_rate)

    def finished(self, outcome: str, ttft: float | None, e2e: float, completion_tokens: int) -> None:
        self.requests.labels(outcome=outcome).inc()
        if ttft is not None:
            self.ttft.observe(ttft)
            self.e2e.observe(e2e)
            if completion_tokens > 1:
                self.tpot.observe((e2e - ttft) / (completion_tokens - 1))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class DecodeLog:
    """SGLang's line while busy, every ``interval`` seconds (the first busy turn at once; 0: never): "decode:
    running N, queued M, accept len L, accept rate R, gen throughput T tok/s" (``tokens`` handed out since)."""

    def __init__(self, metrics: ServeMetrics, interval: float):
        self.metrics, self.interval = metrics, interval
        self.tokens, self._at, self._last = 0, 0.0, time.monotonic()

    def turn(self, running: int, queued: int) -> None:
        now = time.monotonic()
        if now < self._at or self.interval <= 0:
            return
        m = self.metrics
        spec = f", accept len {m.window_accept_length:.2f}, accept rate {m.window_accept_rate:.3f}" \
            if m.speculative else ""
        log.info("decode: running %d, queued %d%s, gen throughput %.1f tok/s", running, queued, spec,
                 self.tokens / max(now - self._last, 1e-9))
        self._at, self._last, self.tokens = now + self.interval, now, 0


class ThreadSeconds(Collector):
    """The engine thread's seconds by activity (``eyas:engine_thread_seconds_total``), exact when scraped: a wait
    for work under way counts up to the scrape."""

    def __init__(self):
        self.seconds = dict.fromkeys(THREAD_ACTIVITIES, 0.0)
        self._idle_since: float | None = None
        self._lock = threading.Lock()  # a scrape reads what the engine thread adds: both or neither
        self.begin()

    def begin(self) -> None:
        """A turn starts (its clock restarts when a wait for work ends)."""
        self._turn, self._spent = time.perf_counter(), {"prefill": 0.0, "step": 0.0}

    def spend(self, activity: str, run):
        """``run()``, its seconds counted to ``activity`` ("prefill" or "step") of this turn."""
        start = time.perf_counter()
        try:
            return run()
        finally:
            self._spent[activity] += time.perf_counter() - start

    def end(self) -> None:
        """The turn's ``spend``s, and the rest of it as host."""
        host = max(0.0, time.perf_counter() - self._turn - sum(self._spent.values()))
        with self._lock:
            for activity, seconds in {**self._spent, "host": host}.items():
                self.seconds[activity] += seconds

    def idle(self, since: float | None) -> None:
        """The thread waits for work from ``since`` (``time.perf_counter()``); None: it woke."""
        with self._lock:
            if since is None and self._idle_since is not None:
                self.seconds["idle"] += time.perf_counter() - self._idle_since
                self._turn = time.perf_counter()
            self._idle_since = since

    def collect(self):
        with self._lock:
            values = dict(self.seconds)
            if self._idle_since is not None:
                values["idle"] += time.perf_counter() - self._idle_since
        family = CounterMetricFamily(PREFIX + "engine_thread_seconds", "Seconds of the engine thread by activity: "
                                     "idle (waiting for work), prefill, step (launching steps and waiting for their "
                                     "tokens), host (the rest of a turn)", labels=["activity"])
        for activity, seconds in values.items():
            family.add_metric([activity], seconds)
        yield family


class AcceptLengths(Collector):
    """A histogram of 1 + accepted for each verify step, buckets 1..``top`` (``eyas:spec_accept_length_per_step``),
    kept as a count per accepted value: one list increment a row, where ``Histogram.observe`` took a lock and a
    bucket search each (a tenth of a millisecond a step at 64 rows, on the engine thread)."""

    def __init__(self, name: str, top: int):
        self.name, self.top = name, top
        self.counts = [0] * (top + 1)  # [a]: verify steps that accepted a draft tokens (the last: a >= top)
        self.total = 0  # the sum of 1 + accepted
        self._lock = threading.Lock()  # a scrape reads what the engine thread adds: all of a step or none

    def add(self, accepted: list[int]) -> list[int]:
        """One engine step's rows; returns this step's count per accepted value [0..max]."""
        step = [0] * (max(accepted) + 1)
        for a in accepted:
            step[a] += 1
        with self._lock:
            for a, n in enumerate(step):
                self.counts[min(a, self.top)] += n
            self.total += len(accepted) + sum(accepted)
        return step

    def collect(self):
        with self._lock:
            counts, total = list(self.counts), self.total
        buckets, running = [], 0
        for le in range(1, self.top + 1):
            running += counts[le - 1]
            buckets.append((floatToGoString(le), running))
        buckets.append(("+Inf", sum(counts)))
        yield HistogramMetricFamily(self.name, "Tokens emitted per verify step (1 + accepted draft tokens)",
                                    buckets=buckets, sum_value=total)


class FirstUseCollector(Collector):
    """What the engine built on first use after warm-up (``models/first_use.py``): Triton kernel variants compiled,
    projection shapes timed and CUDA graphs captured while requests waited, and the seconds they took."""

    def collect(self):
        count = CounterMetricFamily(PREFIX + "engine_first_use", "Triton kernel variants compiled and projection "
                                    "shapes timed (kind=kernel), CUDA graphs captured (kind=graph), after warm-up, "
                                    "while requests waited", labels=["kind"])
        seconds = CounterMetricFamily(PREFIX + "engine_first_use_seconds", "Seconds spent compiling kernels and "
                                      "capturing graphs after warm-up", labels=["kind"])
        for kind, (n, s) in list(FIRST_USE.events.items()):
            count.add_metric([kind], float(n))
            seconds.add_metric([kind], s)
        yield from (count, seconds)


class ChooserCollector(Collector):
    """The active setting, steps per setting and tau per setting of an ``engine.adaptive.Chooser``, read
    when scraped (the engine thread only bumps plain counters; nothing is pushed per step)."""

    def __init__(self, chooser):
        self.chooser = chooser

    def collect(self):
        from ..config import setting_name

        c = self.chooser
        active = GaugeMetricFamily(PREFIX + "spec_active_setting", "1 for the setting (num_steps,eagle_topk,"
                                   "num_draft_tokens; 0 = no speculation) adaptive speculation chose last, else 0",
                                   labels=["setting"])
        steps = CounterMetricFamily(PREFIX + "spec_setting_steps", "Engine steps run with each setting",
                                    labels=["setting"])
        tau = GaugeMetricFamily(PREFIX + "spec_expected_accept_length", "Adaptive speculation's estimate of "
                                "the tokens per row a step of each setting emits, for greedy rows and for sampled "
                                "rows per band of temperature (from its live acceptance on rows of that kind)",
                                labels=["setting", "rows"])
        cost = GaugeMetricFamily(PREFIX + "spec_step_cost_seconds", "Adaptive speculation's estimate of one step's "
                                 "seconds per setting, kind of batch (every row greedy, or some row sampled) and rows "
                                 "bucket: timed at warm-up, then followed by the steps that run",
                                 labels=["setting", "rows", "bucket"])
        seen = CounterMetricFamily(PREFIX + "spec_step_observed_seconds", "Seconds of the live steps that moved "
                                   "adaptive speculation's step cost estimate, as measured (before its clip and "
                                   "average), per setting, kind of batch and rows bucket",
                                   labels=["setting", "rows", "bucket"])
        count = CounterMetricFamily(PREFIX + "spec_step_observations", "Live steps that moved adaptive "
                                    "speculation's step cost estimate, per setting, kind of batch and rows bucket",
                                    labels=["setting", "rows", "bucket"])
        for kind, tallies in c.observed.items():
            for (spec, bucket), (n, seconds) in list(tallies.items()):  # a copy: the engine thread adds keys
                labels = [setting_name(spec), kind, str(bucket)]
                count.add_metric(labels, float(n))
                seen.add_metric(labels, seconds)
        for spec in c.options:
            name = setting_name(spec)
            active.add_metric([name], 1.0 if spec == c.choice else 0.0)
            steps.add_metric([name], float(c.steps[spec]))
            for kind in c.reach:  # greedy, and each band of temperature (``adaptive.kind_of``)
                tau.add_metric([name, kind], c.tau(spec, kind))
            if c.measured:  # model_costs (no timing: the CPU) are relative units, not seconds
                for kind, table in c.costs.items():  # every row greedy, or some row sampled
                    for bucket, seconds in table[spec].items():
                        cost.add_metric([name, kind, str(bucket)], seconds)
        yield from (active, steps, tau, cost, seen, count)
