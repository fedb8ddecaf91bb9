#!/usr/bin/env python3
"""(c) The real pair at batch 1: SmolLM2-135M-Instruct with and without its EAGLE-3 draft.

    python benchmarks/pair.py --model-path /tmp/smollm2.gguf --out results/pair-smollm2.json

Greedy by default (``--temperature 0``; ``--temperature 0.7 --top-p 0.95`` samples, each prompt
seeded by its index, so runs at T = 0, 0.7 and 1.0 can be set side by side), one prompt at a time,
the chat prompt set, up to ``--new-tokens`` each (ending at end-of-turn as a user would see it).
Baseline = eyas's own fast path (native forward, static cache, CUDA graphs) without speculation; the
HF-path baseline is recorded for reference.
For each tree setting: tokens/s end to end and for decoding alone (prefill timed apart), the step's
milliseconds, tau, per-position acceptance, speedup. Side by side in the same run: the baseline
with its step by parts (``whole_step_graphs=False``), and the last setting by parts and
with its several-row projections on cuBLAS (``KernelSettings.row_linears`` off); ``--by-parts-specs``
and ``--cublas-rows-specs`` pick other settings (none: nothing); ``--flip-prologues-specs`` runs
settings with the norm and activation inside the several-row kernel flipped from the default,
``--flip-norm-apart-specs`` with the norm apart and silu inside it (or cuBLAS between the two) flipped.

Lossless check: in bf16, the share of prompts whose speculative output equals the baseline's,
and for each that differs, the target's two best logits at the first difference (a near-tie
means the two orders of bf16 arithmetic, one token vs a tree per forward, rounded differently).
In fp32 (``--fp32-prompts``), speculative output must equal the baseline token for token. Sampled
runs skip both checks (speculation draws other random numbers than plain decoding: the texts differ,
the distribution does not; ``tests/spec/test_device_sampling.py`` tests that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch
from common import chat_prompts, load_pair, sync, write

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models import kv_cache
from eyas.models.kernel_choice import CHOICES
from eyas.models.kernel_settings import KernelSettings
from eyas.models.target import Target
from eyas.sample.sampling import SamplingParams

SAMPLING = {"temperature": 0.0, "top_p": 1.0}  # --temperature / --top-p


def run_all(engine: Engine, prompts: list[list[int]], new_tokens: int) -> dict:
    """End-to-end tok/s over every prompt (prefill included, as ``Engine.generate`` runs a request), and
    the decode share alone (the steps after prefill's first token), timed apart in the same run."""
    params = SamplingParams(max_new_tokens=new_tokens, **SAMPLING)
    engine.warm_up(progress=False)  # every graph captured first, as eyas serve does: no capture in the timing
    engine.generate([prompts[0]], params)  # and every kernel compiled
    outs, secs, prefill, decode = [], [], [], []
    for i, p in enumerate(prompts):
        seq = engine.new_sequence(p, SamplingParams(max_new_tokens=new_tokens, seed=i, **SAMPLING))
        sync()
        t0 = time.perf_counter()
        batch = engine.prefill([seq])
        sync()
        t1 = time.perf_counter()
        while not seq.finished:
            engine.step(batch)
        sync()
        t2 = time.perf_counter()
        secs.append(t2 - t0)
        prefill.append(t1 - t0)
        decode.append(t2 - t1)
        outs.append(seq)
    tokens = sum(len(o.output_ids) for o in outs)
    row = {"tok_s": round(tokens / sum(secs), 2), "tokens": tokens, "seconds": round(sum(secs), 3),
           "per_prompt_tok_s_median": round(statistics.median(len(o.output_ids) / s for o, s in zip(outs, secs)), 2),
           "decode_tok_s": round((tokens - len(outs)) / sum(decode), 2),
           "prefill_ms_median": round(1e3 * statistics.median(prefill), 3)}
    if engine.spec.speculative:
        drafts = sum(o.stats.drafts for o in outs)
        acc = [0] * engine.spec.num_steps
        for o in outs:
            for i, a in enumerate(o.stats.accepted_per_position):
                acc[i] += a
        row["tau"] = round(1 + sum(acc) / drafts, 3)
        row["per_position"] = [round(a / drafts, 3) for a in acc]
        row["step_ms"] = round(1e3 * sum(decode) / drafts, 4)  # every decode step drafts once at batch 1
    else:
        row["step_ms"] = round(1e3 * sum(decode) / (tokens - len(outs)), 4)
    row["outputs"] = [o.output_ids for o in outs]
    return row


@torch.inference_mode()
def first_difference(target: Target, prompt: list[int], base: list[int], spec: list[int]) -> dict | None:
    i = next((k for k, (a, b) in enumerate(zip(base, spec)) if a != b), None)
    if i is None:
        return None if len(base) == len(spec) else {"index": min(len(base), len(spec)), "kind": "length"}
    ids = torch.tensor([prompt + base[:i]], device=target.device)
    n = ids.shape[1]
    visible = torch.ones((1, n, n), dtype=torch.bool, device=target.device).tril()
    mask = kv_cache.attention_mask(torch.zeros(1, dtype=torch.long, device=target.device), 0, visible, target.dtype)
    logits, _ = target.forward(ids, torch.arange(n, device=target.device)[None], mask, kv_cache.new_cache(),
                               capture=False, logits_at=torch.tensor([n - 1], device=target.device))
    top = logits[0, -1].float().topk(2)
    return {"index": i, "baseline_token": base[i], "speculative_token": spec[i],
            "top2_tokens": top.indices.tolist(), "top2_logits": [round(x, 4) for x in top.values.tolist()],
            "gap": round(float(top.values[0] - top.values[1]), 4),
            "both_in_top2": {base[i], spec[i]} <= set(top.indices.tolist())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--draft", default=None, help="draft folder (default: the shipped one)")
    ap.add_argument("--out", default="benchmarks/results/pair-smollm2.json")
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--num-prompts", type=int, default=30)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--specs", nargs="+", default=["5,1,6", "6,4,16", "6,8,32", "6,8,48"])
    ap.add_argument("--hf-prompts", type=int, default=4, help="prompts for the HF-path reference baseline (0: none)")
    ap.add_argument("--fp32-prompts", type=int, default=8)
    ap.add_argument("--by-parts-specs", nargs="*", default=None,
                    help="settings also run with the step by parts (drafter, verify, extend as three replays with "
                         "acceptance and commit launched between them); default: the last of --specs")
    ap.add_argument("--eager-prefill-specs", nargs="*", default=[],
                    help="settings also run with the eager prefill (prefill_graphs=False), side by side; the "
                         "baseline always is")
    ap.add_argument("--cublas-rows-specs", nargs="*", default=None,
                    help="settings also run with the projections of several rows (verify, draft levels, extend) on "
                         "cuBLAS instead of _linear_rows_kernel; default: the last of --specs")
    ap.add_argument("--flip-prologues-specs", nargs="*", default=[],
                    help="settings also run with KernelSettings.row_prologues flipped from its default (the RMSNorm "
                         "and silu(gate) * up inside _linear_rows_kernel, or as their own kernels around cuBLAS)")
    ap.add_argument("--flip-norm-apart-specs", nargs="*", default=[],
                    help="settings also run with KernelSettings.row_norm_apart flipped from its default (a norm before "
                         "a projection of several rows as its own kernel, then _linear_rows_kernel with silu(gate) * "
                         "up inside; or the norm kernel, cuBLAS and the silu kernel)")
    ap.add_argument("--cublas-linears", action="store_true",
                    help="every projection on cuBLAS (no fused one-row _linear_kernel), for a side-by-side run")
    ap.add_argument("--kernels", choices=["measured", "default"], default="measured",
                    help="the projections' kernels: each shape's fastest as timed on this GPU (the engine's "
                         "default), or the built-in choice, none timed")
    ap.add_argument("--no-pdl", action="store_true",
                    help="kernels launched the plain way (no programmatic dependent launch), for a side-by-side run")
    ap.add_argument("--linear-configs", nargs="*", default=[],
                    help="linear_cost.py --sweep JSONs: their best block shapes replace the defaults (one row, or "
                         "several with --rows)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus top-p of a sampled run (default 1.0: off)")
    args = ap.parse_args()
    SAMPLING.update(temperature=args.temperature, top_p=args.top_p)
    greedy = SamplingParams(**SAMPLING).greedy
    from eyas.models.kernels import linear as kernels
    from eyas.models.kernels.triton_ops import failures

    for path in args.linear_configs:
        for r in json.loads(open(path).read())["results"]:
            if "sweep_best" in r:
                table = kernels.LINEAR_ROWS_CONFIGS if r.get("rows", 1) > 1 else kernels.LINEAR_CONFIGS
                table[(r["n"], r["k"], 2)] = tuple(r["sweep_best"]["config"])

    ops = replace(KernelSettings.from_env(), measure=args.kernels == "measured", fused_linears=not args.cublas_linears,
                  row_linears=not args.cublas_linears, pdl=not args.no_pdl)  # every engine's, unless a run flips one

    target, draft = load_pair(args.model_path, args.draft, device=args.device)
    prompts = chat_prompts(target.tokenizer, args.prompts, args.num_prompts)
    # the step by parts (the baseline before engine/decode.py), and the prefill before engine/prefill.py
    parts = run_all(Engine(target, None, SpecConfig("NONE"), max_batch=1, whole_step_graphs=False, kernels=ops),
                    prompts, args.new_tokens)
    eager_prefill = run_all(Engine(target, None, SpecConfig("NONE"), max_batch=1, prefill_graphs=False, kernels=ops),
                            prompts, args.new_tokens)
    base = run_all(Engine(target, None, SpecConfig("NONE"), max_batch=1, kernels=ops), prompts, args.new_tokens)
    print(f"baseline (native, graphs): {base['tok_s']} tok/s (decode {base['decode_tok_s']}, prefill "
          f"{base['prefill_ms_median']} ms); step by parts: {parts['tok_s']} tok/s (decode {parts['decode_tok_s']}); "
          f"eager prefill: {eager_prefill['tok_s']} tok/s (prefill {eager_prefill['prefill_ms_median']} ms)")
    hf = None
    if args.hf_prompts:
        generic = Target(target.model, target.tokenizer, target.name, target.aux_layer_ids)
        hf = run_all(Engine(generic, None, SpecConfig("NONE")), prompts[: args.hf_prompts], args.new_tokens)
        print(f"baseline (generic HF path): {hf['tok_s']} tok/s")
    results = {}
    by_parts = args.specs[-1:] if args.by_parts_specs is None else args.by_parts_specs
    cublas_rows = args.specs[-1:] if args.cublas_rows_specs is None else args.cublas_rows_specs
    prologues = ops.row_prologues
    flipped = f"row prologues {'off' if prologues else 'on'}"
    apart = ops.row_norm_apart
    flipped_apart = f"norm apart {'off' if apart else 'on'}"
    for text in (args.specs + [f"{t} by parts" for t in by_parts] + [f"{t} cublas rows" for t in cublas_rows]
                 + [f"{t} eager prefill" for t in args.eager_prefill_specs]
                 + [f"{t} {flipped}" for t in args.flip_prologues_specs]
                 + [f"{t} {flipped_apart}" for t in args.flip_norm_apart_specs]):
        steps, topk, tokens = (int(x) for x in text.split()[0].split(","))
        routes = {"whole_step_graphs": not text.endswith("by parts"),
                  "prefill_graphs": not text.endswith("eager prefill")}
        kernels = replace(ops, row_linears=ops.row_linears and not text.endswith("cublas rows"),
                          row_prologues=prologues != text.endswith(flipped),
                          row_norm_apart=apart != text.endswith(flipped_apart))
        r = run_all(Engine(target, draft, SpecConfig("EAGLE3", steps, topk, tokens), max_batch=1, kernels=kernels,
                           **routes), prompts, args.new_tokens)
        same = [o == b for o, b in zip(r["outputs"], base["outputs"])] if greedy else [False]
        diffs = [first_difference(target, p, b, o) for p, b, o, s in zip(prompts, base["outputs"], r["outputs"], same)
                 if not s] if greedy else None
        r.update(speedup=round(r["tok_s"] / base["tok_s"], 3),
                 decode_speedup=round(r["decode_tok_s"] / base["decode_tok_s"], 3),
                 speedup_over_step_by_parts=round(r["tok_s"] / parts["tok_s"], 3),
                 bf16_match_share=round(sum(same) / len(same), 3) if greedy else None, bf16_first_differences=diffs)
        print(f"EAGLE3 {text}: {r['tok_s']} tok/s, tau {r['tau']}, {r['speedup']}x (decode {r['decode_speedup']}x, "
              f"step {r['step_ms']} ms against {base['step_ms']}), bf16 match {r['bf16_match_share']}")
        results[text] = {k: v for k, v in r.items() if k != "outputs"}
    fp32 = None
    if args.fp32_prompts and greedy:
        t32, d32 = load_pair(args.model_path, args.draft, dtype="float32", device=args.device)
        few = prompts[: args.fp32_prompts]
        b32 = run_all(Engine(t32, None, SpecConfig("NONE"), max_batch=1, kernels=ops), few, 128)
        steps, topk, tokens = (int(x) for x in args.specs[-1].split(","))
        s32 = run_all(Engine(t32, d32, SpecConfig("EAGLE3", steps, topk, tokens), max_batch=1, kernels=ops), few, 128)
        e32 = run_all(Engine(t32, None, SpecConfig("NONE"), max_batch=1, prefill_graphs=False, kernels=ops), few, 128)
        fp32 = {"spec": args.specs[-1], "prompts": len(few),
                "identical": sum(a == b for a, b in zip(b32["outputs"], s32["outputs"])),
                "baseline_identical_with_eager_prefill": sum(a == b for a, b in zip(b32["outputs"], e32["outputs"])),
                "first_differences": [first_difference(t32, p, a, b) for p, a, b in
                                      zip(few, b32["outputs"], s32["outputs"]) if a != b]}
        print(f"fp32: {fp32['identical']}/{fp32['prompts']} identical; the baseline with the eager prefill: "
              f"{fp32['baseline_identical_with_eager_prefill']}/{fp32['prompts']} identical")
    best = max(results.values(), key=lambda r: r["tok_s"])
    write(args.out, f"SmolLM2-135M-Instruct + EAGLE-3 draft at batch 1, temperature {args.temperature:g}"
          f"{f', top-p {args.top_p:g}' if args.top_p < 1 else ''}, chat prompts", {
        "settings": vars(args), "kernel_choices": dict(CHOICES.picks),
        "baseline_native_graphs": {k: v for k, v in base.items() if k != "outputs"},
        "baseline_step_by_parts": {k: v for k, v in parts.items() if k != "outputs"},
        "baseline_eager_prefill": {k: v for k, v in eager_prefill.items() if k != "outputs"},
        "baseline_outputs_equal_eager_prefill": base["outputs"] == eager_prefill["outputs"],
        "baseline_outputs_equal_by_parts": base["outputs"] == parts["outputs"],
        "baseline_generic_hf_path": hf and {k: v for k, v in hf.items() if k != "outputs"},
        "eagle3": results, "best_speedup": best["speedup"], "fp32_lossless": fp32,
        "kernel_failures": failures(),  # any kernel that fell back in this process
    })


if __name__ == "__main__":
    main()
