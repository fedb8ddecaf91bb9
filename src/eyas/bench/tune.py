"""``eyas tune``: which speculation settings pay on this machine, at each batch size, measured.

    eyas tune --device cuda --batch-sizes 1,4,16,64
    eyas tune --model-path ./t --speculative-draft-model-path ./d --candidates 3,1,4 5,1,6 5,4,16

For every batch size it runs the same prompts, that many at a time, without speculation and with
each candidate ``num_steps,eagle_topk,num_draft_tokens``, end to end through the engine (graphs, drafting,
verification, acceptance: everything a server pays), and recommends the fastest, or no
speculation where none beats it. Verification gets dearer as batch x tree grows while acceptance
stays the same, so the best tree shrinks as the batch grows; how fast it shrinks depends on the
machine (on a 2-core CPU even a chain of 3 rarely pays), which is why this measures instead of
assuming. ``--json-out`` keeps the table; the recommended flags are printed per batch size, and
all of them as one ``--speculative-batch-schedule`` to paste into ``eyas serve``.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from ..checks import check_spec
from ..config import Algorithm, SpecConfig, format_schedule
from ..errors import EyasError
from ..pipeline import add_engine_arguments, engine_args_from
from .cli import level_list

CANDIDATES = ["3,1,4", "5,1,6", "4,2,8", "5,4,16", "6,8,32", "6,8,48"]


def parse_candidate(text: str) -> SpecConfig:
    try:
        steps, topk, tokens = (int(x) for x in text.split(","))
    except ValueError:
        raise EyasError(f"candidate {text!r} is not num_steps,eagle_topk,num_draft_tokens", "e.g. 5,4,16") from None
    return SpecConfig(Algorithm.EAGLE3, steps, topk, tokens)


def measure(engine, prompts: list[list[int]], new_tokens: int, batch: int) -> dict:
    """Tokens/s over all ``prompts``, run ``batch`` at a time (same length outputs), timed on the
    second of two identical passes: the first captures every graph bucket the run reaches (a longer
    prompt crossing an attention-window bucket mid-run would otherwise put captures inside the
    timing). Every batch size sees the same prompts, so acceptance is compared like for like: one
    prompt alone at batch 1 says little about a draft's acceptance on the rest."""
    from ..engine.stats import SpecStats
    from ..sample.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    for chunk in chunks:
        engine.generate(chunk, params)
    tokens, seconds, stats = 0, 0.0, SpecStats()
    for chunk in chunks:
        outs = engine.generate(chunk, params)
        tokens += sum(len(o.output_ids) for o in outs)
        seconds += outs[0].seconds
        for o in outs:
            stats.add(o.stats)
    row = {"tok_s": round(tokens / seconds, 2), "seconds": round(seconds, 4), "prompts": len(prompts)}
    if engine.spec.speculative:
        row["tau"] = round(stats.accept_length, 3)
    return row


