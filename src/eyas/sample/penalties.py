"""Repetition, frequency and presence penalties and logit bias, on the device, per row and per tree node.

The definitions are vLLM's (and OpenAI's for the bias), applied to the raw logits in this order:

1. ``logit_bias``: ``x_t += bias_t`` (OpenAI: a token id -> a value in [-100, 100]);
2. ``repetition_penalty`` r (Hugging Face's and vLLM's; 1: off): a token seen in the prompt or the
   output so far has its logit divided by r where positive, multiplied by r elsewhere;
3. ``frequency_penalty`` f and ``presence_penalty`` q (OpenAI's, in [-2, 2]; 0: off):
   ``x_t -= f * count_t + q * (count_t > 0)``, ``count_t`` the times ``t`` is in the output so far;
4. ``min_tokens`` m (vLLM's): while the output so far holds fewer than m tokens, the row's stop tokens
   (its ``stop_token_ids``, and EOS unless ``ignore_eos``) get ``-inf``.

The sampling settings (temperature, top-k, top-p, min-p: ``sampling.distribution``) then act on the
penalised logits, and a greedy row takes their argmax.

Per-row state lives on the device in ``Penalties``: the settings, a dense bias, the prompt's tokens
as a mask and the output's token counts ``[B, V]`` int32, which every step updates from the tokens it
emitted (``record``, inside the step's graph). Under speculation a node's logits predict the token
after it, so the tokens before that token are the output so far plus the node's drafted ancestors
and itself (the root is already in the output): ``penalize`` adds those to the counts (and to the
output's length, for ``min_tokens``) per node, and
the verifier's acceptance at each node then draws from exactly the distribution the target would
have sampled from with that prefix. Speculation stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Penalties:
    """The penalties of a batch's rows on the device; a row without any has the identity settings."""

    floats: torch.Tensor  # [B, 4] float32: presence, frequency, repetition (1: off), min_tokens (0: off)
    bias: torch.Tensor  # [B, V] float32: logit bias
    prompt: torch.Tensor  # [B, V] bool: the token is in the row's prompt
    counts: torch.Tensor  # [B, V] int32: the token's count in the row's output so far
    stops: torch.Tensor  # [B, V] bool: the row's stop tokens, held back until its output has min_tokens

    @classmethod
    def build(cls, params: list, prompts: list[list[int]], vocab: int, device, eos=()) -> Penalties:
        """The rows of ``params`` (``SamplingParams``) with their ``prompts``; ``eos``: the target's EOS ids."""
        b = len(params)
        floats = torch.tensor([[float(p.presence_penalty), float(p.frequency_penalty), float(p.repetition_penalty),
                                float(p.min_tokens)] for p in params], dtype=torch.float32).reshape(b, 4)
        bias = torch.zeros((b, vocab), dtype=torch.float32)
        prompt = torch.zeros((b, vocab), dtype=torch.bool)
        stops = torch.zeros((b, vocab), dtype=torch.bool)
        for r, (p, ids) in enumerate(zip(params, prompts)):
            for token, value in (p.logit_bias or {}).items():
                bias[r, int(token)] = float(value)
            if float(p.repetition_penalty) != 1.0:
                prompt[r, torch.tensor(ids, dtype=torch.long)] = True
            if p.min_tokens:
                stops[r, [t for t in p.stop_ids(eos) if t < vocab]] = True
        counts = torch.zeros((b, vocab), dtype=torch.int32)
        return cls(floats.to(device), bias.to(device), prompt.to(device), counts.to(device), stops.to(device))

    @classmethod
    def identity(cls, rows: int, vocab: int, device) -> Penalties:
        """``rows`` rows without penalties (joining a batch where others have them)."""
        floats = torch.tensor([[0.0, 0.0, 1.0, 0.0]], device=device).expand(rows, 4).contiguous()
        bools = torch.zeros((rows, vocab), dtype=torch.bool, device=device)
        return cls(floats, torch.zeros((rows, vocab), device=device), bools,
                   torch.zeros((rows, vocab), dtype=torch.int32, device=device), bools.clone())

    def select(self, rows: torch.Tensor) -> Penalties:
        return Penalties(*(t[rows] for t in self.tensors()))

    def concat(self, other: Penalties) -> Penalties:
        return Penalties(*(torch.cat([a, b]) for a, b in zip(self.tensors(), other.tensors())))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """(floats, bias, prompt, counts, stops): ``penalize``'s arguments after the tree, in order."""
        return self.floats, self.bias, self.prompt, self.counts, self.stops


def record(counts: torch.Tensor, tokens: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``counts`` [B, V] plus the first ``n[b]`` tokens of ``tokens`` [B, W] of each row (what a step
    emitted): a new tensor, so a captured step returns it as an output."""
    w = tokens.shape[1]
    emitted = (torch.arange(w, device=tokens.device)[None, :] < n[:, None]).to(counts.dtype)
    return counts.scatter_add(1, tokens, emitted)


def penalize(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, floats: torch.Tensor,
             bias: torch.Tensor, prompt: torch.Tensor, counts: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
    """float32 ``[B, T, V]``: the logits [B, T, V] over a tree (``tokens`` [B, T], ancestor-or-self
    ``mask`` [B, T, T], column 0 the root) penalised at each node as the module's doc says, with the
    node's own drafted ancestors and itself counted as output. A root-only tree (plain decoding, the
    prefill's first token) counts the output alone."""
    b, t, v = logits.shape
    x = logits.float() + bias[:, None]
    c = counts[:, None].expand(b, t, v)
    depth = torch.zeros((b, t), dtype=counts.dtype, device=logits.device)  # drafted tokens on the path to a node
    if t > 1:  # the drafted tokens on the path to each node (the root, column 0, is already counted)
        drafted = mask.clone()
        drafted[:, :, 0] = False
        c = c + torch.zeros((b, t, v), dtype=counts.dtype, device=logits.device).scatter_add_(
            2, tokens[:, None, :].expand(b, t, t), drafted.to(counts.dtype))
        depth = drafted.sum(-1, dtype=counts.dtype)
    presence, frequency, repetition, min_tokens = floats.unbind(-1)
    r = torch.where(repetition > 0, repetition, 1.0)[:, None, None]  # a bucket's zero padding: off
    out = c > 0
    x = torch.where(out | prompt[:, None], torch.where(x > 0, x / r, x * r), x)
    x = x - frequency[:, None, None] * c - presence[:, None, None] * out
    short = (counts.sum(-1, dtype=counts.dtype)[:, None] + depth) < min_tokens[:, None]  # [B, T]: stops held back
    return x.masked_fill(short[:, :, None] & stops[:, None], -torch.inf)
