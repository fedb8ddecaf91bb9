"""Sampling parameters and the target distribution they define.

A temperature below ``GREEDY_BELOW`` (1e-5, as vLLM and SGLang) is greedy: dividing float32 logits by
a smaller one overflows (6e-39 turns every logit into an infinity and the softmax into NaN), and the
distribution it approaches is the argmax anyway. Otherwise logits are divided by the temperature, then
top-k and top-p (nucleus) filters keep the smallest set of tokens, and the result is renormalised. The
nucleus always keeps the most probable token (as vLLM's), however small ``top_p`` is, so the filter
never leaves an empty distribution. The speculative verifier samples from exactly this distribution,
so speculation is lossless for every setting here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from ..errors import EyasError

GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's and SGLang's _SAMPLING_EPS)


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k filter
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise EyasError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise EyasError(f"temperature must be in [0, 100], got {self.temperature!r}", "use 0 for greedy")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise EyasError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise EyasError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return float(self.temperature) < GREEDY_BELOW

    def generator(self) -> torch.Generator:
        seed = self.seed if self.seed is not None else random.getrandbits(63)
        return torch.Generator().manual_seed(int(seed))


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., vocab]`` logits -> float32 probabilities under ``params``; greedy params: the argmax's point mass."""
    if params.greedy:
        x = logits.float()
        return torch.zeros_like(x).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    x = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    p = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each token
        drop_sorted = before >= params.top_p
        drop_sorted[..., 0] = False  # the most probable token stays, whatever top_p rounds to in float32
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        p = p.masked_fill(drop, 0.0)
        p = p / p.sum(dim=-1, keepdim=True)
    return p


def sample(p: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a 1-D distribution on the CPU, reproducible under ``generator``."""
    return int(torch.multinomial(p.cpu(), 1, generator=generator))
