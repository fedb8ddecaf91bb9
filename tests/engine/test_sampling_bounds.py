"""Every accepted sampling setting gives a distribution: a tiny temperature is greedy, a tiny top_p keeps the
top token."""

import pytest
import torch

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.sampling import GREEDY_BELOW, SamplingParams, probs


@pytest.mark.parametrize("temperature", [6e-39, 5e-324, 1e-30, 9.9e-6])
def test_a_temperature_below_1e_5_is_greedy_and_its_distribution_the_argmax(temperature):
    params = SamplingParams(temperature=temperature)
    assert params.greedy
    logits = torch.randn(3, 40, dtype=torch.float64) * 30
    p = probs(logits, params)
    assert torch.equal(p, torch.nn.functional.one_hot(logits.argmax(-1), 40).float())


def test_at_1e_5_the_temperature_samples_and_stays_finite():
    params = SamplingParams(temperature=GREEDY_BELOW)
    assert not params.greedy
    p = probs(torch.randn(3, 40) * 30, params)
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(3))


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 1e-9])
def test_a_tiny_top_p_keeps_the_most_probable_token(top_p):
    logits = torch.randn(3, 40)
    p = probs(logits, SamplingParams(temperature=0.7, top_p=top_p))
    assert torch.equal(p, torch.nn.functional.one_hot(logits.argmax(-1), 40).float())


def test_extreme_settings_generate_next_to_greedy_rows(target):
    engine = Engine(target, None, SpecConfig("NONE"))
    greedy = SamplingParams(max_new_tokens=6, ignore_eos=True)
    odd = [SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=6e-39),
           SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=0.9, top_p=1e-300, seed=1)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    outs = engine.generate(prompts, [greedy, *odd])
    alone = engine.generate(prompts, greedy)
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert [o.output_ids for o in outs] == [o.output_ids for o in alone]  # each of them is the argmax
