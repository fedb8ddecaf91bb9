#!/usr/bin/env python3
"""How much of the target's own answers a draft vocabulary covers, and what a larger one would.

    python benchmarks/vocab_coverage.py --out benchmarks/results/vocab-coverage-smollm2-v9-cpu.json

A draft proposes only the tokens of its vocabulary (``d2t``): a token outside it is never accepted, so
coverage caps acceptance at every draft position. The target answers ``--per-source`` prompts from each of
``--sources`` (chat-corpus JSONL.gz files with a ``prompt`` field), greedy and sampled; the figure is the share
of answer tokens in the draft's vocabulary, and in that vocabulary grown to each of ``--sizes`` with the most
frequent other tokens of a separate prompt sample (``--count-prompts`` from each of ``--count-sources``), as a
grown vocabulary's choice would be made without the answers themselves.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from collections import Counter
from pathlib import Path

import torch
from common import load_pair, write

from eyas.common.prompts import chat_ids
from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.sampling import SamplingParams

SOURCES = ["sharegpt92k-sample", "arena-hard", "prompts-chat", "gpteacher", "oasst-eval-prompts", "koala-test-set"]
COUNT_SOURCES = SOURCES[:2] + ["prompts-chat", "gpteacher", "oasst-eval-prompts", "koala-test-set", "gsm8k-train",
                               "nq-open"]


def prompts(corpus: Path, source: str) -> list[str]:
    with gzip.open(corpus / f"{source}.jsonl.gz", "rt") as f:
        return [json.loads(line)["prompt"] for line in f]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None, help="draft folder (default: the shipped one)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/chat-prompts",
                    help="the chat-prompts corpus (default: ../shared/data/chat-prompts beside the checkout)")
    ap.add_argument("--sources", nargs="+", default=SOURCES)
    ap.add_argument("--per-source", type=int, default=8)
    ap.add_argument("--max-chars", type=int, default=1500, help="prompts longer than this are passed over")
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--top-p", type=float, default=0.95, help="of the sampled answers")
    ap.add_argument("--sizes", type=int, nargs="+", default=[24576, 32768])
    ap.add_argument("--count-sources", nargs="+", default=COUNT_SOURCES)
    ap.add_argument("--count-prompts", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/vocab-coverage.json")
    args = ap.parse_args()

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    target, draft = load_pair(args.model_path, args.draft, dtype=dtype, device=args.device)
    hot = set((draft.d2t.cpu() + torch.arange(len(draft.d2t))).tolist())
    rng = random.Random(args.seed)
    texts = []
    for source in args.sources:
        texts += rng.sample([p for p in prompts(args.corpus, source) if len(p) < args.max_chars], args.per_source)
    ids = [chat_ids(target.tokenizer, t) for t in texts]
    counts = Counter()
    for source in args.count_sources:
        for p in prompts(args.corpus, source)[:args.count_prompts]:
            counts.update(target.tokenizer(p)["input_ids"])
    others = [t for t, _ in counts.most_common() if t not in hot]

    engine = Engine(target, None, SpecConfig("NONE"), max_batch=len(ids))
    results = []
    for temperature in args.temperatures:
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=temperature,
                                top_p=args.top_p if temperature else 1.0, seed=args.seed + 1)
        tokens = [t for o in engine.generate(ids, params) for t in o.output_ids]
        row = {"temperature": temperature, "top_p": params.top_p, "answer_tokens": len(tokens),
               "draft_vocab": len(hot), "covered": round(sum(t in hot for t in tokens) / len(tokens), 4),
               "grown": {}}
        for size in args.sizes:
            grown = hot | set(others[:max(0, size - len(hot))])
            row["grown"][size] = round(sum(t in grown for t in tokens) / len(tokens), 4)
        print(f"T {temperature}: {len(tokens)} answer tokens, in the draft's {len(hot):,} {row['covered']:.4f}, "
              + ", ".join(f"grown to {s:,} {c:.4f}" for s, c in row["grown"].items()))
        results.append(row)
    write(args.out, "the draft vocabulary's coverage of the target's own answers, and of that vocabulary grown with "
          "a prompt sample's most frequent other tokens",
          {"settings": vars(args) | {"corpus": str(args.corpus)}, "prompts": len(ids), "runs": results})


if __name__ == "__main__":
    main()
