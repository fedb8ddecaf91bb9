"""The per-source mix: relative weights, caps and a total, applied to deduplicated prompts.

A source is a file's stem (``sharegpt-v3-pypi``) or a built-in source's name (``pydoc``, ``magpie``).
The spec is one string, so a recipe's command line holds it as is (a mapping of the same, as YAML
or JSON would give, is accepted too)::

    sharegpt-v3-pypi=3,math-test=0.2,gsm8k-train:2000,qwen-math-evals=0

``name=W`` is a relative weight (default 1): a prompt of that source is ``W`` times as likely to be
kept as a prompt of weight 1, and 0 drops the source. ``name:N`` keeps at most ``N`` of it. Without
a total (``max_prompts``) the heaviest sources are kept whole and the others in proportion (so
weights of at most 1 are plain keep fractions); with one, the common rate is raised until the total
is reached, sources filling up to their size or cap. Within a source the prompts kept are those
with the lowest ``split.rank`` under the seed: deterministic, and independent of file order.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..errors import EyasError
from .split import rank

EXAMPLE = "e.g. --source-weights sharegpt-v3-pypi=3,math-test=0.2,gsm8k-train:2000"


def source_key(record: dict) -> str:
    """The name a record's source is weighted and counted by: ``pydoc:os`` -> ``pydoc``."""
    return str(record.get("source", "?")).split(":")[0]


def parse(spec) -> dict[str, dict]:
    """``"a=3,b:2000"`` (or ``{"a": 3, "b": {"cap": 2000}}``, or a list of either) ->
    ``{"a": {"weight": 3.0}, "b": {"cap": 2000}}``."""
    out: dict[str, dict] = defaultdict(dict)
    if isinstance(spec, dict):
        for name, v in spec.items():
            items = v.items() if isinstance(v, dict) else [("weight", v)]
            for k, x in items:
                _set(out, str(name), k, x)
        return dict(out)
    for part in spec if isinstance(spec, list) else [spec]:
        for item in str(part).split(","):
            item = item.strip()
            if not item:
                continue
            sep = "=" if "=" in item else ":" if ":" in item else None
            if sep is None:
                raise EyasError(f"--source-weights item {item!r} has neither '=' (weight) nor ':' (cap)", EXAMPLE)
            name, value = (s.strip() for s in item.split(sep, 1))
            _set(out, name, "weight" if sep == "=" else "cap", value)
    return dict(out)


def _set(out: dict, name: str, kind: str, value) -> None:
    try:
        x = float(value) if kind == "weight" else int(value)
    except (TypeError, ValueError):
        x = None
    if kind not in ("weight", "cap") or not name or x is None or x < 0 or (kind == "weight" and not math.isfinite(x)):
        raise EyasError(f"--source-weights: {name}{'=' if kind == 'weight' else ':'}{value} is not a "
                        f"{'weight (a number >= 0)' if kind == 'weight' else 'cap (a whole number >= 0)'}", EXAMPLE)
    if kind in out[name] and out[name][kind] != x:  # the later value silently won
        sep = "=" if kind == "weight" else ":"
        raise EyasError(f"--source-weights gives {name} two {kind}s: {name}{sep}{_num(out[name][kind])} and "
                        f"{name}{sep}{_num(x)}", f"keep one {name}{sep}... (a weight and a cap may go together)")
    out[name][kind] = x


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def check_names(spec: dict, known, what: str = "--source-weights") -> None:
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise EyasError(f"{what} names {', '.join(unknown)}, which no input or source provides",
                        f"the sources here are: {', '.join(sorted(known))}")


def quotas(sizes: dict[str, int], spec: dict, max_prompts: int | None) -> dict[str, int]:
    """How many prompts to keep of each source (see the module docstring)."""
    w = {s: spec.get(s, {}).get("weight", 1.0) for s in sizes}
    cap = {s: min(n, spec.get(s, {}).get("cap", n)) for s, n in sizes.items()}
    live = [s for s in sizes if w[s] > 0 and cap[s] > 0]
    if not live:
        return dict.fromkeys(sizes, 0)

    def take(rate: float) -> dict[str, int]:
        return {s: min(cap[s], math.floor(w[s] * rate * sizes[s] + 1e-9)) if s in live else 0 for s in sizes}

    if max_prompts is None:
        return take(1 / max(w[s] for s in live))
    full = max(cap[s] / (w[s] * sizes[s]) for s in live)  # every source at its size or cap
    if sum(take(full).values()) <= max_prompts:
        return take(full)
    lo, hi = 0.0, full
    for _ in range(64):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(take(mid).values()) <= max_prompts else (lo, mid)
    return take(lo)


def apply(records: list[dict], spec: dict, max_prompts: int | None, seed: int) -> tuple[list[dict], list[dict]]:
    """(the records the mix keeps, in their order; the ones it leaves out)."""
    if not spec and max_prompts is None:
        return records, []
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_source[source_key(r)].append(i)
    keep_n = quotas({s: len(ix) for s, ix in by_source.items()}, spec, max_prompts)
    keep = set()
    for s, ix in by_source.items():
        keep.update(sorted(ix, key=lambda i: rank(records[i], f"mix:{seed}:{s}"))[: keep_n[s]])
    return [r for i, r in enumerate(records) if i in keep], [r for i, r in enumerate(records) if i not in keep]
