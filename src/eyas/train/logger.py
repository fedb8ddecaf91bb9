"""Training logs: JSONL always (one object per event), and the trackers the recipe names (``trackers``).

Events: ``{"event": "train", "step", "loss", "acc": [per TTT step], "lr", "tokens_per_s", ...}``,
``{"event": "eval", "step", "loss", "acc": [...], "step_loss": [...]}``, ``{"event": "checkpoint"}``.
Only rank 0 writes. Every event with a step goes to the open trackers too, its numbers as
``event/key`` (lists as ``event/key_i``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .trackers import Trackers


class RunLog:
    def __init__(self, folder, enabled: bool = True):
        self.enabled = enabled
        self.file = None
        self.trackers = Trackers()
        if not enabled:
            return
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.file = (folder / "log.jsonl").open("a")

    def track(self, trackers: Trackers) -> None:
        """Send every later event to these trackers too (closed with the log)."""
        self.trackers.close()
        self.trackers = trackers

    def write(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        rec = {"event": event, "time": round(time.time(), 3), **fields}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if "step" in fields:
            self.trackers.log(event, fields["step"], fields)

    def close(self) -> None:
        if self.file:
            self.file.close()
        self.trackers.close()


class Window:
    """Per-TTT-step sums over the steps between two log lines, kept on the device (no host sync)."""

    def __init__(self, steps: int, device):
        self.stats = torch.zeros(3, steps, dtype=torch.float64, device=device)  # loss, correct, scored
        self.tokens, self.n = 0, 0

    def add(self, stats: torch.Tensor, tokens: int) -> None:  # stats [3, k]: loss, accuracy, scored
        s = stats.double()
        k = s.shape[1]
        self.stats[0, :k] += s[0]
        self.stats[1, :k] += s[1] * s[2]
        self.stats[2, :k] += s[2]
        self.tokens += tokens
        self.n += 1
