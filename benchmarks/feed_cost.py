#!/usr/bin/env python3
"""What keeping the draft fed costs a plain step, in-process: NONE against an engine that never speculates but
feeds the draft, each draft feed interval (``EngineConfig.draft_feed_interval``: 1 feeds every step, 8 gives the
draft eight plain steps' tokens at once, ``engine/feed.py``), side by side in one process.

    python benchmarks/feed_cost.py --model-path M [--draft D] --rows 16,64 --intervals 1,8 [--temperature 0.7
        --top-p 0.95] --out feed-cost.json

Each engine is built like ``eyas serve``'s (CUDA graphs captured, the same KV-cache share each), the fed ones
with the schedule ``4096:0;4097:3,1,4`` (no speculation up to 4,096 rows). At each row count, rows of chat
prompts decode for ``--steps`` steps, each launched before the last is collected (the server's overlap
schedule), the engines in turn, ``--repeats`` times; the figure is tokens per second, its median, and each fed
engine's median ratio to NONE over the repeats (each ratio taken within one repeat).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import chat_prompts, write

from eyas.config import Algorithm, SpecConfig, parse_schedule
from eyas.engine.engine import Engine
from eyas.pipeline import EngineArgs, build_engine
from eyas.sample.sampling import SamplingParams

SCHEDULE = "4096:0;4097:3,1,4"


def tokens_per_s(engine: Engine, prompts: list[list[int]], rows: int, steps: int, params: SamplingParams) -> float:
    """Rows decoding ``steps`` overlapped steps after ten untimed ones; the caches emptied after."""
    batch = engine.prefill_all([engine.new_sequence(prompts[i % len(prompts)], params) for i in range(rows)])
    step = engine.launch(batch)
    for i in range(10 + steps):
        if i == 10:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
        ahead = engine.launch(batch, ahead=True)
        engine.collect(step)
        step = ahead if ahead is not None else engine.launch(batch)
    engine.collect(step)
    seconds = time.perf_counter() - start
    if engine.static:
        engine._reset_pools()
    return rows * steps / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--draft", default=None, help="draft folder or shipped name (default: the target's shipped one)")
    ap.add_argument("--rows", default="16,64")
    ap.add_argument("--intervals", default="1,8")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.0, help="the rows' (default 0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mem-fraction-static", type=float, default=None,
                    help="the first engine's (the others take 40%% of what is then free, as a bare serve does)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    first = build_engine(EngineArgs(model_path=args.model_path, speculative_algorithm="EAGLE3",
                                    speculative_draft_model_path=args.draft, speculative_batch_schedule=SCHEDULE,
                                    max_batch=max(rows), mem_fraction_static=args.mem_fraction_static),
                         warm_up=False)
    spec = SpecConfig(Algorithm.EAGLE3, schedule=parse_schedule(SCHEDULE))
    engines = {"NONE": Engine(first.target, None, SpecConfig(Algorithm.NONE), config=first.config)}
    for i in (int(x) for x in args.intervals.split(",")):
        engines[f"fed, interval {i}"] = Engine(first.target, first.draft, spec, draft_path=first.draft_path,
                                               config=first.config.with_(draft_feed_interval=i))
    for e in engines.values():
        print(e.warm_up(progress=False), flush=True)
    prompts = chat_prompts(first.target.tokenizer)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=1 << 20, ignore_eos=True)
    results = []
    for r in rows:
        runs = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name, e in engines.items():
                runs[name].append(tokens_per_s(e, prompts, r, args.steps, params))
        level = {"rows": r, "tokens_per_s": {n: round(statistics.median(v), 1) for n, v in runs.items()},
                 "runs": {n: [round(x, 1) for x in v] for n, v in runs.items()},
                 "over_none": {n: round(statistics.median(a / b for a, b in zip(v, runs["NONE"])), 3)
                               for n, v in runs.items() if n != "NONE"}}
        print(f"{r} rows: " + ", ".join(f"{n} {t:.0f} tok/s" for n, t in level["tokens_per_s"].items())
              + "; over NONE: " + ", ".join(f"{n} {x:.3f}x" for n, x in level["over_none"].items()), flush=True)
        results.append(level)
    if args.out:
        write(args.out, "plain steps that feed the draft against NONE, in-process, per draft feed interval",
              {"settings": vars(args), "results": results})


if __name__ == "__main__":
    main()
