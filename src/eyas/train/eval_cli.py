"""``eyas eval``: real speculative decoding of a draft with its target on held-out prompts.

Reports acceptance length tau, acceptance rate, per-position acceptance, tokens/s with and
without speculation and the speedup. Prompts come from a prepared data folder's held-out split
(rendered with the chat settings the data was made with), a JSONL/text file or a built-in set.
Where the prompts carry a ``category`` (or at least a ``source``), tau is also reported per
category: its first part, ``math/gsm8k`` -> ``math``; a built-in set's prompts carry its name.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..common.categories import category_of, category_table, tally
from ..errors import EyasError


def register(sub) -> None:
    from ..pipeline import add_engine_arguments

    p = sub.add_parser("eval", help="measure a draft's acceptance (tau) and speedup on held-out prompts")
    add_engine_arguments(p)
    p.add_argument("--data", default=None, help="folder from `eyas prepare`: its held-out prompts are used")
    p.add_argument("--prompts", default=None, help="JSONL (messages/conversations/prompt) or text file, one per "
                   "line; or a built-in set: chat, code, reasoning, all")
    p.add_argument("--num-prompts", type=int, default=32,
                   help="prompts to run (default 32); fewer than a file holds are taken in turn from each of its "
                        "categories, so a few stand for all of them")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; else sampled, seeded")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus top-p of sampled rows (default 1: off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k of sampled rows (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p of sampled rows (default 0: off)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together")
    p.add_argument("--baseline", action="store_true", help="also decode without speculation and report the speedup")
    p.add_argument("--json-out", default=None, help="write the results here as JSON")
    p.set_defaults(func=run)


def read_prompts(args) -> tuple[list[tuple[list[dict], str | None]], dict]:
    """(the messages and category of each prompt, the data's chat settings), read and checked before any model
    loads: every prompt has a user turn (a system message alone, or an empty list, is no prompt)."""
    from ..common.prompts import SETS, builtin_set
    from ..data.chat import normalize, prompt_messages
    from ..data.files import nonblank_lines, prompt_file_records

    chat: dict = {}
    records: list[tuple[list[dict], str | None]] = []
    builtin = builtin_set(args.prompts) if args.prompts else None
    if args.data:
        folder = Path(args.data)
        path = folder / "heldout.jsonl"
        if not path.is_file():
            raise EyasError(f"no heldout.jsonl in {folder}", "pass the folder written by `eyas prepare`")
        meta = folder / "meta.json"
        chat = json.loads(meta.read_text()).get("chat", {}) if meta.is_file() else {}
        lines = [(n, line) for n, line in enumerate(path.open(), 1) if line.strip()]
        for n, line in lines:
            rec = json.loads(line)
            records.append((normalize(rec, f"{path}:{n}"), category_of(rec)))
        if not records:
            other = folder / "holdout-prompts.jsonl"
            raise EyasError(f"the held-out split of {folder} is empty (heldout.jsonl holds no prompt)",
                            (f"pass --prompts {other} (its chat holdout), or " if other.is_file() else "")
                            + "prepare with --held-out above 0 (e.g. 0.02), or pass --prompts FILE")
    elif builtin:
        records = [([{"role": "user", "content": p}], name) for name, p in builtin]
    elif args.prompts:
        path = Path(args.prompts)
        if not path.is_file():
            raise EyasError(f"no prompt file {path}",
                            f"pass a JSONL or text file, or a built-in set: {', '.join([*SETS, 'all'])}")
        records = prompt_file_records(path)
        lines = nonblank_lines(path)  # as prompt_file_records reads them: one record per non-blank line
    else:
        raise EyasError("no prompts given", "pass --data FOLDER (held-out split) or --prompts FILE")
    for i, (msgs, _) in enumerate(records):
        if not any(m["role"] == "user" for m in prompt_messages(msgs)):
            where = f"{path}:{lines[i][0]}" if not builtin else f"prompt {i + 1}"
            roles = ", ".join(m["role"] for m in msgs) or "no message at all"
            raise EyasError(f"{where}: the prompt has no user turn ({roles}), so there is nothing to answer",
                            'give it a user message, e.g. {"messages": [{"role": "user", "content": "..."}]} or '
                            '{"prompt": "..."}, or drop that line')
    return records, chat


def in_turn(records: list[tuple[list[dict], str | None]]) -> list[tuple[list[dict], str | None]]:
    """The records taken in turn from each category (in the order the categories first appear, each in file
    order): the first N of a file grouped by category (a chat holdout: 400 prompts over 21 strata) stand for all
    of it, not for its first category. Records without categories keep their order."""
    groups: dict = {}
    for r in records:
        groups.setdefault(r[1], []).append(r)
    if len(groups) < 2:
        return records
    return [g[i] for i in range(max(map(len, groups.values()))) for g in groups.values() if i < len(g)]


def load_prompts(args, tokenizer, read: tuple | None = None) -> tuple[list[list[int]], dict, list[str | None]]:
    """(token ids of each distinct prompt, the data's chat settings, each prompt's category or None);
    ``read``: what ``read_prompts(args)`` returned, where it was called already."""
    from ..data.chat import prompt_messages
    from ..data.regenerate import with_system

    records, chat = read or read_prompts(args)
    records = in_turn(records) if args.num_prompts < len(records) else records
    kw = chat.get("template_kwargs") or {}
    ids, groups, seen = [], [], set()
    for msgs, group in records:  # a prompt counts once, also where the data holds several answers to it
        if len(ids) >= args.num_prompts:
            break
        msgs = with_system(prompt_messages(msgs), chat.get("system_prompt"))
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
        if text not in seen:
            seen.add(text)
            ids.append(tokenizer(text, add_special_tokens=False).input_ids)
            groups.append(group)
    if not ids:
        raise EyasError("the prompt set is empty", "check the file or folder")
    return ids, chat, groups


def _decode(engine, prompts, params, batch_size):
    outs, t = [], time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outs.extend(engine.generate(prompts[i: i + batch_size], params))
    return outs, time.perf_counter() - t


def per_category(outs, groups: list[str | None]) -> dict:
    """{category: {prompts, drafts (verify steps), accepted_tokens, accept_length}}, by name; prompts
    without a category are counted under ``(none)`` so the groups' steps add up to the total."""
    return tally((g, o.stats.drafts, o.stats.accepted) for o, g in zip(outs, groups, strict=True))


def evaluate(engine, prompts, params, batch_size: int = 1, baseline: bool = False,
             groups: list[str | None] | None = None) -> dict:
    """The figures over all prompts; with ``groups`` (a category or None per prompt, some not None)
    also ``per_category``."""
    from ..engine.stats import SpecStats
    from ..pipeline import baseline_engine

    engine.generate(prompts[:1], type(params)(max_new_tokens=4))  # warm-up
    outs, seconds = _decode(engine, prompts, params, batch_size)
    total = SpecStats()
    for o in outs:
        total.add(o.stats)
    n = sum(len(o.output_ids) for o in outs)
    if n == 0:  # every row ended before its first token: a broken target (non-finite logits), never a result
        raise EyasError(f"no prompt generated a token ({outs[0].finish_reason!r} on every one): the target's "
                        "forward gives no usable logits", "check the target's config.json (rms_norm_eps, "
                        "rope_parameters) with eyas doctor --target, and its weights")
    s = engine.spec
    res = {"spec": {"algorithm": s.algorithm.value, "num_steps": s.num_steps, "eagle_topk": s.eagle_topk,
                    "num_draft_tokens": s.num_draft_tokens},
           "prompts": len(prompts), "output_tokens": n, "seconds": round(seconds, 2),
           "tokens_per_s": round(n / seconds, 2), **total.as_dict()}
    if groups and any(g is not None for g in groups):
        res["per_category"] = per_category(outs, groups)
    if baseline:
        plain = baseline_engine(engine)
        base, base_s = _decode(plain, prompts, params, batch_size)
        nb = sum(len(o.output_ids) for o in base)
        res["baseline_tokens_per_s"] = round(nb / base_s, 2)
        res["speedup"] = round((n / seconds) / (nb / base_s), 3)
        if params.greedy:
            res["greedy_identical"] = all(a.output_ids == b.output_ids for a, b in zip(outs, base))
    return res


def nothing_accepted(res: dict, steps: int = 20) -> str | None:
    """A warning where a run of at least ``steps`` verify steps accepted no draft token: tau 1.000 is the
    number of a draft that is not working (another target's, untrained, or a fault), never one to report."""
    if res["drafts"] < steps or res["accepted_tokens"] > 0:
        return None
    return (f"warning: no draft token was accepted in {res['drafts']} verify steps (tau 1.000): this draft speeds "
            "nothing up here. Check that it was trained for this target (eyas doctor --draft DRAFT --target "
            "TARGET), and compare with --temperature 0: a draft accepted greedily but never when sampling "
            "points at the sampler, worth an issue")


def run(args) -> int:
    from ..common.outputs import check_output_file
    from ..pipeline import build_engine, engine_args_from
    from ..sample.sampling import SamplingParams

    for flag, value in (("--num-prompts", args.num_prompts), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:  # before any weights are read: 0 crashed in range(), negatives read as 'empty set'
            raise EyasError(f"{flag} must be at least 1, got {value}",
                            "e.g. --num-prompts 32 --batch-size 1 --max-new-tokens 128 (the defaults)")
    if args.data and args.prompts:  # the data's held-out split would be used and the prompts dropped unread
        raise EyasError(f"--data {args.data} and --prompts {args.prompts} both name the prompts",
                        "pass one: --data FOLDER for its held-out split, or --prompts FILE or a built-in set")
    if args.json_out:  # found before the run, not after it
        check_output_file(args.json_out, "--json-out", "eval.json")
    # checked before any weights are read, as the server checks a request's (tau depends on all of them)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, min_p=args.min_p, seed=0)
    read = read_prompts(args)  # a missing file or a prompt without a user turn: said before the weights are read
    engine = build_engine(engine_args_from(args, rows=args.batch_size))
    if not engine.spec.speculative:
        raise EyasError("eval needs a draft: speculation is off for this target",
                        "pass --speculative-draft-model-path DRAFT (and --speculative-algorithm EAGLE3)")
    prompts, chat, groups = load_prompts(args, engine.target.tokenizer, read)
    res = evaluate(engine, prompts, params, args.batch_size, args.baseline, groups)
    res.update({"target": engine.target.name, "draft": getattr(engine.draft, "name_or_path", None),
                "device": str(engine.device), "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "min_p": args.min_p, "max_new_tokens": args.max_new_tokens,
                "chat": chat})
    print(f"tau (acceptance length): {res['accept_length']:.3f}   acceptance rate: {res['accept_rate']:.3f}")
    if warning := nothing_accepted(res):
        print(warning, file=sys.stderr)
    print(f"accepted per position: {res['accepted_per_position']}  (over {res['drafts']} verify steps)")
    print(f"{res['output_tokens']} tokens at {res['tokens_per_s']:.1f} tok/s"
          + (f"; baseline {res['baseline_tokens_per_s']:.1f} tok/s, speedup {res['speedup']:.2f}x"
             if args.baseline else ""))
    if "per_category" in res:
        print(category_table(res["per_category"]))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(res, indent=2) + "\n")
    return 0
