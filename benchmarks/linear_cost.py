#!/usr/bin/env python3
"""A decode step's projections at batch 1: ``_linear_kernel`` (norm, activation and residual inside)
against what it replaces (the norm kernel, cuBLAS, the silu kernel), per shape.

    python benchmarks/linear_cost.py --out results/linear-cost.json [--sweep]

Shapes: every projection of the Llama-3.1-8B shape and of SmolLM2-135M (and its draft), one row.
Each case is timed inside a CUDA graph of ``--calls`` launches, each on its own copy of
the weight (so that the weights stream from HBM as in a real step, not from the 50 MB L2), and the
graph replayed ``--reps`` times; the figure is microseconds per call and the weight's read bandwidth,
for the kernel with and without programmatic dependent launch (consecutive calls overlap with it).
``--sweep`` also times every (BLOCK_N, BLOCK_K, warps, stages) of a grid and reports the best.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import replace

import torch
from common import write

from eyas.models.kernel_settings import KernelSettings
from eyas.models.kernels import linear as kernels
from eyas.models.kernels.triton_ops import FAILURES, TritonOps
from eyas.models.ops import TORCH

# (name, N, K, kind): kind "norm" = rms_norm then linear; "add" = linear + residual; "norm_silu" = rms_norm,
# linear, silu_mul (gate/up, N = both halves); "plain" = linear.
SHAPES = {
    "8b": [("qkv", 6144, 4096, "norm"), ("o", 4096, 4096, "add"), ("gate_up", 28672, 4096, "norm_silu"),
           ("down", 4096, 14336, "add"), ("lm_head", 128256, 4096, "norm")],
    "smollm2": [("qkv", 960, 576, "norm"), ("o", 576, 576, "add"), ("gate_up", 3072, 576, "norm_silu"),
                ("down", 576, 1536, "add"), ("lm_head", 49152, 576, "norm"), ("draft_qkv", 960, 1152, "plain"),
                ("draft_lm_head", 16384, 576, "norm")],
}


def case(n, k, kind, copies, dtype=torch.bfloat16, rows=1):
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k ** 0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=dtype, generator=g)
    res = torch.randn(rows, n, device="cuda", dtype=dtype, generator=g)
    norm = (torch.rand(k, device="cuda", dtype=dtype, generator=g) + 0.5, 1e-5)

    def call(ops, w):
        if kind == "norm":
            return ops.linear(x, w, None, norm)
        if kind == "norm_silu":
            return ops.linear_silu(x, w, None, norm)
        if kind == "plain":
            return ops.linear(x, w)
        return ops.linear_add(res, x, w, None)
    return ws, call


def graph_us(fn, ws, reps):
    """Microseconds per call: a CUDA graph of one call per weight copy, replayed ``reps`` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in ws[:2]:
            fn(w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in ws:
            fn(w)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(ws))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/linear-cost.json")
    ap.add_argument("--models", default="8b,smollm2")
    ap.add_argument("--calls", type=int, default=16, help="launches per graph at least (more for small weights)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="time a grid of kernel configurations per case")
    ap.add_argument("--grid", default="8,16;256,512,1024;4,8;1,2",
                    help="the sweep's BLOCK_N; BLOCK_K; num_warps; num_stages values")
    ap.add_argument("--names", default=None, help="only these cases (e.g. qkv,o,down)")
    ap.add_argument("--rows", type=int, default=1,
                    help="rows per call: 1 times _linear_kernel; 2-64 _linear_rows_kernel (a verify, a draft level), "
                         "whose sweep grid is then BLOCK_N 16,32,64; BLOCK_K 64,128,256; warps 2,4; stages 1,3 "
                         "unless --grid is given")
    ap.add_argument("--norm-apart", action="store_true",
                    help="with --rows: time q/k/v and gate/up as the engine runs them (the norm kernel, then the rows "
                         "kernel with silu(gate) * up inside) instead of with the norm inside the rows kernel")
    args = ap.parse_args()
    rows_kernel = args.rows > 1
    # the rows kernel with the norm and silu inside, or (--norm-apart, what the engine runs) the norm kernel
    # before it and silu inside
    settings = replace(KernelSettings.from_env(), row_prologues=not args.norm_apart)
    fused_ops = TritonOps(settings)
    cublas_ops = TritonOps(replace(settings, fused_linears=False))  # norm/silu kernels + cuBLAS
    plain_ops = TritonOps(replace(settings, pdl=False))  # the kernels launched the plain way
    configs = kernels.LINEAR_ROWS_CONFIGS if rows_kernel else kernels.LINEAR_CONFIGS
    if rows_kernel and args.grid == ap.get_default("grid"):
        args.grid = "16,32,64;64,128,256;2,4;1,3"
    results = []
    for model in args.models.split(","):
        for name, n, k, kind in SHAPES[model]:
            if args.names and name not in args.names.split(","):
                continue
            # enough copies for 400 MB of weights (8x the L2), at least --calls, at most 2 GB
            copies = max(2, min(max(args.calls, -(-400_000_000 // (n * k * 2))), int(2e9 // (n * k * 2))))
            ws, call = case(n, k, kind, copies, rows=args.rows)
            key = (n, k, 2)
            default = kernels.linear_config(*key)
            if rows_kernel:
                default = default and kernels.linear_rows_config(args.rows, *key)[1:]
            configs[key] = default or (16, 256, 4, 2)  # timed even where the default is cuBLAS
            with torch.no_grad():
                base = graph_us(lambda w, call=call: call(cublas_ops, w), ws, args.reps)
                plain = graph_us(lambda w, call=call: call(plain_ops, w), ws, args.reps)
                fused = graph_us(lambda w, call=call: call(fused_ops, w), ws, args.reps)
                if FAILURES.get("linear_failed"):
                    raise SystemExit(f"_linear_kernel failed for {name} ({n} x {k}): {FAILURES['linear_failed']}")
                want, got = call(TORCH, ws[0]), call(fused_ops, ws[0])
                err = (got.float() - want.float()).abs().max().item()
                row = {"model": model, "name": name, "n": n, "k": k, "kind": kind, "default_config": default,
                       "rows": args.rows, "config": configs[key], "cublas_us": round(base, 2),
                       "fused_no_pdl_us": round(plain, 2),
                       "fused_us": round(fused, 2),
                       "fused_over_cublas": round(fused / base, 3), "max_abs_diff": err,
                       "fused_weight_TBps": round(n * k * 2 / fused / 1e6, 3)}
                if args.sweep:
                    best = None
                    grid = itertools.product(*[[int(v) for v in axis.split(",")] for axis in args.grid.split(";")])
                    for cfg in grid:
                        if cfg[1] > 2 * k and cfg[1] > 256:  # a block much wider than the row
                            continue
                        configs[key] = cfg
                        try:
                            us = graph_us(lambda w, call=call: call(fused_ops, w), ws, max(5, args.reps // 4))
                        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                            FAILURES["linear_failed"] = f"{type(e).__name__}: {e}"
                        if FAILURES.get("linear_failed"):  # the kernel fell back to cuBLAS inside: not its time
                            print("  skip", cfg, FAILURES.pop("linear_failed")[:200])
                            continue
                        if best is None or us < best[1]:
                            best = (cfg, us)
                    if best is not None:
                        row["sweep_best"] = {"config": best[0], "us": round(best[1], 2),
                                             "over_cublas": round(best[1] / base, 3)}
            configs.pop(key, None)
            print(row, flush=True)
            results.append(row)
            del ws
            torch.cuda.empty_cache()
            write(args.out,
                  "a decode step's projections: _linear_kernel against norm/silu kernel + cuBLAS, us per call",
                  {"settings": vars(args), "results": results})  # after each case: a sweep cut short keeps its rows


if __name__ == "__main__":
    main()
