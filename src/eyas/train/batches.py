"""Deterministic, resumable batches with a token budget, split across data-parallel ranks.

An epoch's order is a function of ``(seed, epoch)`` only: rows are shuffled, sorted by length
inside windows of many batches (little padding, still random), cut into global batches of at most
``tokens_per_batch * world`` padded tokens, and the batches shuffled again. Rank ``r`` takes rows
``r, r + world, ...`` of each global batch. So the data position is just ``(epoch, batch index)``,
which is all a checkpoint needs to resume exactly, and every rank agrees on the number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] right-padded with 0
    loss_mask: torch.Tensor  # [B, L] float, ttt_loss alignment
    valid: torch.Tensor  # [B, L] bool, False on padding
    rows: list[int]  # row indices in the split (offline states are looked up by them)

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())


def epoch_batches(lengths: np.ndarray, max_length: int, tokens_per_batch: int, world: int, seed: int,
                  epoch: int, window: int = 64) -> list[list[int]]:
    """Global batches (lists of row ids, each with at least ``world`` rows) for one epoch."""
    rng = np.random.default_rng([seed, epoch])
    lens = np.minimum(lengths, max_length)
    order = rng.permutation(len(lens))
    budget = tokens_per_batch * world
    batches: list[list[int]] = []
    approx_rows = max(world, budget // max(1, int(lens.mean())))
    span = approx_rows * window
    for start in range(0, len(order), span):
        chunk = sorted(order[start: start + span].tolist(), key=lambda i: int(lens[i]))
        cur: list[int] = []
        for i in chunk:
            longest = max(int(lens[i]), max((int(lens[j]) for j in cur), default=0))
            if cur and (len(cur) + 1) * longest > budget:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    batches = [b for b in batches if len(b) >= world]  # every rank needs a row
    perm = rng.permutation(len(batches))
    return [batches[k] for k in perm]


def collate(split, rows: list[int], max_length: int) -> Batch:
    pieces = [split.row(i) for i in rows]
    width = min(max_length, max(len(ids) for ids, _ in pieces))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, (t, m) in enumerate(pieces):
        n = min(len(t), width)
        ids[r, :n] = torch.from_numpy(t[:n].astype(np.int64))
        mask[r, :n] = torch.from_numpy(m[:n].astype(np.float32))
        if n:
            mask[r, n - 1] = 0.0  # the next token was cut off
        valid[r, :n] = True
    return Batch(ids, mask, valid, list(rows))


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device``; to a GPU through pinned memory, so the copy does not make the
    host wait for the GPU's queued work (a plain ``.to("cuda")`` synchronises)."""
    if str(device).startswith("cuda") and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def rank_rows(global_rows: list[int], rank: int, world: int) -> list[int]:
    return global_rows[rank::world]
