"""The batched greedy acceptance agrees with the plain walk, row by row, on many trees."""

import pytest
import torch

from eyas.config import SpecConfig
from eyas.engine.drafter import draft_tree
from eyas.engine.engine import Engine
from eyas.engine.sampling import SamplingParams
from eyas.engine.tree import Tree
from eyas.engine.verify import accept_greedy, accept_greedy_batch


def force_matches(tree: Tree, argmax: torch.Tensor, gen: torch.Generator, share: float) -> torch.Tensor:
    """``argmax`` with a random share of the nodes made correct (the target chooses their token)."""
    argmax = argmax.clone()
    b, t = tree.tokens.shape
    for row in range(b):
        for j in range(1, t):
            if float(torch.rand((), generator=gen)) < share:
                argmax[row, tree.parents[row, j]] = tree.tokens[row, j]
    return argmax


def assert_same_as_walk(tree: Tree, argmax: torch.Tensor, width: int) -> int:
    """Compare both ways for every row; return how many draft tokens were accepted in all."""
    cols, counts, bonus = accept_greedy_batch(tree, argmax, width)
    assert cols.shape == (tree.tokens.shape[0], width)
    accepted = 0
    for row in range(tree.tokens.shape[0]):
        path, b = accept_greedy(tree, argmax[row], row)
        n = int(counts[row])
        assert cols[row, :n].tolist() == path, f"row {row}"
        assert cols[row, n:].eq(0).all() and int(bonus[row]) == b
        accepted += n - 1
    return accepted


def random_tree(gen: torch.Generator, rows: int, size: int, vocab: int) -> Tree:
    """Parents anywhere earlier; every token of a row distinct, so siblings differ as drafted ones do."""
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, j, (), generator=gen)) for j in range(1, size)])
                           for _ in range(rows)])
    tokens = torch.stack([torch.randperm(vocab, generator=gen)[:size] for _ in range(rows)])
    return Tree.from_parents(tokens, parents)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.8, 1.0])
def test_batched_acceptance_matches_the_walk_on_synthetic_trees(share):
    gen = torch.Generator().manual_seed(int(share * 10))
    accepted = 0
    for size in (1, 2, 5, 9, 16):
        tree = random_tree(gen, 7, size, vocab=40)
        argmax = force_matches(tree, torch.randint(0, 40, (7, size), generator=gen), gen, share)
        deepest = int(tree.depth.max()) + 1
        for width in (deepest, deepest + 2):  # the engine's width is static: at least the deepest path
            accepted += assert_same_as_walk(tree, argmax, width)
    assert accepted > 0 or share == 0


@pytest.mark.parametrize("spec", [SpecConfig("EAGLE3", 4, 3, 8), SpecConfig("EAGLE3", 3, 4, 16),
                                  SpecConfig("EAGLE3", 5, 1, 6)],
                         ids=lambda s: f"{s.num_steps}x{s.eagle_topk}-{s.num_draft_tokens}")
def test_batched_acceptance_matches_the_walk_on_drafted_trees(target, draft, spec):
    engine = Engine(target, draft, spec)
    prompts = [[72, 101, 108, 108, 111], [7] * 23, [200, 13], list(range(30, 71))]
    batch = engine.prefill([engine.new_sequence(p, SamplingParams()) for p in prompts])
    gen = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(4):
        tree = draft_tree(draft, batch.draft_cache, batch.lengths, batch.root, batch.draft_logits,
                          batch.draft_hidden, spec, engine.draft_steps)
        for share in (0.0, 0.5, 1.0):
            argmax = force_matches(tree, torch.randint(0, 320, tree.tokens.shape, generator=gen), gen, share)
            accepted += assert_same_as_walk(tree, argmax, spec.num_steps + 1)
        engine.step(batch)
    assert accepted > 0
