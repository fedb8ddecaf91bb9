"""The device sampler and tree verifier keep the target's distribution exactly, for every row at once.

Synthetic trees over an 8-token vocabulary with fixed logits per node: the exact distribution of the
tokens a step emits is enumerated along the tree (a token that is a child's continues at that child,
any other ends the step) and compared by chi-square with what ``accept_rows`` emits for tens of
thousands of rows, each drawing from the counter-based RNG with its own seed. Rows of one batch mix
settings (greedy, temperature, top-k, top-p, min-p); the test is shown to fail for two biased draws.
"""

import pytest
import torch
from distributions import CHAIN, TREE, batch_tree, emitted, pvalue, step_distribution, tree_and_logits
from scipy.stats import chisquare

from eyas.engine.sampler import accept_rows
from eyas.sample.sampling import SamplingParams, SamplingRows, probs
from eyas.spec import draw
from eyas.spec.rng import uniform
from eyas.spec.tree import Tree
from eyas.spec.verify import accept_greedy, accept_greedy_batch

V = 8
SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
            SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=1.3, min_p=0.15),
            SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05), SamplingParams()]  # the last greedy


def exact(parents, tokens, logits, params: SamplingParams, n: int = 3) -> dict[tuple, float]:
    """P(the first ``n`` tokens the step emits), with the reference ``probs`` at each node."""
    return step_distribution(parents, tokens, lambda node, prefix: probs(logits[node], params), n)


def run(parents, tokens, logits, params: list[SamplingParams], rows: int, n: int = 3):
    """What ``accept_rows`` emits (the first ``n`` tokens as tuples) for ``rows`` rows cycling through ``params``."""
    plist = [params[r % len(params)] for r in range(rows)]
    sr = SamplingRows.build(plist, list(range(rows)), "cpu")
    tree, width, k = batch_tree(parents, tokens, rows)
    cols, counts, bonus = accept_rows(tree, logits.expand(rows, len(parents), V), width, sr.floats, sr.ints,
                                      torch.full((rows,), 17), True)
    return emitted(tree, cols, counts, bonus, n)


@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_one_batch_of_mixed_settings_emits_each_rows_exact_distribution(shape):
    tokens, logits = tree_and_logits(shape, seed=len(shape), vocab=V)
    rows = 8000 * len(SETTINGS)
    out = run(shape, tokens, logits, SETTINGS, rows)
    for i, params in enumerate(SETTINGS):
        mine = out[i::len(SETTINGS)]
        if params.greedy:  # the greedy walk: one outcome
            tree = Tree.from_parents(torch.tensor([tokens]), torch.tensor([shape]))
            path, b = accept_greedy(tree, logits.argmax(-1), 0)
            assert set(mine) == {tuple([tokens[c] for c in path[1:]] + [b])[:3]}
            continue
        assert pvalue(mine, exact(shape, tokens, logits, params)) > 1e-3, params
    assert len({o[0] for o in out}) > 3 and any(len(o) == 3 for o in out)  # accepted deep, rejected often


@pytest.mark.parametrize("biased", ["a uniform squared", "one uniform for every position"])
def test_a_biased_draw_fails_the_same_test(biased, monkeypatch):
    real = draw.uniform
    if biased == "a uniform squared":  # not uniform: the first tokens of the vocabulary drawn too often
        monkeypatch.setattr(draw, "uniform", lambda seed, position, lane: real(seed, position, lane) ** 2)
    else:  # each depth of a step draws at the same uniform: its tokens are drawn together, not one by one
        monkeypatch.setattr(draw, "uniform", lambda seed, position, lane: real(seed, position * 0, lane))
    params = SamplingParams(temperature=1.0)
    tokens, logits = tree_and_logits(TREE, seed=len(TREE), vocab=V)
    out = run(TREE, tokens, logits, [params], 16000)
    assert pvalue(out, exact(TREE, tokens, logits, params)) < 1e-6


def random_tree(gen: torch.Generator, rows: int, size: int, vocab: int) -> Tree:
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, j, (), generator=gen)) for j in range(1, size)])
                           for _ in range(rows)])
    tokens = torch.stack([torch.randperm(vocab, generator=gen)[:size] for _ in range(rows)])
    return Tree.from_parents(tokens, parents)


