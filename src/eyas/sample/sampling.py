"""Sampling parameters, the batch's per-row sampling tensors, and the target distribution they define.

A temperature below ``GREEDY_BELOW`` (1e-5, as vLLM and SGLang) is greedy: dividing float32 logits by
a smaller one overflows (6e-39 turns every logit into an infinity and the softmax into NaN), and the
distribution it approaches is the argmax anyway.

Otherwise the distribution is defined in threshold form, in SGLang's order: ``x = logits /
temperature``, then top-k, top-p (nucleus, on the top-k-renormalised distribution) and min-p, each a
per-row threshold on ``x``, and ``p(t) = exp(x_t - m) / Z`` where ``x_t >= thr`` (0 elsewhere), with
``m`` the largest ``x``, ``thr`` the largest of the three thresholds and ``Z`` the sum over the kept
tokens:

- top-k keeps ``x >= `` the k-th largest value (ties with it kept);
- top-p keeps the smallest prefix of the sorted distribution whose mass *before* each token is below
  ``top_p``, i.e. ``x >= `` the value of its last entry (ties kept); the most probable token is always
  kept, however small ``top_p`` is, so the filter never leaves an empty distribution;
- min-p keeps ``p >= min_p * p_max``, i.e. ``x >= m + log(min_p)``.

Penalties and logit bias (``penalties.py``) act on the logits before all of this, so ``x`` above is
the penalised logits over temperature; a greedy row with penalties takes the penalised argmax.

``distribution`` (``spec.distribution``) computes it for many rows at once on the device (the sort
only where a row uses top-k or top-p): the reference, and ``ops.distribution`` on the CPU; on a GPU
that op is a Triton kernel with no sort (``spec.distribution_kernel``). ``probs`` is the same
definition for one ``SamplingParams``, the reference the tests enumerate. The speculative verifier
samples from exactly this distribution (``sampler.py``), so speculation is lossless for every setting here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..errors import EyasError
from ..spec.distribution import distribution
from .grammar import GrammarSpec
from .penalties import Penalties

GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's and SGLang's _SAMPLING_EPS)
GREEDY, SAMPLED, FILTERED = "greedy", "sampled", "filtered"  # what a batch needs: argmax, no sort, a sort
PENALIZED = "penalized"  # some row has penalties or a logit bias: those first, then as FILTERED
KINDS = (GREEDY, SAMPLED, FILTERED, PENALIZED)  # each needs what the ones before it need
MAX_LOGPROBS = 20  # the most alternatives a token's logprobs may list (vLLM's default --max-logprobs)


@dataclass
class SamplingParams:
    max_new_tokens: int = 128  # 0: the prompt alone, no token emitted (for its ``prompt_logprobs``)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k filter
    min_p: float = 0.0  # 0: no min-p filter
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0: off
    frequency_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0: off
    repetition_penalty: float = 1.0  # vLLM's and Hugging Face's, > 0; 1: off
    logit_bias: dict[int, float] = field(default_factory=dict)  # OpenAI's: token id -> [-100, 100]
    grammar: GrammarSpec | None = None  # structured output: the output is constrained to it (``grammar.py``)
    logprobs: int | None = None  # per emitted token its log-probability and this many alternatives; None: off
    min_tokens: int = 0  # vLLM's: no stop token (stop_token_ids, EOS) nor stop string before this many tokens
    # per prompt token (the first has none) its raw log-probability and this many alternatives; None: off
    prompt_logprobs: int | None = None

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise EyasError(f"max_new_tokens must be an integer >= 0 (0: the prompt alone), got "
                            f"{self.max_new_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 100.0:
            raise EyasError(f"temperature must be in [0, 100], got {self.temperature!r}", "use 0 for greedy")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise EyasError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise EyasError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}")
        if not 0.0 <= float(self.min_p) <= 1.0:
            raise EyasError(f"min_p must be in [0, 1], got {self.min_p!r}", "use 0 for no min-p filter")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= float(getattr(self, name)) <= 2.0:
                raise EyasError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}", "use 0 for no penalty")
        if not float(self.repetition_penalty) > 0.0 or not math.isfinite(float(self.repetition_penalty)):
            raise EyasError(f"repetition_penalty must be a positive number, got {self.repetition_penalty!r}",
                            "use 1 for no penalty; above 1 discourages repeats")
        for token, value in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise EyasError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not -100.0 <= float(value) <= 100.0:
                raise EyasError(f"logit_bias values must be in [-100, 100], got {value!r} for token {token}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise EyasError(f"min_tokens must be an integer from 0 to the output's maximum length "
                            f"({self.max_new_tokens}), got {self.min_tokens!r}",
                            "lower min_tokens, or raise the maximum (max_tokens; /generate: max_new_tokens)")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not (isinstance(n, int) and 0 <= n <= MAX_LOGPROBS):
                raise EyasError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {n!r}",
                                f"ask for at most {MAX_LOGPROBS} alternatives per token (vLLM's cap), or None for none")

    @property
    def greedy(self) -> bool:
        return float(self.temperature) < GREEDY_BELOW

    @property
    def filtered(self) -> bool:
        """Top-k or top-p is on (its threshold needs a sort of the vocabulary)."""
        return not self.greedy and (self.top_k > 0 or float(self.top_p) < 1.0)

    def stop_ids(self, eos) -> frozenset[int]:
        """The tokens that end this row: its ``stop_token_ids``, and the target's ``eos`` unless ``ignore_eos``."""
        return frozenset(self.stop_token_ids) | frozenset(() if self.ignore_eos else eos)

    @property
    def penalized(self) -> bool:
        """A penalty, a logit bias or a minimum length is on (the batch then keeps per-row token counts on the
        device)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or any(self.logit_bias.values()) or self.min_tokens)


@dataclass
class SamplingRows:
    """The sampling settings of a batch's rows, on the device, built when the batch's membership
    changes (prefill, merge, filter), never per step. Two packed tensors, so a graph replay copies
    them in two launches; a batch where some row has penalties also carries ``pen`` (``Penalties``:
    its output token counts, updated every step)."""

    floats: torch.Tensor  # [B, 3] float32: temperature (0: greedy), top_p, min_p
    ints: torch.Tensor  # [B, 2] int64: top_k (0: off), seed
    kind: str = GREEDY  # GREEDY (every row), SAMPLED (none filters), FILTERED or PENALIZED: the code it needs
    pen: Penalties | None = None  # with PENALIZED only
    logprobs: Asked | None = None  # the rows that ask for logprobs; None: no row does (the step pays nothing)

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int], device, prompts: list[list[int]] | None = None,
              vocab: int = 0, eos=()) -> SamplingRows:
        """The rows' settings; ``prompts``, ``vocab`` (the logits' width) and ``eos`` (the target's EOS ids) are
        needed when a row is ``penalized``."""
        floats = [[0.0 if p.greedy else float(p.temperature), float(p.top_p), float(p.min_p)] for p in params]
        ints = [[max(p.top_k, 0), s] for p, s in zip(params, seeds)]
        kind = _kind(params)
        pen = Penalties.build(params, prompts, vocab, device, eos) if kind == PENALIZED else None
        return cls(torch.tensor(floats, dtype=torch.float32).reshape(-1, 3).to(device),
                   torch.tensor(ints, dtype=torch.long).reshape(-1, 2).to(device), kind, pen,
                   Asked.of([p.logprobs for p in params], device))

    @property
    def temperature(self) -> torch.Tensor:  # [B]
        return self.floats[:, 0]

    @property
    def top_p(self) -> torch.Tensor:  # [B]
        return self.floats[:, 1]

    @property
    def min_p(self) -> torch.Tensor:  # [B]
        return self.floats[:, 2]

    @property
    def top_k(self) -> torch.Tensor:  # [B]
        return self.ints[:, 0]

    @property
    def seed(self) -> torch.Tensor:  # [B]
        return self.ints[:, 1]

    def select(self, rows: torch.Tensor, params: list[SamplingParams]) -> SamplingRows:
        """The rows ``rows`` (whose params are ``params``): ``Engine.filter``."""
        kind = _kind(params)
        pen = self.pen.select(rows) if kind == PENALIZED else None
        return SamplingRows(self.floats[rows], self.ints[rows], kind, pen,
                            Asked.of([p.logprobs for p in params], self.floats.device))

    def concat(self, other: SamplingRows) -> SamplingRows:
        kind = max(self.kind, other.kind, key=KINDS.index)
        pen = None
        if kind == PENALIZED:
            vocab = (self.pen or other.pen).bias.shape[1]
            pen = (self._pen_or_identity(vocab)).concat(other._pen_or_identity(vocab))
        return SamplingRows(torch.cat([self.floats, other.floats]), torch.cat([self.ints, other.ints]), kind, pen,
                            Asked.of(Asked.wants_of(self) + Asked.wants_of(other), self.floats.device))

    def _pen_or_identity(self, vocab: int) -> Penalties:
        return self.pen if self.pen is not None else Penalties.identity(len(self.floats), vocab, self.floats.device)

    def pen_tensors(self) -> tuple[torch.Tensor, ...] | None:
        """``pen``'s tensors (``Penalties.tensors``), as ``sampler.accept`` takes them; None without."""
        return None if self.pen is None else self.pen.tensors()


@dataclass
class Asked:
    """The rows of a batch that ask for logprobs (``sample/logprobs.py``), kept with ``SamplingRows``."""

    wants: list[int | None]  # per row of the batch: the alternatives it asks for (0..MAX_LOGPROBS), None: none
    rows: torch.Tensor  # [A] long, on the device: the rows that ask
    top: int  # the most alternatives any of them asks for

    @classmethod
    def of(cls, wants: list[int | None], device) -> Asked | None:
        index = [i for i, w in enumerate(wants) if w is not None]
        if not index:
            return None
        return cls(list(wants), torch.tensor(index, dtype=torch.long, device=device), max(wants[i] for i in index))

    @staticmethod
    def wants_of(rows: SamplingRows) -> list[int | None]:
        return rows.logprobs.wants if rows.logprobs is not None else [None] * len(rows.floats)


def _kind(params: list[SamplingParams]) -> str:
    if any(p.penalized for p in params):
        return PENALIZED
    return FILTERED if any(p.filtered for p in params) else GREEDY if all(p.greedy for p in params) else SAMPLED


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., vocab]`` logits -> float32 probabilities under ``params``; greedy params: the argmax's point mass.
    Penalties and bias are not applied here: pass logits already through ``penalties.penalize``."""
    if params.greedy:
        x = logits.float()
        return torch.zeros_like(x).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    flat = logits.reshape(-1, logits.shape[-1])
    n = flat.shape[0]
    floats = torch.tensor([[float(params.temperature), float(params.top_p), float(params.min_p)]],
                          device=logits.device).expand(n, 3)
    ints = torch.tensor([[max(params.top_k, 0), 0]], device=logits.device).expand(n, 2)
    x, m, thr, z = distribution(flat, floats, ints, params.filtered)
    p = torch.exp(x - m[:, None]) * (x >= thr[:, None]) / z[:, None]
    return p.reshape(logits.shape)
