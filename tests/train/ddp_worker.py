"""Run by test_ddp under torchrun (gloo, CPU): train the tiny draft a few steps, save each rank's weights."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eyas.train import dist  # noqa: E402
from eyas.train.trainer import Trainer  # noqa: E402
from helpers import tiny_target  # noqa: E402
from train_fixtures import tiny_recipe  # noqa: E402


def main(data: str, out: str, tokens_per_batch: int, extra: list[str]) -> None:
    torch.set_num_threads(1)
    ctx = dist.init("cpu", backend="gloo")
    target = tiny_target(dtype=torch.float32)
    recipe = tiny_recipe(data, out, **{"data.tokens_per_batch": tokens_per_batch, "train.max_steps": 6,
                                       "log.eval_every": 6, **dict(e.split("=", 1) for e in extra)})
    trainer = Trainer(recipe, target=target, ctx=ctx)
    summary = trainer.fit()
    torch.save({"state": trainer.draft_state(), "summary": summary},
               Path(out) / f"rank{ctx.rank}-of{ctx.world}.pt")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
