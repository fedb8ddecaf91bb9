#!/usr/bin/env python3
"""Where a speculative step's time goes: draft tree, target verify, acceptance + commit, draft extend.

    python benchmarks/step_profile.py --model-path /tmp/smollm2.gguf --specs 6,8,48 5,1,6 --by-parts \
        --out step-profile.json

Two passes per setting over the same prompts at batch 1: one untouched (the step's real time), and
one with the device synchronised around each of the engine's phases (``eyas/engine/phases.py``:
``timed_by``), so each phase's time is its own, host and device together (the sum exceeds the untouched
step by the lost overlap). The plain decode step is timed the same way as the baseline. A step replayed
whole from one CUDA graph has no parts to time (only ``step`` and ``finish``): ``--by-parts`` runs every
step by parts. A prefill's own phases are keyed ``prefill/<phase>``.

Wall clock rather than ``torch.profiler`` (``kernel_profile.py`` reads the device's timeline of the same
phases): the profiler records every op on the host, which inflates the host's share of each phase.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from common import chat_prompts, load_pair, sync, write

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine.phases import timed_by
from eyas.sample.sampling import SamplingParams


class Synced:
    """A ``timed_by`` timer: each phase's seconds with the device synchronised before and after it."""

    def __init__(self):
        self.seconds = defaultdict(list)
        self.within = ""  # "prefill/" inside a prefill

    @contextmanager
    def __call__(self, name: str):
        key = self.within + name
        if name == "prefill":
            self.within = "prefill/"
        sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.seconds[key].append(time.perf_counter() - t0)
            if name == "prefill":
                self.within = ""


def step_ms(engine: Engine, prompts, new_tokens: int) -> tuple[float, int]:
    """Median milliseconds per step and the steps run, over every prompt's decode."""
    times, steps = [], 0
    for p in prompts:
        batch = engine.prefill([engine.new_sequence(p, SamplingParams(max_new_tokens=new_tokens))])
        while not batch.seqs[0].finished:
            sync()
            t0 = time.perf_counter()
            engine.step(batch)
            sync()
            times.append(time.perf_counter() - t0)
            steps += 1
    return statistics.median(times) * 1e3, steps


def phases(engine: Engine, prompts, new_tokens: int) -> dict:
    timer = Synced()
    with timed_by(timer):
        total, _ = step_ms(engine, prompts, new_tokens)
    out = {name: round(statistics.median(v) * 1e3, 3) for name, v in timer.seconds.items()}
    out["step_synced"] = round(total, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--specs", nargs="+", default=["6,8,48", "5,1,6"])
    ap.add_argument("--max-batch", type=int, default=1,
                    help="rows the engine's KV cache and graphs are built for (eyas serve: 32, eval: 64)")
    ap.add_argument("--by-parts", action="store_true",
                    help="run every step by parts (no whole-step graph), so each part is timed")
    ap.add_argument("--out", default="benchmarks/results/step-profile-smollm2.json")
    args = ap.parse_args()

    target, draft = load_pair(args.model_path, args.draft, device=args.device)
    prompts = chat_prompts(target.tokenizer, args.prompts, args.num_prompts)
    rows = {}
    for text in ["none", *args.specs]:
        spec = SpecConfig("NONE") if text == "none" else SpecConfig("EAGLE3", *(int(x) for x in text.split(",")))
        engine = Engine(target, None if text == "none" else draft, spec, max_batch=args.max_batch,
                        whole_step_graphs=not args.by_parts)
        engine.warm_up(progress=False)
        ms, steps = step_ms(engine, prompts, args.new_tokens)
        row = {"step_ms": round(ms, 3), "steps": steps, "phases_ms": phases(engine, prompts, args.new_tokens)}
        rows[text] = row
        print(f"{text:>8}: step {row['step_ms']:.3f} ms  phases (synced) {row['phases_ms']}")
    write(args.out, "one speculative step's phases at batch 1 (median ms; phases timed with the device synchronised)",
          {"settings": vars(args), "steps": rows})


if __name__ == "__main__":
    main()
