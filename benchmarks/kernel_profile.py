#!/usr/bin/env python3
"""What the GPU runs in one speculative step: kernels, their time, and the idle gaps between them.

    python benchmarks/kernel_profile.py --model-path /tmp/smollm2.gguf --specs none 6,8,48 --max-batch 1 \
        --out kernel-profile.json [--trace-dir DIR]

``step_profile.py`` times each phase with the device synchronised around it; this one leaves the step
untouched and reads the device's own timeline (``torch.profiler``, kernels inside CUDA graph replays
included): per phase, the kernels launched, the time they ran, and the wall time the phase spanned on
the device. Busy time far below the span means launch gaps (the host); busy time near it means the
kernels themselves (too many, or too slow). The phases are the engine's own profiler ranges
(``eyas/engine/phases.py``: ``eyas.step``, ``eyas.draft``, ...); a step replayed whole from one CUDA graph
shows as ``step`` and ``finish`` alone, ``--by-parts`` runs every step by parts so each part shows. On the
CPU there is no device timeline: a phase's span is its time on the host. With ``--model 8b`` the target is
the random Llama-3.1-8B shape and only plain decoding is profiled (benchmark a's forward).

A sampled step (``--temperature 0.7 --top-p 0.95``, ``--top-k``) runs the distribution's kernel
(``spec.distribution_kernel``); ``--torch-distribution`` runs the sort-based reference instead
(before/after). ``--distribution ROWS,VOCAB`` times that op alone on random logits, kernel against
reference, and exits; ``--distribution-configs`` adds the kernel at other launch configurations (one
program a row, ``BLOCKxWARPS``; or ``PROGRAMSxCANDIDATESxBLOCKxWARPS``, programs > 1 the split), the
numbers ``distribution_kernel.ROW_CONFIGS`` and ``UNFILTERED_CONFIGS`` (``--distribution-unfiltered``) take:

    python benchmarks/kernel_profile.py --distribution 1056,49152 --top-p 0.95 --top-k 50
    python benchmarks/kernel_profile.py --distribution 1,4,16,151936 --top-p 0.95 --top-k 50 \
        --distribution-configs 4096x32 {32,64,128}x{16,64,256}x{64,256}x{4,8}

Likewise the draws (``spec.draw_kernel``; ``--torch-draw`` runs the step with their torch reference):
``--draw ROWS,VOCAB`` times the op alone on random rows, kernels against reference, also at each of
``--draw-configs CHUNKSxBLOCKxWARPS``:

    python benchmarks/kernel_profile.py --draw 1,16,33,528,49152 --draw-configs 32x512x4 64x256x4
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import Counter
from pathlib import Path

import torch
from common import (
    chat_prompts,
    llama31_8b_config,
    load_draft_for,
    load_pair,
    random_model,
    smollm2_135m_config,
    sync,
    time_ms,
    write,
)
from torch.profiler import ProfilerActivity, profile

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine.phases import NAMES, PREFIX
from eyas.sample.sampling import SamplingParams


def analyse(trace: dict, steps: int) -> dict:
    """Per phase and per step: kernels, busy device ms, device span ms (the host's span on the CPU); the top
    kernels by time."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    on_device = any(e.get("cat") == "gpu_user_annotation" for e in events)
    timeline = "gpu_user_annotation" if on_device else "user_annotation"  # on the CPU, the host's
    spans = [e for e in events if e.get("cat") == timeline and e["name"].startswith(PREFIX)]
    out = {}
    for name in sorted({s["name"] for s in spans}):
        ranges = [(s["ts"], s["ts"] + s["dur"]) for s in spans if s["name"] == name]
        inside = [k for k in kernels if any(a <= k["ts"] < b for a, b in ranges)]
        out[name.removeprefix(PREFIX)] = {
            "kernels_per_step": round(len(inside) / steps, 1),
            "busy_ms_per_step": round(sum(k["dur"] for k in inside) / 1e3 / steps, 4),
            "span_ms_per_step": round(sum(b - a for a, b in ranges) / 1e3 / steps, 4),
        }
    by_name: Counter = Counter()
    count: Counter = Counter()
    for k in kernels:
        by_name[k["name"][:120]] += k["dur"]
        count[k["name"][:120]] += 1
    out["top_kernels"] = [{"name": n, "ms_per_step": round(t / 1e3 / steps, 4), "per_step": round(count[n] / steps, 1)}
                          for n, t in by_name.most_common(25)]
    if kernels:
        out["device_busy_ms_per_step"] = round(sum(k["dur"] for k in kernels) / 1e3 / steps, 4)
        span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
        out["device_span_ms_per_step"] = round(span / 1e3 / steps, 4)
        out["kernels_per_step"] = round(len(kernels) / steps, 1)
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    out["memcpy_memset_per_step"] = round(len(copies) / steps, 1)
    out["memcpy_memset_ms_per_step"] = round(sum(e["dur"] for e in copies) / 1e3 / steps, 4)
    return out


def profile_engine(engine: Engine, prompt: list[int], steps: int, trace_path: Path | None,
                   temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0) -> dict:
    params = SamplingParams(max_new_tokens=10_000, ignore_eos=True, temperature=temperature, top_p=top_p, top_k=top_k)
    seqs = [engine.new_sequence(prompt, params) for _ in range(engine.rows)]
    batch = engine.prefill(seqs)
    for _ in range(5):
        engine.step(batch)
    sync()
    before = sum(len(s.output_ids) for s in seqs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, record_shapes=False) as prof:
        for _ in range(steps):
            engine.step(batch)
        sync()
    path = trace_path or Path("/tmp/kernel-profile-trace.json")
    # tokens a row gains a step: a setting that accepts nothing (tau 1) times a step that does no work
    tau = (sum(len(s.output_ids) for s in seqs) - before) / (steps * len(seqs))
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    if trace_path is not None:
        with gzip.open(str(path) + ".gz", "wt") as f:
            json.dump(trace, f)
        path.unlink()
    return {**analyse(trace, steps), "tokens_per_row_step": round(tau, 3)}


def distribution_config(text: str):
    """``distribution_kernel.Config`` of "BLOCKxWARPS" (one program a row, the default candidates) or
    "PROGRAMSxCANDIDATESxBLOCKxWARPS"."""
    from eyas.spec import distribution_kernel

    numbers = [int(n) for n in text.split("x")]
    if len(numbers) == 2:
        numbers = [1, distribution_kernel.SPLIT, *numbers]
    if len(numbers) != 4:
        raise SystemExit(f"--distribution-configs: {text!r} is neither BLOCKxWARPS nor PROGRAMSxCANDIDATESxBLOCKxWARPS")
    return distribution_kernel.Config(*numbers)


def time_distribution(rows_list: list[int], vocab: int, temperature: float, top_p: float, top_k: int, device: str,
                      configs: list[str], filtered: bool = True) -> dict:
    """Milliseconds per call of the distribution op on [rows, vocab] random logits (every row filtered, or
    with ``filtered`` False none), for each of ``rows_list``: the torch reference (a sort where filtered) and
    the Triton kernels at the dispatch's launch and at each of ``configs`` (``distribution_config``), each
    captured in a CUDA graph and replayed as the step replays it (eagerly on the CPU)."""
    from eyas.models.kernel_settings import KernelSettings
    from eyas.spec import distribution_kernel
    from eyas.spec.ops import TORCH
    from eyas.spec.tree_kernels import SpecTritonOps

    launch = SpecTritonOps(KernelSettings(measure=False))._launch
    parsed = {c: distribution_config(c) for c in configs}
    out = {}
    for rows in rows_list:
        logits = torch.randn(rows, vocab, device=device) * 4
        floats = torch.tensor([[temperature or 1.0, top_p, 0.0]], device=device).expand(rows, 3).contiguous()
        ints = torch.tensor([[top_k, 0]], device=device).expand(rows, 2).contiguous()
        args = (logits, floats, ints, filtered)
        fns = {"torch": lambda a=args: TORCH.distribution(*a),
               "kernel": lambda a=args: distribution_kernel.distribution(launch, *a)}
        for c, config in parsed.items():
            fns[f"kernel {c}"] = lambda a=args, k=config: distribution_kernel.distribution(launch, *a, k)
        out[rows] = {name: round(statistics.median(graphed_ms(fn, device)), 4) for name, fn in fns.items()}
        print(rows, "rows:", out[rows], flush=True)
    return {"vocab": vocab, "temperature": temperature, "top_p": top_p, "top_k": top_k, "filtered": filtered,
            "default": {rows: distribution_kernel.launch_config(rows, filtered) for rows in rows_list}, "ms": out}


def time_draw(rows_list: list[int], vocab: int, device: str, configs: list[str]) -> dict:
    """Milliseconds per call of the draws (a sampled step's, ``ops.draw``) on [rows, vocab] random rows, no
    threshold: the torch reference and the kernels at their default launch and at each of ``configs``
    ("CHUNKSxBLOCKxWARPS"), each in a CUDA graph as ``graphed_ms``."""
    from eyas.models.kernel_settings import KernelSettings
    from eyas.spec import draw_kernel
    from eyas.spec.ops import TORCH
    from eyas.spec.tree_kernels import SpecTritonOps

    launch = SpecTritonOps(KernelSettings(measure=False))._launch
    out = {}
    for rows in rows_list:
        x = torch.randn(rows, vocab, device=device) * 4
        args = (x, x.amax(dim=-1), torch.full((rows,), torch.finfo(torch.float32).min, device=device),
                torch.zeros(rows, dtype=torch.bool, device=device), torch.arange(rows, device=device),
                torch.full((rows,), 100, device=device))
        fns = {"torch": lambda a=args: TORCH.draw(*a), "kernel": lambda a=args: draw_kernel.draw(launch, *a)}
        for c in configs:
            chunks, block, warps = (int(n) for n in c.split("x"))
            fns[f"kernel {c}"] = lambda a=args, s=chunks, b=block, w=warps: draw_kernel.draw(
                launch, *a, chunks=s, block=b, warps=w)
        out[rows] = {n: round(statistics.median(graphed_ms(fn, device)), 4) for n, fn in fns.items()}
        print(rows, "rows:", out[rows], flush=True)
    return {"vocab": vocab, "default": {rows: draw_kernel.chunking(rows, vocab) for rows in rows_list}, "ms": out}


def graphed_ms(fn, device: str, reps: int = 20) -> list[float]:
    """``fn``'s milliseconds per replay of a CUDA graph of it (``time_ms`` of ``fn`` itself on the CPU)."""
    if not str(device).startswith("cuda"):
        return time_ms(fn)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, reps=reps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default="smollm2-135m-instruct",
                    help="or '8b' for the random Llama-3.1-8B shape (NONE only), 'smollm2-shape' for a random SmolLM2 "
                         "shape with the shipped draft (kernels and their time, not acceptance)")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--specs", nargs="+", default=["none", "6,8,48"])
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=1, help="rows decoding together")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--torch-distribution", action="store_true",
                    help="the sampled step's distribution by the sort-based torch reference instead of its kernel")
    ap.add_argument("--distribution", default=None, metavar="ROWS[,ROWS...],VOCAB",
                    help="time the distribution op alone on [ROWS, VOCAB] logits (kernel and torch, each in a CUDA "
                         "graph) for each ROWS, then exit")
    ap.add_argument("--distribution-configs", nargs="*", default=[], metavar="[PROGRAMSxCANDIDATESx]BLOCKxWARPS",
                    help="with --distribution: the kernel also at these launch configurations, e.g. 2048x16 (one "
                         "program a row) or 64x64x256x8 (the split: 64 programs a row, 64 candidates a pass)")
    ap.add_argument("--distribution-unfiltered", action="store_true",
                    help="with --distribution: rows without top-k and top-p (the max and z passes; --top-p and "
                         "--top-k are then ignored)")
    ap.add_argument("--torch-draw", action="store_true",
                    help="the sampled step's draws by their torch reference instead of their kernels (before/after)")
    ap.add_argument("--draw", default=None, metavar="ROWS[,ROWS...],VOCAB",
                    help="time the draws alone on [ROWS, VOCAB] rows (kernels and torch, each in a CUDA graph) for "
                         "each ROWS, then exit")
    ap.add_argument("--draw-configs", nargs="*", default=[], metavar="CHUNKSxBLOCKxWARPS",
                    help="with --draw: the kernels also at these launch configurations, e.g. 32x512x4")
    ap.add_argument("--by-parts", action="store_true",
                    help="run every step by parts (no whole-step graph), so each part shows on the timeline")
    ap.add_argument("--trace-dir", default=None, help="keep each setting's chrome trace (gzipped) here")
    ap.add_argument("--out", default="benchmarks/results/kernel-profile-smollm2.json")
    args = ap.parse_args()
    if args.torch_draw:
        from eyas.spec.tree_ops import TreeOps
        from eyas.spec.verify_kernels import TritonVerifyOps

        TritonVerifyOps.draw = TreeOps.draw
    if args.draw:
        *rows, vocab = (int(n) for n in args.draw.split(","))
        result = time_draw(rows, vocab, args.device, args.draw_configs)
        if args.out:
            write(args.out, "a sampled step's draws alone, kernels against the torch reference, CUDA graphs", result)
        return
    if args.torch_distribution:  # every row count to the sort, through the dispatch's own table
        from eyas.spec import distribution_kernel

        distribution_kernel.ROW_CONFIGS = ((1 << 62, None),)
    if args.distribution:
        *rows, vocab = (int(n) for n in args.distribution.split(","))
        unfiltered = args.distribution_unfiltered
        result = time_distribution(rows, vocab, args.temperature, 1.0 if unfiltered else args.top_p,
                                   0 if unfiltered else args.top_k, args.device, args.distribution_configs,
                                   not unfiltered)
        if args.out:
            write(args.out, "the sampling distribution op alone, kernel against the sort, CUDA graphs", result)
        return

    if args.model_path in ("8b", "smollm2-shape"):
        from eyas.models.native import NativeTarget

        eight_b = args.model_path == "8b"
        config = llama31_8b_config() if eight_b else smollm2_135m_config()
        name = "llama-3.1-8b-shape" if eight_b else "smollm2-shape"
        target = NativeTarget(random_model(config, device=args.device), name=name)
        target.info = type(target.info)(**{**target.info.__dict__, "max_context": 4096})
        draft = None if eight_b else load_draft_for(target, args.draft, args.device)
        prompt = list(range(1000, 1128))
        if eight_b:
            args.specs = ["none"]
    else:
        target, draft = load_pair(args.model_path, args.draft, device=args.device)
        prompt = chat_prompts(target.tokenizer, "chat", 1)[0]
    results = {}
    for text in args.specs:
        spec = SpecConfig("NONE") if text == "none" else SpecConfig("EAGLE3", *(int(x) for x in text.split(",")))
        engine = Engine(target, None if text == "none" else draft, spec, max_batch=args.max_batch,
                        whole_step_graphs=not args.by_parts)
        engine.rows = args.rows
        engine.warm_up(progress=False)
        trace_name = f"trace-{text.replace(',', '-')}-mb{args.max_batch}.json"
        trace = Path(args.trace_dir) / trace_name if args.trace_dir else None
        if trace:
            trace.parent.mkdir(parents=True, exist_ok=True)
        results[text] = profile_engine(engine, prompt, args.steps, trace, args.temperature, args.top_p,
                                       args.top_k)
        r = results[text]
        print(f"{text:>8} max-batch {args.max_batch}: {r.get('kernels_per_step')} kernels, busy "
              f"{r.get('device_busy_ms_per_step')} ms of {r.get('device_span_ms_per_step')} ms per step; "
              f"{r['memcpy_memset_per_step']} copies/memsets, {r['memcpy_memset_ms_per_step']} ms; "
              f"{r['tokens_per_row_step']} tokens a row a step")
        for phase in NAMES:
            if phase in r:
                print(f"    {phase:>13}: {r[phase]}")
        for k in r["top_kernels"][:8]:
            print(f"      {k['ms_per_step']:.4f} ms  x{k['per_step']}  {k['name'][:90]}")
        engine = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write(args.out, "device timeline of speculative steps (torch.profiler): kernels, busy and span per phase",
          {"settings": vars(args), "results": results})


if __name__ == "__main__":
    main()
