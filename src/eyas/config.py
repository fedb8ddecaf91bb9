"""Speculative-decoding settings, named as SGLang names them, validated in one place.

``num_steps``      depth of the draft tree: draft forward passes per verify step.
``eagle_topk``     children expanded per node (1 = a chain).
``num_draft_tokens`` tokens the target verifies per step, *counting the root* (the last token
                   already emitted), so ``num_draft_tokens - 1`` are draft proposals.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import EyasError


class Algorithm(str, Enum):
    NONE = "NONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"

    @classmethod
    def parse(cls, value: "str | Algorithm | None") -> "Algorithm":
        if value is None:
            return cls.NONE
        if isinstance(value, Algorithm):
            return value
        name = str(value).strip().upper().replace("-", "")
        try:
            return cls(name)
        except ValueError:
            raise EyasError(
                f"unknown speculative algorithm {value!r}",
                "use one of NONE, EAGLE, EAGLE3 (EAGLE-3 drafts need EAGLE3)",
            ) from None


@dataclass(frozen=True)
class SpecConfig:
    algorithm: Algorithm = Algorithm.EAGLE3
    num_steps: int = 5
    eagle_topk: int = 1
    num_draft_tokens: int = 6

    def __post_init__(self):
        object.__setattr__(self, "algorithm", Algorithm.parse(self.algorithm))
        if self.algorithm is not Algorithm.NONE:
            self.check_tree()

    @property
    def speculative(self) -> bool:
        return self.algorithm is not Algorithm.NONE

    @property
    def max_tree_tokens(self) -> int:
        """Most draft tokens the dynamic tree can hold: topk at depth 1, topk^2 per deeper step."""
        k = self.eagle_topk
        if k == 1:
            return self.num_steps
        return k + (self.num_steps - 1) * k * k

    def check_tree(self) -> None:
        for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EyasError(
                    f"--speculative-{name.replace('_', '-')} "
                    f"must be a positive integer, got {value!r}",
                    "e.g. --speculative-num-steps 5 --speculative-eagle-topk 1 "
                    "--speculative-num-draft-tokens 6",
                )
        if self.num_draft_tokens < 2:
            raise EyasError(
                f"--speculative-num-draft-tokens {self.num_draft_tokens} leaves no draft token: "
                "it counts the root, so speculation needs at least 2",
                "use num_steps + 1 for a chain (e.g. 6 with 5 steps), or more for a tree",
            )
        if self.num_draft_tokens - 1 > self.max_tree_tokens:
            raise EyasError(
                f"--speculative-num-draft-tokens {self.num_draft_tokens} is larger than the tree "
                f"can hold: with num_steps={self.num_steps} and eagle_topk={self.eagle_topk} the "
                f"drafter proposes at most {self.max_tree_tokens} tokens (+1 root = "
                f"{self.max_tree_tokens + 1})",
                f"lower --speculative-num-draft-tokens to at most {self.max_tree_tokens + 1}, or "
                "raise --speculative-num-steps / --speculative-eagle-topk",
            )
