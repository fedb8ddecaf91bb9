"""Training checkpoints that resume exactly: weights, optimizer, scheduler, RNG and data position.

    <output>/checkpoints/step-<n>/state.pt     {draft, optimizer, scheduler, rng, position, step}
    <output>/checkpoints/step-<n>/draft/       the draft as a loadable EAGLE-3 folder

RNG covers Python, NumPy, torch's CPU and (if present) CUDA generators. The data position is the
``(epoch, batch)`` of the next batch (see ``batches``); the order inside an epoch is a function of
the seed, so nothing else about the data has to be saved. ``--resume`` takes a step folder or the
output folder (its latest checkpoint).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

from ..errors import EyasError


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(folder, step: int, draft_state: dict, optimizer, scheduler, position: tuple[int, int], recipe: dict,
         keep: int = 2) -> Path:
    root = Path(folder) / "checkpoints"
    path = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "draft": draft_state, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state(), "position": list(position),
                "recipe": recipe}, tmp / "state.pt")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)  # a checkpoint folder exists only once complete
    for old in sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep or None]:
        shutil.rmtree(old)
    return path


def latest(path) -> Path:
    p = Path(path)
    if (p / "state.pt").is_file():
        return p
    steps = sorted((p / "checkpoints").glob("step-*"), key=lambda q: int(q.name.split("-")[1]))
    if not steps:
        raise EyasError(f"no checkpoint under {p}", "pass a run's output folder or one of its checkpoints/step-N")
    return steps[-1]


def load(path) -> dict:
    ckpt = latest(path)
    return torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
