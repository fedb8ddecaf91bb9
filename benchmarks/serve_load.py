#!/usr/bin/env python3
"""Served load: streaming chat completions at 1, 4, 16 and 64 clients, greedy and T = 0.7, JSON out.

    python benchmarks/serve_load.py --url http://127.0.0.1:30000 --baseline-url http://127.0.0.1:30001
    python benchmarks/serve_load.py --model-path smollm2-135m-instruct --in-process --out results/load.json
    python benchmarks/serve_load.py --model-path T --speculative-draft-model-path D --speculative-num-steps 3 ...

Given URLs, it loads the running servers (``--url``: the speculative one or the only one,
``--baseline-url``: a NONE one). Given ``--model-path`` and no URL, it starts ``python -m eyas.serve``
itself on loopback: one server from the ``--speculative-*`` flags and, when those speculate, a NONE
server of the same target beside it (``--no-baseline``: not), and stops them at the end.

Each level is ``clients`` closed-loop clients, each sending ``--requests-per-client`` streaming
``/v1/chat/completions`` one after another (``stream_options``: usage, continuous usage), prompts from
``--prompts`` (a built-in set or a JSONL file) in turn, ``--max-tokens`` each (``ignore_eos`` unless
``--stop-at-eos``, so every request asks the same work; ``--output-len-spread R``: each request's own length,
drawn from ``max_tokens x [1 - R, 1 + R]`` by its index in the level, the same draws for every server and the
in-process engine, so that rows end at different steps as real answers do, vLLM's ``--random-range-ratio``;
without it the rows of a NONE server all end in the same step), sampled at each of ``--temperatures`` with
``--top-p`` or the item's own (``0.7:0.95``; sent in every request; greedy ignores it). Per level: output
tok/s (all tokens over the level's wall time), TTFT (request sent to first text), inter-token latency (the
gap between two chunks with text; one chunk can hold several tokens, a speculative step's), TPOT per request
((e2e - TTFT) / (tokens - 1)), p50/p90/p99 of each, tau from the server's ``/metrics`` counters before and
after the level and, where the prompts have categories (a built-in set's name, a JSONL line's ``category``),
``per_category``: tau per category from each response's usage (verify steps and accepted tokens summed per
category, as ``eyas eval`` reports it) and, with ``auto``, the steps each setting ran
(``steps_per_setting``, from ``eyas:spec_setting_steps_total``) and what its chooser believed after it
(``chooser``: tau per setting and kind of row, step cost per setting, kind of batch and rows bucket, and
``observed_ms``: the level's live steps that moved those costs, [count, mean ms as measured]); for an eyas
server, ``engine_thread``: its engine thread's seconds in the level by activity and its steps (a turn is booked
when it ends: one under way as the level began counts in it whole).
``--in-process`` loads the same engine here (``--model-path`` and the ``--speculative-*`` flags must
describe the servers) and runs the same prompts through its own loop (steps launched ahead, as
``Engine.generate``) with the clients as the batch size and the same temperature and top-p, so each served
figure has its in-process figure beside it (with ``auto``, also the steps each setting ran in-process and
what that engine's chooser believed).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import write

from eyas.bench.online import scrape, served_model, stream_chat
from eyas.common import server_metrics
from eyas.common.categories import requests_tally
from eyas.common.prompts import prompt_records
from eyas.config import setting_name


def percentiles(xs: list[float]) -> dict | None:
    """p50/p90/p99 (nearest rank) and the mean, in seconds; None without samples."""
    if not xs:
        return None
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, max(0, round(q * len(xs) + 0.5) - 1))]
    return {"p50": round(pick(0.5), 6), "p90": round(pick(0.9), 6), "p99": round(pick(0.99), 6),
            "mean": round(sum(xs) / len(xs), 6)}


def per_client(args, clients: int) -> int:
    """Requests each client sends in a level: ``--requests-per-client``, more where ``--min-requests`` needs them."""
    return max(args.requests_per_client, -(-args.min_requests // clients))


def output_lengths(max_tokens: int, spread: float, n: int) -> list[int]:
    """The ``max_tokens`` of a level's ``n`` requests, by index: uniform over ``max_tokens x [1 - spread,
    1 + spread]`` (at least 1), the same list wherever it is drawn (a fixed seed); all ``max_tokens`` at 0."""
    rng = random.Random(0)
    low, high = max(1, round(max_tokens * (1 - spread))), round(max_tokens * (1 + spread))
    return [rng.randint(low, high) for _ in range(n)]


# -- over HTTP ------------------------------------------------------------------------------------
async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    s = await stream_chat(client, url, body)
    if not s.arrivals:
        raise RuntimeError("the stream carried no text")
    usage = s.usage or {}
    return {"tokens": int(usage.get("completion_tokens") or 0), "ttft": s.arrivals[0] - s.start,
            "e2e": s.end - s.start, "gaps": [b - a for a, b in itertools.pairwise(s.arrivals)],
            "steps": usage.get("spec_verify_ct"), "accepted": usage.get("spec_accept_token_num")}


async def load(url: str, model: str, prompts: list[tuple[str, str | None]], clients: int, per_client: int,
               max_tokens: int | list[int], temperature: float, ignore_eos: bool, timeout: float,
               top_p: float = 1.0) -> tuple[list[dict], list[str], float]:
    """``prompts``: (text, category or None) pairs, taken in turn; ``max_tokens``: one for all, or one per request
    of the level (``output_lengths``)."""
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def run_client(c: int) -> list:
            out = []
            for k in range(per_client):
                i = c * per_client + k
                prompt, category = prompts[i % len(prompts)]
                body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": max_tokens[i] if isinstance(max_tokens, list) else max_tokens,
                        "temperature": temperature, "top_p": top_p, "ignore_eos": ignore_eos, "stream": True,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
                try:
                    out.append({**await one_request(client, url, body), "category": category})
                except (httpx.HTTPError, RuntimeError, ValueError) as e:
                    out.append(f"{type(e).__name__}: {e}")
            return out

        start = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(run_client(c) for c in range(clients))) for r in rs]
        seconds = time.perf_counter() - start
    return [r for r in results if isinstance(r, dict)], [r for r in results if isinstance(r, str)], seconds


def server_state(url: str) -> tuple[dict[str, float], dict, dict[str, float]]:
    """The server's state from ``/metrics``: the engine thread's seconds so far by activity and its steps
    (``eyas:engine_thread_seconds_total``, ``eyas:engine_steps_total``; another server's: empty), and
    ``auto``'s (both empty for a fixed setting): the steps run per setting so far
    (``eyas:spec_setting_steps_total``), and what its chooser believes (its tau per setting and kind of row,
    and where timed its step cost per setting, kind of batch and rows bucket)."""
    try:
        parsed = server_metrics.parse(httpx.get(url + "/metrics", timeout=30).text)
    except (httpx.HTTPError, ValueError):
        return {}, {}, {}
    thread = {labels["activity"]: v for labels, v in parsed.get("eyas:engine_thread_seconds", [])}
    thread.update(("steps", v) for _, v in parsed.get("eyas:engine_steps", []))
    steps = {labels["setting"]: v for labels, v in parsed.get("eyas:spec_setting_steps", [])}
    view: dict = {}
    for labels, v in parsed.get("eyas:spec_expected_accept_length", []):
        view.setdefault("tau", {}).setdefault(labels["setting"], {})[labels["rows"]] = round(v, 4)
    for labels, v in parsed.get("eyas:spec_step_cost_seconds", []):
        costs = view.setdefault("cost_ms", {}).setdefault(labels["setting"], {}).setdefault(labels["rows"], {})
        costs[labels["bucket"]] = round(1000 * v, 4)
    for name, at in (("eyas:spec_step_observations", 0), ("eyas:spec_step_observed_seconds", 1)):
        for labels, v in parsed.get(name, []):
            tally = view.setdefault("observed", {}).setdefault(labels["setting"], {}).setdefault(labels["rows"], {})
            tally.setdefault(labels["bucket"], [0.0, 0.0])[at] = v
    return steps, view, thread


def observed_during(before: dict, after: dict) -> dict:
    """{setting: {kind: {bucket: [steps, mean ms]}}}: the live steps that moved the chooser's cost estimates between
    two ``server_state`` views, and their mean seconds as measured (before the estimate's clip and average)."""
    out: dict = {}
    for setting, kinds in after.get("observed", {}).items():
        for kind, buckets in kinds.items():
            for bucket, (n, seconds) in buckets.items():
                n0, s0 = before.get("observed", {}).get(setting, {}).get(kind, {}).get(bucket, (0.0, 0.0))
                if n > n0:
                    mean_ms = round(1000 * (seconds - s0) / (n - n0), 4)
                    out.setdefault(setting, {}).setdefault(kind, {})[bucket] = [int(n - n0), mean_ms]
    return out


def served_level(url: str, model: str, prompts: list[tuple[str, str | None]], clients: int, args,
                 temperature: float, top_p: float) -> dict:
    _, before = scrape(url)
    steps_before, view_before, thread_before = server_state(url)
    n = per_client(args, clients)
    done, errors, seconds = asyncio.run(load(url, model, prompts, clients, n,
                                             output_lengths(args.max_tokens, args.output_len_spread, clients * n),
                                             temperature, not args.stop_at_eos, args.timeout,
                                             top_p))
    _, after = scrape(url)
    steps_after, view, thread_after = server_state(url)
    steps = {k: int(v - steps_before.get(k, 0)) for k, v in steps_after.items()}
    tokens = sum(r["tokens"] for r in done)
    level = {"requests": len(done), "errors": errors[:5], "output_tokens": tokens, "seconds": round(seconds, 4),
             "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else 0.0,
             "ttft_s": percentiles([r["ttft"] for r in done]),
             "itl_s": percentiles([g for r in done for g in r["gaps"]]),
             "tpot_s": percentiles([(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in done if r["tokens"] > 1]),
             "tau": None, "per_category": requests_tally((r["category"], r["steps"], r["accepted"]) for r in done)}
    if thread_after:  # where the engine thread's time went during this level (seconds; steps: a count)
        level["engine_thread"] = {k: round(v - thread_before.get(k, 0.0), 4) for k, v in thread_after.items()}
    if any(steps.values()):  # which settings auto ran during this level, and why
        level["steps_per_setting"] = {k: n for k, n in steps.items() if n}
        level["chooser"] = {**{k: v for k, v in view.items() if k != "observed"},
                            "observed_ms": observed_during(view_before, view)}
    if after is not None and after.has_spec_metrics:
        acc = server_metrics.acceptance(before, after)
        if acc is not None and acc.tau is not None:
            level["tau"] = round(acc.tau, 4)
            level["accept_rate"] = round(acc.rate, 4) if acc.rate is not None else None
    return level


# -- in-process -----------------------------------------------------------------------------------
def in_process_level(engine, prompt_ids: list[list[int]], clients: int, args, temperature: float,
                     top_p: float, categories: list[str | None] | None = None) -> dict:
    from eyas.bench.offline import run_engine
    from eyas.sample.sampling import SamplingParams

    n = clients * per_client(args, clients)
    ids = [prompt_ids[i % len(prompt_ids)] for i in range(n)]
    groups = [categories[i % len(categories)] for i in range(n)] if categories else None
    lengths = output_lengths(args.max_tokens, args.output_len_spread, n)  # as the served level's requests
    params = [SamplingParams(max_new_tokens=m, temperature=temperature, top_p=top_p if temperature else 1.0,
                             ignore_eos=not args.stop_at_eos) for m in lengths]
    chooser = engine.chooser
    before = dict(chooser.steps) if chooser else {}
    run = run_engine(engine, ids, params, clients, "in-process", categories=groups)
    tokens = run.output_tokens
    level = {"tokens_per_s": round(tokens / run.seconds, 2), "output_tokens": tokens, "seconds": round(run.seconds, 4),
             "ttft_s": percentiles([r.ttft for r in run.requests if r.ttft is not None]),
             "tpot_s": percentiles([r.tpot for r in run.requests if r.tpot is not None]),
             "tau": run.acceptance.get("tau"), "per_category": run.per_category}
    if chooser:  # as the served level's: the steps each setting ran, and what the chooser believed after them
        level["steps_per_setting"] = {setting_name(s): n - before[s] for s, n in chooser.steps.items() if n > before[s]}
        kinds = list(chooser.costs)  # kinds of batch: greedy, sampled
        level["chooser"] = {"tau": {setting_name(s): {k: round(chooser.tau(s, k), 4) for k in chooser.reach}
                                    for s in chooser.options}}
        if chooser.measured:
            level["chooser"]["cost_ms"] = {
                setting_name(s): {k: {str(b): round(1000 * v, 4) for b, v in chooser.costs[k][s].items()}
                                  for k in kinds} for s in chooser.options}
    return level


# -- servers it starts itself ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(flags: list[str], log_path: Path, stack: ExitStack, py_spy: str | None = None
                 ) -> tuple[str, subprocess.Popen]:
    """``eyas serve`` on a free loopback port, stopped when ``stack`` closes. ``py_spy``: run under that py-spy
    binary, which records the server's Python stacks, every thread, idle included, for its whole life (collapsed
    stacks beside ``log_path``, ``.stacks.txt``; a child, as attaching needs rights a container may not grant)."""
    port = free_port()
    log = stack.enter_context(open(log_path, "w"))  # noqa: SIM115 - closed by the stack
    command = [sys.executable, "-m", "eyas.serve", *flags, "--port", str(port), "--log-interval", "0"]
    if py_spy:
        command = [py_spy, "record", "--rate", "200", "--idle", "--threads", "--nonblocking", "--format", "raw",
                   "--output", str(log_path.with_suffix(".stacks.txt")), "--", *command]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def stop():
        server = child_of(proc.pid) if py_spy else proc.pid  # py-spy writes its stacks once the server ends
        if server is not None:
            os.kill(server, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()

    stack.callback(stop)
    return f"http://127.0.0.1:{port}", proc


def child_of(pid: int) -> int | None:
    """The first child process of ``pid`` (py-spy's: the server), from /proc."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def wait_ready(url: str, proc, log_path: Path, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} was not ready in {timeout:.0f} s")


def engine_flags(args) -> list[str]:
    """The engine flags given here, as ``eyas serve`` takes them (speculative ones apart)."""
    flags = ["--model-path", args.model_path, "--device", args.device, "--dtype", args.dtype,
             "--max-running-requests", str(args.max_running_requests)]
    flags += [] if args.overlap_schedule else ["--no-overlap-schedule"]
    flags += shlex.split(args.serve_flags) if args.serve_flags else []
    return flags + (["--disable-cuda-graph"] if args.disable_cuda_graph else [])


def spec_flags(args) -> list[str]:
    out = []
    for name in ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                 "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_batch_schedule",
                 "draft_feed_interval"):
        value = getattr(args, name)
        if value is not None:
            out += ["--" + name.replace("_", "-"), str(value)]
    return out


def label_of(url: str) -> str:
    try:
        return str(httpx.get(url + "/server_info", timeout=10).json().get("algorithm") or "server")
    except (httpx.HTTPError, ValueError):
        return "server"


# -- the command ----------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (the speculative one, or the only one)")
    p.add_argument("--baseline-url", help="a running NONE server of the same target")
    p.add_argument("--model-path", help="start the servers from this target (and --speculative-* flags)")
    for name in ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-batch-schedule"):
        p.add_argument(name, default=None)
    for name in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--draft-feed-interval"):
        p.add_argument(name, type=int, default=None)
    p.add_argument("--no-baseline", action="store_true", help="start no NONE server beside the speculative one")
    p.add_argument("--static-settings", default=None, metavar="'S,K,N;...'",
                   help="also start one static server per tree (num_steps,eagle_topk,num_draft_tokens) of the same "
                        "draft beside them, e.g. '3,1,4;5,1,6;4,4,16;6,8,32': each level runs every server, and the "
                        "summary sets the first server against NONE and against the best of these")
    p.add_argument("--serve-flags", default=None, metavar="'FLAGS'",
                   help="more eyas serve flags for both servers it starts, one string (e.g. "
                        "'--membership-wait-steps 0'), so that one command A/Bs a serving setting")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--overlap-schedule", action=argparse.BooleanOptionalAction, default=True,
                   help="the servers' overlap schedule (on, as eyas serve's default; --no-overlap-schedule: off)")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--clients", default="1,4,16,64", help="client counts (default 1,4,16,64)")
    p.add_argument("--temperatures", default="0,0.7",
                   help="default 0,0.7; an item T:P samples at T with top-p P (else --top-p), e.g. 0,0.7:0.95,1:1")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus top-p sent with every request (default 1.0: off, as OpenAI clients send)")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=0,
                   help="at least this many requests per level (more per client at low client counts): a level "
                        "long enough that a server's warm-up and its adaptive choice settle (default 0)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--output-len-spread", type=float, default=0.0, metavar="R",
                   help="each request's max_tokens drawn from max_tokens x [1 - R, 1 + R], the same for every "
                        "server (default 0: all alike, so a NONE server's rows end in the same step)")
    p.add_argument("--stop-at-eos", action="store_true", help="let requests end at end of turn (default: ignore_eos)")
    p.add_argument("--prompts", default="chat", help="chat, code, reasoning, all, or a JSONL file "
                   "(\"prompt\" and optionally \"category\" per line)")
    p.add_argument("--in-process", action="store_true", help="also the engine in this process, same prompts")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="JSON file (default: print only)")
    p.add_argument("--logs", default=None, metavar="DIR",
                   help="keep the servers' logs here (main.log, NONE.log: the banner, what adaptive speculation "
                        "chose and why, what was built after warm-up); default: a temporary folder, removed")
    p.add_argument("--py-spy", default=None, metavar="BIN",
                   help="run the servers it starts under this py-spy binary: each one's Python stacks, every "
                        "thread, idle included, over its whole life, as <name>.stacks.txt in --logs "
                        "(benchmarks/stacks.py reads them)")
    args = p.parse_args(argv)
    if not 0.0 <= args.output_len_spread < 1.0:
        p.error(f"--output-len-spread must be in [0, 1), got {args.output_len_spread}: e.g. 0.5 for lengths "
                "from half to one and a half --max-tokens")
    if not 0.0 < args.top_p <= 1.0:
        p.error(f"--top-p must be in (0, 1], got {args.top_p}: e.g. --top-p 0.95, or 1 for no filter")
    try:
        args.levels = temperature_levels(args.temperatures, args.top_p)
    except ValueError as e:
        p.error(f"--temperatures: {e}")
    if not args.url and not args.model_path:
        p.error("give --url (and --baseline-url) for running servers, or --model-path to start them")
    if args.py_spy and not (args.model_path and args.logs and not args.url):
        p.error("--py-spy records the servers this starts: give --model-path (no --url) and --logs DIR")
    if args.in_process and not args.model_path:
        p.error("--in-process loads the engine here: give --model-path and the servers' --speculative-* flags")
    for tree in (args.static_settings or "").split(";"):
        if tree.strip() and (args.url or not args.speculative_draft_model_path or len(tree.split(",")) != 3
                             or not all(x.strip().isdigit() for x in tree.split(","))):
            p.error(f"--static-settings {tree.strip()!r}: give trees as S,K,N;S,K,N (e.g. '3,1,4;6,8,32'), with "
                    "--model-path and --speculative-draft-model-path (the static servers are started here)")
    return args


def settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("out", "levels")}


def save(args, runs: list[dict], complete: bool) -> None:
    write(args.out, "served load: streaming chat completions per client count and temperature",
          {"settings": settings(args), "complete": complete, "summary": summary(runs), "runs": runs},
          quiet=not complete)


def static_trees(args) -> list[str]:
    """``--static-settings``' trees, each as ``S,K,N``."""
    return [t.strip().replace(" ", "") for t in (args.static_settings or "").split(";") if t.strip()]


def static_flags(args, tree: str) -> list[str]:
    """A static server of ``tree``: the first server's algorithm and draft, its tree flags, no schedule."""
    steps, topk, tokens = tree.split(",")
    return ["--speculative-algorithm", args.speculative_algorithm or "EAGLE3",
            "--speculative-draft-model-path", args.speculative_draft_model_path,
            "--speculative-num-steps", steps, "--speculative-eagle-topk", topk,
            "--speculative-num-draft-tokens", tokens]


def summary(runs: list[dict]) -> list[str]:
    """Per level, the first server's tok/s against NONE's and against the best other speculating server's."""
    out = []
    for key in dict.fromkeys((r["temperature"], r["top_p"], r["clients"]) for r in runs):
        level = {r["server"]: r["tokens_per_s"] for r in runs if (r["temperature"], r["top_p"], r["clients"]) == key}
        first, rate = next(iter(level.items()))
        others = {k: v for k, v in level.items() if k not in (first, "NONE")}
        text = f"T={key[0]} top-p {key[1]} c={key[2]}: {first} {rate:.0f} tok/s"
        if level.get("NONE"):
            text += f", {rate / level['NONE']:.3f}x NONE"
        if others:
            best = max(others, key=others.get)
            text += f", {rate / others[best]:.3f}x the best static ({best}, {others[best]:.0f} tok/s)"
        out.append(text)
    return out


def temperature_levels(text: str, top_p: float) -> list[tuple[float, float]]:
    """``0,0.7:0.95,1:1`` -> [(0.0, top_p), (0.7, 0.95), (1.0, 1.0)]: each level's temperature and top-p."""
    levels = []
    for item in text.split(","):
        t, _, p = item.partition(":")
        level = (float(t), float(p) if p else top_p)
        if level[0] < 0 or not 0.0 < level[1] <= 1.0:
            raise ValueError(f"{item!r}: a temperature is >= 0 and a top-p in (0, 1], e.g. 0.7:0.95")
        levels.append(level)
    return levels


def main(argv=None) -> int:
    args = parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    prompts = prompt_records(args.prompts)
    with ExitStack() as stack:
        targets = []  # (label, url)
        if args.url:
            targets = [(label_of(args.url), args.url.rstrip("/"))]
            if args.baseline_url:
                targets.append(("NONE", args.baseline_url.rstrip("/")))
        else:
            work = (Path(args.logs) if args.logs
                    else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="serve-load-"))))
            work.mkdir(parents=True, exist_ok=True)
            wanted = [("main", engine_flags(args) + spec_flags(args))]
            if not args.no_baseline and args.speculative_algorithm != "NONE":
                wanted.append(("NONE", engine_flags(args) + ["--speculative-algorithm", "NONE"]))
            wanted += [(tree, engine_flags(args) + static_flags(args, tree)) for tree in static_trees(args)]
            # the first server starts once the others are ready: an ``auto`` one times its steps while it
            # captures its graphs, which must not share the GPU with another server's capture
            ready = {}
            for group in (wanted[1:], wanted[:1]):
                started = [(name, *start_server(flags, work / f"{name}.log", stack, args.py_spy),
                            work / f"{name}.log") for name, flags in group]
                for name, url, proc, log_path in started:
                    wait_ready(url, proc, log_path)
                    ready[name] = (name if name in static_trees(args) else label_of(url), url)
            targets = [ready[name] for name, _ in wanted]
            targets = list(dict.fromkeys(targets))  # the main server may itself be NONE
        engines = in_process_engines(args, [label for label, _ in targets]) if args.in_process else {}
        runs = []
        models = {url: served_model(url) for _, url in targets}
        for url, model in models.items():
            asyncio.run(load(url, model, prompts[:1], 1, 1, 8, 0.0, True, args.timeout, args.top_p))  # warm-up
        # level by level, the servers one after the other: a ratio between them is taken minutes apart at most
        for temperature, top_p in args.levels:
            for c in clients:
                for label, url in targets:
                    level = {"server": label, "url": url, "clients": c, "temperature": temperature,
                             "top_p": top_p,
                             **served_level(url, models[url], prompts, c, args, temperature, top_p)}
                    if label in engines:
                        engine, ids = engines[label]
                        inproc = in_process_level(engine, ids, c, args, temperature, top_p, [g for _, g in prompts])
                        level["in_process"] = inproc
                        level["served_over_in_process"] = round(level["tokens_per_s"] / inproc["tokens_per_s"], 3)
                    print(line(level), flush=True)
                    runs.append(level)
                    if args.out:  # after every level: a run cut short (a device call's time limit) keeps its levels
                        save(args, runs, complete=False)
    for text in summary(runs):
        print(text)
    if args.out:
        save(args, runs, complete=True)
    else:
        print(json.dumps({"settings": settings(args), "runs": runs}, indent=1))
    return 1 if any(r["errors"] for r in runs) else 0


