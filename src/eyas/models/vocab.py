"""The draft vocabulary: which target tokens the draft can propose, and the id maps.

``d2t`` (int64, ``[draft_vocab]``): ``target_id = draft_id + d2t[draft_id]`` (offsets, as in
SGLang and the EAGLE-3 release). ``t2d`` (bool, ``[vocab]``): which target ids are in the draft
vocabulary. Draft ids are ordered by target id, so both maps are monotone.
"""

from __future__ import annotations

import torch

from ..errors import EyasError


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``draft_vocab_size`` most frequent target tokens -> (d2t, t2d). Ties go to lower ids."""
    vocab = counts.numel()
    if not 0 < draft_vocab_size <= vocab:
        raise EyasError(
            f"draft vocabulary size {draft_vocab_size} must be in 1..{vocab} (the target vocabulary)",
            "choose a smaller --draft-vocab-size",
        )
    # Stable sort on descending counts keeps ties in id order.
    order = torch.sort(-counts.double(), stable=True).indices[:draft_vocab_size]
    target_ids = torch.sort(order).values
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t.long(), t2d


def identity_vocab(vocab: int, draft_vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Maps for a draft vocabulary of the first ``draft_vocab_size`` target ids."""
    n = vocab if draft_vocab_size is None else draft_vocab_size
    return build_vocab(torch.arange(vocab, 0, -1), n)


def draft_to_target(d2t: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    return draft_ids + d2t[draft_ids]


def target_to_draft(t2d: torch.Tensor) -> torch.Tensor:
    """Dense ``[vocab]`` map target id -> draft id (-1 where the draft cannot emit it)."""
    out = torch.full(t2d.shape, -1, dtype=torch.long)
    out[t2d.cpu()] = torch.arange(int(t2d.sum()))
    return out
