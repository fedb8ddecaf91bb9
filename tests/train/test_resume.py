"""--resume continues exactly: a run interrupted after a checkpoint ends with the same weights."""

import torch

from eyas.train.trainer import Trainer
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe


def test_resume_matches_uninterrupted(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=48)
    sets = {"train.max_steps": 16, "log.checkpoint_every": 6, "train.epochs": 3}

    full = Trainer(tiny_recipe(data, tmp_path / "full", **sets), target=target)
    full.fit()

    crashed = Trainer(tiny_recipe(data, tmp_path / "part", **sets), target=target)
    crashed.fit(stop_after=9)  # dies at step 9; the last checkpoint is step 6
    resumed = Trainer(tiny_recipe(data, tmp_path / "part", **sets), target=target)
    resumed.resume(tmp_path / "part")
    assert resumed.step == 6 and resumed.position[1] >= 6 or resumed.position[0] > 0
    resumed.fit()

    a, b = full.draft.state_dict(), resumed.draft.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.scheduler.get_last_lr() == full.scheduler.get_last_lr()
