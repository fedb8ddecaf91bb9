"""Acceptance per prompt category, one shape for ``eyas eval`` (offline) and the served benchmarks.

A prompt's category is the first part of its ``category`` (``stem/mmlu/astronomy`` -> ``stem``), else
its ``source`` (``pydoc:os`` -> ``pydoc``); a built-in set's prompts carry the set's name. Per category:
the prompts, the verify steps (``drafts``), the accepted draft tokens and tau = 1 + accepted / steps,
the definition of the server's ``usage.spec_accept_length``, so the steps-weighted mean of the
categories' tau is the overall tau.
"""

from __future__ import annotations

from collections.abc import Iterable

NONE = "(none)"  # the group of prompts without a category or source, where others have one


def category_of(record) -> str | None:
    """The group a prompt's tau is reported under: the first part of its ``category``, else its
    ``source`` up to the first ``:``, else None."""
    if not isinstance(record, dict):
        return None
    if record.get("category"):
        return str(record["category"]).split("/")[0]
    return str(record["source"]).split(":")[0] if record.get("source") else None


def tally(rows: Iterable[tuple[str | None, int, int]]) -> dict:
    """(category or None, verify steps, accepted tokens) per prompt -> ``{category: {prompts, drafts,
    accepted_tokens, accept_length}}`` by name; prompts without a category count under ``NONE`` so the
    groups' steps add up to the total."""
    sums: dict[str, list[int]] = {}
    for group, steps, accepted in rows:
        s = sums.setdefault(group or NONE, [0, 0, 0])
        s[0] += 1
        s[1] += int(steps)
        s[2] += int(accepted)
    return {g: {"prompts": n, "drafts": d, "accepted_tokens": a, "accept_length": round(1.0 + a / d if d else 1.0, 4)}
            for g, (n, d, a) in sorted(sums.items())}


def requests_tally(rows: Iterable[tuple[str | None, int | None, int | None]]) -> dict | None:
    """``tally`` of requests (category or None, verify steps, accepted tokens), where the steps are known;
    None where no request has a category or none reported its steps (a server without speculation)."""
    rows = list(rows)
    known = [r for r in rows if r[1] is not None and r[2] is not None]
    return tally(known) if known and any(r[0] is not None for r in rows) else None


def category_table(rows: dict) -> str:
    """A ``tally`` as a few aligned lines: category, prompts, verify steps, tau."""
    w = max(len("category"), *map(len, rows))
    lines = [f"{'category':<{w}}  prompts  steps    tau"]
    lines += [f"{g:<{w}}  {r['prompts']:>7}  {r['drafts']:>5}  {r['accept_length']:>5.3f}" for g, r in rows.items()]
    return "\n".join(lines)
