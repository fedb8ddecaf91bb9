"""With sampling, speculative decoding reproduces the target's distribution exactly.

A target with a 16-token vocabulary lets the exact distribution of the first tokens be computed
by enumeration; samples from the speculative engine are compared with it by chi-square tests.
"""

import pytest
import torch
from helpers import byte_tokenizer, tiny_model, train_draft
from scipy.stats import chisquare

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine.stats import SpecStats
from eyas.models.target import Target
from eyas.sample.sampling import SamplingParams, probs

V = 16
PROMPT = [3, 1, 4, 1, 5]
N = 3000


@pytest.fixture(scope="module")
def small():
    model = tiny_model(seed=3, vocab_size=V, num_hidden_layers=6, eos_token_id=None, bos_token_id=None,
                       pad_token_id=None)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peaky enough that acceptance is common, not certain
    target = Target(model, byte_tokenizer(), name="tiny-16", aux_layer_ids=[1, 3, 4])
    return target, train_draft(target, steps=80, ttt_steps=3)


def exact_distributions(target, params: SamplingParams):
    """P(t1, t2) [V, V] and P(t3) [V] by enumerating every prefix."""
    m = target.model
    with torch.no_grad():
        p1 = probs(m(torch.tensor([PROMPT])).logits[0, -1], params).double()  # [V]
        pre2 = torch.tensor([PROMPT + [a] for a in range(V)])
        p2 = probs(m(pre2).logits[:, -1], params).double()  # [V, V] = P(t2 | t1)
        joint12 = p1[:, None] * p2
        pre3 = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = probs(m(pre3).logits[:, -1], params).double()  # [V*V, V]
        marg3 = (joint12.reshape(-1)[:, None] * p3).sum(0)
    return joint12, marg3


def chi2_pvalue(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Goodness of fit, pooling cells whose expected count is below 5."""
    counts, exp = counts.double().flatten(), expected_p.flatten() * counts.sum()
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    ex = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = ex > 0
    obs, ex = obs[keep], ex[keep]
    return float(chisquare(obs.numpy(), ex.numpy() * obs.sum().item() / ex.sum().item()).pvalue)


def sample_tokens(engine, params: SamplingParams, n: int, seed0: int):
    rows, stats = [], SpecStats()
    for start in range(0, n, 500):
        ps = [SamplingParams(max_new_tokens=3, temperature=params.temperature, top_p=params.top_p,
                             top_k=params.top_k, seed=seed0 + start + i, ignore_eos=True) for i in range(500)]
        for o in engine.generate([PROMPT] * 500, ps):
            rows.append(o.output_ids[:3])
            stats.add(o.stats)
    return torch.tensor(rows), stats


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=6, top_p=0.9),
], ids=["t1", "t0.7-topk6-topp0.9"])
def test_speculative_sampling_matches_the_target_distribution(small, params):
    target, draft = small
    joint12, marg3 = exact_distributions(target, params)
    engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 6))
    rows, stats = sample_tokens(engine, params, N, seed0=1000)
    # accept and reject paths both well exercised, at depth 1 and deeper
    assert stats.accepted >= 500 and stats.draft_tokens - stats.accepted >= 500
    assert len(stats.accepted_per_position) >= 2 and stats.accepted_per_position[1] >= 50
    counts12 = torch.zeros(V, V)
    counts12.index_put_((rows[:, 0], rows[:, 1]), torch.ones(N), accumulate=True)
    counts3 = torch.bincount(rows[:, 2], minlength=V)
    assert chi2_pvalue(counts12, joint12) > 1e-3
    assert chi2_pvalue(counts3, marg3) > 1e-3


def test_the_test_can_fail(small):
    """Sanity of the statistics: samples from the *draft's* greedy choice are rejected by the test."""
    target, draft = small
    params = SamplingParams(temperature=1.0)
    joint12, _ = exact_distributions(target, params)
    rows = torch.full((N, 2), int(joint12.sum(1).argmax()))
    counts = torch.zeros(V, V)
    counts.index_put_((rows[:, 0], rows[:, 1]), torch.ones(N), accumulate=True)
    assert chi2_pvalue(counts, joint12) < 1e-6


def test_seeds_make_sampling_reproducible(small):
    target, draft = small
    engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 6))
    def run(seed):
        params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=seed, ignore_eos=True)
        return engine.generate([PROMPT], params)[0].output_ids
    assert run(7) == run(7)
    assert any(run(7) != run(s) for s in (8, 9, 10))
    # a row's randomness is its own: the same seed gives the same tokens inside a batch
    ps = [SamplingParams(max_new_tokens=20, temperature=1.0, seed=s, ignore_eos=True) for s in (5, 7, 9)]
    outs = engine.generate([PROMPT, PROMPT, [2, 2]], ps)
    assert outs[1].output_ids == run(7)
