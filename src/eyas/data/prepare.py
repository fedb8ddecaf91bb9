"""``eyas prepare`` as a function: sources -> exclusion -> dedup -> chat holdout -> mix -> split ->
regeneration -> tokens + mask -> vocab counts.

Output folder:
    train.jsonl, heldout.jsonl    the conversations (with regenerated answers)
    holdout-prompts.jsonl         the chat evaluation set no training sees (with --holdout-prompts)
    <split>.{tokens,mask,offsets}.npy  see ``tokenized``
    vocab_counts.npy              int64 [vocab]: frequency of each learned target token (train only)
    answers.jsonl                 with --regenerate-url: the server's answers as they arrived (``remote``)
    meta.json                     target, chat settings (system prompt, thinking, template hash),
                                  regeneration settings and throughput, counts per source (``ledger``)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..common.training_record import template_sha
from ..errors import EyasError
from . import holdout, sources
from .chat import prompt_messages, render
from .files import read_inputs
from .ledger import Ledger
from .prepare_config import PrepareConfig
from .regenerate import RegenStats, magpie_prompts, regenerate, self_prompts, with_system
from .selection import select, selection_meta, write_jsonl
from .tokenized import vocab_counts, write_split


def _sharded(fn, items: list, dist_ctx) -> list:
    """Run ``fn`` on this rank's share of ``items``; every rank's result, in rank order (one on a
    single rank)."""
    if dist_ctx is None or dist_ctx.world == 1:
        return [fn(items)]
    return dist_ctx.gather_objects(fn(items[dist_ctx.rank:: dist_ctx.world]))


def collect(target, cfg: PrepareConfig, dist_ctx=None, log=print) -> list[dict]:
    """Every record of the inputs and built-in sources (``self`` and ``magpie`` need ``target``)."""
    records: list[dict] = list(read_inputs(cfg.inputs))
    for name in cfg.sources:
        if name == "self":
            requests = sources.self_instruct_requests(cfg.self_per_topic)
            if cfg.limit is not None and cfg.limit < len(requests):  # a request, a prompt: spread over the topics
                requests = [requests[i * len(requests) // cfg.limit] for i in range(cfg.limit)]
            got = [r for part in _sharded(lambda xs: self_prompts(target, xs, cfg.regen), requests, dist_ctx)
                   for r in part]
            log(f"source self: {len(got)} prompts written by the target from {len(requests)} requests")
        elif name == "magpie":
            asks = list(range(cfg.magpie_prompts))[: cfg.limit]
            got = [r for part in _sharded(lambda xs: magpie_prompts(target, len(xs), cfg.regen), asks, dist_ctx)
                   for r in part]
            log(f"source magpie: {len(got)} prompts written by the target from {len(asks)} openings of a user turn")
        else:
            got = list(sources.builtin(name, cfg.limit))
            log(f"source {name}: {len(got)} prompts")
        records.extend(got)
    if not records:
        raise EyasError("no conversations: every source was empty",
                        "pass --input FILE.jsonl and/or --source chatterbot/pydoc/self/magpie")
    return records


# what a run with a model leaves in --out (beyond the prompt files --select-only writes itself)
ANSWERED = ("meta.json", "answers.jsonl", "train.tokens.npy", "heldout.tokens.npy")


def refuse_answered_out(out: Path) -> None:
    """--select-only into the output of a run with a model would replace its answered train/heldout.jsonl
    with bare prompts and leave its tokens and meta.json describing another selection. A full run
    rewrites every file it owns (and resumes from answers.jsonl), a select-only one only its own: so
    an earlier --select-only folder is rewritten, an answered one is refused."""
    found = [name for name in ANSWERED if (out / name).exists()]
    if found:
        raise EyasError(f"--out {out} holds the output of an `eyas prepare` run with a model ({', '.join(found)}): "
                        "--select-only would replace its answered train.jsonl / heldout.jsonl with bare prompts "
                        "and leave its tokens and meta.json describing another selection",
                        "pass --select-only a new --out folder (or remove that one first, if its answers are "
                        "no longer wanted)")


def select_only(cfg: PrepareConfig, out, log=print) -> dict:
    """``--select-only``: the selection without a model: train.jsonl and heldout.jsonl as prompts
    (unanswered), holdout-prompts.jsonl and selection.json (the meta's selection part)."""
    needs = sorted({"self", "magpie"} & set(cfg.sources))
    if needs:
        raise EyasError(f"--select-only runs without a model, but source {', '.join(needs)} needs the target to "
                        "write prompts", "drop --select-only, or those sources")
    out = Path(out)
    refuse_answered_out(out)
    ledger = Ledger()
    train, held, chat_eval = select(collect(None, cfg, None, log), cfg, ledger, log)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "heldout.jsonl", held)
    holdout.write(out, chat_eval)
    meta = selection_meta(cfg, ledger, chat_eval)
    (out / "selection.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"prompts per source:\n{ledger.table()}")
    log(f"wrote {out}: {len(train)} train and {len(held)} held-out prompts, {len(chat_eval)} in the chat holdout "
        "(no answers, no tokens: run without --select-only to regenerate and tokenize)")
    return meta


def template_hash(tokenizer) -> str:
    return template_sha(tokenizer.chat_template)


def tokenize(tokenizer, records: list[dict], cfg: PrepareConfig):
    """``(rows, truncated, skipped, no_answer)``: ``no_answer`` counts conversations whose answer starts
    beyond ``max_length`` (the prompt fills it), which leave no row."""
    rows, truncated, skipped, no_answer = [], 0, 0, 0
    kw = cfg.regen.template_kwargs
    for r in records:
        msgs = with_system(r["messages"], cfg.regen.system_prompt)
        if not any(m["role"] == "assistant" for m in msgs):
            skipped += 1
            continue
        rd = render(tokenizer, msgs, kw, cut=bool(r.get("truncated")))  # an answer cut at max_new_tokens
        ids, mask = rd.input_ids, rd.loss_mask
        if len(ids) > cfg.max_length:
            ids, mask, truncated = ids[: cfg.max_length], mask[: cfg.max_length - 1] + [0], truncated + 1
        if sum(mask):
            rows.append((ids, mask))
        else:
            no_answer += 1
    return rows, truncated, skipped, no_answer


def _answerable(tokenizer, records: list[dict], cfg: PrepareConfig) -> tuple[list[dict], int]:
    """The records whose prompt, rendered with the generation prompt, leaves room for an answer within
    ``max_length``, and how many do not: answering those would cost generation (past the target's
    context, when the prompt is longer) for rows ``tokenize`` drops."""
    kw, keep = cfg.regen.template_kwargs, []
    for r in records:
        msgs = with_system(prompt_messages(r["messages"]), cfg.regen.system_prompt)
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) < cfg.max_length:
            keep.append(r)
    return keep, len(records) - len(keep)