def in_process_engines(args, labels: list[str]) -> dict:
    """label -> (engine, chat prompt ids): the servers' engine built here, and its NONE twin."""
    from eyas.bench.offline import warm_up
    from eyas.common.prompts import chat_ids
    from eyas.pipeline import EngineArgs, baseline_engine, build_engine

    kw = {k: getattr(args, k) for k in ("speculative_algorithm", "speculative_draft_model_path",
                                        "speculative_num_steps", "speculative_eagle_topk",
                                        "speculative_num_draft_tokens", "speculative_batch_schedule")
          if getattr(args, k) is not None}
    engine = build_engine(EngineArgs(model_path=args.model_path, device=args.device, dtype=args.dtype,
                                     cuda_graphs=not args.disable_cuda_graph, max_batch=args.max_running_requests,
                                     **kw))
    ids = [chat_ids(engine.target.tokenizer, p) for p, _ in prompt_records(args.prompts)]  # as the server renders them
    out = {engine.spec.algorithm.value: (engine, ids)}
    if engine.spec.speculative and "NONE" in labels:
        out["NONE"] = (baseline_engine(engine), ids)
    for e, p in out.values():
        warm_up(e, p[0])
    return {label: v for label, v in out.items() if label in labels}


def steps_text(level: dict) -> str:
    return " steps " + " ".join(f"{k}:{n}" for k, n in level["steps_per_setting"].items())


