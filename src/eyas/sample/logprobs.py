"""Log-probabilities of the tokens the engine emits, from the target's distribution as the sampler uses it.

A row asks with ``SamplingParams.logprobs`` = N (0..``MAX_LOGPROBS``): for every token it emits it
then gets that token's log-probability and the N most likely tokens with theirs (``TokenLogprob``).

The distribution is the one the token was drawn from (``sampling.py``): the target's logits at the
token's position, through the penalties and logit bias (``penalties.penalize``), then temperature,
top-k, top-p and min-p (``sampling.distribution``): ``log p(t) = x_t - m - log z`` for a kept token,
-inf for a filtered one. A greedy row (temperature 0) gets the plain ``log_softmax`` of its logits
after penalties and bias (its top-p, top-k and min-p do not apply: it takes the argmax).

Under speculation the j-th token a step emits was accepted at the j-th node of the accepted path
(the bonus token at the path's last node), and the target's logits there are the verify forward's
at that node, which predict the token after the node's prefix: the same logits plain decoding
computes at that position. So the logprobs equal the ones ``Algorithm.NONE`` reports for the same
tokens (up to float rounding). Penalties along the path count the drafted tokens before each node,
as the verifier does (``penalize`` on the path as a chain).

A prompt's logprobs (``SamplingParams.prompt_logprobs`` = N, ``prompt_logprobs``) are of the raw model's
distribution instead: the plain ``log_softmax`` of the target's logits at each prompt position, before
penalties, bias and temperature (what vLLM returns for ``prompt_logprobs`` by default). They come from the
prefill's logits at every position of the prompt (``prefill.prefill_eagerly`` for a group of short prompts,
``prefill.prefill_chunk`` a piece at a time for a long one).

Cost: nothing for a batch where no row asks (``SamplingRows.logprobs`` is None; the engine does not
call this). Otherwise only the asking rows' path logits are gathered, with one top-k on the device,
and the results are copied to the host asynchronously (``to("cpu", non_blocking=True)``: pinned
memory on a GPU) behind the step's own readback of its tokens, so the host waits once, as before.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..spec.ops import TORCH
from .penalties import penalize
from .sampling import FILTERED, PENALIZED, SamplingRows

PROMPT_SLICE = 128  # prompt positions whose log-softmax over the vocabulary is taken at once (``prompt_logprobs``)


class TokenLogprob(NamedTuple):
    """One token's: its log-probability, the most likely tokens ``(id, logprob)``, most likely first, and its
    rank (1: the most likely; the count of tokens at least as likely as it, itself included)."""

    logprob: float
    top: list[tuple[int, float]]
    rank: int = 1


class Pending:
    """Logprobs on their way to the host: valid once the step's readback has waited on the device."""

    def __init__(self, wants: list[int | None], top: int, packed: torch.Tensor):
        # wants: per row of the batch, the alternatives it asks for (None: it does not ask); top: the most of them
        self.wants, self.top, self.packed = wants, top, packed

    def unpack(self, counts: list[int]) -> list[list[TokenLogprob] | None]:
        """Per row of the batch: the entries of its first ``counts[b]`` emitted tokens (None where it did not ask)."""
        data, n = self.packed.tolist(), self.top  # [A, W, 2 + 2N]: logprob, rank, N top logprobs, N top ids
        out, k = [], 0
        for want, count in zip(self.wants, counts):
            if want is None:
                out.append(None)
                continue
            out.append([TokenLogprob(v[0], [(int(v[2 + n + i]), v[2 + i]) for i in range(want)], int(v[1]))
                        for v in data[k][:count]])
            k += 1
        return out

    def row(self) -> list[TokenLogprob]:
        """Every entry of a one-row ``Pending``: a piece of a prompt's (``prompt_logprobs``)."""
        return self.unpack([self.packed.shape[1]])[0]


