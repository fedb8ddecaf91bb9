"""What the server says about itself: the startup printout, ``/server_info`` and ``eyas:spec_info``.

The aux line is the one to read when acceptance is 1.00: it shows how many target layers are
captured, how wide their concatenation is, and that the draft's fc takes exactly that width.
"""

from __future__ import annotations

import hashlib

from ..config import AUTO, format_schedule, setting_name
from ..layers import to_sglang
from ..models.kernel_choice import CHOICES


def template_sha(template: str | None) -> str:
    """First 16 hex digits of sha256(chat template): what ``eyas prepare`` records for a draft."""
    return hashlib.sha256((template or "").encode()).hexdigest()[:16]


def training_warnings(engine) -> list[str]:
    """Train/serve mismatches the draft's own record reveals (the top causes of low acceptance)."""
    if engine.draft is None or not engine.spec.speculative:
        return []
    from ..common.training_record import context_warning

    context = context_warning(engine)
    try:
        from ..common.training_record import read_record

        rec = read_record(getattr(engine.draft, "name_or_path", "."), engine.draft.config)
    except Exception:  # noqa: BLE001 - no record readable: nothing to compare
        return [context] if context else []
    out = ([context] if context else []) + [f"note: the draft's {w}" for w in rec.warnings]
    have = template_sha(getattr(engine.target.tokenizer, "chat_template", None))
    if rec.template_sha and rec.template_sha != have:
        out.append(f"WARNING: this server renders chats with template sha256 {have}, the draft was trained on "
                   f"{rec.template_sha}: expect low acceptance on chat requests; pass the training template with "
                   "--chat-template")
    if rec.max_length and engine.max_context > rec.max_length:
        out.append(f"note: the draft was trained on sequences of at most {rec.max_length} tokens and the context "
                   f"here is {engine.max_context}: acceptance may fall past {rec.max_length} (a draft trained with "
                   f"data.max_length {engine.max_context} keeps it; --context-length {rec.max_length} would refuse "
                   "longer requests instead)")
    return out


def describe(engine) -> dict:
    """Plain facts about the loaded pair (JSON-ready)."""
    t, d, s = engine.target, engine.draft, engine.spec
    info = {
        "target": t.name,
        "target_architecture": t.info.architecture,
        "target_layers": t.info.num_layers,
        "target_hidden_size": t.info.hidden_size,
        "vocab_size": t.info.vocab_size,
        "dtype": str(t.dtype).replace("torch.", ""),
        "device": str(t.device),
        "context_length": engine.max_context,
        "algorithm": s.algorithm.value,
        "speculative": s.speculative,
        "chat_template_sha256_16": template_sha(getattr(t.tokenizer, "chat_template", None)),
    }
    choice = getattr(engine, "setting_choice", None)  # set by eyas serve (serve/defaults.py)
    if choice is not None:
        info.update(setting=choice.setting, setting_source=choice.source, setting_reason=choice.why)
    if s.speculative and d is not None:
        ids = list(t.aux_layer_ids)
        tree = next(o for o in s.options if o.speculative)  # with a schedule: the smallest batches' tree
        info.update(
            draft=getattr(d, "name_or_path", None) or "<in memory>",
            draft_architecture=",".join(getattr(d.config, "architectures", None) or []),
            draft_hidden_size=d.config.hidden_size,
            draft_vocab_size=d.draft_vocab_size,
            aux_layer_ids=ids,
            aux_layer_ids_sglang=to_sglang(ids),
            aux_width=len(ids) * t.info.hidden_size,
            fc_in=d.fc.in_features,
            fc_out=d.fc.out_features,
            num_steps=tree.num_steps,
            eagle_topk=tree.eagle_topk,
            num_draft_tokens=tree.num_draft_tokens,
            batch_schedule=format_schedule(s),  # "auto" when adaptive
            settings=[setting_name(o) for o in s.options],  # every setting a step may run ("0": none)
        )
    return info


