"""Trackers through accelerate: TensorBoard event files read back with TensorBoard's own reader, a
registered GeneralTracker that receives exactly what log.jsonl holds, and trackers asked for but not
installed refused before anything loads, naming the pip command."""

import json
import sys
from typing import ClassVar

import pytest
import torch
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker
from helpers import save_tiny_model, tiny_target
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_fixtures import make_data, tiny_recipe

from eyas.cli import main
from eyas.errors import EyasError
from eyas.train import trackers
from eyas.train.recipe import LogSection
from eyas.train.trainer import Trainer

SETS = {"train.max_steps": 10, "log.every": 5, "log.eval_every": 10}


def jsonl(run):
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def expected(run) -> dict:
    """What every tracker should have received: {(tag, step): value} from log.jsonl."""
    out = {}
    for rec in jsonl(run):
        if "step" in rec:
            fields = {k: v for k, v in rec.items() if k not in ("event", "time")}
            out.update({(tag, rec["step"]): v for tag, v in trackers.metrics(rec["event"], fields).items()})
    return out


def test_report_to_tensorboard_writes_events_that_tensorboard_reads_back(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "target")
    data = make_data(tiny_target(dtype=torch.float32), tmp_path / "data", rows=24)
    run = tmp_path / "run"
    args = ["train", "--model-path", str(model), "--data", str(data), "--output", str(run),
            "--report-to", "tensorboard", "--run-name", "tiny-run"]
    for k, v in {"data.max_length": 64, "data.tokens_per_batch": 512, "data.eval_rows": 8, "draft.vocab_size": 300,
                 "train.ttt_steps": 3, "train.device": "cpu", "log.checkpoint_every": 0, "log.progress": False,
                 **SETS}.items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 0, capsys.readouterr().err
    acc = EventAccumulator(str(run / "tensorboard" / "tiny-run"))
    acc.Reload()
    got = {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    want = expected(run)
    assert {"train/loss", "train/acc_0", "train/acc_2", "train/lr", "train/tokens_per_s", "eval/acc_0",
            "eval/loss"} <= {tag for tag, _ in want}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key  # TensorBoard stores float32
    assert [e.step for e in acc.Scalars("train/loss")] == [5, 10]


class Recorder(GeneralTracker):
    """A custom tracker, registered with accelerate under a name a recipe can use."""

    name = "recorder"
    requires_logging_directory = True
    runs: ClassVar[list] = []

    def __init__(self, project, logging_dir):
        super().__init__()
        self.project, self.logging_dir = project, logging_dir
        self.config, self.logged, self.started, self.finished = None, [], 0, 0
        Recorder.runs.append(self)

    @property
    def tracker(self):
        return self

    def start(self):
        self.started += 1

    def store_init_configuration(self, values):
        self.config = values

    def log(self, values, step=None, **kwargs):
        self.logged.append((step, dict(values)))

    def finish(self):
        self.finished += 1


def test_a_registered_tracker_gets_the_recipe_and_every_logged_number(tmp_path, monkeypatch):
    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "recorder", Recorder)
    monkeypatch.setattr(Recorder, "runs", [])
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=24)
    run = tmp_path / "run"
    recipe = tiny_recipe(data, run, **SETS, **{"log.trackers": "[recorder]", "log.project": "eagle",
                                              "log.dir": str(tmp_path / "trk"), "log.checkpoint_every": 5})
    Trainer(recipe, target=target).fit()
    [rec] = Recorder.runs
    assert (rec.project, rec.logging_dir, rec.started, rec.finished) == ("eagle", str(tmp_path / "trk"), 1, 1)
    assert rec.config["optim.lr"] == 3e-3 and rec.config["train.ttt_steps"] == 3
    assert rec.config["log.trackers"] == "['recorder']"  # lists arrive as text: every tracker takes that
    got = {(tag, step): v for step, values in rec.logged for tag, v in values.items()}
    assert got == expected(run)
    assert {step for step, _ in rec.logged} == {5, 10}


def log_section(**kw) -> LogSection:
    log = LogSection()
    for k, v in kw.items():
        setattr(log, k, v)
    return log


def test_tensorboard_true_is_an_alias_and_names_are_checked():
    assert trackers.requested(log_section()) == []
    assert trackers.requested(log_section(tensorboard=True)) == ["tensorboard"]
    assert trackers.requested(log_section(trackers=["TensorBoard"], tensorboard=True)) == ["tensorboard"]
    assert trackers.requested(log_section(trackers="tensorboard,none")) == ["tensorboard"]
    with pytest.raises(EyasError, match="'tensorbord', which is not a tracker accelerate knows") as e:
        trackers.requested(log_section(trackers=["tensorbord"]))
    assert "tensorboard" in e.value.fix and "wandb" in e.value.fix and "mlflow" in e.value.fix


@pytest.mark.parametrize("name, module, package", [("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow"),
                                                   ("tensorboard", "torch.utils.tensorboard", "tensorboard")])
def test_a_tracker_that_is_not_installed_is_an_error_naming_the_package(name, module, package, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(EyasError, match=f"the {name} tracker was asked for .* the {package} package cannot be "
                                        "imported") as e:
        trackers.requested(log_section(trackers=[name]))
    assert f"pip install {package}" in e.value.fix


def test_report_to_a_missing_tracker_stops_before_the_target_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    rc = main(["train", "--model-path", str(tmp_path / "no-such-target"), "--data", str(tmp_path / "no-data"),
               "--output", str(tmp_path / "run"), "--report-to", "tensorboard,wandb", "--set", "train.device=cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "eyas: error: the wandb tracker was asked for" in err and "pip install wandb" in err
    assert not (tmp_path / "run").exists()
