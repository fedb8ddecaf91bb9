#!/usr/bin/env python3
"""What one long prompt does to the streams already running: ``eyas serve`` per ``--chunked-prefill-size``.

    python benchmarks/long_prompt.py --chunk-sizes -1 2048 512 --out benchmarks/results/long-prompt-cpu.json

For each chunk size (-1: every prompt prefilled whole) it starts ``python -m eyas.serve`` on loopback
(``--model-path``, plain decoding unless ``--server-flags`` say otherwise), runs ``--bystanders``
streaming chat requests (``--max-tokens`` each, ``ignore_eos``), and once every bystander has its first
text sends one chat request whose prompt is about ``--prompt-tokens`` tokens of prose (``--long-tokens``
out). Per setting: the long request's TTFT, the bystanders' inter-chunk gaps while it was being
prefilled (from its send to its first text: the longest and p50/p99) and over their whole run, and their
tok/s. The servers run one after the other, each measured ``--repeats`` times; the figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import write
from serve_load import percentiles, start_server, wait_ready

from eyas.bench.online import served_model, stream_chat

PROSE = ("The river ran past the mill and the old stone bridge, and the children counted the boats that went "
         "under it on their way to the sea. ")


def long_prompt(tokenizer, tokens: int) -> str:
    """About ``tokens`` tokens of prose, ending in a question."""
    per = max(1, len(tokenizer(PROSE)["input_ids"]))
    return PROSE * max(1, tokens // per) + "\nHow many boats did they count? Answer in one sentence."


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


async def one_run(url: str, model: str, prompt: str, args) -> dict:
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    limits = httpx.Limits(max_connections=args.bystanders + 4)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        streams = [asyncio.create_task(stream_chat(client, url, {
            **body, "messages": [{"role": "user", "content": f"Tell story number {i} about a lighthouse."}]}))
            for i in range(args.bystanders)]
        await asyncio.sleep(args.delay)  # the bystanders are streaming by now
        sent = time.perf_counter()
        long = await stream_chat(client, url, {**body, "max_tokens": args.long_tokens,
                                               "messages": [{"role": "user", "content": prompt}]})
        done = await asyncio.gather(*streams)
    first = long.arrivals[0] if long.arrivals else long.end
    during, gaps, tokens = [], [], 0
    for s in done:
        pairs = list(zip(s.arrivals, s.arrivals[1:]))
        gaps += [b - a for a, b in pairs]
        during += [b - a for a, b in pairs if b > sent and a < first]  # a gap that overlaps the long prefill
        tokens += int((s.usage or {}).get("completion_tokens") or 0)
    span = max(s.end for s in done) - min(s.start for s in done)
    return {"long_ttft_s": round(first - sent, 4), "long_prompt_tokens": (long.usage or {}).get("prompt_tokens"),
            "bystander_gap_max_during_s": round(max(during), 4) if during else None,
            "bystander_gaps_during": percentiles(during), "bystander_gaps": percentiles(gaps),
            "bystander_tok_s": round(tokens / span, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default="smollm2-135m-instruct")
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[-1, 2048, 512])
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--bystanders", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--long-tokens", type=int, default=8)
    p.add_argument("--delay", type=float, default=1.0, help="seconds the bystanders stream before the long prompt")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--server-flags", default="--speculative-algorithm NONE", help="more eyas serve flags")
    p.add_argument("--note", default="")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from eyas.pipeline import load_tokenizer

    tokenizer = load_tokenizer(args.model_path, 1 << 30)
    prompt = long_prompt(tokenizer, args.prompt_tokens)
    results = {}
    for size in args.chunk_sizes:
        with ExitStack() as stack, tempfile.TemporaryDirectory() as logs:
            log_path = Path(logs) / f"serve-{size}.log"
            flags = ["--model-path", args.model_path, "--chunked-prefill-size", str(size), *args.server_flags.split()]
            url, proc = start_server(flags, log_path, stack)
            wait_ready(url, proc, log_path)
            runs = [asyncio.run(one_run(url, served_model(url), prompt, args)) for _ in range(args.repeats)]
        results[str(size)] = {"runs": runs, **{key: median(runs, key) for key in (
            "long_ttft_s", "bystander_gap_max_during_s", "bystander_tok_s")}}
        r = results[str(size)]
        print(f"chunk {size:>5}: long prompt TTFT {r['long_ttft_s']:.3f} s, bystanders' longest gap during it "
              f"{r['bystander_gap_max_during_s']:.3f} s, bystanders {r['bystander_tok_s']:.1f} tok/s", flush=True)
    if args.out:
        write(args.out, "long prompt among running streams", {"args": vars(args), "note": args.note,
                                                               "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
