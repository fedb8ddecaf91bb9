"""The draft a training run starts from: blank (a rank that receives rank 0's weights), or built for the
target with the draft vocabulary of the data's token counts, then warm-started from a saved draft
(``draft.init_from``) or given the target's own LM head rows and final norm (``init_head_from_target``)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import EyasError
from ..models.draft import Eagle3Draft
from ..models.vocab import build_vocab
from .recipe import Recipe
from .warm_start import warm_start


def _target_norm(target):
    for path in ("model.norm", "model.language_model.norm", "transformer.ln_f", "norm"):
        try:
            return target.model.get_submodule(path)
        except AttributeError:
            continue
    return None


def blank_draft(target, recipe: Recipe) -> Eagle3Draft:
    """A draft of ``build_draft``'s shapes with any values, for a rank that receives rank 0's."""
    r = recipe
    size = min(r.draft.vocab_size, target.info.vocab_size)
    return Eagle3Draft(Eagle3Draft.config_for_target(target, size, r.draft.aux_layer_ids)).float()


def build_draft(target, recipe: Recipe, counts: np.ndarray, allow_pickle: bool = False) -> Eagle3Draft:
    r = recipe
    vocab = target.info.vocab_size
    if len(counts) != vocab:
        raise EyasError(f"the data's vocabulary counts cover {len(counts)} ids, the target has {vocab}",
                        "the data was prepared for another target: run `eyas prepare` with this target")
    size = min(r.draft.vocab_size, vocab)
    draft = Eagle3Draft.for_target(target, size, r.draft.aux_layer_ids, seed=r.train.seed).float()
    d2t, t2d = build_vocab(torch.from_numpy(counts), size)
    draft.d2t.copy_(d2t.to(draft.d2t.device))
    draft.t2d.copy_(t2d.to(draft.t2d.device))
    if r.draft.init_from:
        warm_start(draft, r.draft.init_from, target, torch.from_numpy(counts), allow_pickle)
    elif r.draft.init_head_from_target:
        with torch.no_grad():
            head = target.model.get_output_embeddings().weight
            draft.lm_head.weight.copy_(head[t2d.to(head.device)].float())
            norm = _target_norm(target)
            if norm is not None and getattr(norm, "weight", None) is not None:
                draft.norm.weight.copy_(norm.weight.float())
    return draft
