#!/usr/bin/env python3
"""What a step costs inside an ``auto`` engine, in-process: each setting run alone, and in the pattern of the
chooser's refreshes, against an engine without a draft, side by side in one process.

    python benchmarks/switch_cost.py --model-path /tmp/smollm2.gguf --rows 1,16,64 --temperatures 0,1 \
        --setting 3,1,4 --out switch-cost.json

``auto``'s chooser times each step as the time between two read-backs (``Engine.collect``), steps launched
ahead as the server's overlap schedule runs them, and it compares a plain step of its own (which keeps the
draft's feed, ``engine/feed.py``) with its speculative ones. A served ``auto`` once timed its plain steps at
1.5-5x what a NONE server's took; this separates the engine's share from the server's: at each row count and
temperature, rows of chat prompts step ``--steps`` times (after ten untimed) as

    NONE          the engine without a draft
    auto 0        the ``auto`` engine, every step plain (its feed kept, flushed every feed interval)
    auto S        the ``auto`` engine, every step of setting S (``--setting``)
    refresh       the ``auto`` engine, S for ``--busy`` steps then four plain ones, over and over: the steps a
                  refresh times are the middle two plain ones (``refresh_plain``), and the first S after the
                  plain ones pays for the draft's catch-up (``after_plain``)

Each figure is the median gap between read-backs, in ms (and the p90). The engines are built like ``eyas serve``'s
(CUDA graphs captured where there is a GPU); ``auto``'s own chooser is not consulted (each step's setting is given).
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import chat_prompts, write

from eyas.config import Algorithm, SpecConfig, setting_name
from eyas.engine.engine import Engine
from eyas.pipeline import EngineArgs, build_engine
from eyas.sample.sampling import SamplingParams


def gaps(engine: Engine, prompts: list[list[int]], rows: int, pattern: list, params: SamplingParams,
         warm: int = 10) -> list[tuple[int, str, float]]:
    """(position in ``pattern``, setting, ms since the last read-back) of each step, steps launched ahead."""
    batch = engine.prefill_all([engine.new_sequence(prompts[i % len(prompts)], params) for i in range(rows)])
    out, last = [], None
    step = engine.launch(batch, pattern[0])
    for i in range(1, warm + len(pattern) + 1):
        setting = pattern[i % len(pattern)]
        ahead = engine.launch(batch, setting, ahead=True)
        engine.collect(step)
        now = time.perf_counter()
        if last is not None and i > warm:
            out.append(((i - 1) % len(pattern), setting_name(step.spec), 1000 * (now - last)))
        last = now
        step = ahead if ahead is not None else engine.launch(batch, setting)
    engine.collect(step)
    if engine.static:
        engine._reset_pools()
    return out


def stats(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"steps": len(ms), "median_ms": round(statistics.median(ms), 4),
            "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--draft", default=None, help="draft folder or shipped name (default: the target's shipped one)")
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--temperatures", default="0,1", help="each level's rows sample at this (0: greedy)")
    ap.add_argument("--setting", default="3,1,4", help="the speculative setting beside plain steps (one of auto's)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--busy", type=int, default=16, help="steps of the setting between refreshes")
    ap.add_argument("--context-length", type=int, default=2048)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    auto = build_engine(EngineArgs(model_path=args.model_path, speculative_algorithm="EAGLE3",
                                   speculative_draft_model_path=args.draft, speculative_batch_schedule="auto",
                                   max_batch=max(rows), context_length=args.context_length))
    none = Engine(auto.target, None, SpecConfig(Algorithm.NONE), config=auto.config)
    print(none.warm_up(progress=False), flush=True)
    options = {setting_name(s): s for s in auto.spec.options}
    if args.setting not in options:
        ap.error(f"--setting {args.setting}: auto's settings are {', '.join(options)}")
    plain, spec = options["0"], options[args.setting]
    prompts = chat_prompts(auto.target.tokenizer)
    results = []
    for t in (float(x) for x in args.temperatures.split(",")):
        params = SamplingParams(temperature=t, max_new_tokens=1 << 20, ignore_eos=True)
        for r in rows:
            level = {"rows": r, "temperature": t,
                     "NONE": stats([g for _, _, g in gaps(none, prompts, r, [none.spec] * args.steps, params)]),
                     "auto 0": stats([g for _, _, g in gaps(auto, prompts, r, [plain] * args.steps, params)]),
                     f"auto {args.setting}": stats([g for _, _, g in gaps(auto, prompts, r, [spec] * args.steps,
                                                                          params)])}
            cycle = [spec] * args.busy + [plain] * 4
            timed = gaps(auto, prompts, r, cycle * max(1, args.steps // len(cycle)), params)
            at = {k: [g for i, _, g in timed if i % len(cycle) == k] for k in range(len(cycle))}
            level["refresh_plain"] = stats(at[args.busy + 1] + at[args.busy + 2])
            level["after_plain"] = stats(at[0])
            level["refresh_busy"] = stats([g for k in range(2, args.busy) for g in at[k]])
            print(f"T {t} rows {r}: " + ", ".join(f"{k} {v['median_ms']:.3f} ms" for k, v in level.items()
                                                   if isinstance(v, dict)), flush=True)
            results.append(level)
    if args.out:
        write(args.out, "auto's steps in-process, alone and in the refresh pattern, against NONE (ms between "
              "read-backs, steps launched ahead)", {"settings": vars(args), "results": results})


if __name__ == "__main__":
    main()
