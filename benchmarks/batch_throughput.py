#!/usr/bin/env python3
"""(d) Throughput at batch 1, 4, 16, 64, with and without speculation, tree chosen per batch size.

    python benchmarks/batch_throughput.py --model-path /tmp/smollm2.gguf --out results/batch-smollm2.json

This is ``eyas tune``'s sweep written to a file: for each batch size, the baseline and every
candidate tree, end to end through the engine (fixed-length outputs, greedy), and the best one.
Every batch size runs the same ``--num-prompts`` prompts, that many at a time.
"""

from __future__ import annotations

import argparse

import torch
from common import chat_prompts, load_pair, write

from eyas.bench.tune import CANDIDATES, parse_candidate, sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--out", default="benchmarks/results/batch-smollm2.json")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--candidates", nargs="+", default=CANDIDATES)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=32,
                    help="prompts run at every batch size, evenly spread over the chat, code and reasoning sets "
                         "(repeated up to the largest batch size)")
    args = ap.parse_args()
    target, draft = load_pair(args.model_path, args.draft, device=args.device)
    prompts = chat_prompts(target.tokenizer, "all")
    prompts = [prompts[i * len(prompts) // args.num_prompts] for i in range(min(args.num_prompts, len(prompts)))]
    rows = sweep(target, draft, prompts, args.batch_sizes, [parse_candidate(c) for c in args.candidates],
                 args.new_tokens)
    write(args.out, "throughput by batch size, SmolLM2-135M-Instruct + EAGLE-3 draft, greedy, bf16", {
        "settings": vars(args), "batches": rows,
        "speculation_ahead_at": [r["batch"] for r in rows if r["best"] != "NONE"],
    })


if __name__ == "__main__":
    main()
