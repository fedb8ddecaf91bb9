#!/usr/bin/env python3
"""(b) The verify-cost curve: one target forward of k new tokens over a context, relative to k = 1.

    python benchmarks/verify_cost.py --out results/verify-cost-8b.json                # Llama-3.1-8B shape
    python benchmarks/verify_cost.py --shape qwen3-8b --out ...                         # Qwen3-8B shape
    python benchmarks/verify_cost.py --model-path smollm2-135m-instruct --out ...     # a real model

The forward is the one speculation verifies with: eyas's native path on its static KV cache, aux
states captured, replayed from a CUDA graph (and eagerly, for comparison), milliseconds per call
synchronised, median of ``--reps``. The mask lets every new token see the whole context (the
cost of a tree mask is the same). ``--kernels default measured`` runs the curve twice, side by
side: the projections' built-in kernel choice, then each shape's fastest as timed on this GPU
(``eyas.models.kernel_choice``, what the engine runs).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from common import llama31_8b_config, qwen3_8b_config, random_model, summary, time_ms, write

from eyas.models.kernel_choice import CHOICES
from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget, PoolPlan
from eyas.models.target import Target


def curve(target: NativeTarget, contexts: list[int], ks: list[int], reps: int, graphs: bool,
          kernels: KernelSettings) -> dict:
    per_slot = target.bytes_per_slot()
    plan = PoolPlan(1, max(contexts) + 2 * max(ks), (max(contexts) + 2 * max(ks)) * per_slot)
    pool, runner = target.new_pool(plan, [1], ks, graphs, capture_aux=True, kernels=kernels)  # held: its graphs
    pool.hold(1)
    dev, vocab = target.device, target.info.vocab_size
    out = {}
    for ctx in contexts:
        rows = {}
        for k in ks:
            ids = torch.randint(0, vocab, (1, k), device=dev)
            pos = (ctx + torch.arange(k, device=dev))[None]
            mask = torch.zeros((1, 1, k, ctx + k), dtype=target.dtype, device=dev)

            def step(ctx=ctx, ids=ids, pos=pos, mask=mask):
                pool.crop(ctx)
                target.forward(ids, pos, mask, pool)

            rows[k] = summary(time_ms(step, reps=reps, warmup=3))
        base = rows[ks[0]]["median"]
        out[str(ctx)] = {str(k): {**v, "relative": round(v["median"] / base, 3)} for k, v in rows.items()}
        print(f"context {ctx} ({'graphs' if graphs else 'eager'}): " +
              ", ".join(f"k={k} {v['median']:.3f} ms ({v['median'] / base:.2f}x)" for k, v in rows.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/verify-cost-8b.json")
    ap.add_argument("--model-path", default=None, help="a real target (default: random Llama-3.1-8B shape)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shape", choices=["llama-3.1-8b", "qwen3-8b"], default="llama-3.1-8b",
                    help="the random-weight target's shape (without --model-path)")
    ap.add_argument("--kernels", nargs="+", choices=["default", "measured"], default=["measured"],
                    help="the projections' kernels: built in, or chosen by timing on this GPU (both: side by side)")
    args = ap.parse_args()

    if args.model_path:
        from eyas.models.loading import load_target

        base = load_target(args.model_path, device="cuda", dtype="bfloat16")
        name = args.model_path
    else:
        config = llama31_8b_config() if args.shape == "llama-3.1-8b" else qwen3_8b_config()
        base = Target(random_model(config), name=f"{args.shape}-shape")
        name = f"{args.shape} shape, random bf16 weights"
    target = NativeTarget.from_target(base)
    results, k16 = {}, {}
    for kernels in args.kernels:
        print(f"projection kernels: {kernels}")
        CHOICES.picks = {}  # each run chooses afresh, not from the one before it
        settings = replace(KernelSettings.from_env(), measure=kernels == "measured")
        with torch.inference_mode():
            modes = ("graphs", "eager") if kernels == args.kernels[-1] else ("graphs",)
            results[kernels] = {mode: curve(target, args.contexts, args.ks, args.reps, mode == "graphs", settings)
                                for mode in modes}
        k16[kernels] = {ctx: results[kernels]["graphs"][str(ctx)].get("16", {}).get("relative")
                        for ctx in args.contexts}
    write(args.out, f"verify cost of k new tokens, {name}, batch 1", {
        "settings": vars(args), "ms": results, "k16_over_k1_graphs": k16,
        "kernel_choices": dict(CHOICES.picks), "kernel_timings_us": CHOICES.timings,
    })


if __name__ == "__main__":
    main()
