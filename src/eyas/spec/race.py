"""A sampled step's draws by the exponential race (the torch reference): each node's token, keyed by position.

At a node ``n`` of a verified tree, ``p`` is the target's distribution there in threshold form
(``distribution``: ``p(t)`` proportional to ``exp(x_t)`` where ``x_t >= thr``). The node draws

    d(n) = argmax over kept t of  x_t - log(E_t),   E_t = -log(u_t),   u_t = rng.uniform(seed, q, t)

where ``q`` is the node's position in its sequence. The ``E_t`` are independent unit exponentials, so token ``t``
wins with probability ``p(t)`` (the Gumbel-max trick). A greedy row (temperature 0) draws the argmax.

Verification is greedy acceptance with ``d`` in place of the argmax (``verify.accept_greedy_batch``): a node is
accepted when it and its ancestors carry their parents' draws, and the step emits the accepted path and the
draw at its last node. So every emitted token is a draw from ``p`` at its prefix, with noise of its own position:
the output is exactly the target's distribution, whatever the tree. The draw at a position depends on the seed,
the position and the text before it alone, so a seeded request gives the same tokens under any tree, with or
without speculation, in any batch: ``auto`` may change the tree from step to step without changing the text.

Acceptance is that of tree rejection sampling with the draft's candidates as point masses (SGLang's
``tree_speculative_sampling_target_only``): a node's children are accepted with probability the sum of
their ``p``, and when none is, the emitted token follows ``p`` without them.

``u`` has 23 bits and a half step (``rng.uniform_at``): ``-log(E_t)`` is at most about 16.6, so the race
reads the distribution to about 2^-23 per token, as an inverse-CDF draw from a 24-bit uniform would.
"""

from __future__ import annotations

import math

import torch

from ..models import consts
from .rng import key, uniform_at


def race(x: torch.Tensor, thr: torch.Tensor, greedy: torch.Tensor, seed: torch.Tensor,
         position: torch.Tensor) -> torch.Tensor:
    """[N] each row's draw: of ``x`` [N, V] float32 (``distribution``'s) the entries ``>= thr`` [N], raced with
    the noise of ``seed`` [N] at ``position`` [N] (int64); ``greedy`` [N] rows take the argmax of the whole row.
    Ties go to the first index, as ``torch.argmax``; a row of -inf alone draws 0."""
    lanes = consts.arange(x.shape[-1], x.device)
    gumbel = -torch.log(-torch.log(uniform_at(key(seed, position)[:, None], lanes[None])))
    score = torch.where(x >= thr[:, None], x + gumbel, -math.inf)
    return torch.where(greedy, x.argmax(dim=-1), score.argmax(dim=-1))
