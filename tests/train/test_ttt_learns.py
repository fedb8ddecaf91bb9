"""The TTT loss falls on a tiny target and per-step accuracy rises far above chance."""

import torch
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe

from eyas.train.trainer import Trainer


def test_loss_decreases_and_accuracy_rises(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=96)
    recipe = tiny_recipe(data, tmp_path / "run", **{"train.max_steps": 240, "log.eval_every": 240,
                                                      "data.eval_rows": 12})
    trainer = Trainer(recipe, target=target)
    before = trainer.evaluate()
    summary = trainer.fit()
    after = summary["heldout"]
    chance = 1 / 300
    assert after["loss"] < before["loss"] - 0.5, (before, after)
    assert all(a > 30 * chance for a in after["acc"]), after  # every TTT step well above chance
    assert after["acc"][0] > before["acc"][0] + 0.1
    assert (tmp_path / "run" / "draft" / "model.safetensors").is_file()
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    assert any('"event": "eval"' in line for line in lines)
