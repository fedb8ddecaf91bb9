#!/usr/bin/env python3
"""Soak an eyas (or any OpenAI-compatible) server: mixed streaming and plain load for a while.

    python benchmarks/soak.py --seconds 180 --concurrency 24 --out benchmarks/results/soak
    python benchmarks/soak.py --url http://127.0.0.1:30000 --seconds 600

Without ``--url`` it starts ``python -m eyas.serve`` itself on a tiny random Llama pair (the
load, not the model, is under test) or on ``--model-path``. Every request must end as a 200 with a
complete body (streams end with ``[DONE]``) or as a 4xx/503 carrying a JSON error; anything else
(a dropped connection, a 5xx, a truncated stream) is counted as lost. Once a second it samples
the server's resident memory (``/proc`` when it started the server, else the standard
``process_resident_memory_bytes`` metric) and ``eyas:num_requests_running``. Writes
``OUT.json`` and ``OUT.png``; exits 1 if anything was lost or memory grew after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["hi", "Tell me a story about a hawk.", "2+2?", "Write a haiku about rain.",
           "List three colors.", "Why is the sky blue? Explain at length, please." * 3]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_server(args, work: Path) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    model = args.model_path
    extra = ["--speculative-algorithm", "NONE"] if args.no_draft else []
    if model is None:
        from helpers import save_tiny_model, tiny_target, train_draft  # tests/helpers.py

        model = str(save_tiny_model(work / "target"))
        if not args.no_draft:
            train_draft(tiny_target(dtype=__import__("torch").float32), steps=40).save_pretrained(work / "draft")
            extra = ["--speculative-draft-model-path", str(work / "draft"), "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(work / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "eyas.serve", "--model-path", model, "--port", str(port),
                             "--max-running-requests", str(args.max_running), *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {(work / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    raise SystemExit("server did not become ready")


async def one_request(client: httpx.AsyncClient, url: str, rng: random.Random, stats: dict) -> None:
    stream = rng.random() < 0.5
    chat = rng.random() < 0.6
    max_tokens = rng.choice([4, 8, 16, 32])
    prompt = rng.choice(PROMPTS)
    body = {"max_tokens": max_tokens, "stream": stream, "temperature": rng.choice([0, 0.8])}
    if chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    t0 = time.perf_counter()
    try:
        if stream:
            done = False
            async with client.stream("POST", url + path, json=body, timeout=120) as r:
                if r.status_code != 200:
                    await r.aread()
                    return classify_refusal(r, stats, t0)
                async for line in r.aiter_lines():
                    if line.strip() == "data: [DONE]":
                        done = True
            outcome = "ok" if done else "lost"
        else:
            r = await client.post(url + path, json=body, timeout=120)
            if r.status_code != 200:
                return classify_refusal(r, stats, t0)
            outcome = "ok" if r.json().get("choices") else "lost"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        outcome = "lost"
        stats["errors"].append(f"{type(e).__name__}: {e}")
    stats[outcome] += 1
    if outcome == "ok":
        stats["latency"].append(time.perf_counter() - t0)
        stats["done_at"].append(time.perf_counter())


def classify_refusal(r: httpx.Response, stats: dict, t0: float) -> None:
    try:
        reason = r.json()["error"]["message"]
    except Exception:  # noqa: BLE001 - a refusal without a JSON reason is a loss
        reason = None
    if r.status_code < 500 or (r.status_code == 503 and reason):
        stats["refused"] += 1
        stats["refusals"][str(r.status_code)] = stats["refusals"].get(str(r.status_code), 0) + 1
    else:
        stats["lost"] += 1
        stats["errors"].append(f"HTTP {r.status_code}: {r.text[:200]}")


def scrape(url: str, proc) -> tuple[float, float]:
    """(resident MB, running requests) from /proc or /metrics."""
    rss = running = float("nan")
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "process_resident_memory_bytes":
                    rss = s.value / 2**20
                if s.name in ("eyas:num_requests_running", "sglang:num_running_reqs", "vllm:num_requests_running"):
                    running = s.value
    except httpx.HTTPError:
        pass
    if proc is not None:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, running


async def soak(args, url: str, proc) -> dict:
    stats = {"ok": 0, "refused": 0, "lost": 0, "latency": [], "done_at": [], "errors": [], "refusals": {}}
    samples = []
    rng = random.Random(args.seed)
    start = time.perf_counter()
    stop_at = start + args.seconds
    limits = httpx.Limits(max_connections=args.concurrency * 2)

    async def worker(i: int):
        wrng = random.Random(args.seed * 1000 + i)
        async with httpx.AsyncClient(limits=limits) as client:
            while time.perf_counter() < stop_at and stats["ok"] + stats["refused"] + stats["lost"] < args.max_requests:
                await one_request(client, url, wrng, stats)

    async def sampler():
        while time.perf_counter() < stop_at:
            rss, running = await asyncio.to_thread(scrape, url, proc)
            samples.append({"t": round(time.perf_counter() - start, 2), "rss_mb": rss, "running": running,
                            "completed": stats["ok"]})
            await asyncio.sleep(1.0)

    await asyncio.gather(sampler(), *[worker(i) for i in range(args.concurrency)])
    await asyncio.sleep(2.0)  # let the server settle, then read the final state
    rss, running = scrape(url, proc)
    samples.append({"t": round(time.perf_counter() - start, 2), "rss_mb": rss, "running": running,
                    "completed": stats["ok"]})
    _ = rng
    return {"stats": stats, "samples": samples, "elapsed_s": time.perf_counter() - start}


def summarise(args, result: dict) -> dict:
    s, samples = result["stats"], result["samples"]
    total = s["ok"] + s["refused"] + s["lost"]
    warm = [x["rss_mb"] for x in samples if x["t"] >= args.warmup and x["rss_mb"] == x["rss_mb"]]
    third = max(1, len(warm) // 3)
    early, late = (statistics.median(warm[:third]), statistics.median(warm[-third:])) if warm else (0.0, 0.0)
    growth = late - early
    return {
        "requests": total, "ok": s["ok"], "refused": s["refused"], "refusals_by_status": s["refusals"],
        "lost": s["lost"], "errors": s["errors"][:20],
        "seconds": round(result["elapsed_s"], 1),
        "throughput_rps": round(s["ok"] / result["elapsed_s"], 2),
        "latency_s": {q: round(percentile(s["latency"], p), 4) for q, p in (("p50", .5), ("p90", .9), ("p99", .99))},
        "rss_mb_after_warmup": {"first_third_median": round(early, 1), "last_third_median": round(late, 1),
                                "growth": round(growth, 1)},
        "running_at_end": samples[-1]["running"],
        "memory_flat": growth <= args.max_growth_mb,
        "samples": samples,
    }


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x["t"] for x in summary["samples"]]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot(t, [x["completed"] for x in summary["samples"]])
    ax[0].set_ylabel("completed requests")
    ax[1].plot(t, [x["rss_mb"] for x in summary["samples"]])
    ax[1].set_ylabel("server RSS (MB)")
    ax[2].plot(t, [x["running"] for x in summary["samples"]])
    ax[2].set_ylabel("running requests")
    ax[2].set_xlabel("seconds")
    fig.suptitle(f"soak: {summary['requests']} requests, {summary['lost']} lost, "
                 f"p50 {summary['latency_s']['p50']} s, RSS growth {summary['rss_mb_after_warmup']['growth']} MB")
    fig.tight_layout()
    fig.savefig(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="server to soak (default: start one)")
    p.add_argument("--model-path", help="target for the server this script starts (default: tiny random Llama)")
    p.add_argument("--no-draft", action="store_true", help="start the server without speculation")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--max-requests", type=int, default=10**9)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--warmup", type=float, default=20, help="seconds before memory counts")
    p.add_argument("--max-growth-mb", type=float, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="soak")
    args = p.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url
        if url is None:
            proc, url = start_server(args, Path(tmp))
        try:
            result = asyncio.run(soak(args, url.rstrip("/"), proc))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
    summary = summarise(args, result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    summary["meta"] = {"commit": commit, "machine": f"{os.uname().nodename} {os.cpu_count()} cpus",
                       "args": {k: v for k, v in vars(args).items()}}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    plot(summary, out.with_suffix(".png"))
    brief = {k: summary[k] for k in ("requests", "ok", "refused", "lost", "throughput_rps", "latency_s",
                                     "rss_mb_after_warmup", "running_at_end", "memory_flat")}
    print(json.dumps(brief, indent=1))
    return 0 if summary["lost"] == 0 and summary["memory_flat"] and summary["running_at_end"] in (0, 0.0) else 1


if __name__ == "__main__":
    sys.exit(main())