def line(level: dict) -> str:
    ms = lambda d, k="p50": "-" if not d else f"{1000 * d[k]:.2f}"
    text = (f"{level['server']:>6} c={level['clients']:<3} T={level['temperature']:<4} "
            f"{level['tokens_per_s']:>9.1f} tok/s  TTFT p50 {ms(level['ttft_s'])} ms  "
            f"ITL p50 {ms(level['itl_s'])} p99 {ms(level['itl_s'], 'p99')} ms")
    if level.get("tau") is not None:
        text += f"  tau {level['tau']:.2f}"
        if level["tau"] < 1.005:  # a draft that never works here (or a fault): a number not to report
            text += " (NO DRAFT TOKEN ACCEPTED)"
    if level.get("per_category"):
        text += " (" + ", ".join(f"{g} {r['accept_length']:.2f}" for g, r in level["per_category"].items()) + ")"
    if level.get("steps_per_setting"):
        text += " " + steps_text(level)
    if level.get("engine_thread"):
        text += "  thread " + " ".join(f"{k}:{v:g}" for k, v in level["engine_thread"].items())
    if "in_process" in level:
        inproc = level["in_process"]
        text += f"  in-process {inproc['tokens_per_s']:.1f} tok/s ({level['served_over_in_process']:.0%})"
        if inproc.get("steps_per_setting"):
            text += steps_text(inproc)
    if level["errors"]:
        text += f"  ERRORS {len(level['errors'])}: {level['errors'][0]}"
    return text


if __name__ == "__main__":
    sys.exit(main())
