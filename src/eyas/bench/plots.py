"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

    throughput.png    output tokens/s, baseline vs speculative, per concurrency level
    acceptance.png    per-position acceptance: share of verify steps that accepted depth i
    tau.png           distribution of per-request tau
"""

from __future__ import annotations

from pathlib import Path

from .results import BenchResult


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: BenchResult, out) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    written = []
    levels = result.levels
    # tokens/s
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(len(levels)))
    w = 0.38
    base = [lv.baseline.tokens_per_s if lv.baseline else 0 for lv in levels]
    spec = [lv.speculative.tokens_per_s if lv.speculative else 0 for lv in levels]
    ax.bar([x - w / 2 for x in xs], base, w, label="baseline (no speculation)", color="#999999")
    ax.bar([x + w / 2 for x in xs], spec, w, label="EAGLE-3", color="#1f77b4")
    for x, lv in zip(xs, levels):
        if lv.speedup:
            ax.annotate(f"{lv.speedup:.2f}x", (x + w / 2, spec[x]), ha="center", va="bottom", fontsize=9)
    temps = len({lv.temperature for lv in levels}) > 1  # several temperatures: name each bar's
    ax.set_xticks(xs, [f"T={lv.temperature:g}\nc={lv.concurrency}" if temps else str(lv.concurrency) for lv in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput: baseline vs speculative")
    ax.legend()
    fig.tight_layout()
    written.append(_save(fig, out / "throughput.png", plt))
    # per-position acceptance
    fig, ax = plt.subplots(figsize=(6, 4))
    for lv in levels:
        per = (lv.speculative.acceptance.get("per_position") if lv.speculative else None) or []
        if per:
            ax.plot(range(1, len(per) + 1), per, marker="o",
                    label=f"T={lv.temperature:g}, concurrency {lv.concurrency}")
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("share of verify steps accepting it")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance")
    if ax.lines:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "the server does not expose per-position acceptance", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    written.append(_save(fig, out / "acceptance.png", plt))
    # tau distribution
    fig, ax = plt.subplots(figsize=(6, 4))
    taus = [r.tau for lv in levels if lv.speculative for r in lv.speculative.requests if r.tau is not None]
    if taus:
        ax.hist(taus, bins=min(20, max(5, len(taus) // 2)), color="#1f77b4")
        ax.axvline(sum(taus) / len(taus), color="k", linestyle="--", label=f"mean {sum(taus) / len(taus):.2f}")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no per-request tau reported", ha="center", transform=ax.transAxes)
    ax.set_xlabel("tau (tokens per target forward) per request")
    ax.set_ylabel("requests")
    ax.set_title("Acceptance length distribution")
    fig.tight_layout()
    written.append(_save(fig, out / "tau.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
