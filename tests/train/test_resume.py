"""--resume continues exactly (a run interrupted after a checkpoint ends with the same weights), reads
checkpoints without unpickling, falls back past broken ones and refuses what does not match."""

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import save_tiny_model, tiny_target
from safetensors.torch import load_file
from train_fixtures import make_data, tiny_recipe

from eyas.cli import main
from eyas.errors import EyasError
from eyas.models.safety import load_torch_file
from eyas.train.trainer import Trainer


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


# -- checkpoints never run code; resume falls back, refuses mismatches, finds its recipe --------------------------
SETS = {"train.max_steps": 8, "log.checkpoint_every": 2, "log.keep_checkpoints": 3}


class Payload:
    """Unpickling this writes a marker file: proof that a loader executed pickle code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A run from a saved target folder that died at step 7: checkpoints step-2, step-4, step-6."""
    root = tmp_path_factory.mktemp("crashed")
    save_tiny_model(root / "target")
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, root / "data", rows=24)
    Trainer(tiny_recipe(data, root / "run", target=str(root / "target"), **SETS), target=target).fit(stop_after=7)
    return root, target, data


def copy_run(crashed, tmp_path):
    root, target, data = crashed
    shutil.copytree(root / "run", tmp_path / "run")
    return tmp_path / "run", target, data


def trainer_for(run, target, data, messages=None, **sets):
    sets = {**SETS, "target": str(Path(data).parent / "target"), **sets}
    return Trainer(tiny_recipe(data, run, **sets), target=target,
                   log=(messages.append if messages is not None else print))


def test_checkpoints_load_with_weights_only_and_the_recipe_is_written_at_the_start(crashed):
    root = crashed[0]
    state = load_torch_file(root / "run/checkpoints/step-6/state.pt")  # weights_only=True, no allowlist
    assert set(state) == {"optimizer", "scheduler", "rng"}  # the draft is the servable folder beside it
    assert (root / "run/checkpoints/step-6/model.safetensors").is_file()
    assert json.loads((root / "run/checkpoints/step-6/checkpoint.json").read_text())["step"] == 6
    assert (root / "run/recipe.yaml").is_file()  # the run died before completing


def test_a_crafted_state_pt_is_never_unpickled(crashed, tmp_path):
    run, target, data = copy_run(crashed, tmp_path)
    marker = tmp_path / "pwned"
    newest = run / "checkpoints/step-6"
    pickle.loads(pickle.dumps(Payload(str(tmp_path / "proof"))))  # plain unpickling runs the payload
    assert (tmp_path / "proof").exists()
    with open(newest / "state.pt", "wb") as f:
        pickle.dump({"draft": Payload(str(marker))}, f, protocol=2)
    messages = []
    t = trainer_for(run, target, data, messages)
    t.resume(run)  # skipped with a warning naming it, the previous intact checkpoint taken
    assert t.step == 4 and not marker.exists()
    assert any("step-6" in m and "not loaded" in m for m in messages), messages
    with pytest.raises(EyasError, match="holds objects other than tensors"):
        t.resume(newest)  # named explicitly: no fallback
    # Without checkpoint.json it reads as an older eyas's checkpoint: refused unless --allow-pickle ...
    (newest / "checkpoint.json").unlink()
    with pytest.raises(EyasError, match="older eyas") as e:
        t.resume(newest)
    assert "--allow-pickle" in e.value.fix
    # ... and even allowed, it is read with weights_only=True: the payload is refused, not run.
    with pytest.raises(EyasError, match="cannot be resumed from"):
        t.resume(newest, allow_pickle=True)
    assert not marker.exists()


def test_an_older_checkpoint_resumes_only_with_allow_pickle(crashed, tmp_path):
    run, target, data = copy_run(crashed, tmp_path)
    step = run / "checkpoints/step-6"
    state = load_torch_file(step / "state.pt")
    meta = json.loads((step / "checkpoint.json").read_text())
    state["rng"]["numpy"] = np.random.get_state()  # what eyas wrote before: a tuple holding an ndarray
    state["draft"] = load_file(step / "model.safetensors")  # ... with the draft inside state.pt
    torch.save({**state, "step": meta["step"], "position": meta["position"], "recipe": meta["recipe"]},
               step / "state.pt")
    (step / "checkpoint.json").unlink()
    t = trainer_for(run, target, data)
    with pytest.raises(EyasError, match="--allow-pickle"):
        t.resume(step)
    t.resume(step, allow_pickle=True)
    assert t.step == 6


