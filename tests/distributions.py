"""Exact distributions of one speculative step, and the chi-square test that compares them with what the
sampler emits (tests/spec/test_device_sampling.py, tests/engine/test_penalties.py).

A step's first ``n`` tokens are enumerated along the tree: at each node the target's distribution; a
token that is a child's continues at that child, any other ends the step (it is the bonus token).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from eyas.spec.tree import Tree

CHAIN = [-1, 0, 1, 2]  # parents: root -> 1 -> 2 -> 3
TREE = [-1, 0, 0, 0, 1, 1, 2, 4]  # root: 3 children; node 1: 2; node 2: 1; node 4: 1


def tree_and_logits(parents: list[int], seed: int, vocab: int) -> tuple[list[int], torch.Tensor]:
    """Tokens (siblings distinct, the likelier ones first as a draft proposes them) and logits [T, vocab]."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(parents), vocab, generator=gen) * 1.6
    tokens = [int(torch.randint(0, vocab, (), generator=gen))]
    for j, p in enumerate(parents[1:], start=1):
        siblings = [tokens[c] for c in range(1, j) if parents[c] == p]
        order = [int(t) for t in logits[p].argsort(descending=True) if int(t) not in siblings]
        tokens.append(order[0] if len(siblings) != 1 else order[2])  # a second child: a less likely token
    return tokens, logits


def step_distribution(parents: list[int], tokens: list[int], node_probs: Callable[[int, tuple], torch.Tensor],
                      n: int = 3) -> dict[tuple, float]:
    """P(the first ``n`` tokens the step emits). ``node_probs(node, prefix)``: the distribution [vocab] the
    step samples from at ``node``, ``prefix`` being the tokens emitted before it."""
    out: dict[tuple, float] = {}

    def walk(node, prefix, mass):
        p = node_probs(node, prefix).double()
        kids = {tokens[c]: c for c in range(len(parents)) if parents[c] == node}
        for a in range(p.shape[-1]):
            if p[a] == 0:
                continue
            seq = prefix + (a,)
            if a in kids and len(seq) < n:
                walk(kids[a], seq, mass * float(p[a]))
            else:
                out[seq] = out.get(seq, 0.0) + mass * float(p[a])

    walk(0, (), 1.0)
    return out


def batch_tree(parents: list[int], tokens: list[int], rows: int) -> tuple[Tree, int, int]:
    """(the tree repeated over ``rows``, its width (depth + 1), the most children of one node)."""
    tree = Tree.from_parents(torch.tensor([tokens] * rows), torch.tensor([parents] * rows))
    most_children = max(sum(1 for p in parents if p == q) for q in range(len(parents)))
    return tree, int(tree.depth.max()) + 1, most_children


def emitted(tree: Tree, cols: torch.Tensor, counts: torch.Tensor, bonus: torch.Tensor, n: int = 3) -> list[tuple]:
    """Each row's first ``n`` emitted tokens: the accepted path below the root, then the bonus token."""
    path = tree.tokens.gather(1, cols)
    return [tuple(path[r, 1:int(counts[r])].tolist() + [int(bonus[r])])[:n] for r in range(len(counts))]


def pvalue(observed: list[tuple], expected: dict[tuple, float]) -> float:
    """Chi-square goodness of fit, pooling cells whose expected count is below 5 (and anything unexpected)."""
    from scipy.stats import chisquare

    total = len(observed)
    counts = Counter(observed)
    big = [key for key, p in expected.items() if p * total >= 5]
    obs = [counts.get(key, 0) for key in big]
    ex = [expected[key] * total for key in big]
    obs.append(total - sum(obs))
    ex.append(total - sum(ex))
    return float(chisquare(obs, ex).pvalue)