def test_greedy_rows_get_exactly_the_greedy_acceptance_beside_sampled_rows():
    gen = torch.Generator().manual_seed(0)
    for size in (1, 2, 5, 9, 16):
        tree = random_tree(gen, 12, size, vocab=30)
        logits = torch.randn(12, size, 30, generator=gen)
        for row in range(12):  # make the target choose the drafted tokens often
            for j in range(1, size):
                if torch.rand((), generator=gen) < 0.6:
                    logits[row, tree.parents[row, j], tree.tokens[row, j]] += 20
        params = [SETTINGS[r % len(SETTINGS)] for r in range(12)]
        sr = SamplingRows.build(params, list(range(12)), "cpu")
        width = int(tree.depth.max()) + 1
        got = accept_rows(tree, logits, width, sr.floats, sr.ints, torch.arange(12), True)
        want = accept_greedy_batch(tree, logits.argmax(-1), width)
        greedy = torch.tensor([p.greedy for p in params])
        for g, w in zip(got, want):
            assert torch.equal(g[greedy], w[greedy])
        counts, cols = got[1], got[0]
        assert (counts >= 1).all() and (cols.gather(1, (counts - 1)[:, None]) < size).all()


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The previous sort-based definition (softmax, top-k, top-p on sorted probabilities), plus min-p."""
    x = logits.double() / params.temperature
    if params.top_k > 0:
        x = x.masked_fill(x < torch.topk(x, params.top_k, dim=-1).values[..., -1:], float("-inf"))
    p = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        drop = (torch.cumsum(sorted_p, dim=-1) - sorted_p) >= params.top_p
        drop[..., 0] = False
        p = p.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), 0.0)
    if params.min_p > 0:
        p = p.masked_fill(p < params.min_p * p.amax(-1, keepdim=True), 0.0)
    return p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("params", SETTINGS[:-1] + [SamplingParams(temperature=0.5, top_p=0.3, top_k=40, min_p=0.2)],
                         ids=str)
def test_the_threshold_definition_is_the_usual_one(params):
    logits = torch.randn(64, 300, generator=torch.Generator().manual_seed(1)) * 3
    torch.testing.assert_close(probs(logits, params).double(), reference_probs(logits, params), atol=1e-6, rtol=1e-4)


def test_ties_at_a_threshold_are_kept():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0]])
    assert probs(logits, SamplingParams(temperature=1.0, top_k=2))[0].gt(0).tolist() == [True] * 4 + [False]


def test_min_p_is_validated():
    with pytest.raises(Exception, match="min_p"):
        SamplingParams(temperature=1.0, min_p=1.5)


def test_the_counter_based_draws_are_uniform_and_independent():
    seeds = torch.arange(40000)[:, None]
    u = uniform(seeds, torch.tensor(5), torch.arange(4)[None])  # [N, 4]
    bins = (u * 16).long()
    for lane in range(4):
        assert chisquare(torch.bincount(bins[:, lane], minlength=16).numpy()).pvalue > 1e-3
    pairs = bins[:, 0] * 16 + bins[:, 1]  # two lanes of one row: joint uniform over 256 cells
    assert chisquare(torch.bincount(pairs, minlength=256).numpy()).pvalue > 1e-3
    nxt = uniform(seeds, torch.tensor(6), torch.arange(1)[None])  # the next position, same lane
    assert chisquare(torch.bincount(bins[:, 0] * 16 + (nxt[:, 0] * 16).long(), minlength=256).numpy()).pvalue > 1e-3
    again = uniform(torch.tensor([7, -3, 2**63 - 1]), torch.tensor([100, 0, 2**31]), torch.tensor([0, 5, 9]))
    assert torch.equal(again, uniform(torch.tensor([7, -3, 2**63 - 1]), torch.tensor([100, 0, 2**31]),
                                      torch.tensor([0, 5, 9])))
    assert (u > 0).all() and (u < 1).all() and u.dtype == torch.float32
