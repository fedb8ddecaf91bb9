"""``eyas prepare``'s settings, one object: read by ``prepare`` (collection, regeneration, tokens) and by
``selection`` (exclusion, holdout, mix, split)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .regenerate import RegenConfig


@dataclass
class PrepareConfig:
    inputs: list[str] = field(default_factory=list)  # conversation files, folders or globs (``files``)
    sources: list[str] = field(default_factory=list)  # chatterbot, pydoc, self, magpie
    limit: int | None = None  # per source
    self_per_topic: int = 8
    magpie_prompts: int = 2000  # prompts the target is asked to write (source magpie), before dedup
    exclude: list[str] = field(default_factory=list)  # prompt sets (names, files) kept out of the data
    source_weights: str | list | dict = field(default_factory=dict)  # the mix (``mix.parse``)
    max_prompts: int | None = None  # the mix's total
    mix_seed: int = 0
    holdout_prompts: int = 0  # the chat evaluation set (``holdout``)
    holdout_sources: list[str] = field(default_factory=list)  # drawn from these sources (default: all)
    holdout_seed: int = 0
    held_out: float = 0.02
    max_length: int = 2048
    regenerate: bool = False
    keep_answers: bool = False  # with regenerate: keep the given answers beside the target's
    regen: RegenConfig = field(default_factory=RegenConfig)