def info_labels(engine) -> dict[str, str]:
    """Labels of ``eyas:spec_info`` (strings; absent settings are empty). Under ``auto`` no one tree is the
    server's (``eyas:spec_active_setting`` names the one running): the tree labels are empty, as without a draft."""
    i = describe(engine)
    if i.get("batch_schedule") == AUTO:
        i = {k: v for k, v in i.items() if k not in ("num_steps", "eagle_topk", "num_draft_tokens")}
    ids = i.get("aux_layer_ids")
    return {
        "algorithm": i["algorithm"],
        "target": i["target"],
        "draft": i.get("draft", ""),
        "aux_layer_ids": ",".join(map(str, ids)) if ids else "",
        "num_steps": str(i.get("num_steps", "")),
        "eagle_topk": str(i.get("eagle_topk", "")),
        "num_draft_tokens": str(i.get("num_draft_tokens", "")),
        "batch_schedule": i.get("batch_schedule", ""),
        "draft_vocab_size": str(i.get("draft_vocab_size", "")),
        "context_length": str(i["context_length"]),
    }


def banner_lines(engine, max_running: int, max_queued: int) -> list[str]:
    i = describe(engine)
    lines = [
        (f"target: {i['target']} ({i['target_architecture']}, {i['target_layers']} layers, hidden "
         f"{i['target_hidden_size']}, vocab {i['vocab_size']}), {i['dtype']} on {i['device']}"),
        f"engine: {engine.layout}",
    ]
    choice = getattr(engine, "setting_choice", None)
    if not i["speculative"]:
        lines.append("speculative algorithm: NONE (" + ("no draft: " if choice is None else "")
                     + "plain decoding, one token per target forward)")
    else:
        ids, h, n = i["aux_layer_ids"], i["target_hidden_size"], len(i["aux_layer_ids"])
        shape = "chain" if i["eagle_topk"] == 1 else "tree"
        lines += [
            f"speculative algorithm: {i['algorithm']}",
            f"draft: {i['draft']} ({i['draft_architecture'] or '?'}, hidden {i['draft_hidden_size']})",
            (f"captured layers: {ids} (inputs of those decoder layers; SGLang eagle_aux_hidden_state_layer_ids "
             f"{i['aux_layer_ids_sglang']})"),
            f"aux hidden states: {n} x {h} = {n * h} -> fc {i['fc_in']} -> {i['fc_out']}",
            f"draft vocabulary: {i['draft_vocab_size']} of {i['vocab_size']} target tokens",
            (f"tree: num_steps {i['num_steps']}, eagle_topk {i['eagle_topk']}, num_draft_tokens "
             f"{i['num_draft_tokens']} ({shape}; {i['num_draft_tokens'] - 1} draft tokens verified per step)"
             if not i["batch_schedule"] else
             f"tree per step: auto, the setting with the most expected tok/s for the batch among "
             f"{' '.join(setting_name(o) for o in engine.spec.options)} (num_steps,eagle_topk,num_draft_tokens; "
             "0 = no speculation; eyas:spec_active_setting in /metrics)"
             if i["batch_schedule"] == "auto" else
             f"tree per batch size: {i['batch_schedule']} (BOUND:num_steps,eagle_topk,num_draft_tokens for "
             "batches up to BOUND, the last entry also for larger ones; 0 = no speculation)"),
        ]
    lines += [choice.line()] if choice is not None else []
    kernels = CHOICES.summary()  # after the warm-up, which times the projections' kernels on a GPU
    lines += [kernels] if kernels else []
    lines += [
        f"chat template: sha256 {i['chat_template_sha256_16']}",
        f"context length: {i['context_length']}",
        f"max running requests: {max_running}, queue: {max_queued}",
    ]
    return lines + training_warnings(engine)


def overlap_line(engine, on: bool = True, asked: bool = False, wait_steps: int = 8) -> str | None:
    """The banner's word on the overlap schedule (``on``: ``--overlap-schedule``, the default): what runs on
    this engine, and how long a change of the batch's rows may wait (``wait_steps``: ``--membership-wait-steps``).
    On the generic path, which launches nothing ahead, it speaks only when the flag was ``asked``."""
    if not on:
        return "schedule: each step read back before the next is launched (--no-overlap-schedule)"
    if getattr(engine, "launches_ahead", False):
        wait = (f"rows that end leave, and new requests join, several at once within {wait_steps} steps"
                if wait_steps else "each row leaves or joins at once")
        return ("schedule: each step launched before the last one's tokens are read back (the overlap schedule; "
                f"steps by parts, for logprobs or a grammar, are read back first; --no-overlap-schedule: off); "
                f"{wait} (--membership-wait-steps)")
    if asked:
        return ("schedule: --overlap-schedule has no effect on this engine: it launches whole steps ahead (the "
                "native path), and this one has none (the generic path); every step is read back first")
    return None
