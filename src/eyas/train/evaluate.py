"""Held-out per-step top-1 accuracy and loss of the TTT unroll: the number users watch in training."""

from __future__ import annotations

import torch

from .batches import collate, epoch_batches, rank_rows


@torch.no_grad()
def heldout_metrics(module, split, states, ctx, max_length: int, tokens_per_batch: int, steps: int, decay: float,
                    max_rows: int, autocast=None) -> dict:
    """Accuracy and loss per TTT step over (up to) ``max_rows`` held-out rows, summed over ranks.

    ``module`` is the (possibly DDP/FSDP-wrapped) ``TTTModule``: called as in training, so sharded
    parameters are gathered the same way."""
    was_training = module.training
    module.eval()
    lengths = split.lengths()[:max_rows]
    batches = epoch_batches(lengths, max_length, tokens_per_batch, ctx.world, seed=0, epoch=0)
    sums = [0.0] * (3 * steps)  # correct, loss sum, count per step
    dev = ctx.device
    for rows in batches:
        b = collate(split, rank_rows(rows, ctx.rank, ctx.world), max_length)
        aux, logits = states(b)
        with autocast() if autocast else torch.autocast("cpu", enabled=False):
            _, r = module(b.input_ids.to(dev), aux.float(), logits, b.loss_mask.to(dev), b.valid.to(dev), None)
        for i, (acc, loss, n) in enumerate(zip(r.step_acc, r.step_loss, r.step_count)):
            sums[3 * i] += acc * n
            sums[3 * i + 1] += loss * n
            sums[3 * i + 2] += n
    sums = ctx.sum(sums)
    module.train(was_training)
    counts = [sums[3 * i + 2] for i in range(steps)]
    acc = [sums[3 * i] / c if c else 0.0 for i, c in enumerate(counts)]
    loss = [sums[3 * i + 1] / c if c else 0.0 for i, c in enumerate(counts)]
    return {"acc": [round(a, 4) for a in acc], "step_loss": [round(x, 4) for x in loss],
            "loss": round(sum(decay ** i * x for i, x in enumerate(loss)), 4), "positions": int(counts[0])}
