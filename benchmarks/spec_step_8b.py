#!/usr/bin/env python3
"""A whole speculative step at 8B shape, against the plain step, and the speedup it would give.

    python benchmarks/spec_step_8b.py --out benchmarks/results/spec-step-8b-h200.json

For a random-weight Llama-3.1-8B-shaped target and a Qwen3-8B-shaped one, each with a random
8B-shaped EAGLE-3 draft (one layer, fc 3 x 4096 -> 4096, a 32,000-token draft vocabulary), at each
tree setting and batch size: the median milliseconds of ``Engine.step`` (tree drafting, verify,
acceptance, commit and draft extend, as the engine runs them: one captured graph a step) over
contexts of ``--context`` tokens, the plain step (NONE) in the same run, and the speedup each
setting would give at tau 3, 4 and 5: ``tau x plain step / speculative step``. Random weights accept
nothing, so this measures what a step costs; what it accepts is the trained draft's business.

``--profile-steps N`` then records N more steps of each setting at the first batch size with
``torch.profiler`` and keeps ``kernel_profile.analyse``'s reading of the device's timeline: kernels a step,
busy and span milliseconds, and the kernels that take the time (where a step beyond the plain one goes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from dataclasses import replace

import torch
from common import llama31_8b_config, qwen3_8b_config, random_model, sync, write

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.draft import Eagle3Draft
from eyas.models.kernel_choice import CHOICES
from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget
from eyas.models.target import Target
from eyas.sample.sampling import SamplingParams

SHAPES = {"llama-3.1-8b": llama31_8b_config, "qwen3-8b": qwen3_8b_config}


def step_ms(engine: Engine, batch_size: int, context: int, steps: int, vocab: int,
            profile_steps: int = 0) -> tuple[float, float, dict | None]:
    """Median milliseconds of one step over ``batch_size`` rows of ``context`` random tokens, the tokens each
    row gained a step, and (``profile_steps`` > 0) the device timeline of that many more steps."""
    gen = torch.Generator().manual_seed(batch_size)
    params = SamplingParams(max_new_tokens=steps * (engine.tree_size + 1) + 8, ignore_eos=True)
    seqs = [engine.new_sequence(torch.randint(0, vocab, (context,), generator=gen).tolist(), params)
            for _ in range(batch_size)]
    batch = engine.prefill(seqs)
    for _ in range(3):
        engine.step(batch)
    before = sum(len(s.output_ids) for s in batch.seqs)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        engine.step(batch)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    gained = (sum(len(s.output_ids) for s in batch.seqs) - before) / (steps * batch_size)
    return statistics.median(times), gained, profiled(engine, batch, profile_steps) if profile_steps else None


def profiled(engine: Engine, batch, steps: int) -> dict:
    """``kernel_profile.analyse`` of ``steps`` steps of ``batch``: kernels, busy and span ms a step, top kernels."""
    from kernel_profile import analyse
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step(batch)
        sync()
    path = f"/tmp/spec-step-8b-trace-{time.monotonic_ns()}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    out = analyse(trace, steps)
    out["top_kernels"] = out["top_kernels"][:15]
    return out


def measure(shape: str, model, args, kernels: KernelSettings) -> dict:
    """Every setting's step for one target ``model`` (an HF causal LM of the shape named ``shape``), the
    engine's kernels under ``kernels``."""
    base = Target(model, name=f"{shape}-shape")
    target = NativeTarget.from_target(base)
    target.info = type(target.info)(**{**target.info.__dict__, "max_context": args.context_limit})
    draft = Eagle3Draft.for_target(base, draft_vocab_size=args.draft_vocab)
    vocab = target.info.vocab_size
    rows, plain = {}, {}
    for text in ["none", *args.specs]:
        spec = SpecConfig("NONE") if text == "none" else SpecConfig("EAGLE3", *(int(x) for x in text.split(",")))
        start = time.perf_counter()
        engine = Engine(target, None if text == "none" else draft, spec, max_batch=max(args.batches), kernels=kernels)
        warm = engine.warm_up(progress=False)
        built = time.perf_counter() - start
        with torch.inference_mode():
            for i, b in enumerate(args.batches):
                ms, gained, prof = step_ms(engine, b, args.context, args.steps, vocab, args.profile_steps * (i == 0))
                row = {"step_ms": round(ms, 3), "tokens_per_row_per_step": round(gained, 3)}
                if prof is not None:
                    row["profile"] = prof
                if text == "none":
                    plain[b] = ms
                else:
                    row["plain_steps"] = round(ms / plain[b], 3)
                    row["speedup_at_tau"] = {str(t): round(t * plain[b] / ms, 3) for t in args.taus}
                rows[f"{text} batch {b}"] = row
                print(f"{shape} {text:>7} batch {b}: {ms:.3f} ms a step" +
                      (f" = {row['plain_steps']:.2f} plain steps, speedup at tau "
                       + ", ".join(f"{t}: {v:.2f}x" for t, v in row["speedup_at_tau"].items())
                       if text != "none" else ""), flush=True)
        rows[f"{text} build"] = {"seconds": round(built, 1), "warm_up": warm}
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    del base, target, draft
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/spec-step-8b.json")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--specs", nargs="+", default=["4,4,16", "6,8,32", "5,1,6"],
                    help="num_steps,eagle_topk,num_draft_tokens settings")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=512, help="prompt tokens each row holds before timing")
    ap.add_argument("--context-limit", type=int, default=2048, help="the engine's context length (sizes the cache)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--taus", type=float, nargs="+", default=[3.0, 4.0, 5.0])
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="then profile this many steps of each setting at the first batch size (default 0: none)")
    ap.add_argument("--default-kernels", action="store_true",
                    help="the built-in kernel choice for every shape, none timed (the comparison run)")
    args = ap.parse_args()
    kernels = replace(KernelSettings.from_env(), measure=not args.default_kernels)
    results = {shape: measure(shape, random_model(SHAPES[shape]()), args, kernels) for shape in args.shapes}
    write(args.out, "a whole speculative step at 8B shape against the plain step (median ms, random weights)", {
        "settings": vars(args), "kernels": CHOICES.summary() or "built-in defaults, none timed",
        "kernel_choices": dict(CHOICES.picks), "kernel_timings_us": CHOICES.timings, "steps": results,
    })


if __name__ == "__main__":
    main()
