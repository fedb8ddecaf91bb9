"""A chat evaluation set that no training run sees: prompts set aside by category, written to a file.

``--holdout-prompts N`` takes ``N`` single-turn prompts out of the data before the mix is applied,
spread evenly over strata (a source and the first part of its records' ``category``:
``arena-hard/creative_writing``, ``gpteacher/roleplay``, ``hh-rlhf-test/helpful-base``), round
robin, each stratum in ``split.rank`` order under ``--holdout-seed``. The choice depends on that seed
and on the prompts of the chosen sources only: not on the weights, the regeneration seed or file
order, so every mix measured against it is measured on the same prompts. They are written to
``holdout-prompts.jsonl`` as ``{"prompt", "source", "category"}`` lines, which ``eyas eval --prompts``,
``eyas bench --prompts`` and ``benchmarks/pair.py --prompts`` read; pass that file to ``--exclude``
in every later ``eyas prepare`` so no later run trains on it either.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .exclude import drop_excluded
from .mix import source_key
from .split import rank

FILE = "holdout-prompts.jsonl"


def stratum(record: dict) -> str:
    category = record.get("category")
    return f"{source_key(record)}/{category.split('/')[0]}" if category else source_key(record)


def pick(records: list[dict], n: int, sources: list[str] | None,
         seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    """(the rest, the held-out prompts, records of the rest dropped because a user turn of theirs is
    a held-out prompt). Candidates are records of one user turn and no answer from ``sources``
    (every source when None)."""
    if n <= 0:
        return records, [], []
    strata: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        m = r["messages"]
        if len(m) == 1 and m[0]["role"] == "user" and (not sources or source_key(r) in sources):
            strata[stratum(r)].append(i)
    queues = [sorted(ix, key=lambda i: rank(records[i], f"holdout:{seed}"), reverse=True)
              for _, ix in sorted(strata.items())]
    chosen: list[int] = []
    while len(chosen) < n and any(queues):
        for q in queues:
            if q and len(chosen) < n:
                chosen.append(q.pop())
    taken = set(chosen)
    held = [records[i] for i in sorted(chosen)]
    rest, leaked = drop_excluded([r for i, r in enumerate(records) if i not in taken],
                                 [r["messages"][0]["content"] for r in held])
    return rest, held, leaked


def write(folder: Path, held: list[dict]) -> Path | None:
    """``held`` as the folder's chat holdout; none (``--holdout-prompts 0``): an earlier run's file in the same
    folder is removed, since this selection's ``selection.json`` names no holdout and the folder is rewritten."""
    path = Path(folder) / FILE
    if not held:
        path.unlink(missing_ok=True)
        return None
    with path.open("w") as f:
        for r in held:
            row = {"prompt": r["messages"][0]["content"], "source": source_key(r)}
            if r.get("category"):
                row["category"] = r["category"]
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
