"""The batched greedy acceptance agrees with the plain walk, row by row, on many trees."""

import pytest
import torch

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.sampling import SamplingParams
from eyas.spec.drafter import draft_tree
from eyas.spec.tree import Tree
from eyas.spec.verify import accept_greedy, accept_greedy_batch


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


@pytest.mark.parametrize("size", [1, 2, 9, 48])
def test_tree_mask_and_depth_match_a_walk_up_the_parents(size):
    """``from_parents`` takes the ancestor closure by squaring; a plain walk is the reference, with
    the depth bound given (as the drafter does, exact) and without it."""
    gen = torch.Generator().manual_seed(size)
    rows = 5
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(max(0, j - 3), j, (), generator=gen))
                                                for j in range(1, size)]) for _ in range(rows)])
    tokens = torch.arange(rows * size).view(rows, size)
    want_mask = torch.zeros(rows, size, size, dtype=torch.bool)
    want_depth = torch.zeros(rows, size, dtype=torch.long)
    for r in range(rows):
        for j in range(size):
            node = j
            while node >= 0:
                want_mask[r, j, node] = True
                node = int(parents[r, node])
            want_depth[r, j] = int(want_mask[r, j].sum()) - 1
    for bound in (int(want_depth.max()), None):
        tree = Tree.from_parents(tokens, parents, max_depth=bound)
        assert torch.equal(tree.mask, want_mask) and torch.equal(tree.depth, want_depth)


def test_two_stage_topk_is_topk():
    from eyas.spec.tree_ops import topk

    gen = torch.Generator().manual_seed(0)
    for x in (torch.randn(3, 8, 16384, generator=gen), torch.randn(64, 8, 16384, generator=gen),
              torch.randint(0, 4, (2, 4096), generator=gen).float(),
              torch.randn(5, 300, generator=gen)):
        for k in (1, 2, 8):
            values, ids = topk(x, k)
            assert torch.equal(values, x.topk(k, dim=-1).values)
            assert torch.equal(x.gather(-1, ids), values)


def test_a_certain_draft_still_keeps_every_parent():
    """When the draft is certain, log-probabilities tie at 0 down every path; the selection must
    still take parents before children (the CPU path raises if a chosen node lost its parent)."""
    from eyas.spec.drafter import _grow

    class Certain:
        d2t = torch.zeros(64, dtype=torch.long)

    def feed(step, tokens, hidden, parent, mask):
        logits = torch.full(tokens.shape + (64,), -1e4)
        logits[..., 3] = 1e4  # log_softmax: exactly 0 for token 3, -2e4 for the rest
        logits[..., 5] = 1e4 - 1e-3
        return hidden, logits

    for k, steps, total in ((2, 4, 9), (4, 3, 12), (1, 5, 6)):
        logits0 = torch.zeros(2, 64)
        logits0[:, 3] = 1e4
        tree = _grow(Certain, torch.tensor([1, 2]), logits0, torch.zeros(2, 8),
                     SpecConfig("EAGLE3", steps, k, total), feed)
        assert (tree.parents[:, 1:] >= 0).all() and (tree.parents[:, 1:] < torch.arange(1, total)).all()
        assert int(tree.depth.max()) == steps  # the certain path is drafted to the end


def test_ranking_puts_every_parent_strictly_above_its_children():
    """What keeps parents in the tree whatever order ``topk`` gives ties: a child (score <= its
    parent's) always ranks strictly lower, at 0, at float32's coarse magnitudes, for every depth."""
    from eyas.spec.drafter import _deeper

    parent = torch.tensor([0.0, -1e-30, -1e-8, -0.3, -7.0, -19.99, -80.5, -1e4])
    for depth in range(12):
        for child in (parent, parent - 1e-7, parent * (1 + 2.0 ** -23)):
            assert (_deeper(parent, depth) > _deeper(child.float(), depth + 1)).all(), depth