def sweep(target, draft, prompts: list[list[int]], batch_sizes: list[int], candidates: list[SpecConfig],
          new_tokens: int, cuda_graphs: bool = True, log=print) -> list[dict]:
    """Every batch size runs the same prompts in batches of its size: the set, repeated to a
    multiple of the largest batch size (so that no batch runs short)."""
    from ..engine.engine import Engine

    most = max(batch_sizes)
    total = -(-max(len(prompts), most) // most) * most
    work = [prompts[i % len(prompts)] for i in range(total)]
    rows = []
    for b in batch_sizes:
        base = _run(lambda b=b: Engine(target, None, SpecConfig(Algorithm.NONE), max_batch=b,
                                       cuda_graphs=cuda_graphs), work, new_tokens, b)
        log(f"batch {b:>3}  baseline        {base['tok_s']:>9.1f} tok/s")
        cands = []
        for spec in candidates:
            r = _run(lambda b=b, spec=spec: Engine(target, draft, spec, max_batch=b, cuda_graphs=cuda_graphs),
                     work, new_tokens, b)
            r.update(spec=_label(spec), speedup=round(r["tok_s"] / base["tok_s"], 3))
            cands.append(r)
            log(f"batch {b:>3}  {_label(spec):<15} {r['tok_s']:>9.1f} tok/s  tau {r['tau']:.2f}  {r['speedup']:.2f}x")
        # a draft that accepted nothing (tau 1.00) emits a token a step at a draft's cost: it cannot pay, and a
        # figure that says otherwise is noise (a short run, a busy machine): never recommended
        paying = [r for r in cands if r["tau"] > 1.0 and r["tok_s"] > base["tok_s"]]
        best = max(paying, key=lambda r: r["tok_s"], default=None)
        rows.append({"batch": b, "baseline": base, "candidates": cands, "best": best["spec"] if best else "NONE",
                     "best_speedup": best["speedup"] if best else 1.0})
    return rows


def _run(make, prompts, new_tokens, batch) -> dict:
    engine = make()
    try:
        return measure(engine, prompts, new_tokens, batch)
    finally:
        del engine
        gc.collect()  # the caches and their graphs hold device memory until collected
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure which tree settings pay at each batch size on this machine",
                       description=__doc__.split("\n\n")[2].replace("\n", " "))
    add_engine_arguments(p)
    g = p.add_argument_group("tuning")
    g.add_argument("--batch-sizes", default="1,4,16", type=level_list("--batch-sizes"),
                   help="comma-separated batch sizes (default 1,4,16)")
    g.add_argument("--candidates", nargs="+", default=CANDIDATES,
                   help=f"num_steps,eagle_topk,num_draft_tokens settings to try (default {' '.join(CANDIDATES)})")
    g.add_argument("--prompts", default="chat", help="chat, code, reasoning, all, or a .jsonl file (default chat)")
    g.add_argument("--num-prompts", type=int, default=None,
                   help="the first N prompts of the set (default all); every batch size runs the same ones")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request (default 64)")
    g.add_argument("--json-out", default=None, help="write the measurements as JSON here")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..common.outputs import check_output_file
    from ..common.prompts import chat_ids, prompt_set
    from ..pipeline import build_engine
    from .cli import parse_levels

    sizes = parse_levels(args.batch_sizes, "--batch-sizes")
    if args.json_out:  # before the sweep, not after it
        check_output_file(args.json_out, "--json-out", "tune.json")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise EyasError(f"--num-prompts must be at least 1, got {args.num_prompts}", "e.g. --num-prompts 16")
    if args.max_new_tokens < 2:  # the first token comes from the prefill: no step to time below two
        raise EyasError(f"--max-new-tokens must be at least 2, got {args.max_new_tokens}", "e.g. --max-new-tokens 64")
    candidates = [parse_candidate(c) for c in args.candidates]
    ns = engine_args_from(args)
    ns.max_batch = max(sizes)
    print("loading ...", file=sys.stderr, flush=True)
    engine = build_engine(ns, warm_up=False)
    if engine.draft is None:
        raise EyasError(f"nothing to tune: no draft is given or shipped for {args.model_path!r}",
                        "pass --speculative-draft-model-path DRAFT")
    for spec in candidates:
        check_spec(spec, engine.target.info, engine.draft, engine.draft_path, engine.target.aux_layer_ids)
    target, draft = engine.target, engine.draft
    del engine
    ids = [chat_ids(target.tokenizer, p) for p in prompt_set(args.prompts)[:args.num_prompts]]
    rows = sweep(target, draft, ids, sizes, candidates, args.max_new_tokens, ns.cuda_graphs,
                 log=lambda s: print(s, file=sys.stderr, flush=True))
    print()
    for r in rows:
        flags = "--speculative-algorithm NONE" if r["best"] == "NONE" else _flags(r["best"])
        print(f"batch {r['batch']:>3}: {flags}   ({r['best_speedup']:.2f}x over no speculation)")
    schedule = recommend_schedule(rows)
    print("all batch sizes: " + (f"--speculative-batch-schedule '{schedule}'" if schedule
                                 else "--speculative-algorithm NONE (no setting beat plain decoding)"))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump({"target": target.name, "device": str(target.device), "max_new_tokens": args.max_new_tokens,
                       "batches": rows, "schedule": schedule}, f, indent=1)
    return 0


def recommend_schedule(rows: list[dict]) -> str | None:
    """The winners as ``--speculative-batch-schedule`` text (a batch size between two measured ones
    gets the larger one's, the smaller tree); None when no batch size gains from speculation."""
    entries: list[tuple[int, SpecConfig]] = []
    for r in sorted(rows, key=lambda r: r["batch"]):
        spec = SpecConfig(Algorithm.NONE) if r["best"] == "NONE" else parse_candidate(r["best"])
        if entries and entries[-1][1] == spec:
            entries.pop()  # the same setting as the batch size below: one entry covers both
        entries.append((r["batch"], spec))
    return format_schedule(entries) if any(s.speculative for _, s in entries) else None


def _label(spec: SpecConfig) -> str:
    return f"{spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens}"


def _flags(spec: str) -> str:
    steps, topk, tokens = spec.split(",")
    return (f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} "
            f"--speculative-num-draft-tokens {tokens}")
