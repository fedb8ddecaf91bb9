"""Which server answers at a URL, and its acceptance figures, from its Prometheus text.

Metric names, each checked against that project's source:

    eyas     eyas:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total, ..._per_pos_total{position},
             gauges eyas:spec_accept_length / eyas:spec_accept_rate, eyas:spec_info{algorithm,...}
             (src/eyas/serve/metrics.py)
    vLLM     counters vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens,
             vllm:spec_decode_num_accepted_tokens, vllm:spec_decode_num_accepted_tokens_per_pos{position}
             (exposed with ``_total``), labels model_name and engine; registered only when a
             speculative_config is set (vllm-project/vllm vllm/v1/spec_decode/metrics.py,
             ``SpecDecodingProm``); vllm:generation_tokens_total (vllm/v1/metrics/loggers.py)
    SGLang   gauges sglang:spec_accept_length and sglang:spec_accept_rate (``accepted / draft tokens``),
             0 unless speculating; sglang:generation_tokens_total; only with --enable-metrics
             (sgl-project/sglang python/sglang/srt/metrics/collector.py, ``SchedulerMetricsCollector``)

Counters give exact figures over any interval (``tau = 1 + d accepted / d drafts``); SGLang's gauges
are averages over its last logging interval, read as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EYAS, SGLANG, VLLM, UNKNOWN = "eyas", "sglang", "vllm", "unknown"
LABEL = {EYAS: "eyas", SGLANG: "SGLang", VLLM: "vLLM", UNKNOWN: "an unknown OpenAI-compatible server"}

NAMES = {
    EYAS: {"drafts": "eyas:spec_decode_num_drafts", "draft_tokens": "eyas:spec_decode_num_draft_tokens",
           "accepted": "eyas:spec_decode_num_accepted_tokens",
           "per_pos": "eyas:spec_decode_num_accepted_tokens_per_pos", "gen": "eyas:generation_tokens",
           "length": "eyas:spec_accept_length", "rate": "eyas:spec_accept_rate"},
    VLLM: {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
           "accepted": "vllm:spec_decode_num_accepted_tokens",
           "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos", "gen": "vllm:generation_tokens"},
    SGLANG: {"gen": "sglang:generation_tokens", "length": "sglang:spec_accept_length",
             "rate": "sglang:spec_accept_rate"},
}


def server_root(url: str) -> str:
    """The server's root from what a user pastes: an OpenAI client's base URL ends in ``/v1``, and asking
    ``/v1/v1/models`` and ``/v1/metrics`` would blame the server for a 404 of the URL's making."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def parse(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text -> {sample name without ``_total``: [(labels, value)]}, via prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.removesuffix("_total")
            if name.endswith("_created"):
                continue
            out.setdefault(name, []).append((dict(s.labels), float(s.value)))
    return out


def detect(samples: dict, owned_by: str | None = None) -> str:
    """eyas, sglang or vllm: from the metric prefixes, else from /v1/models' ``owned_by``."""
    for kind, prefix in ((EYAS, "eyas:"), (SGLANG, "sglang:"), (VLLM, "vllm:")):
        if any(n.startswith(prefix) for n in samples):
            return kind
    owner = (owned_by or "").lower()
    for kind in (EYAS, SGLANG, VLLM):
        if kind in owner:
            return kind
    return UNKNOWN


@dataclass
class Snapshot:
    """One scrape's acceptance figures (None: the server does not expose that figure)."""

    kind: str
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_pos: dict[int, float] = field(default_factory=dict)
    gauge_length: float | None = None
    gauge_rate: float | None = None
    generation_tokens: float | None = None
    algorithm: str | None = None  # eyas:spec_info

    @property
    def has_counters(self) -> bool:
        return self.drafts is not None and self.accepted is not None

    @property
    def has_token_counters(self) -> bool:
        """Draft and accepted token counters without the drafts counter: vLLM v0, and v1 before
        ``spec_decode_num_drafts`` (both register ``num_draft_tokens`` / ``num_accepted_tokens`` only)."""
        return self.draft_tokens is not None and self.accepted is not None

    @property
    def has_spec_metrics(self) -> bool:
        return self.has_counters or self.has_token_counters or self.gauge_length is not None


def _sum(samples: dict, name: str | None) -> float | None:
    if not name or name not in samples:
        return None
    return sum(v for _, v in samples[name])


def snapshot(samples: dict, kind: str) -> Snapshot:
    names = NAMES.get(kind, {})
    snap = Snapshot(kind, _sum(samples, names.get("drafts")), _sum(samples, names.get("draft_tokens")),
                    _sum(samples, names.get("accepted")))
    for labels, value in samples.get(names.get("per_pos", ""), []):
        if "position" in labels:
            pos = int(labels["position"])
            snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + value
    if kind == SGLANG:  # per-rank gauges: the mean over the ranks that decoded (an idle rank's stays 0)
        for key, attr in (("length", "gauge_length"), ("rate", "gauge_rate")):
            vals = [v for _, v in samples.get(names[key], [])]
            busy = [v for v in vals if v != 0] or vals
            setattr(snap, attr, sum(busy) / len(busy) if busy else None)
    else:
        snap.gauge_length, snap.gauge_rate = _sum(samples, names.get("length")), _sum(samples, names.get("rate"))
    snap.generation_tokens = _sum(samples, names.get("gen"))
    if kind == EYAS:
        info = samples.get("eyas:spec_info") or []
        snap.algorithm = info[0][0].get("algorithm") if info else None
    return snap


BACKWARDS = "counters went backwards: the server restarted between the two reads"


@dataclass
class Acceptance:
    """Figures over an interval: tau, rate, per-position rates, and how they were obtained."""

    tau: float | None
    rate: float | None
    per_position: list[float]
    drafts: float
    source: str  # "counters over the probes", "lifetime counters", "gauge", ...


def acceptance(before: Snapshot | None, after: Snapshot) -> Acceptance | None:
    """Exact figures from counter deltas (or lifetime counters without ``before``); else the gauges."""
    if after.has_counters:
        b = before if before is not None and before.has_counters else None
        d = after.drafts - (b.drafts if b else 0)
        a = after.accepted - (b.accepted if b else 0)
        t = (after.draft_tokens or 0) - ((b.draft_tokens or 0) if b else 0)
        if d <= 0:
            return Acceptance(None, None, [], 0, BACKWARDS if d < 0 else
                              "counters did not move" if b else "no verify step yet")
        positions = sorted(after.per_pos)
        per = [(after.per_pos[p] - ((b.per_pos.get(p, 0.0)) if b else 0.0)) / d for p in positions]
        return Acceptance(1 + a / d, a / t if t else None, per, d,
                          "counters over the probes" if b else "lifetime counters")
    if after.has_token_counters:  # no drafts counter: the rate is exact, tau only when nothing was accepted
        b = before if before is not None and before.has_token_counters else None
        t = after.draft_tokens - (b.draft_tokens if b else 0)
        a = after.accepted - (b.accepted if b else 0)
        if t <= 0:
            return Acceptance(None, None, [], 0, BACKWARDS if t < 0 else
                              "counters did not move" if b else "no verify step yet")
        where = "token counters over the probes" if b else "lifetime token counters"
        if a == 0:  # no proposal accepted: every step emitted its bonus token alone, whatever the drafts
            return Acceptance(1.0, 0.0, [], 0, where)
        return Acceptance(None, a / t, [], 0, f"{where}; tau not exposed (no spec_decode_num_drafts counter)")
    if after.gauge_length is not None:
        return Acceptance(after.gauge_length, after.gauge_rate, [], 0, "gauge (average of the last interval)")
    return None
