"""``draft.init_from``: start a run's draft from a saved draft of the same target, or refuse."""

from __future__ import annotations

import torch

from ..errors import EyasError
from ..formats import load_draft
from ..models.draft import Eagle3Draft


def warm_start(draft: Eagle3Draft, path: str, target, allow_pickle: bool = False) -> None:
    """Start ``draft`` from a saved draft of the same target (any format eyas reads, or a shipped
    draft's name): every trainable tensor and the vocabulary maps (``lm_head``'s rows belong to
    them). Anything that does not fit is refused, so a warm start never silently scrambles weights."""
    from ..common.draft_registry import resolve_draft_path

    folder = resolve_draft_path(path)
    src = load_draft(folder, embed_weight=target.embed_tokens.weight.detach().float(),
                     dtype=torch.float32, allow_pickle=allow_pickle)  # raises if built for another vocabulary
    fix = ("start from a draft trained for this target with the same draft.vocab_size and aux layers, "
           "or unset draft.init_from")
    want = draft.aux_layer_ids or target.aux_layer_ids
    have = src.aux_layer_ids or target.aux_layer_ids
    if list(have) != list(want):
        raise EyasError(f"draft.init_from {folder} fuses target layers {list(have)}, "
                        f"this run captures {list(want)}", fix)
    mine, theirs = draft.state_dict(), src.state_dict()
    keys = [k for k, p in draft.named_parameters() if p.requires_grad] + ["d2t", "t2d"]
    bad = [f"{k} {tuple(theirs[k].shape)} vs {tuple(mine[k].shape)}" for k in keys if theirs[k].shape != mine[k].shape]
    if bad:
        raise EyasError(f"draft.init_from {folder} does not fit this run's draft (init vs run): " + "; ".join(bad), fix)
    for name in ("rope_parameters", "rms_norm_eps"):
        a, b = getattr(src.config, name, None), getattr(draft.config, name, None)
        if a != b:
            raise EyasError(f"draft.init_from {folder} has {name} {a!r}, this run's draft {b!r}", fix)
    with torch.no_grad():
        for k in keys:
            mine[k].copy_(theirs[k].to(mine[k].dtype))
