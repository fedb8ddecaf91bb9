"""Training logs: JSONL always (one object per event), TensorBoard where it is installed.

Events: ``{"event": "train", "step", "loss", "acc": [per TTT step], "lr", "tokens_per_s", ...}``,
``{"event": "eval", "step", "loss", "acc": [...], "step_loss": [...]}``, ``{"event": "checkpoint"}``.
Only rank 0 writes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class RunLog:
    def __init__(self, folder, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.file = None
        self.tb = None
        if not enabled:
            return
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.file = (folder / "log.jsonl").open("a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(folder / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL alone
                self.tb = None

    def write(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        rec = {"event": event, "time": round(time.time(), 3), **fields}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.tb is not None and "step" in fields:
            for k, v in fields.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{event}/{k}", v, fields["step"])
                elif isinstance(v, list) and v and isinstance(v[0], (int, float)) and k in ("acc", "step_loss"):
                    for i, x in enumerate(v):
                        self.tb.add_scalar(f"{event}/{k}_{i}", x, fields["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
