#!/usr/bin/env python3
"""(a) Decode tok/s at batch 1, Llama-3.1-8B shape, random bf16 weights, against the bandwidth limit.

    python benchmarks/decode_8b.py --out results/decode-8b.json

In one run: the device-to-device copy bandwidth, HF transformers ``generate`` (eager), eyas's
native path eager (``--disable-cuda-graph``), with CUDA graphs but the torch ops in place of the
Triton kernels (``EYAS_KERNELS=torch``), with the kernels but cuBLAS for every projection
(``TritonOps.fused_linears = False``: the norms, the activation and the residual adds as separate
kernels), and the default (a decode step's projections as ``_linear_kernel``). The limit is bandwidth divided
by the weight bytes a decode step reads (all weights but the embedding table); the figure for all
weights, embedding included, is recorded too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from common import (
    copy_bandwidth,
    llama31_8b_config,
    random_model,
    read_bytes_per_token,
    sync,
    write,
)

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine.sampling import SamplingParams
from eyas.models.native import NativeTarget


def eyas_decode_tps(engine: Engine, prompt: list[int], new_tokens: int, reps: int) -> list[float]:
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine.generate([prompt], SamplingParams(max_new_tokens=16, ignore_eos=True))  # warm-up and capture
    out = []
    for _ in range(reps):
        batch = engine.prefill([engine.new_sequence(prompt, params)])
        sync()
        t0 = time.perf_counter()
        while not batch.seqs[0].finished:
            engine.step(batch)
        sync()
        out.append((len(batch.seqs[0].output_ids) - 1) / (time.perf_counter() - t0))
    return out


def hf_decode_tps(model, prompt: list[int], new_tokens: int) -> float:
    ids = torch.tensor([prompt], device="cuda")
    kw = dict(do_sample=False, pad_token_id=0)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
    sync()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    sync()
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    sync()
    return (new_tokens - 1) / (time.perf_counter() - t0 - prefill)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/decode-8b.json")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hf-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--linear-configs", help="a linear_cost.py --sweep JSON: its best configs replace linear_config's")
    args = ap.parse_args()
    if args.linear_configs:
        import json

        from eyas.models import kernels

        for r in json.loads(open(args.linear_configs).read())["results"]:
            if "sweep_best" in r:
                kernels.LINEAR_CONFIGS[(r["n"], r["k"], 2)] = tuple(r["sweep_best"]["config"])

    bw = copy_bandwidth()
    model = random_model(llama31_8b_config(args.layers))
    read = read_bytes_per_token(model)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = torch.randint(0, 128000, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    limit = bw["bytes_per_s"] / read
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s; weights read per token {read / 1e9:.2f} GB; "
          f"limit {limit:.1f} tok/s")

    hf = hf_decode_tps(model, prompt, args.hf_new_tokens)
    print(f"HF generate (eager): {hf:.1f} tok/s")
    target = NativeTarget(model, name="llama-3.1-8b-shape")
    target.info = type(target.info)(**{**target.info.__dict__, "max_context": args.context_length})
    runs = {}
    # "graphs-torch-ops": graphs without the Triton kernels (EYAS_KERNELS=torch), the kernels' effect
    # side by side; "graphs-cublas-linears": the kernels but cuBLAS projections; "graphs" is the default path.
    from eyas.models.kernels import TritonOps

    for name, graphs, ops_mode, fused in (("eager", False, "auto", True), ("graphs-torch-ops", True, "torch", True),
                                          ("graphs-cublas-linears", True, "auto", False), ("graphs", True, "auto", True)):
        os.environ["EYAS_KERNELS"] = ops_mode
        TritonOps.fused_linears = fused
        engine = Engine(target, None, SpecConfig("NONE"), max_batch=1, cuda_graphs=graphs)
        tps = eyas_decode_tps(engine, prompt, args.new_tokens, args.reps)
        runs[name] = {"tok_s": [round(x, 2) for x in tps], "median": round(statistics.median(tps), 2),
                      "layout": engine.layout,  # and any kernel that fell back, so a row never hides one
                      "kernel_failures": TritonOps.failures()}
        print(f"eyas native {name}: {statistics.median(tps):.1f} tok/s ({engine.layout})")
        del engine
    os.environ.pop("EYAS_KERNELS")
    best = runs["graphs"]["median"]
    write(args.out, "decode tok/s at batch 1, Llama-3.1-8B shape, random bf16 weights", {
        "settings": vars(args),
        "copy_bandwidth_TBps": round(bw["bytes_per_s"] / 1e12, 3),
        "weights_GB": round(total / 1e9, 3),
        "weights_read_per_token_GB": round(read / 1e9, 3),
        "limit_tok_s": round(limit, 1),
        "limit_tok_s_all_weights": round(bw["bytes_per_s"] / total, 1),
        "hf_generate_eager_tok_s": round(hf, 2),
        "eyas": runs,
        "eyas_graphs_share_of_limit": round(best / limit, 3),
        "eyas_graphs_share_of_limit_all_weights": round(best / (bw["bytes_per_s"] / total), 3),
        "eyas_graphs_over_hf_eager": round(best / hf, 2),
    })


if __name__ == "__main__":
    main()
