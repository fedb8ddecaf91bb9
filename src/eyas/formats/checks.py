"""Whether a draft folder's tensors are an EAGLE-3 draft eyas can run, with a message naming what is wrong.

``check_official_shapes``: a ``LlamaForCausalLM`` folder is an official EAGLE-3 release only if its
``fc`` fuses three target states (and not two: EAGLE-1/2). ``check_state``: every tensor the draft
needs is there and ``fc`` / ``lm_head`` agree with the config. ``check_fits``: no tensor more and
every shape the one eyas's draft built from the config has. Tensors are named as the folder's
format spells them (``names.shown``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig

from ..errors import EyasError
from .names import LOOKS_LIKE, OFFICIAL, OFFICIAL_ARCHITECTURE, REQUIRED, shown

SERVABLE_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_layer_ids(path: Path, looks: str, key: str, ids) -> None:
    """A captured-layer list as a config writes it: a non-empty list of distinct whole numbers."""
    fine = (isinstance(ids, list) and ids and len(set(ids)) == len(ids)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in ids))
    if not fine:
        raise EyasError(f"{path} looks like {looks}, but its {key} is {ids!r}; it must list the captured target "
                        "layers as distinct whole numbers (three for EAGLE-3, e.g. [1, 15, 27] in SGLang indexing)",
                        "restore the draft's config.json, or re-export the draft with eyas export")


def check_official_shapes(path: Path, data: dict, shapes: dict) -> None:
    """A LlamaForCausalLM folder is an EAGLE-3 draft only if its fc fuses 3 target states."""
    hidden = int(data.get("hidden_size") or 0)
    target_hidden = int(data.get("target_hidden_size") or hidden)
    if "fc.weight" not in shapes:
        layered = any(k.startswith("layers.") for k in shapes)
        raise EyasError(
            f"{path}: config.json says {OFFICIAL_ARCHITECTURE} and there is no fc.weight"
            + (" but full decoder layers: this is a plain Llama model, not a draft" if layered else "")
            + "; an official EAGLE-3 draft has fc.weight of width 3 x hidden and midlayer.* tensors",
            "pass an EAGLE-3 draft folder as the draft (the target goes in --model-path)",
        )
    if len(shapes["fc.weight"]) != 2:
        raise EyasError(f"{path} looks like {LOOKS_LIKE[OFFICIAL]}, but fc.weight has shape {shapes['fc.weight']}, "
                        "not a matrix", "download the draft again")
    out_dim, in_dim = shapes["fc.weight"]
    if in_dim == 2 * target_hidden:
        raise EyasError(
            f"{path}: fc.weight is {in_dim} = 2 x hidden {target_hidden} wide, cat(embed, hidden): this is an "
            "EAGLE-1/2 draft, not EAGLE-3 (whose fc fuses 3 captured target states, 3 x hidden)",
            "serve it with SGLang --speculative-algorithm EAGLE, or train an EAGLE-3 draft with eyas train",
        )
    if in_dim != 3 * target_hidden or out_dim != hidden:
        raise EyasError(
            f"{path} looks like {LOOKS_LIKE[OFFICIAL]}, but fc.weight is {out_dim} x {in_dim}; with hidden_size "
            f"{hidden} and target_hidden_size {target_hidden} it must be {hidden} x {3 * target_hidden}",
            "the weights and config.json do not belong together; download the draft again",
        )



def check_state(path: Path, fmt: str, config: LlamaConfig, state: dict) -> None:
    check_dtypes(path, fmt, state)  # a quantised folder first: its names and values are not a draft's
    looks = LOOKS_LIKE[fmt]
    missing = [n for n in REQUIRED if n not in state]
    vocab, draft_vocab = int(config.vocab_size), int(config.draft_vocab_size)
    if draft_vocab != vocab and "d2t" not in state:
        missing.append("d2t")
    if missing:
        absent = ", ".join(shown(fmt, n) for n in missing)
        extra = (f" (its draft vocabulary of {draft_vocab} tokens is smaller than the target's {vocab}, so d2t, "
                 "the draft-to-target id map, is required)") if "d2t" in missing else ""
        raise EyasError(f"{path} looks like {looks} but is missing {absent}{extra}",
                        "download or export the draft again; a complete folder has all of "
                        + ", ".join(shown(fmt, n) for n in (*REQUIRED, "d2t")))
    hidden = int(config.hidden_size)
    target_hidden = int(getattr(config, "target_hidden_size", None) or hidden)
    ids = (getattr(config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    n_aux = len(ids) if ids is not None else 3
    fc = tuple(state["fc.weight"].shape)
    if fc != (hidden, n_aux * target_hidden):
        raise EyasError(
            f"{path} looks like {looks}, but fc.weight is {' x '.join(map(str, fc)) or 'a scalar'}; "
            f"it must fuse {n_aux} captured "
            f"layers x target_hidden_size {target_hidden} = {n_aux * target_hidden} into hidden {hidden}"
            + (" (2 x hidden: an EAGLE-1/2 draft)" if fc[-1] == 2 * target_hidden else ""),
            "the weights and config.json do not belong together; re-export the draft from its source",
        )
    check_finite(path, fmt, state)
    lm_head = tuple(state["lm_head.weight"].shape)
    if lm_head != (draft_vocab, hidden):
        raise EyasError(f"{path} looks like {looks}, but lm_head.weight is {lm_head}, its config implies "
                        f"({draft_vocab}, {hidden}) = (draft_vocab_size, hidden_size)",
                        "the weights and config.json do not belong together")


QUANT_SUFFIXES = ("_scale", "_scale_inv", "_zero_point", ".qweight", ".scales", ".qzeros", ".g_idx")


def check_dtypes(path: Path, fmt: str, state: dict) -> None:
    """Refuse a quantised draft before any arithmetic on its tensors: FP8 (or other low-precision) weights, with or
    without their scale tensors. Without the scales the stored values are not the weights and cannot be upcast to
    them; with them, it is a quantised checkpoint, which eyas does not run."""

    looks = LOOKS_LIKE[fmt]
    fix = ("export the draft unquantised in bfloat16, float16 or float32 (from the checkpoint it was quantised "
           "from; eyas export writes such a folder)")
    scales = sorted(k for k in state if k.endswith(QUANT_SUFFIXES))
    low = sorted((k, str(t.dtype).replace("torch.", "")) for k, t in state.items()
                 if torch.is_tensor(t) and t.is_floating_point() and t.dtype not in SERVABLE_FLOATS)
    if scales:
        shown_low = f"; {shown(fmt, low[0][0])} is stored as {low[0][1]}" if low else ""
        raise EyasError(f"{path} looks like {looks}, but it is a quantised checkpoint: it holds quantisation "
                        f"tensors ({', '.join(shown(fmt, k) for k in scales[:4])}{', ...' if len(scales) > 4 else ''})"
                        f"{shown_low}; eyas runs drafts with plain bfloat16, float16 or float32 weights", fix)
    if low:
        name, kind = low[0]
        more = f" (and {len(low) - 1} more tensor(s))" if len(low) > 1 else ""
        raise EyasError(f"{path} looks like {looks}, but {shown(fmt, name)} is stored as {kind}{more}, with no scale "
                        "tensors: an FP8 weight without its scales is not the trained weight, and upcasting it "
                        "would give a draft that proposes garbage; eyas expects bfloat16, float16 or float32", fix)


def check_finite(path: Path, fmt: str, state: dict) -> None:
    """No NaN or infinite weight: a draft with one proposes garbage and is rejected every step, silently."""
    for name, t in state.items():
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        flat = t.reshape(-1)
        for part in flat.split(1 << 24):  # a bounded temporary, also for a shipped 160k x 7168 embedding
            if not bool(torch.isfinite(part).all()):
                bad = int((~torch.isfinite(flat)).sum())
                raise EyasError(f"{path} looks like {LOOKS_LIKE[fmt]}, but {shown(fmt, name)} holds {bad} NaN or "
                                "infinite values: every proposal would be rejected (accept length 1.00)",
                                "export the draft again from a healthy checkpoint (a diverged training run or a "
                                "broken conversion writes such values)")


def check_d2t(path: Path, fmt: str, d2t, draft_vocab: int, vocab: int) -> None:
    """``d2t`` as ``target id = draft id + d2t[draft id]`` can use it: one offset per draft id, inside the target."""
    looks = LOOKS_LIKE[fmt]
    fix = "rebuild the draft vocabulary maps (eyas train builds d2t/t2d together) or export the draft again"
    if tuple(d2t.shape) != (draft_vocab,):
        raise EyasError(f"{path} looks like {looks}, but d2t has shape {tuple(d2t.shape)}, its config implies "
                        f"({draft_vocab},) = draft_vocab_size", fix)
    ids = d2t.long() + torch.arange(draft_vocab)
    if draft_vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise EyasError(f"{path} looks like {looks}, but its d2t maps draft ids to target ids "
                        f"{int(ids.min())}..{int(ids.max())}, outside the target vocabulary 0..{vocab - 1}", fix)


def check_maps(path: Path, fmt: str, config: LlamaConfig, state: dict) -> None:
    """The vocabulary maps as serving checks them (``eyas.checks.check_vocab_maps``, the one check: shapes, range,
    one-to-one, t2d agreeing), so export and ``draft.init_from`` refuse what ``eyas serve`` and the doctor refuse.
    A folder without t2d (SGLang's) is checked with the t2d the loaders rebuild from d2t."""
    from ..checks import check_vocab_maps

    if "d2t" not in state:
        return  # the full vocabulary: the identity maps
    d2t, t2d = state["d2t"], state.get("t2d")
    draft_vocab, vocab = int(config.draft_vocab_size), int(config.vocab_size)
    if t2d is None:
        check_d2t(path, fmt, d2t, draft_vocab, vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[d2t.long() + torch.arange(draft_vocab)] = True
    try:
        check_vocab_maps(d2t, t2d, draft_vocab, vocab)
    except EyasError as e:
        raise EyasError(f"{path} looks like {LOOKS_LIKE[fmt]}, but its vocabulary maps are broken: {e.problem}",
                        e.fix) from None


def check_fits(path: Path, fmt: str, state: dict, expected: dict) -> None:
    """``state`` against ``expected``, the tensors of eyas's draft built from its config (on ``meta``): no tensor
    more, and each one present of the shape and kind (floating point or integer ids) the draft has. ``read_draft``
    checks the tensors a folder holds; ``build_draft`` the state completed for loading."""
    looks = LOOKS_LIKE[fmt]
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise EyasError(f"{path} looks like {looks} but holds tensors eyas's draft does not have: "
                        f"{', '.join(shown(fmt, k) for k in unexpected)}",
                        "this is a variant of EAGLE-3 eyas cannot run (e.g. extra layers or biases)")
    for k, want in expected.items():
        if k not in state:
            continue
        have = state[k]
        if tuple(have.shape) != tuple(want.shape):
            raise EyasError(f"{path} looks like {looks}, but {shown(fmt, k)} has shape "
                            f"{tuple(have.shape)}, its config implies {tuple(want.shape)}",
                            "the weights and config.json do not belong together")
        kind = str(have.dtype).replace("torch.", "")
        if want.is_floating_point() and not have.is_floating_point():
            raise EyasError(f"{path} looks like {looks}, but {shown(fmt, k)} is stored as {kind}, where a "
                            "floating-point weight was expected: loading would cast the integers (a quantised "
                            "export) to floats, and the draft would propose garbage, silently",
                            "export the draft unquantised (bfloat16, float16 or float32)")
        if not want.is_floating_point() and have.is_floating_point():
            raise EyasError(f"{path} looks like {looks}, but {shown(fmt, k)} is stored as {kind}; it holds token "
                            "ids or offsets, whole numbers, and floats would be truncated to other tokens",
                            "rebuild the draft vocabulary maps (eyas train builds d2t/t2d together) or export the "
                            "draft again")
