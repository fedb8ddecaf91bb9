"""``draft.init_from``: start a run's draft from a saved draft of the same target, or refuse."""

from __future__ import annotations

import torch

from ..errors import EyasError
from ..formats import load_draft
from ..models.draft import Eagle3Draft
from ..models.vocab import build_vocab, target_to_draft

VOCABULARY = ("lm_head.weight", "d2t", "t2d")  # the tensors a draft vocabulary of another size reshapes


def warm_start(draft: Eagle3Draft, path: str, target, counts: torch.Tensor, allow_pickle: bool = False) -> None:
    """Start ``draft`` from a saved draft of the same target (any format eyas reads, or a shipped
    draft's name): every trainable tensor and the vocabulary maps (``lm_head``'s rows belong to
    them). Where the saved draft's vocabulary has another size (``draft.vocab_size`` grown, or shrunk), the
    run's keeps the saved one's tokens first (the data's most frequent of them where fewer fit), then the
    data's most frequent others (``counts`` [vocab]); each ``lm_head`` row follows its token, and a token new
    to the draft starts from the target's own output row. Anything else that does not fit is refused, so a
    warm start never silently scrambles weights."""
    from ..common.draft_registry import resolve_draft_path

    folder = resolve_draft_path(path)
    src = load_draft(folder, embed_weight=target.embed_tokens.weight.detach().float(),
                     dtype=torch.float32, allow_pickle=allow_pickle)  # raises if built for another vocabulary
    fix = ("start from a draft trained for this target with the same width and aux layers, "
           "or unset draft.init_from")
    want = draft.aux_layer_ids or target.aux_layer_ids
    have = src.aux_layer_ids or target.aux_layer_ids
    if list(have) != list(want):
        raise EyasError(f"draft.init_from {folder} fuses target layers {list(have)}, "
                        f"this run captures {list(want)}", fix)
    mine, theirs = draft.state_dict(), src.state_dict()
    regrow = src.draft_vocab_size != draft.draft_vocab_size
    keys = [k for k, p in draft.named_parameters() if p.requires_grad] + ["d2t", "t2d"]
    bad = [f"{k} {tuple(theirs[k].shape)} vs {tuple(mine[k].shape)}" for k in keys
           if theirs[k].shape != mine[k].shape and not (regrow and k in VOCABULARY)]
    if bad:
        raise EyasError(f"draft.init_from {folder} does not fit this run's draft (init vs run): " + "; ".join(bad), fix)
    for name in ("rope_parameters", "rms_norm_eps"):
        a, b = getattr(src.config, name, None), getattr(draft.config, name, None)
        if a != b:
            raise EyasError(f"draft.init_from {folder} has {name} {a!r}, this run's draft {b!r}", fix)
    with torch.no_grad():
        for k in keys:
            if not (regrow and k in VOCABULARY):
                mine[k].copy_(theirs[k].to(mine[k].dtype))
        if regrow:
            _regrow(draft, src, target, counts)


def _regrow(draft: Eagle3Draft, src: Eagle3Draft, target, counts: torch.Tensor) -> None:
    """``draft``'s vocabulary of its own size from ``src``'s tokens first, then ``counts``' most frequent
    others; its ``lm_head`` rows from ``src``'s where the token was there, else from the target's output rows."""
    counts = counts.double().cpu()
    kept = src.t2d.cpu()
    d2t, t2d = build_vocab(torch.where(kept, counts + counts.max() + 1, counts), draft.draft_vocab_size)
    ids = d2t + torch.arange(len(d2t))  # the run's draft id -> target id
    head = target.model.get_output_embeddings().weight.detach()
    rows = head[ids.to(head.device)].float().to(draft.lm_head.weight.device)
    old = target_to_draft(kept)[ids]  # the saved draft's id of each, or -1
    there = old >= 0
    rows[there.to(rows.device)] = src.lm_head.weight.float()[old[there].to(src.lm_head.weight.device)].to(rows.device)
    draft.lm_head.weight.copy_(rows)
    draft.d2t.copy_(d2t.to(draft.d2t.device))
    draft.t2d.copy_(t2d.to(draft.t2d.device))