def log_probs(x: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool, ops=TORCH) -> torch.Tensor:
    """[A, W, V] float32 log-probabilities of the logits ``x`` [A, W, V] (penalised already) under each row's
    settings ``floats`` [A, 3], ``ints`` [A, 2] (``ops.distribution``); greedy rows: the plain log-softmax."""
    a, w, v = x.shape
    greedy = floats[:, 0] <= 0
    temperature, top_p, min_p = floats.unbind(-1)  # a greedy row: no top-p, no min-p, no top-k
    floats = torch.stack([temperature, torch.where(greedy, 1.0, top_p), torch.where(greedy, 0.0, min_p)], dim=-1)
    ints = torch.where(greedy[:, None], 0, ints)
    xs, m, thr, z = ops.distribution(x.reshape(a * w, v), floats[:, None].expand(a, w, 3).reshape(-1, 3),
                                 ints[:, None].expand(a, w, 2).reshape(-1, 2), filtered)
    lp = torch.where(xs >= thr[:, None], xs - (m + torch.log(z))[:, None], -math.inf)
    return lp.view(a, w, v)


def path_logprobs(logits: torch.Tensor, path: torch.Tensor, cols: torch.Tensor, emitted: torch.Tensor,
                  rows: SamplingRows, ops=TORCH) -> Pending:
    """The logprobs of the tokens a step emitted, for the rows that ask (``rows.logprobs``): ``logits``
    [B, T, V] the target's over the tree, ``cols`` [B, W] the accepted path's columns (root first),
    ``path`` [B, W] their tokens, ``emitted`` [B, W] the tokens emitted (token j drawn at node
    ``cols[:, j]``). Call it before the step records its tokens in the penalty counts."""
    asked = rows.logprobs
    r = asked.rows
    x = logits[r[:, None], cols[r]]  # [A, W, V] the path's nodes
    if rows.pen is not None:
        w = cols.shape[1]
        chain = torch.ones((w, w), dtype=torch.bool, device=x.device).tril().expand(len(r), w, w)
        x = penalize(x, path[r], chain, *(t[r] for t in rows.pen.tensors()))
    lp = log_probs(x, rows.floats[r], rows.ints[r], rows.kind in (FILTERED, PENALIZED), ops)
    return Pending(asked.wants, asked.top, packed(lp, emitted[r], asked.top).to("cpu", non_blocking=True))


def packed(lp: torch.Tensor, tokens: torch.Tensor, top: int) -> torch.Tensor:
    """[A, W, 2 + 2N] float64 (``Pending``'s layout): each token of ``tokens`` [A, W] under its log-probabilities
    ``lp`` [A, W, V]: its logprob, its rank, the ``top`` N largest logprobs and their ids (ids < 2**53: exact)."""
    chosen = lp.gather(2, tokens[..., None])
    rank = (lp >= chosen).sum(dim=-1, keepdim=True)
    best = lp.topk(top, dim=-1)
    return torch.cat([chosen.double(), rank.double(), best.values.double(), best.indices.double()], dim=-1)


def prompt_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int, ops=TORCH) -> Pending:
    """The raw model's logprobs of ``tokens`` [W] (a piece of a prompt, each the token after a position) under
    ``logits`` [W, V] (the target's at those positions) and the ``top`` N most likely tokens: the plain
    ``log_softmax``, before penalties, bias and temperature (vLLM's ``prompt_logprobs``). Taken
    ``PROMPT_SLICE`` positions at a time, so a long piece never holds more than that many float32 rows of the
    vocabulary at once; on its way to the host as ``path_logprobs``' are."""
    floats = torch.tensor([[0.0, 1.0, 0.0]], device=logits.device)  # temperature 0: the plain log-softmax
    ints = torch.zeros((1, 2), dtype=torch.long, device=logits.device)
    parts = []
    for s in range(0, logits.shape[0], PROMPT_SLICE):
        lp = log_probs(logits[None, s : s + PROMPT_SLICE], floats, ints, False, ops)  # [1, slice, V]
        parts.append(packed(lp, tokens[None, s : s + PROMPT_SLICE], top))
    return Pending([top], top, torch.cat(parts, dim=1).to("cpu", non_blocking=True))


def first_logprobs(logits: torch.Tensor, firsts: torch.Tensor, rows: SamplingRows, ops=TORCH) -> Pending:
    """``path_logprobs`` of each row's first token ``firsts`` [B], drawn from its prefill logits [B, V]."""
    zeros = torch.zeros_like(firsts)[:, None]
    return path_logprobs(logits[:, None], zeros, zeros, firsts[:, None], rows, ops)
