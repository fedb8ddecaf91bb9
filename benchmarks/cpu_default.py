#!/usr/bin/env python3
"""What speculation costs and earns on this CPU: the figures behind eyas serve's CPU default (issue 31).

    OMP_NUM_THREADS=1 python benchmarks/cpu_default.py --out benchmarks/results/cpu-default-smollm2.json

One process, the target and the shipped draft loaded once, every setting sharing them:

    verify cost   one target forward of k new tokens (k = 1, 2, 4, 6, 16, 32) over a chat prompt's context,
                  relative to k = 1: the price of checking k - 1 draft tokens (median of ``--reps``, the
                  k's interleaved so a busy machine slows them alike)
    settings      greedy generation of ``--num-prompts`` chat prompts x ``--max-tokens`` with no speculation,
                  chains 3/1/4 and 5/1/6, trees 4/4/16 and 6/8/32, and auto (adaptive); per prompt the
                  settings run one after the other (side by side), the order rotating per prompt: tokens/s,
                  tau, seconds per step; medians over prompts, and each setting's speedup over no speculation
                  per prompt, then the median
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import torch

try:
    from eyas.common.prompts import prompt_set
except ImportError:  # before the move to eyas.common
    from eyas.bench.prompts import prompt_set
from eyas.config import Algorithm, SpecConfig, setting_name
from eyas.engine.engine import Engine
from eyas.models import kv_cache
from eyas.pipeline import EngineArgs, build_engine
from eyas.sample.sampling import SamplingParams

SETTINGS = ["0", "3,1,4", "5,1,6", "4,4,16", "6,8,32", "auto"]


def spec_of(name: str) -> SpecConfig:
    if name == "0":
        return SpecConfig(Algorithm.NONE)
    if name == "auto":
        return SpecConfig.auto()
    return SpecConfig(Algorithm.EAGLE3, *(int(x) for x in name.split(",")))


@torch.inference_mode()
def verify_costs(engine: Engine, ids: list[int], ks: list[int], reps: int) -> dict:
    """Median ms of one target forward of k new tokens after ``ids`` (causal among them), per k."""
    seq = engine.new_sequence(ids, SamplingParams(max_new_tokens=1 << 20))
    batch = engine.prefill_all([seq])
    cache, lengths = batch.target_cache, batch.lengths
    slots = cache.num_slots()
    times = {k: [] for k in ks}
    for _ in range(reps + 1):
        for k in ks:
            tokens = torch.randint(0, engine.target.info.vocab_size, (1, k))
            causal = torch.ones(k, k, dtype=torch.bool).tril()[None]
            mask = kv_cache.attention_mask(lengths, slots, causal, engine.target.dtype)
            positions = lengths[:, None] + torch.arange(k)[None]
            start = time.perf_counter()
            engine.target.forward(tokens, positions, mask, cache, capture=True)
            times[k].append((time.perf_counter() - start) * 1e3)
            cache.crop(slots)
    ms = {k: statistics.median(t[1:]) for k, t in times.items()}
    return {str(k): {"ms": round(ms[k], 2), "vs_1": round(ms[k] / ms[ks[0]], 2)} for k in ks}


@torch.inference_mode()
def step_costs(plain: Engine, drafting: Engine, ids: list[int], reps: int) -> dict:
    """Median ms of one decode step: plain decoding (no draft loaded), a step without speculation in an
    engine that has a draft (the root verified alone, the draft still fed: what auto's no-speculation
    steps cost), and a chain of one draft token (1/1/2)."""
    out = {}
    for name, engine, spec in (("none_no_draft", plain, None), ("none_draft_fed", drafting, spec_of("0")),
                               ("chain_1_1_2", drafting, None)):
        seq = engine.new_sequence(ids, SamplingParams(max_new_tokens=1 << 20, ignore_eos=True))
        batch = engine.prefill_all([seq])
        times = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            engine.step(batch, spec)
            times.append((time.perf_counter() - start) * 1e3)
        out[name] = round(statistics.median(times[1:]), 2)
    return out


@torch.inference_mode()
def generate(engine: Engine, ids: list[int], max_tokens: int) -> dict:
    seq = engine.new_sequence(ids, SamplingParams(max_new_tokens=max_tokens))
    start = time.perf_counter()
    batch = engine.prefill_all([seq])
    prefill = time.perf_counter() - start
    steps = 0
    while not seq.finished:
        engine.step(batch)
        steps += 1
    seconds = time.perf_counter() - start
    n = len(seq.output_ids)
    return {"tokens": n, "seconds": seconds, "tok_s": n / seconds, "steps": steps,
            "step_ms": (seconds - prefill) / steps * 1e3, "tau": (n - 1) / steps if steps else 1.0,
            "output": seq.output_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ks", default="1,2,4,6,16,32")
    ap.add_argument("--settings", default=";".join(SETTINGS), help="';'-separated: 0, STEPS,TOPK,TOKENS, auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    base = build_engine(EngineArgs(device="cpu", speculative_batch_schedule="auto"))
    load_s = time.perf_counter() - t0
    target, draft, path = base.target, base.draft, base.draft_path
    tok = target.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p in prompt_set("chat")[: args.num_prompts]]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
    names = args.settings.split(";")
    engines = {}
    for name in names:
        spec = spec_of(name)
        engines[name] = base if name == "auto" else Engine(target, draft if spec.speculative else None, spec,
                                                           draft_path=path if spec.speculative else None)
    ks = [int(k) for k in args.ks.split(",")]
    verify = verify_costs(engines["0"], prompts[0], ks, args.reps)
    print("verify cost (ms, vs k=1):", verify, flush=True)
    step = step_costs(engines["0"], Engine(target, draft, spec_of("1,1,2"), draft_path=path), prompts[0], args.reps)
    print("step ms:", step, flush=True)
    runs = {name: [] for name in names}
    for i, ids in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            r = generate(engines[name], ids, args.max_tokens)
            runs[name].append(r)
            print(f"prompt {i} {name:7s} {r['tokens']:3d} tok {r['tok_s']:6.1f} tok/s tau {r['tau']:.2f} "
                  f"step {r['step_ms']:.1f} ms", flush=True)
    ref = [r["output"] for r in runs["0"]]
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "tok_s_median": round(statistics.median(r["tok_s"] for r in rs), 2),
            "tau_median": round(statistics.median(r["tau"] for r in rs), 3),
            "tau_overall": round(sum(r["tokens"] - 1 for r in rs) / sum(r["steps"] for r in rs), 3),
            "step_ms_median": round(statistics.median(r["step_ms"] for r in rs), 2),
            "speedup_median": round(statistics.median(r["tok_s"] / b["tok_s"] for r, b in zip(rs, runs["0"])), 3),
            "outputs_equal_none": [r["output"] for r in rs] == ref,
        }
    if base.chooser is not None:
        summary["auto"]["steps_per_setting"] = {setting_name(s): n for s, n in base.chooser.steps.items()}
        summary["auto"]["tau_estimates"] = {setting_name(s): round(base.chooser.tau(s), 3)
                                            for s in base.chooser.options}
    for name, s in summary.items():
        print(f"{name:7s} {s}", flush=True)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                                text=True).stdout.strip()
        result = {
            "what": "SmolLM2-135M-Instruct + shipped EAGLE-3 draft on the CPU, batch 1, greedy, chat prompts: "
                    "verify cost per k and tok/s per setting, side by side",
            "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python benchmarks/cpu_default.py "
                       + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
            "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": {"cpus": torch.get_num_threads(), "processor": platform.processor() or platform.machine(),
                        "torch": torch.__version__, "python": platform.python_version()},
            "draft": path, "load_s": round(load_s, 1),
            "verify_cost": verify, "step_ms": step,
            "settings": summary,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
