"""The demo's reason why speculation does not pay, from the bench figures it measured (fast, no model)."""

from __future__ import annotations

from types import SimpleNamespace

from eyas.demo import step_cost, why_not


def run(tok_s: float, tau: float | None = None):
    return SimpleNamespace(tokens_per_s=tok_s, acceptance={"tau": tau} if tau else {})


def test_step_cost_is_seconds_per_step_over_seconds_per_plain_token():
    # 10 tok/s plain = 0.1 s a token; 6 tok/s at tau 1.5 = 0.25 s a step: a step costs 2.5 plain ones
    assert abs(step_cost(run(6.0, 1.5), run(10.0)) - 2.5) < 1e-9
    assert step_cost(run(6.0), run(10.0)) is None  # no acceptance figures: nothing to say
    assert step_cost(run(0.0, 1.5), run(10.0)) is None


def test_why_not_names_the_step_cost_and_the_acceptance():
    text = why_not((5, 1, 6), 2.5, 1.5, 0.6)
    assert text.startswith("speculation does not pay on this machine: a step of the chain 5/1/6 (5 draft forwards, "
                           "then verifying 6 tokens) costs 2.5x a plain decoding step here, and the draft accepts "
                           "1.50 tokens a step on these prompts (0.60x): it pays only above 2.5 tokens a step.")
    assert "the tree 4/4/16" in why_not((4, 4, 16), 4.0, 2.0, 0.5)
    assert why_not((5, 1, 6), None, None, None).startswith("speculation was not measured here")
