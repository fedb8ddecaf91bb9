"""Refuse, before any generation, every target/draft/algorithm combination that would fail silently.

Each check raises ``EyasError`` naming the fix. ``eyas serve`` runs them before binding its port;
the engine runs them when it is built, so no code path generates with an unchecked pair.
"""

from __future__ import annotations

import torch

from .config import Algorithm, SpecConfig
from .errors import EyasError
from .layers import check_aux_layers, check_trained_depth


def draft_kind(fc_in: int | None, target_hidden: int, num_aux: int, architecture: str = "") -> str:
    """'eagle3' when fc fuses n_aux target states, 'eagle' when it fuses cat(embed, hidden), else 'none'."""
    if fc_in is None:
        return "none"
    if "eagle3" in architecture.lower():
        return "eagle3"
    if num_aux > 1 and fc_in == num_aux * target_hidden:
        return "eagle3"
    if fc_in == 2 * target_hidden:
        return "eagle"
    return "eagle3" if fc_in % target_hidden == 0 and fc_in // target_hidden >= 3 else "unknown"


def check_algorithm(
    algorithm: Algorithm, draft_path, fc_in: int | None, target_hidden: int, num_aux: int, architecture: str = ""
) -> None:
    if algorithm is Algorithm.NONE:
        if draft_path:
            raise EyasError(
                f"a draft model ({draft_path}) was given but --speculative-algorithm is NONE, so it would "
                "never be used",
                "pass --speculative-algorithm EAGLE3 to speculate with it, or drop the draft path",
            )
        return
    if not draft_path:
        raise EyasError(
            f"--speculative-algorithm {algorithm.value} needs a draft model, and none was given "
            "(eyas never uses the target as its own draft)",
            "pass --speculative-draft-model-path PATH, or --speculative-algorithm NONE to serve without speculation",
        )
    kind = draft_kind(fc_in, target_hidden, num_aux, architecture)
    if algorithm is Algorithm.EAGLE and kind == "eagle3":
        raise EyasError(
            f"the draft is an EAGLE-3 draft (its fc fuses {num_aux} x {target_hidden} = {fc_in} aux "
            "hidden-state features) but --speculative-algorithm is EAGLE. Under EAGLE no aux states "
            "are captured, fc is bypassed and every proposal is rejected (accept length 1.00)",
            'use --speculative-algorithm EAGLE3 (in vLLM\'s --speculative-config: "method": "eagle3")',
        )
    if algorithm is Algorithm.EAGLE3 and kind == "none":
        raise EyasError(
            "--speculative-algorithm EAGLE3 needs an EAGLE-3 draft with an fc layer fusing the "
            "target's aux hidden states; this draft has no fc",
            "give an EAGLE-3 draft, or --speculative-algorithm EAGLE for an EAGLE-1/2 draft",
        )
    if algorithm is Algorithm.EAGLE3 and kind == "eagle":
        raise EyasError(
            f"this draft's fc takes {fc_in} = 2 x {target_hidden} features (cat(embed, hidden)): it is an "
            "EAGLE-1/2 draft, not EAGLE-3",
            "use --speculative-algorithm EAGLE with SGLang for this draft, or train an EAGLE-3 draft with eyas train",
        )
    if algorithm is Algorithm.EAGLE:
        raise EyasError(
            "eyas's engine runs EAGLE-3 drafts only; EAGLE-1/2 drafts are not supported here",
            "serve an EAGLE-1/2 draft with SGLang (--speculative-algorithm EAGLE), or use an EAGLE-3 draft with EAGLE3",
        )