def test_a_truncated_or_missing_state_falls_back_to_the_last_intact_checkpoint(crashed, tmp_path):
    run, target, data = copy_run(crashed, tmp_path)
    f = run / "checkpoints/step-6/state.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    (run / "checkpoints/step-4/state.pt").unlink()
    messages = []
    t = trainer_for(run, target, data, messages)
    t.resume(run)
    assert t.step == 2
    warning = " ".join(messages)
    assert "step-6" in warning and "truncated" in warning and "step-4" in warning and "no state.pt" in warning
    (run / "checkpoints/step-2/state.pt").unlink()
    with pytest.raises(EyasError, match="no intact checkpoint under"):
        t.resume(run)


def test_a_changed_recipe_is_refused_naming_the_fields_unless_allowed(crashed, tmp_path):
    run, target, data = copy_run(crashed, tmp_path)
    t = trainer_for(run, target, data, **{"optim.lr": 1e-3, "train.seed": 5})
    with pytest.raises(EyasError, match=r"optim.lr 0.003 -> 0.001.*train.seed 0 -> 5") as e:
        t.resume(run)
    assert "--allow-recipe-change" in e.value.fix
    t.resume(run, allow_recipe_change=True)  # explicit: the new learning rate applies from here
    assert t.step == 6 and t.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * t.scheduler.lr_lambdas[0](6))


def test_a_run_may_be_extended_without_allowing_changes(crashed, tmp_path):
    """How long a run goes (max_steps, a time budget, epochs) is not what a step computes: a resume that
    extends a run is no recipe change."""
    run, target, data = copy_run(crashed, tmp_path)
    t = trainer_for(run, target, data, **{"train.max_steps": 12, "train.time_budget_s": 600, "train.epochs": 9})
    t.resume(run)
    assert t.step == 6


def test_another_vocabulary_size_names_both_sizes(crashed, tmp_path):
    run, target, data = copy_run(crashed, tmp_path)
    t = trainer_for(run, target, data, **{"draft.vocab_size": 200})
    with pytest.raises(EyasError, match="draft vocabulary of 300 tokens over a target vocabulary of 320; this run's "
                                        "draft has 200 tokens over 320"):
        t.resume(run, allow_recipe_change=True)


def test_cli_resume_with_the_run_folder_alone(crashed, tmp_path, capsys):
    run, _, _ = copy_run(crashed, tmp_path)
    assert main(["train", "--resume", str(run)]) == 0
    assert "resumed at step 6" in capsys.readouterr().out
    assert (run / "draft" / "config.json").is_file()
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    assert main(["train", "--resume", str(run)]) == 2
    assert "eyas: error: no intact checkpoint" in capsys.readouterr().err


