"""A run stops at its first NaN/inf loss without saving over its last good checkpoint; a checkpoint holding
NaN weights is not resumed."""

import pytest
import torch
from helpers import tiny_target
from safetensors.torch import load_file, save_file
from train_fixtures import make_data, tiny_recipe

from eyas.errors import EyasError
from eyas.train.trainer import Trainer

SETS = {"train.max_steps": 8, "log.checkpoint_every": 2, "log.every": 2}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    target = tiny_target(dtype=torch.float32)
    return root, target, make_data(target, root / "data", rows=24)


def poisoned(trainer, at_step):
    """The draft's weights turn NaN before step ``at_step`` (1-based), as a diverged run's do."""
    step = trainer.train_step

    def wrapped(b):
        if trainer.step + 1 == at_step:
            with torch.no_grad():
                trainer.draft.fc.weight.fill_(float("nan"))
        return step(b)
    trainer.train_step = wrapped
    return trainer


def test_training_stops_at_the_first_nan_loss_and_keeps_the_last_good_checkpoint(setup):
    root, target, data = setup
    run = root / "run"
    trainer = poisoned(Trainer(tiny_recipe(data, run, **SETS), target=target), at_step=5)
    with pytest.raises(EyasError) as e:
        trainer.fit()
    assert "NaN/inf at step 5" in e.value.problem and "optim.lr" in e.value.fix and "float32" in e.value.fix
    assert "step-4" in e.value.fix
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert not (run / "draft").exists()
    for name in ("step-2", "step-4"):
        weights = load_file(run / "checkpoints" / name / "model.safetensors")
        assert all(torch.isfinite(v).all() for v in weights.values())
    assert '"nonfinite"' in (run / "log.jsonl").read_text()


def test_a_nan_between_log_lines_is_caught_before_the_checkpoint(setup):
    root, target, data = setup
    run = root / "run2"
    sets = {**SETS, "log.every": 100, "log.checkpoint_every": 3}
    with pytest.raises(EyasError, match="at step 2"):
        poisoned(Trainer(tiny_recipe(data, run, **sets), target=target), at_step=2).fit()
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").glob("step-*"))


def test_resume_refuses_a_checkpoint_with_nan_weights(setup):
    root, target, data = setup
    run = root / "run3"
    Trainer(tiny_recipe(data, run, **SETS), target=target).fit(stop_after=3)
    weights = run / "checkpoints" / "step-2" / "model.safetensors"
    sd = load_file(weights)
    sd["midlayer.self_attn.q_proj.weight"][0, 0] = float("inf")
    save_file(sd, weights)
    with pytest.raises(EyasError, match="midlayer.self_attn.q_proj.weight") as e:
        Trainer(tiny_recipe(data, run, **SETS), target=target).resume(run)
    assert "NaN/inf" in e.value.problem and "earlier checkpoint" in e.value.fix
