"""``eyas doctor --draft PATH --target PATH``: every reason a draft would be silently useless, before serving.

Reads the draft folder in any format eyas knows (``eyas.formats``: eyas, SGLang/SpecForge,
speculators, official EAGLE-3), the draft's tensors (small) and the target's config and tokenizer
(weights only for a GGUF target; of a folder, which weight files it holds), then runs one check per failure
mode. The refusals themselves
live in ``eyas.checks`` and ``eyas.layers``; this module turns each into a table row instead of an
exception, so a person sees every problem at once.

    format      the folder is a complete EAGLE-3 draft in a known layout
    algorithm   --speculative-algorithm against the draft's kind (EAGLE vs EAGLE3)
    fc width    fc input = target hidden x captured layers
    layers      captured layer ids within the target's depth, and as the draft was trained
    vocabulary  draft and target vocabularies
    d2t/t2d     the draft-to-target id maps
    embeddings  embedding width, shared or shipped
    context     the draft's trained context against the serving context
    template    the chat template recorded at training against the target's
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import formats
from ..checks import check_algorithm, check_vocab_maps, draft_kind
from ..common.target_facts import TargetFacts, read_target
from ..common.training_record import past_draft_positions, read_record, record_of, template_sha
from ..config import Algorithm
from ..errors import EyasError
from ..formats import names as format_names
from ..layers import check_aux_layers, check_trained_depth, default_aux_layers, to_sglang
from .verdict import OK, PROBLEM, WARNING, Report

FMT_NAMES = {"eyas": "eyas", "sglang": "SGLang/SpecForge", "speculators": "speculators (vLLM)",
             "eagle3": "official EAGLE-3"}


def diagnose(draft_path, target: str, algorithm: str | None = None, context_length: int | None = None,
             trust_remote_code: bool = False, allow_pickle: bool = False) -> Report:
    report = Report(f"draft {draft_path} for target {target}")
    try:
        folder = formats.read_draft(draft_path, allow_pickle)
    except EyasError as e:
        report.add("format", PROBLEM, e.problem, e.fix or "")
        report.verdict = "NOT SERVABLE: the draft folder cannot be read"
        return report
    cfg = folder.config
    report.add("format", OK, f"{FMT_NAMES.get(folder.format, folder.format)} EAGLE-3 draft, hidden "
               f"{cfg.hidden_size}, draft vocabulary {cfg.draft_vocab_size} of {cfg.vocab_size}")
    layout = draft_layout(target)
    if layout is not None:  # read as a target, a draft looks like a 1-layer model: every row would mislead
        report.add("target", PROBLEM, *draft_as_target(target, layout))
        report.verdict = "cannot check the pair: the target is a draft folder"
        return report
    try:
        facts = read_target(target, trust_remote_code, weights=True, allow_pickle=allow_pickle)
    except EyasError as e:
        report.add("target", PROBLEM, e.problem, e.fix or "")
        report.verdict = "cannot check the pair: the target cannot be read"
        return report
    check_algorithm_row(report, folder, facts, algorithm)
    n_aux = check_fc_row(report, folder, facts)
    check_layers_row(report, folder, facts, n_aux)
    check_vocab_row(report, folder, facts)
    check_maps_row(report, folder, facts)
    check_embeddings_row(report, folder, facts)
    check_norm_flag_row(report, folder)
    record = read_record(draft_path, cfg)
    check_context_row(report, folder, facts, record, context_length)
    check_template_row(report, facts, record)
    if record.warnings:  # informational fields of another type than eyas writes: shown, then ignored
        report.add("training record", WARNING, "; ".join(record.warnings),
                   "the checks above went on without those fields; correct or remove them in the draft's "
                   "config.json (eyas export writes a clean record)")
    report.verdict = ("ready to serve: no check found a reason for this draft to be silently useless (how well it "
                      "is accepted: eyas eval offline, eyas doctor --url on the server)" if not report.problems
                      else f"NOT READY: {len(report.problems)} problem(s) would make the draft useless or fail")
    report.figures = {"format": folder.format, "target_layers": facts.num_layers, "target_hidden": facts.hidden_size,
                      "aux_layer_ids": folder.aux_layer_ids or default_aux_layers(facts.num_layers)}
    return report


def draft_layout(path: str) -> str | None:
    """The draft layout (eyas, SGLang/SpecForge, ...) of a folder given as a target, by the markers the draft readers
    use (``eyas.formats``: architectures, speculators_model_type, an official release's fc); None for anything else."""
    try:
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            return None
        fmt = formats.detect_format(folder)  # an official release's .bin is not opened: no pickle runs
    except (EyasError, OSError, ValueError):
        return None
    return FMT_NAMES.get(fmt, fmt)


def draft_as_target(path: str, layout: str) -> tuple[str, str]:
    """(problem, fix) for a draft folder passed as --target."""
    return (f"--target {path} is an EAGLE-3 draft folder ({layout} layout), not a target model: read as one it "
            "looks like a 1-layer model, and every check against it would be wrong",
            f"pass it as --draft {path}, with --target the model it was trained for (or leave --target out: the "
            "target the draft records is used)")


def _fc_in(folder) -> int:
    return int(folder.state["fc.weight"].shape[1])


def _n_aux(folder) -> int:
    ids = folder.aux_layer_ids
    return len(ids) if ids is not None else 3


def check_algorithm_row(report: Report, folder, facts: TargetFacts, algorithm: str | None) -> None:
    arch = ",".join(getattr(folder.config, "architectures", None) or [])
    n_aux, fc_in = _n_aux(folder), _fc_in(folder)
    kind = draft_kind(fc_in, fc_in // n_aux, n_aux, arch)
    if kind == "eagle3" and (getattr(folder.config, "eagle_config", None) or {}).get("use_aux_hidden_state") is False:
        report.add("algorithm", PROBLEM, "eagle_config.use_aux_hidden_state is false in an EAGLE-3 draft whose fc "
                   f"fuses {fc_in} = {n_aux} x {fc_in // n_aux} features: SGLang then captures no aux states "
                   "even under EAGLE3, skips fc and rejects every proposal (accept length 1.00), silently",
                   "set eagle_config.use_aux_hidden_state to true, or re-export the draft with eyas export")
        return
    if algorithm is None:
        report.add("algorithm", OK, f"{kind.upper()} draft: serve it with --speculative-algorithm EAGLE3 "
                   "(SGLang EAGLE3, vLLM method eagle3); pass --speculative-algorithm to check your flag")
        return
    if algorithm.strip().upper() == "NEXTN" and kind == "eagle3":
        report.add("algorithm", PROBLEM, "--speculative-algorithm NEXTN: SGLang runs NEXTN as EAGLE, which gives an "
                   "EAGLE-3 draft no aux states; its fc is skipped and every proposal rejected (accept length "
                   "1.00), silently", "--speculative-algorithm EAGLE3 (NEXTN is for a target's own MTP layers)")
        return
    try:
        alg = Algorithm.parse(algorithm)
        check_algorithm(alg, str(folder.path), fc_in, fc_in // n_aux, n_aux, arch)
    except EyasError as e:
        report.add("algorithm", PROBLEM, e.problem, e.fix or "")
        return
    report.add("algorithm", OK, f"{alg.value} matches an EAGLE-3 draft (aux states captured, fc applied)")


def check_fc_row(report: Report, folder, facts: TargetFacts) -> int:
    n_aux, fc_in, h, n = _n_aux(folder), _fc_in(folder), facts.hidden_size, facts.num_layers
    if n_aux >= n - 1 and fc_in == n_aux * h:
        report.add("fc width", PROBLEM, f"fc takes {fc_in} = {n_aux} x {h}: the draft fuses (nearly) every hidden "
                   f"state of the {n}-layer target; EAGLE-3 fuses exactly 3 captured layers (EAGLE #294)",
                   "retrain with three captured layers, the default [2, N//2, N-3] (eyas train does)")
    elif fc_in == n_aux * h:
        report.add("fc width", OK if n_aux == 3 else WARNING,
                   f"fc takes {fc_in} = {n_aux} captured layers x target hidden {h}",
                   "EAGLE-3 captures 3 layers; SGLang and vLLM expect 3")
    else:
        other = f" (a target of hidden {fc_in // n_aux})" if fc_in % n_aux == 0 else ""
        report.add("fc width", PROBLEM, f"fc takes {fc_in} features, this target provides {n_aux} x {h} = {n_aux * h}"
                   f": the draft was built for another target{other}",
                   "use the draft trained for this target, or this draft's own target")
    return n_aux


def check_layers_row(report: Report, folder, facts: TargetFacts, n_aux: int) -> None:
    n = facts.num_layers
    ids = folder.aux_layer_ids
    recorded = record_of(folder.config)[0]  # unreadable fields dropped (reported by the training record row)
    trained_ids = recorded.get("aux_layer_ids")
    shown_ids = ids if ids is not None else default_aux_layers(n)
    try:
        check_aux_layers(shown_ids, n)
        check_trained_depth(recorded, n)
    except EyasError as e:
        report.add("layers", PROBLEM, e.problem, e.fix or "")
        return
    if trained_ids is not None and list(trained_ids) != list(shown_ids):
        report.add("layers", PROBLEM, f"the draft was trained on layers {list(trained_ids)} but its config makes "
                   f"servers capture {shown_ids} (eyas ids; SGLang eagle_aux_hidden_state_layer_ids "
                   f"{to_sglang(shown_ids)})", "re-export the draft with eyas export so both agree")
        return
    where = "written in the config" if ids is not None else "not written: servers use the default"
    default = default_aux_layers(n)
    if ids is not None and list(ids) != default:
        for m in range(4, 4 * n):
            if default_aux_layers(m) == list(ids):
                report.add("layers", WARNING, f"captured layers {ids} are the default of a {m}-layer target, this "
                           f"one has {n} (default {default}): the draft was probably trained for another model",
                           "check that the draft was trained for this target")
                return
    report.add("layers", OK, f"captured layers {shown_ids} (inputs of those decoder layers; SGLang ids "
               f"{to_sglang(shown_ids)}), {where}, within the target's {n} layers")


def check_norm_flag_row(report: Report, folder) -> None:
    """A speculators folder without ``norm_before_residual``: vLLM's speculators loader reads it as true, eyas
    and speculators as false (the maths eyas computes): the engines would compute different logits."""
    if folder.format != "speculators":
        return
    try:
        data = json.loads((Path(folder.path) / "config.json").read_text())
    except (OSError, ValueError):
        return
    if "norm_before_residual" not in data:
        report.add("norm_before_residual", WARNING, "config.json does not say norm_before_residual: vLLM computes "
                   "the draft with it true when absent, eyas (and speculators) with it false, so they give "
                   "different logits and one of them accepts little",
                   'add "norm_before_residual": false to config.json where the draft was trained without it '
                   "(speculators' default; what eyas computes)")


def check_vocab_row(report: Report, folder, facts: TargetFacts) -> None:
    v, tv = int(folder.config.vocab_size), facts.vocab_size
    if v != tv:
        report.add("vocabulary", PROBLEM, f"the draft's vocabulary has {v} tokens, the target's {tv}: "
                   "another tokenizer", "use a draft trained for this target's tokenizer")
        return
    rec = format_names.recorded_target(folder.config)
    report.add("vocabulary", OK, f"{v} tokens on both sides" + (f"; trained for {rec}" if rec else ""))


def check_maps_row(report: Report, folder, facts: TargetFacts) -> None:
    cfg, state = folder.config, folder.state
    dv, v = int(cfg.draft_vocab_size), int(cfg.vocab_size)
    if "d2t" not in state:
        report.add("d2t/t2d", OK, "full draft vocabulary: no maps needed")
        return
    import torch

    d2t = state["d2t"]
    t2d = state.get("t2d")
    if t2d is None:  # SGLang drops t2d; rebuild it from d2t as the loaders do
        t2d = torch.zeros(v, dtype=torch.bool)
        ids = d2t.long() + torch.arange(d2t.numel())
        if ids.min() >= 0 and ids.max() < v:
            t2d[ids] = True
    try:
        check_vocab_maps(d2t, t2d, dv, v)
    except EyasError as e:
        report.add("d2t/t2d", PROBLEM, e.problem, e.fix or "")
        return
    report.add("d2t/t2d", OK, f"d2t maps {dv} draft ids one-to-one into the target's {v}; t2d agrees")


def check_embeddings_row(report: Report, folder, facts: TargetFacts) -> None:
    h = int(folder.config.hidden_size)
    emb = folder.state.get("embed_tokens.weight")
    if emb is not None:
        if tuple(emb.shape) != (facts.vocab_size, h):
            report.add("embeddings", PROBLEM, f"the draft ships embed_tokens {tuple(emb.shape)}, expected "
                       f"({facts.vocab_size}, {h}) = (target vocabulary, draft hidden)",
                       "re-export the draft with the target's embeddings")
        else:
            report.add("embeddings", OK, f"the draft ships its own {facts.vocab_size} x {h} embeddings")
        return
    if facts.embed_width != h:
        report.add("embeddings", PROBLEM, f"the draft shares the target's embeddings, but they are {facts.embed_width} "
                   f"wide and the draft's hidden size is {h}",
                   "a draft narrower or wider than its target must ship its own embed_tokens.weight")
        return
    report.add("embeddings", OK, f"shared from the target ({facts.embed_width} wide = draft hidden)")


def check_context_row(report: Report, folder, facts: TargetFacts, record, context_length: int | None) -> None:
    serving = context_length or facts.max_context
    past = past_draft_positions(serving, folder.config)
    if past:
        report.add("context", PROBLEM, *past)
        return
    if record.max_length is None:
        report.add("context", WARNING if folder.format != "eyas" else OK,
                   f"serving context {serving or 'unknown'}; the draft's training length is not recorded"
                   + (" (SGLang, speculators and official folders do not record it)"
                      if folder.format != "eyas" else ""),
                   "if the draft was trained at 2048 tokens (the usual), expect lower acceptance on longer prompts")
        return
    if serving and serving > record.max_length:
        report.add("context", WARNING, f"the draft was trained on sequences of at most {record.max_length} tokens and "
                   f"the serving context is {serving}: acceptance drops on longer conversations",
                   f"serve with --context-length {record.max_length}, or train with data.max_length {serving}")
        return
    report.add("context", OK, f"trained at {record.max_length} tokens, serving context {serving}")


def check_template_row(report: Report, facts: TargetFacts, record) -> None:
    if not facts.chat_template:
        report.add("chat template", WARNING, "the target has no chat template: chat requests fall back to raw text, "
                   "which the draft probably never saw", "serve an instruct model, or use /v1/completions")
        return
    if record.template_sha is None:
        where = " (the training data's meta.json is not here)" if record.source else ""
        report.add("chat template", OK, f"the template used at training is not recorded{where}; cannot compare")
        return
    have = template_sha(facts.chat_template)
    if have != record.template_sha:
        report.add("chat template", PROBLEM, f"the draft was trained on conversations rendered with another chat "
                   f"template (sha {record.template_sha}, the target's is {have}): train/serve mismatch is the top "
                   "cause of low acceptance (SpecForge #296, EAGLE #264)",
                   "retrain on data prepared with this target's tokenizer, or serve the target it was trained with")
        return
    thinking = "" if record.thinking is None else f"; thinking {'on' if record.thinking else 'off'} at training"
    report.add("chat template", OK, f"same template as at training (sha {have}){thinking}")
