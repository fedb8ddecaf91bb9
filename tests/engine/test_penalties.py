"""Penalties and logit bias on the device keep the verifier exact along every tree path.

The reference is written on the host from the definitions (vLLM's penalties, OpenAI's bias), for one
context at a time: the prompt, the output so far and the drafted tokens on the path to a node. The
exact distribution of what a step emits is enumerated along the tree (``distributions.step_distribution``)
and compared by chi-square with what ``sampler.accept`` emits for thousands of rows of one batch with
different settings; counting only a node itself and not its drafted ancestors must fail the same test.
"""

import pytest
import torch
from distributions import CHAIN, TREE, batch_tree, emitted, pvalue, step_distribution, tree_and_logits

from eyas.engine import sampler
from eyas.engine.sampler import accept
from eyas.sample.penalties import penalize, record
from eyas.sample.sampling import PENALIZED, SamplingParams, SamplingRows, probs
from eyas.spec.tree import Tree

V = 8
PROMPT = [1, 2]
OUTPUT = [4, 4]  # the output so far; its last token is the tree's root
SETTINGS = [SamplingParams(temperature=1.0, presence_penalty=1.5),
            SamplingParams(temperature=0.8, frequency_penalty=1.0, top_k=5),
            SamplingParams(temperature=1.0, repetition_penalty=1.8, top_p=0.9),
            SamplingParams(temperature=1.2, logit_bias={3: 2.0, 5: -100.0}, min_p=0.05),
            SamplingParams(temperature=1.0, presence_penalty=-1.0, frequency_penalty=2.0, repetition_penalty=0.7),
            SamplingParams(temperature=1.0),  # no penalty, in a penalized batch
            SamplingParams(presence_penalty=2.0, repetition_penalty=1.5),  # greedy, on the penalised logits
            # no stop token before the output has 3 tokens: the root holds them back, the nodes below it not
            SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[3, 6], max_new_tokens=8)]


def reference(logits: torch.Tensor, context: list[int], params: SamplingParams) -> torch.Tensor:
    """The penalised logits [V] of one context (prompt tokens first, then ``context``, the output)."""
    x = logits.double().clone()
    for t, b in params.logit_bias.items():
        x[t] += b
    for t in set(PROMPT + context):
        r = params.repetition_penalty
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t in set(context):
        x[t] -= params.frequency_penalty * context.count(t) + params.presence_penalty
    if len(context) < params.min_tokens:
        x[params.stop_token_ids] = -torch.inf
    return x


def walk(parents, tokens, logits, params: SamplingParams, n: int = 3) -> dict[tuple, float]:
    """P(the first ``n`` tokens a step emits) with every node's context: the output, then its path."""
    return step_distribution(
        parents, tokens, lambda node, prefix: probs(reference(logits[node], OUTPUT + list(prefix), params), params), n)


def run(parents, tokens, logits, params: list[SamplingParams], rows: int, n: int = 3) -> list[tuple]:
    plist = [params[r % len(params)] for r in range(rows)]
    sr = SamplingRows.build(plist, list(range(rows)), "cpu", [PROMPT] * rows, V)
    assert sr.kind == PENALIZED
    out_ids = torch.tensor([OUTPUT] * rows)
    sr.pen.counts = record(sr.pen.counts, out_ids, torch.full((rows,), len(OUTPUT)))
    tree, width, _ = batch_tree(parents, tokens, rows)
    cols, counts, bonus = accept(tree, logits.expand(rows, len(parents), V), width, sr.kind, sr.floats, sr.ints,
                                 torch.full((rows,), 17), pen=sr.pen_tensors())
    return emitted(tree, cols, counts, bonus, n)


def shape_with_root(shape):
    tokens, logits = tree_and_logits(shape, seed=len(shape), vocab=V)
    tokens[0] = OUTPUT[-1]
    return tokens, logits


@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_penalised_rows_emit_the_exact_penalised_distribution_along_each_path(shape):
    tokens, logits = shape_with_root(shape)
    out = run(shape, tokens, logits, SETTINGS, 6000 * len(SETTINGS))
    for i, params in enumerate(SETTINGS):
        mine = out[i::len(SETTINGS)]
        expected = walk(shape, tokens, logits, params)
        if params.greedy:  # one outcome: the walk along the penalised argmax
            assert set(mine) == {max(expected, key=expected.get)} and max(expected.values()) == pytest.approx(1.0)
            continue
        assert pvalue(mine, expected) > 1e-3, params


def test_ignoring_the_drafted_ancestors_fails_the_same_test(monkeypatch):
    def self_only(logits, tokens, mask, *rest):  # each node counts itself, not the path above it
        return penalize(logits, tokens, mask & torch.eye(mask.shape[-1], dtype=torch.bool), *rest)

    monkeypatch.setattr(sampler, "penalize", self_only)
    params = SamplingParams(temperature=1.0, frequency_penalty=2.0, presence_penalty=2.0)
    tokens, logits = shape_with_root(CHAIN)
    out = run(CHAIN, tokens, logits, [params], 12000)
    assert pvalue(out, walk(CHAIN, tokens, logits, params)) < 1e-6


def test_min_tokens_counted_without_the_drafted_depth_fails_the_same_test(monkeypatch):
    def root_only(logits, tokens, mask, *rest):  # each node as if nothing were drafted above it
        return penalize(logits, tokens, mask & (torch.arange(mask.shape[-1]) == 0), *rest)

    monkeypatch.setattr(sampler, "penalize", root_only)
    params = SETTINGS[-1]
    tokens, logits = shape_with_root(CHAIN)
    out = run(CHAIN, tokens, logits, [params], 12000)
    assert pvalue(out, walk(CHAIN, tokens, logits, params)) < 1e-6


def test_the_device_penalties_match_the_definition_at_every_node():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(len(TREE), V, generator=gen) * 2
    tokens, _ = shape_with_root(TREE)
    tree = Tree.from_parents(torch.tensor([tokens]), torch.tensor([TREE]))
    for params in [p for p in SETTINGS if p.penalized]:
        sr = SamplingRows.build([params], [0], "cpu", [PROMPT], V)
        counts = record(sr.pen.counts, torch.tensor([OUTPUT]), torch.tensor([len(OUTPUT)]))
        got = penalize(logits[None], tree.tokens, tree.mask, sr.pen.floats, sr.pen.bias, sr.pen.prompt, counts,
                       sr.pen.stops)[0]
        for node in range(len(TREE)):
            path = [tokens[j] for j in range(1, len(TREE)) if tree.mask[0, node, j]]
            torch.testing.assert_close(got[node].double(), reference(logits[node], OUTPUT + path, params))


@pytest.mark.parametrize("bad, match", [({"presence_penalty": 2.5}, "presence_penalty"),
                                        ({"frequency_penalty": -3}, "frequency_penalty"),
                                        ({"repetition_penalty": 0}, "repetition_penalty"),
                                        ({"logit_bias": {5: 101}}, "logit_bias"),
                                        ({"logit_bias": {-1: 1}}, "logit_bias"),
                                        ({"min_tokens": -1}, "min_tokens"),
                                        ({"min_tokens": 200, "max_new_tokens": 100}, "min_tokens")])
def test_penalty_settings_are_validated(bad, match):
    with pytest.raises(Exception, match=match):
        SamplingParams(temperature=1.0, **bad)
