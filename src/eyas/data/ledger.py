"""What happened to each source's prompts on the way into the data: the summary ``eyas prepare``
prints at the end and writes to ``meta.json`` (``sources``).

    read        records the source gave
    excluded    dropped by --exclude (a benchmark prompt, a given file) or as a held-out prompt's repeat
    duplicate   a prompt already read (case and whitespace folded), or an empty one (no user text)
    holdout     set aside for the chat evaluation set (holdout-prompts.jsonl)
    mixed out   left out by the weights, caps or total of the mix
    kept        what goes on to the train and held-out splits (before regeneration)
"""

from __future__ import annotations

from collections import Counter, defaultdict

from .mix import source_key

COLUMNS = ("read", "excluded", "duplicate", "holdout", "mixed out", "kept")


class Ledger:
    def __init__(self):
        self.counts: dict[str, Counter] = defaultdict(Counter)

    def add(self, column: str, records) -> None:
        for r in records:
            self.counts[source_key(r)][column] += 1

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {s: {c: self.counts[s][c] for c in COLUMNS} for s in sorted(self.counts)}

    def table(self) -> str:
        rows = [[s, *(str(v) for v in d.values())] for s, d in self.as_dict().items()]
        totals = [sum(self.counts[s][c] for s in self.counts) for c in COLUMNS]
        rows.append(["total", *map(str, totals)])
        head = ["source", *COLUMNS]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def fmt(row):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

        return "\n".join([fmt(head), *map(fmt, rows)])