def prepare(target, cfg: PrepareConfig, out, dist_ctx=None, log=print, remote=None) -> dict:
    """``remote``: a ``remote.RemoteRegenerator`` answers the prompts through a server instead of
    ``target`` in-process (``target`` then needs only its tokenizer and info)."""
    out = Path(out)
    ctx = target.info.max_context
    if ctx and cfg.max_length > ctx:
        raise EyasError(f"--max-length {cfg.max_length} is longer than the target's context ({ctx})",
                        f"use --max-length {ctx} or less")
    ledger = Ledger()
    train, held, chat_eval = select(collect(target, cfg, dist_ctx, log), cfg, ledger, log)
    stats, unanswered = {}, {}
    if cfg.regenerate:
        for name, split in (("train", train), ("heldout", held)):
            split, unanswered[name] = _answerable(target.tokenizer, split, cfg)
            if unanswered[name]:
                log(f"{name}: {unanswered[name]} prompts not sent for answers: each fills --max-length "
                    f"{cfg.max_length} by itself, so no answer token would be left to learn")

            def run(xs):
                got, st = remote.regenerate(xs) if remote else regenerate(target, xs, cfg.regen)
                return got, asdict(st)
            parts = _sharded(run, split, dist_ctx)
            got = [r for p, _ in parts for r in p]
            st = RegenStats(sum(s["prompts"] for _, s in parts), sum(s["answer_tokens"] for _, s in parts),
                            sum(s["truncated"] for _, s in parts), max(s["seconds"] for _, s in parts))
            stats[name] = {**asdict(st), "tokens_per_s": round(st.tokens_per_s, 1), "ranks": len(parts),
                           "no_answer": len(split) - len(got)}
            log(f"regenerated {name}: {st.answer_tokens} answer tokens in {st.seconds:.1f} s "
                f"({st.tokens_per_s:.0f} tok/s on {len(parts)} rank(s)), {st.truncated} cut at max_new_tokens")
            if len(got) < len(split):  # an empty answer (the turn ended at once) or a prompt the server refused
                log(f"{name}: {len(split) - len(got)} of {len(split)} prompts got no answer (empty, or refused by "
                    "the server) and are left out")
            if cfg.keep_answers:  # the given answers too: e.g. one sampled and one greedy answer per prompt
                got = [r for r in split if any(m["role"] == "assistant" for m in r["messages"])] + got
            if name == "train":
                train = got
            else:
                held = got
    if dist_ctx is not None and dist_ctx.rank != 0:
        return {}
    out.mkdir(parents=True, exist_ok=True)
    holdout.write(out, chat_eval)
    summary = {}
    for name, split in (("train", train), ("heldout", held)):
        write_jsonl(out / f"{name}.jsonl", split)
        rows, truncated, skipped, no_answer = tokenize(target.tokenizer, split, cfg)
        no_answer += unanswered.get(name, 0)
        if no_answer and name not in unanswered:
            log(f"{name}: {no_answer} of {len(split)} conversations dropped: the prompt fills --max-length "
                f"{cfg.max_length}, so no answer token is left to learn")
        if name == "train" and not rows and no_answer:
            raise EyasError(f"the training split is empty after rendering: every prompt fills --max-length "
                            f"{cfg.max_length}, leaving no answer token", "raise --max-length (up to the target's "
                            "context) or give shorter prompts")
        if name == "train" and not rows:
            raise EyasError("the training split is empty after rendering: no conversation has an assistant turn",
                            "add --regenerate so the target answers the prompts, or give conversations with answers")
        if skipped:
            log(f"warning: {name}: {skipped} of {len(split)} records have no assistant turn (prompts alone) and were "
                "left out; add --regenerate to have the target answer them")
        write_split(out, name, rows)
        summary[name] = {"rows": len(rows), "tokens": sum(len(i) for i, _ in rows),
                         "loss_tokens": sum(sum(m) for _, m in rows), "truncated": truncated,
                         "no_assistant_turn": skipped, "prompt_fills_max_length": no_answer}
        if name == "train":
            np.save(out / "vocab_counts.npy", vocab_counts(rows, target.info.vocab_size))
    meta = {
        "target": {"name": target.info.name, "num_layers": target.info.num_layers,
                   "hidden_size": target.info.hidden_size, "vocab_size": target.info.vocab_size},
        "chat": {"system_prompt": cfg.regen.system_prompt, "template_kwargs": cfg.regen.template_kwargs,
                 "thinking": cfg.regen.template_kwargs.get("enable_thinking"),
                 "template_sha256_16": template_hash(target.tokenizer)},
        "regeneration": {**cfg.regen.as_dict(), "enabled": cfg.regenerate, "keep_answers": cfg.keep_answers,
                         "stats": stats, "server": remote.meta if remote else None},
        **selection_meta(cfg, ledger, chat_eval), "max_length": cfg.max_length, "splits": summary,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log(f"prompts per source:\n{ledger.table()}")
    log(f"wrote {out}: train {summary['train']['rows']} rows / {summary['train']['loss_tokens']} loss tokens, "
        f"held out {summary['heldout']['rows']} rows")
    return meta
