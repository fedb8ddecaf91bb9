"""Benchmark results as plain data: one ``Run`` per (server or engine, concurrency), JSON out.

Per request: output tokens, time to first token (TTFT), end-to-end time, time per output token
after the first (TPOT = (e2e - TTFT) / (tokens - 1)), its own tau, verify steps and accepted tokens
where known, and its prompt's category. Per run: output tokens/s (all output tokens over the run's
wall time), mean TTFT and TPOT, acceptance (tau, rate, per-position) for the speculative side, and
``per_category`` (``eyas eval``'s shape: prompts, verify steps, accepted tokens, tau per category)
where the prompts have categories and the requests their steps.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from ..common.categories import category_table, requests_tally


@dataclass
class Request:
    tokens: int
    ttft: float | None
    e2e: float
    tau: float | None = None
    verify_steps: int | None = None  # the request's own, where the engine or server says
    accepted: int | None = None  # draft tokens accepted over those steps
    category: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.tokens - 1)


@dataclass
class Run:
    label: str  # "baseline" | "speculative"
    concurrency: int
    seconds: float
    requests: list[Request] = field(default_factory=list)
    acceptance: dict = field(default_factory=dict)  # tau, accept_rate, per_position, verify_steps
    errors: list[str] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_category(self) -> dict | None:
        """Acceptance per prompt category from the requests' own steps; None where no request has a
        category or none reported its steps (a server without speculation)."""
        return requests_tally((r.category, r.verify_steps, r.accepted) for r in self.requests)

    def summary(self) -> dict:
        ttft = [r.ttft for r in self.requests if r.ttft is not None]
        tpot = [r.tpot for r in self.requests if r.tpot is not None]
        return {
            "label": self.label, "concurrency": self.concurrency, "requests": len(self.requests),
            "output_tokens": self.output_tokens, "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "ttft_mean_s": round(statistics.fmean(ttft), 5) if ttft else None,
            "ttft_p50_s": round(statistics.median(ttft), 5) if ttft else None,
            "tpot_mean_s": round(statistics.fmean(tpot), 6) if tpot else None,
            "acceptance": self.acceptance, "per_category": self.per_category, "errors": self.errors[:5],
            "per_request": [{**asdict(r), "tpot": r.tpot} for r in self.requests],
        }


@dataclass
class Level:
    concurrency: int
    baseline: Run | None
    speculative: Run | None
    temperature: float = 0.0  # the sampling temperature of both runs (0: greedy)

    @property
    def speedup(self) -> float | None:
        if self.baseline and self.speculative and self.baseline.tokens_per_s > 0:
            return self.speculative.tokens_per_s / self.baseline.tokens_per_s
        return None

    def summary(self) -> dict:
        return {"concurrency": self.concurrency, "temperature": self.temperature,
                "baseline": self.baseline.summary() if self.baseline else None,
                "speculative": self.speculative.summary() if self.speculative else None,
                "speedup": round(self.speedup, 4) if self.speedup else None}


@dataclass
class BenchResult:
    mode: str  # "offline" | "online"
    setup: dict  # target/draft or URLs, prompt set, max tokens, temperature
    levels: list[Level] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"mode": self.mode, "setup": self.setup, "levels": [lv.summary() for lv in self.levels]}


def table(result: BenchResult) -> str:
    """A short text table: one row per (temperature, concurrency level)."""
    head = (f"{'T':>4}  {'conc':>4}  {'baseline tok/s':>14}  {'spec tok/s':>10}  {'speedup':>7}  {'tau':>5}  "
            f"{'rate':>5}  {'TTFT ms':>7}  {'TPOT ms':>7}  per-position acceptance")
    lines = [head]
    for lv in result.levels:
        b, s = lv.baseline, lv.speculative
        acc = s.acceptance if s else {}
        ss = s.summary() if s else {}
        per = ", ".join(f"{p:.2f}" for p in acc.get("per_position") or [])
        cells = [
            f"{lv.temperature:>4g}",
            f"{lv.concurrency:>4}",
            _fmt(b.tokens_per_s if b else None, "{:.1f}", 14),
            _fmt(s.tokens_per_s if s else None, "{:.1f}", 10),
            _fmt(lv.speedup, "{:.2f}x", 7),
            _fmt(acc.get("tau"), "{:.2f}", 5),
            _fmt(acc.get("accept_rate"), "{:.2f}", 5),
            _fmt(ss.get("ttft_mean_s") and ss["ttft_mean_s"] * 1000, "{:.0f}", 7),
            _fmt(ss.get("tpot_mean_s") and ss["tpot_mean_s"] * 1000, "{:.1f}", 7),
            f"[{per}]",
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def category_tables(result: BenchResult) -> str:
    """The speculative side's ``per_category`` of each level as a small table under a title line;
    empty where no level has one."""
    blocks = []
    for lv in result.levels:
        rows = lv.speculative.per_category if lv.speculative else None
        if rows:
            blocks.append(f"tau per category, T={lv.temperature:g} c={lv.concurrency}:\n" + category_table(rows))
    return "\n".join(blocks)


def _fmt(value, spec: str, width: int) -> str:
    return (spec.format(value) if value is not None else "-").rjust(width)
