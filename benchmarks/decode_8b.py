#!/usr/bin/env python3
"""(a) Decode tok/s at batch 1, Llama-3.1-8B shape, random bf16 weights, against the bandwidth limit.

    python benchmarks/decode_8b.py --out results/decode-8b.json

In one run: the device-to-device copy bandwidth, HF transformers ``generate`` (eager), eyas's
native path eager (``--disable-cuda-graph``), with CUDA graphs but the torch ops in place of the
Triton kernels (``EYAS_KERNELS=torch``), with the kernels but cuBLAS for every projection
(``KernelSettings.fused_linears`` off: the norms, the activation and the residual adds as separate
kernels), the default without programmatic dependent launch (``KernelSettings.pdl`` off), the step by
parts (``whole_step_graphs=False``: the mask, accept and commit launched around the target's
graph), and the default
(a decode step's projections as ``_linear_kernel``, every kernel launched dependent on the one
before). Each row records whether its tokens equal the default's. The limit is bandwidth divided
by the weight bytes a decode step reads (all weights but the embedding table); the figure for all
weights, embedding included, is recorded too.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import (
    copy_bandwidth,
    llama31_8b_config,
    random_model,
    read_bytes_per_token,
    smollm2_135m_config,
    sync,
    write,
)

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.kernel_choice import CHOICES
from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

# row: (CUDA graphs, the kernels' mode (as EYAS_KERNELS names it), one-row projections as _linear_kernel, dependent
# launch, the plain step as one graph). "graphs-torch-ops": graphs without the Triton kernels, the kernels' effect
# side by side; "graphs-by-parts": the target's graph with the mask, accept and commit around it from the host;
# "graphs" is the default path.
ROWS = {
    "eager": (False, "auto", True, True, True),
    "graphs-torch-ops": (True, "torch", True, True, True),
    "graphs-cublas-linears": (True, "auto", False, True, True),
    "graphs-no-pdl": (True, "auto", True, False, True),
    "graphs-by-parts": (True, "auto", True, True, False),
    "graphs-default-kernels": (True, "auto", True, True, True),  # each projection's built-in kernel, none timed
    "graphs": (True, "auto", True, True, True),
}


def eyas_decode_tps(engine: Engine, prompt: list[int], new_tokens: int, reps: int) -> tuple[list[float], list[int]]:
    """tok/s of each repetition, and the tokens of the last."""
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine.warm_up(progress=False)  # every window's graph now, not inside the first timed run
    engine.generate([prompt], SamplingParams(max_new_tokens=16, ignore_eos=True))
    out = []
    for _ in range(reps):
        batch = engine.prefill([engine.new_sequence(prompt, params)])
        sync()
        t0 = time.perf_counter()
        while not batch.seqs[0].finished:
            engine.step(batch)
        sync()
        out.append((len(batch.seqs[0].output_ids) - 1) / (time.perf_counter() - t0))
    return out, batch.seqs[0].output_ids


def graph_replay_ms(engine: Engine, reps: int = 50) -> dict[str, float]:
    """Milliseconds per replay of the target's one-token graph, back to back with no host work between,
    per attention window: the device's share of a decode step (the rest of a step is the host's)."""
    out = {}
    for (rows, tokens, window), g in sorted(engine.target_runner.graphs.items()):
        if rows == 1 and tokens == 1 and g.graph is not None:
            g.graph.replay()
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                g.graph.replay()
            sync()
            out[str(window)] = round((time.perf_counter() - t0) * 1e3 / reps, 4)
    engine.target_pool.reset()
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
    ap.add_argument("--shape", choices=["8b", "smollm2"], default="8b",
                    help="smollm2: SmolLM2-135M's shape instead (where the host, not the GPU, sets a step's pace)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hf-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--linear-configs", help="a linear_cost.py --sweep JSON: its best configs replace linear_config's")
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"which eyas rows, in order (of {','.join(ROWS)}); a row named twice runs twice, interleaved")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate")
    args = ap.parse_args()
    unknown = [r for r in args.rows.split(",") if r not in ROWS]
    if unknown:
        ap.error(f"--rows: no row {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    if args.linear_configs:
        import json

        from eyas.models.kernels import linear as kernels

        for r in json.loads(open(args.linear_configs).read())["results"]:
            if "sweep_best" in r:
                kernels.LINEAR_CONFIGS[(r["n"], r["k"], 2)] = tuple(r["sweep_best"]["config"])

    bw = copy_bandwidth()
    model = random_model(llama31_8b_config(args.layers) if args.shape == "8b" else smollm2_135m_config())
    read = read_bytes_per_token(model)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = torch.randint(0, model.config.vocab_size - 256, (args.prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    limit = bw["bytes_per_s"] / read
    print(f"copy bandwidth {bw['bytes_per_s'] / 1e12:.2f} TB/s; weights read per token {read / 1e9:.2f} GB; "
          f"limit {limit:.1f} tok/s")

    hf = None if args.no_hf else hf_decode_tps(model, prompt, args.hf_new_tokens)
    if hf:
        print(f"HF generate (eager): {hf:.1f} tok/s")
    target = NativeTarget(model, name="llama-3.1-8b-shape")
    target.info = type(target.info)(**{**target.info.__dict__, "max_context": args.context_length})
    runs, tokens = {}, {}
    from eyas.models.kernels.triton_ops import failures

    for name in args.rows.split(","):
        graphs, ops_mode, fused, pdl, whole = ROWS[name]
        kernels = KernelSettings(mode=ops_mode, measure=name != "graphs-default-kernels", fused_linears=fused, pdl=pdl)
        CHOICES.picks = {}  # each row chooses afresh, not from the rows before it
        engine = Engine(target, None, SpecConfig("NONE"), max_batch=1, cuda_graphs=graphs, whole_step_graphs=whole,
                        kernels=kernels)
        tps, tokens[name] = eyas_decode_tps(engine, prompt, args.new_tokens, args.reps)
        tps = runs.get(name, {}).get("tok_s", []) + [round(x, 2) for x in tps]  # a row named again: interleaved
        runs[name] = {"tok_s": tps, "median": round(statistics.median(tps), 2),
                      "layout": engine.layout,  # and any kernel that fell back, so a row never hides one
                      "kernel_failures": failures()}
        if graphs:
            runs[name]["graph_replay_ms_by_window"] = graph_replay_ms(engine)
            runs[name]["step_ms"] = round(1e3 / runs[name]["median"], 4)
        print(f"eyas native {name}: {statistics.median(tps):.1f} tok/s ({engine.layout}); one-token graph alone: "
              f"{runs[name].get('graph_replay_ms_by_window')} ms by window")
        del engine
    for name in runs:
        if "graphs" in tokens:
            runs[name]["tokens_equal_graphs"] = tokens[name] == tokens["graphs"]
    best = runs.get("graphs", {}).get("median")
    write(args.out, "decode tok/s at batch 1, Llama-3.1-8B shape, random bf16 weights", {
        "settings": vars(args),
        "copy_bandwidth_TBps": round(bw["bytes_per_s"] / 1e12, 3),
        "weights_GB": round(total / 1e9, 3),
        "weights_read_per_token_GB": round(read / 1e9, 3),
        "limit_tok_s": round(limit, 1),
        "limit_tok_s_all_weights": round(bw["bytes_per_s"] / total, 1),
        "hf_generate_eager_tok_s": hf and round(hf, 2),
        "eyas": runs,
        "eyas_graphs_share_of_limit": best and round(best / limit, 3),
        "eyas_graphs_share_of_limit_all_weights": best and round(best / (bw["bytes_per_s"] / total), 3),
        "eyas_graphs_over_hf_eager": best and hf and round(best / hf, 2),
    })


if __name__ == "__main__":
    main()
