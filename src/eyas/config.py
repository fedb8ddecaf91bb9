"""Speculative-decoding settings, named as SGLang names them, validated in one place.

``num_steps``      depth of the draft tree: draft forward passes per verify step.
``eagle_topk``     children expanded per node (1 = a chain).
``num_draft_tokens`` tokens the target verifies per step, *counting the root* (the last token
                   already emitted), so ``num_draft_tokens - 1`` are draft proposals.
``schedule``       optional settings per running batch size (``--speculative-batch-schedule``):
                   ``((1, 6,8,48 settings), (4, ...), (32, no speculation))``; a step with ``B`` rows
                   uses the first entry whose bound is ``>= B`` (the last entry also covers larger
                   batches). It replaces the three settings above, which are then unused.
``adaptive``       ``--speculative-batch-schedule auto``: every step runs whichever of ``AUTO_CANDIDATES``
                   (and no speculation) promises the most tokens per second for its batch size
                   (``engine/adaptive.py``). ``SpecConfig.auto`` builds it; the three settings above are
                   then the largest candidate's, what the caches and metrics are sized for.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum

from .errors import EyasError

# The trees ``--speculative-batch-schedule auto`` chooses among, beside no speculation: (num_steps, eagle_topk,
# num_draft_tokens). Few on purpose: each one needs its own CUDA graphs. A short and a long chain for large
# batches, a small and a large tree for small ones (``eyas tune``'s winners on the H200, issue 30).
AUTO_CANDIDATES = ((3, 1, 4), (5, 1, 6), (4, 4, 16), (6, 8, 32))
AUTO = "auto"


class Algorithm(str, Enum):
    NONE = "NONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"

    @classmethod
    def parse(cls, value: str | Algorithm | None) -> Algorithm:
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
    schedule: tuple[tuple[int, SpecConfig], ...] = ()  # (max rows, settings); NONE settings = no draft
    adaptive: bool = False  # --speculative-batch-schedule auto: the engine's chooser picks among ``options``

    @classmethod
    def auto(cls, algorithm: str | Algorithm = Algorithm.EAGLE3) -> SpecConfig:
        """``--speculative-batch-schedule auto``: the largest candidate's settings, adaptive."""
        return cls(algorithm, *max(AUTO_CANDIDATES, key=lambda c: c[2]), adaptive=True)

    def __post_init__(self):
        object.__setattr__(self, "algorithm", Algorithm.parse(self.algorithm))
        object.__setattr__(self, "schedule", tuple(tuple(e) for e in self.schedule))
        if self.adaptive and (self.schedule or self.algorithm is Algorithm.NONE):
            raise EyasError("--speculative-batch-schedule auto needs speculation and no hand-written schedule"
                            + (", but --speculative-algorithm is NONE" if self.algorithm is Algorithm.NONE else ""),
                            "pass --speculative-algorithm EAGLE3 and a draft for auto, or drop the schedule")
        if self.schedule:
            check_schedule(self)
        elif self.algorithm is not Algorithm.NONE:
            self.check_tree()
        self._keep_hash()

    # settings key the engine's tables, looked up many times a step: the hash is taken once (not pickled: an
    # enum's hash differs between processes)
    def _keep_hash(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._keep_hash()

    def for_batch(self, rows: int) -> SpecConfig:
        """The settings a step over ``rows`` sequences uses (``speculative`` False: the root alone). An
        adaptive one answers with itself: the engine's chooser picks, from the live acceptance."""
        for bound, spec in self.schedule:
            if rows <= bound:
                return spec
        return self.schedule[-1][1] if self.schedule else self

    @property
    def options(self) -> list[SpecConfig]:
        """Every setting a step may use: the schedule's entries, the candidates of auto (no speculation
        first), or this one."""
        if self.adaptive:
            return [SpecConfig(Algorithm.NONE)] + [SpecConfig(self.algorithm, *c) for c in AUTO_CANDIDATES]
        return [spec for _, spec in self.schedule] or [self]

    @property
    def verify_sizes(self) -> list[int]:
        """Tokens per row the target verifies in a step, for each setting (1 without speculation)."""
        return sorted({s.num_draft_tokens if s.speculative else 1 for s in self.options})

    @property
    def path_width(self) -> int:
        """Tokens a step can emit per row: the longest root-to-leaf path plus the bonus token."""
        return min(self.num_steps + 1, self.num_draft_tokens) if self.speculative else 1

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


def parse_schedule(text: str | None, algorithm: str | Algorithm = Algorithm.EAGLE3) -> tuple:
    """``"1:6,8,48;4:4,4,16;32:0"`` -> ``((1, SpecConfig(.., 6, 8, 48)), (4, ..), (32, SpecConfig(NONE)))``."""
    if not text:
        return ()
    if text.strip().lower() == AUTO:
        raise EyasError("--speculative-batch-schedule auto is not a list of entries",
                        "build it with SpecConfig.auto(algorithm) (the flag's value 'auto' does)")
    fix = ("write BOUND:STEPS,TOPK,TOKENS entries (or BOUND:0 for no speculation) separated by ';', "
           "bounds rising, e.g. --speculative-batch-schedule '1:6,8,48;4:4,4,16;16:3,1,4;32:0'")
    out = []
    for entry in text.replace(" ", "").strip(";").split(";"):
        try:
            bound, _, rest = entry.partition(":")
            numbers = [int(x) for x in rest.split(",")]
            if numbers == [0]:
                spec = SpecConfig(Algorithm.NONE)
            elif len(numbers) == 3:
                spec = SpecConfig(algorithm, *numbers)
            else:
                raise ValueError
            out.append((int(bound), spec))
        except EyasError as e:  # a setting check_tree refuses (EyasError is a ValueError: first)
            raise EyasError(f"--speculative-batch-schedule entry {entry!r}: {e.problem}", e.fix) from None
        except ValueError:
            raise EyasError(f"--speculative-batch-schedule entry {entry!r} is not BOUND:STEPS,TOPK,TOKENS "
                            "or BOUND:0", fix) from None
    return tuple(out)


def format_schedule(schedule) -> str:
    """The flag syntax of a schedule (what ``parse_schedule`` reads back), or of a spec's: ``auto`` when adaptive."""
    if isinstance(schedule, SpecConfig):
        if schedule.adaptive:
            return AUTO
        schedule = schedule.schedule
    return ";".join(f"{bound}:{setting_name(s)}" for bound, s in schedule)


def setting_name(spec: SpecConfig) -> str:
    """``"6,8,32"`` (num_steps, eagle_topk, num_draft_tokens), or ``"0"`` without speculation: the schedule's
    spelling of one setting, as logs and ``eyas:spec_active_setting{setting}`` show it."""
    return f"{spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens}" if spec.speculative else "0"


def check_schedule(spec: SpecConfig) -> None:
    fix = "e.g. --speculative-batch-schedule '1:6,8,48;4:4,4,16;16:3,1,4;32:0' (bounds rising, 0 = no draft)"
    if spec.algorithm is Algorithm.NONE:
        raise EyasError("--speculative-batch-schedule needs speculation, but --speculative-algorithm is NONE",
                        "pass --speculative-algorithm EAGLE3 and a draft (--speculative-draft-model-path), "
                        "or drop the schedule")
    bounds = [bound for bound, _ in spec.schedule]
    if any(not isinstance(b, int) or b < 1 for b in bounds):
        raise EyasError(f"--speculative-batch-schedule bounds must be batch sizes of 1 or more, got {bounds}", fix)
    if bounds != sorted(set(bounds)):
        raise EyasError(f"--speculative-batch-schedule bounds {bounds} must rise strictly (each entry covers "
                        "batch sizes up to its bound)", fix)
    if not any(s.speculative for _, s in spec.schedule):
        raise EyasError("--speculative-batch-schedule never speculates (every entry is 0)",
                        "use --speculative-algorithm NONE for plain decoding")
    for bound, s in spec.schedule:
        if s.schedule or (s.speculative and s.algorithm is not spec.algorithm):
            raise EyasError(f"--speculative-batch-schedule entry for {bound} rows must be plain settings of "
                            f"{spec.algorithm.value}", fix)
