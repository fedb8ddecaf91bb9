"""Run by test_ddp and test_shard_moe under torchrun (gloo, CPU): train the tiny draft a few steps, save
each rank's weights, the first step's gradients (whole tensors, after clipping) and the run's summary.
The target is the tiny Llama, or each model folder of a ``target=PATH[,PATH...]`` override in turn (loaded
as eyas loads one; results under OUT/<folder name>), so one launch serves several targets."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import tiny_target
from train_fixtures import tiny_recipe

from eyas.common import dist
from eyas.train.trainer import Trainer


def first_grads(trainer: Trainer) -> dict:
    """Capture the gradients the first optimizer step applies (a collective under FSDP: every rank calls it)."""
    grads = {}

    def hook(optimizer, args, kwargs):
        if not grads:
            for name, p in trainer.module.named_parameters():
                if p.grad is not None:
                    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    grads[name] = g.detach().clone()

    trainer.optimizer.register_step_pre_hook(hook)
    return grads


def run(ctx, target, data: str, out: Path, sets: dict) -> dict:
    """Train a few steps; return the draft's weights, the first gradients, the summary and the share of
    the target's weights this rank holds (1.0 unless the target is sharded)."""
    recipe = tiny_recipe(data, out, **{"train.max_steps": 6, "log.eval_every": 6, **sets})
    trainer = Trainer(recipe, target=target, ctx=ctx)
    grads = first_grads(trainer)
    summary = trainer.fit()
    params = list(trainer.target.model.parameters())
    held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
    return {"state": trainer.draft_state(), "summary": summary, "grads": grads,
            "target_share": held / sum(p.numel() for p in params)}


def main(data: str, out: str, tokens_per_batch: int, extra: list[str]) -> None:
    torch.set_num_threads(1)
    ctx = dist.init("cpu", backend="gloo")
    sets = {"data.tokens_per_batch": tokens_per_batch, **dict(e.split("=", 1) for e in extra)}
    folders = sets.pop("target", "")
    runs = [(f, Path(out) / Path(f).name) for f in folders.split(",")] if folders else [(None, Path(out))]
    for folder, run_out in runs:
        target = tiny_target(dtype=torch.float32) if folder is None else None
        result = run(ctx, target, data, run_out, {**sets, "target": folder} if folder else sets)
        torch.save(result, run_out / f"rank{ctx.rank}-of{ctx.world}.pt")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