def test_cli_resume_of_a_finished_run_leaves_it_as_it_is(crashed, tmp_path, capsys):
    """Resuming a run that already reached its last step used to 'finish' it again: summary.json
    rewritten with heldout null and 0 s, a second done event, draft/ rewritten."""
    run, _, _ = copy_run(crashed, tmp_path)
    assert main(["train", "--resume", str(run), "--set", "log.eval_every=8"]) == 0
    summary = (run / "summary.json").read_text()
    assert json.loads(summary)["heldout"] is not None
    log = (run / "log.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "log.eval_every=8"]) == 0
    assert "nothing to train: the checkpoint is at step 8" in capsys.readouterr().out
    assert (run / "summary.json").read_text() == summary and (run / "log.jsonl").read_text() == log


def test_cli_new_run_into_a_run_folder_is_refused(crashed, tmp_path, capsys):
    """Without --resume, a run started in another run's folder overwrote its draft/ and recipe.yaml,
    appended to its log.jsonl, and its own checkpoints were pruned beside the old run's higher steps."""
    run, _, data = copy_run(crashed, tmp_path)
    recipe = run / "recipe.yaml"
    assert main(["train", "--recipe", str(recipe), "--output", str(run)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (checkpoints up to step-6)" in err and f"--resume {run}" in err
    (tmp_path / "file").write_text("x")
    assert main(["train", "--recipe", str(recipe), "--output", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_cli_resume_of_a_missing_path_says_so(tmp_path, capsys):
    """It said 'no recipe.yaml in that run folder' of a folder that does not exist (a typo in the path)."""
    assert main(["train", "--resume", str(tmp_path / "runz")]) == 2
    assert "no such run folder or checkpoint" in capsys.readouterr().err


def test_a_full_disk_while_saving_says_where_to_go_on_from(crashed, tmp_path, monkeypatch):
    """A checkpoint that could not be written died in an OSError/SafetensorError traceback and left its
    half-written .step-N.tmp folder taking the space."""
    import eyas.train.checkpoint as checkpoint

    run, target, data = copy_run(crashed, tmp_path)
    t = trainer_for(run, target, data)
    t.resume(run)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(EyasError, match="could not write the checkpoint step-8 .*No space left on device") as e:
        t.fit()
    assert f"continue from step-6 with --resume {run}" in e.value.fix
    assert not (run / "checkpoints" / ".step-8.tmp").exists()


def test_ctrl_c_says_how_to_resume(crashed, tmp_path, capsys, monkeypatch):
    """Ctrl-C ended eyas train with exit 130 and not a word: which checkpoint holds the run, how to go on."""
    run, _, _ = copy_run(crashed, tmp_path)

    def interrupted(self, stop_after=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "fit", interrupted)
    assert main(["train", "--resume", str(run)]) == 130
    assert f"interrupted at step 6; the newest checkpoint is step-6: continue with eyas train --resume {run}" \
        in capsys.readouterr().out


def test_resuming_an_older_step_into_its_own_run_is_refused(crashed, tmp_path, capsys):
    """--resume RUN/checkpoints/step-2 beside step-6 wrote the branch's checkpoints among the old ones; the
    branch's own were pruned first and a later --resume RUN continued the abandoned timeline, silently."""
    run, _, _ = copy_run(crashed, tmp_path)
    assert main(["train", "--resume", str(run / "checkpoints" / "step-2")]) == 2
    err = capsys.readouterr().err
    assert "older than the run's step-6" in err and "--output NEW_FOLDER" in err
    assert main(["train", "--resume", str(run / "checkpoints" / "step-2"), "--recipe", str(run / "recipe.yaml"),
                 "--output", str(tmp_path / "branch")]) == 0
    assert (tmp_path / "branch" / "checkpoints" / "step-8").is_dir()


def test_data_prepared_again_under_the_same_path_is_a_change(tmp_path):
    """``eyas prepare --out`` into the data folder of a running run rewrites its rows: a resume would go on at the
    saved (epoch, batch) over other rows, and its draft vocabulary was built from the old ones. The checkpoint
    records the rows' digest, and the resume names the change unless allowed."""
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=24)
    save_tiny_model(tmp_path / "target")
    sets = {**SETS, "target": str(tmp_path / "target")}
    Trainer(tiny_recipe(data, tmp_path / "run", **sets), target=target).fit(stop_after=3)
    Trainer(tiny_recipe(data, tmp_path / "run", **sets), target=target).resume(tmp_path / "run")  # the same rows
    make_data(target, data, rows=24, seed=1)
    t = Trainer(tiny_recipe(data, tmp_path / "run", **sets), target=target)
    with pytest.raises(EyasError, match="the training rows in data.path .*prepared again") as e:
        t.resume(tmp_path / "run")
    assert "--allow-recipe-change" in e.value.fix
    t.resume(tmp_path / "run", allow_recipe_change=True)


def test_resume_with_a_recipe_that_writes_elsewhere_is_refused(crashed, tmp_path, capsys):
    """``--resume RUN --recipe R`` with R's output another folder (the copied run's recipe still names the
    original) went on in R's folder, not RUN; now refused, naming --output RUN and --output NEW_FOLDER."""
    run, _, _ = copy_run(crashed, tmp_path)
    assert main(["train", "--resume", str(run), "--recipe", str(run / "recipe.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"not in {run}" in err and f"--output {run}" in err and "--output NEW_FOLDER" in err
    assert main(["train", "--resume", str(run), "--recipe", str(run / "recipe.yaml"), "--output", str(run)]) == 0
    assert "resumed at step 6" in capsys.readouterr().out