def check_pair(target_info, draft, aux_layer_ids: list[int]) -> None:
    """Draft built for this target: fc width, captured layers, vocabularies, embeddings, maps."""
    h, n_aux = target_info.hidden_size, len(aux_layer_ids)
    check_aux_layers(aux_layer_ids, target_info.num_layers)
    check_trained_depth(getattr(draft.config, "eyas", None), target_info.num_layers)
    fc_in = draft.fc.in_features
    if fc_in != n_aux * h:
        raise EyasError(
            f"the draft's fc takes {fc_in} features but this target provides {n_aux} captured layers x "
            f"hidden {h} = {n_aux * h}: the draft was built for another target"
            + (f" (hidden {fc_in // n_aux})" if fc_in % n_aux == 0 else ""),
            "use a draft trained for this target (eyas train), or the target it was trained for",
        )
    if draft.config.vocab_size != target_info.vocab_size:
        raise EyasError(
            f"the draft's vocabulary has {draft.config.vocab_size} tokens, the target's {target_info.vocab_size}",
            "use a draft trained for this target's tokenizer",
        )
    # Every path embeds draft tokens with the draft's own table (draft.embed): a draft narrower or wider than the
    # target runs when it ships its embeddings (formats.build_draft refuses sharing the target's of another width).
    width = draft.embed_tokens.weight.shape[1]
    if width != draft.config.hidden_size:
        raise EyasError(
            f"embedding width mismatch: the draft's token embeddings are {width} wide, its hidden size is "
            f"{draft.config.hidden_size} (the target's embeddings are {target_info.embed_width} wide)",
            "a draft narrower or wider than its target must ship its own embed_tokens.weight, as wide as its hidden",
        )
    check_vocab_maps(draft.d2t, draft.t2d, draft.draft_vocab_size, target_info.vocab_size)


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab: int, vocab: int) -> None:
    fix = "rebuild the draft vocabulary (eyas train builds d2t/t2d together) or re-export the draft"
    if tuple(d2t.shape) != (draft_vocab,):
        raise EyasError(f"d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab},) = draft_vocab_size", fix)
    if tuple(t2d.shape) != (vocab,):
        raise EyasError(f"t2d has shape {tuple(t2d.shape)}, expected ({vocab},) = the target vocabulary", fix)
    target_ids = d2t.long().cpu() + torch.arange(draft_vocab)
    if target_ids.min() < 0 or target_ids.max() >= vocab:
        raise EyasError(f"d2t maps draft ids outside the target vocabulary 0..{vocab - 1}", fix)
    if len(torch.unique(target_ids)) != draft_vocab:
        raise EyasError("d2t maps two draft ids to the same target id", fix)
    t2d = t2d.bool().cpu()
    if int(t2d.sum()) != draft_vocab or not bool(t2d[target_ids].all()):
        raise EyasError(
            f"t2d marks {int(t2d.sum())} target ids but d2t defines {draft_vocab}; the two maps disagree", fix
        )


def check_spec(spec: SpecConfig, target_info, draft, draft_path, aux_layer_ids) -> None:
    """Everything, in the order a person would want to hear about it."""
    fc_in = None if draft is None else getattr(getattr(draft, "fc", None), "in_features", None)
    num_aux = len(aux_layer_ids) if aux_layer_ids else 3
    arch = ""
    if draft is not None:
        arch = ",".join(getattr(draft.config, "architectures", None) or [])
    check_algorithm(spec.algorithm, draft_path, fc_in, target_info.hidden_size, num_aux, arch)
    if spec.speculative:
        for option in spec.options:
            if option.speculative:
                option.check_tree()
        check_pair(target_info, draft, aux_layer_ids)
        check_topk(spec, draft.draft_vocab_size)


def check_topk(spec: SpecConfig, draft_vocab: int) -> None:
    """Each node expands its ``eagle_topk`` best draft tokens: no more than the draft vocabulary has."""
    widest = max(o.eagle_topk for o in spec.options if o.speculative)
    if widest > draft_vocab:
        raise EyasError(
            f"--speculative-eagle-topk {widest} is larger than the draft's vocabulary of {draft_vocab} tokens: "
            "a node cannot expand more children than there are tokens to propose",
            f"use --speculative-eagle-topk {min(draft_vocab, 8)} or less",
        )


def check_room(max_context: int, tree_size: int) -> None:
    """A row's context must hold a prompt beside the largest tree a step verifies and its bonus token."""
    if max_context - tree_size - 1 < 1:
        raise EyasError(f"a row's context of {max_context} tokens leaves no room for a prompt beside the largest tree "
                        f"a step verifies ({tree_size} tokens, and its bonus)",
                        f"raise --context-length to at least {tree_size + 2} (or --mem-fraction-static), or verify a "
                        "smaller tree (--speculative-num-draft-tokens)")
