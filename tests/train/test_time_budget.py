"""train.time_budget_s: the run ends near its budget even when steps get faster after the first measurement."""

import torch
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe

import eyas.train.trainer as trainer_module
from eyas.train.trainer import Trainer


class Clock:
    """A fake clock that only the steps advance."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def budgeted(tmp_path, monkeypatch, max_steps: int, seconds_of_step, clock=None, **sets) -> tuple[Trainer, Clock]:
    """A trainer with a 200 s budget whose step ``i`` takes ``seconds_of_step(i)`` on the fake clock."""
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=48)
    clock = clock or Clock()
    monkeypatch.setattr(trainer_module, "time", clock)
    t = Trainer(tiny_recipe(data, tmp_path / "run", **{"train.max_steps": max_steps, "train.epochs": 500,
                                                        "train.time_budget_s": 200, **sets}), target=target)
    step = t.train_step

    def timed_step(batch):
        clock.now += seconds_of_step(t.step)
        return step(batch)

    t.train_step = timed_step
    return t, clock


def test_a_time_budget_is_refit_when_steps_speed_up(tmp_path, monkeypatch):
    t, clock = budgeted(tmp_path, monkeypatch, 2000, lambda i: 2.0 if i < 45 else 1.0)  # 0.5 steps/s, then 1
    summary = t.fit()
    # measured at 0.5 steps/s the run would stop at 100 steps, 145 s into a 200 s budget; refit, it uses the budget
    assert 190 <= clock.now <= 210, clock.now
    assert summary["steps"] == t.total_steps and 150 <= t.total_steps <= 160
    log = (tmp_path / "run" / "log.jsonl").read_text()
    assert log.count('"event": "budget"') == 2


def test_a_time_budget_never_goes_past_the_recipes_steps(tmp_path, monkeypatch):
    t, _ = budgeted(tmp_path, monkeypatch, 80, lambda i: 0.1)
    assert t.fit()["steps"] == 80


def test_a_time_budget_holds_when_steps_are_too_slow_to_reach_the_measurement(tmp_path, monkeypatch):
    """Steps/s was first measured over steps 15-45, so a run of 10 s steps in a 200 s budget ran 46 steps,
    460 s, before the budget had any say."""
    t, clock = budgeted(tmp_path, monkeypatch, 2000, lambda i: 10.0)
    summary = t.fit()
    assert clock.now <= 210, clock.now
    assert summary["steps"] == t.total_steps and 18 <= t.total_steps <= 21


def test_a_budgeted_run_resumes_its_schedule_and_the_rest_of_its_budget(tmp_path, monkeypatch):
    """A resumed time-budgeted run went back to the recipe's 2000 steps (its learning rate jumped back
    up the cosine) and got a whole new budget, however much of it the crashed run had spent."""
    t, clock = budgeted(tmp_path, monkeypatch, 2000, lambda i: 1.0, **{"log.checkpoint_every": 60})
    t.fit(stop_after=70)  # fitted to 200 steps at step 45, checkpointed at 60 s, crashed at 70
    assert t.total_steps == 200
    clock.now = 1000.0  # a new process, later
    again, _ = budgeted(tmp_path, monkeypatch, 2000, lambda i: 1.0, clock, **{"log.checkpoint_every": 60})
    again.resume(tmp_path / "run")
    assert again.step == 60 and again.total_steps == 200
    assert again.scheduler.lr_lambdas[0](61) == t.scheduler.lr_lambdas[0](61)
    assert again.fit()["steps"] == 200 and 1130 <= clock.now <= 1150, clock.now  # the 140 s it had left
