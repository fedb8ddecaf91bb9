"""A sampled step's draws (the torch reference): each node's token, by inverse CDF at a uniform keyed by position.

At a node ``n`` of a verified tree, ``p`` is the target's distribution there in threshold form
(``distribution``: weights ``exp(x_t - m)`` where ``x_t >= thr``). The node draws

    d(n) = the first token whose running weight (in vocabulary order) passes u * (the total weight),
    u = rng.uniform(seed, q, 0)

where ``q`` is the node's position in its sequence: token ``t`` is drawn with probability ``p(t)``. A greedy row
(temperature 0) draws the argmax.

Verification is greedy acceptance with ``d`` in place of the argmax (``verify.accept_greedy_batch``): a node is
accepted when it and its ancestors carry their parents' draws, and the step emits the accepted path and the
draw at its last node. So every emitted token is a draw from ``p`` at its prefix with the uniform of its own
position: the output is exactly the target's distribution, whatever the tree. The draw at a position depends on
the seed, the position and the text before it alone, so a seeded request gives the same tokens under any tree,
with or without speculation, in any batch: ``auto`` may change the tree from step to step without changing the
text. (Rejection sampling keyed its uniforms by (depth, child): there the tree decided which sample a seed gave.)

Acceptance is that of tree rejection sampling with the draft's candidates as point masses (SGLang's
``tree_speculative_sampling_target_only``): a node's children are accepted with probability the sum of their
``p``, and when none is, the emitted token follows ``p`` without them.

``u`` has 23 bits and a half step (``rng.uniform``), so a token is drawn to about 2^-23 of its probability. Where
rounding leaves the target past the last positive weight, that token is taken; a row with no positive weight
draws 0.
"""

from __future__ import annotations

import torch

from ..models import consts
from .rng import uniform


def draw(x: torch.Tensor, m: torch.Tensor, thr: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor,
         position: torch.Tensor) -> torch.Tensor:
    """[N] each row's draw: of ``x`` [N, V] float32 (``distribution``'s, with its ``m`` and ``thr`` [N]) by
    inverse CDF at ``rng.uniform(seed [N], position [N], 0)``; ``greedy`` [N] rows take the argmax of the row (the
    first of equal maxima, as ``torch.argmax``)."""
    v = x.shape[-1]
    w = torch.where(x >= thr[:, None], torch.exp(x - m[:, None]), 0.0)
    cum = w.cumsum(-1)
    u = uniform(seed, position, torch.zeros_like(position))
    pick = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True).clamp(max=v - 1)
    last_positive = ((w > 0) * consts.arange(v, x.device)).argmax(-1, keepdim=True)  # past the end by rounding
    pick = torch.where(w.gather(1, pick) > 0, pick, last_positive)[:, 0]
    return torch.where(greedy, x.argmax(dim=-1), pick)
