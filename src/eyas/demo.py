"""``eyas demo``: the whole story in one command, on a CPU, in a few minutes.

1. start ``eyas serve`` twice on loopback: SmolLM2-135M-Instruct with its shipped EAGLE-3 draft
   (``EAGLE3``), and the same target without speculation (the baseline);
2. run ``eyas bench`` over HTTP against both, on the same chat prompts;
3. run the live ``eyas doctor`` against the speculative server (probes, baseline) and print its
   verdict, then the lines ``curl /metrics | grep accept`` shows;
4. replay the story's mistake, ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft, and show
   eyas refusing it with its message.

Everything it starts it stops: the servers run in their own sessions and are terminated in
``finally``, also on Ctrl-C and SIGTERM. Without a shipped draft (a development checkout before
training), a randomly initialised draft stands in and the verdict says, truthfully, that it is
not accepted. Exit status 0 when the draft is accepted (the verdict starts with "working") and the
mistake was refused, 1 otherwise. Whether speculation pays on this machine is reported, not
gated: a 135M target on a CPU is dominated by per-forward overhead, so a weak draft can be
accepted and still slower (the verdict then says "working (tau ...) but SLOWER THAN BASELINE").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .errors import EyasError
from .models.loading import SMOLLM2


def register(sub) -> None:
    p = sub.add_parser("demo", help="serve SmolLM2 + its draft, bench against a baseline, run the doctor (CPU, minutes)")
    p.add_argument("--model-path", default=SMOLLM2, help=f"target (default {SMOLLM2!r})")
    p.add_argument("--draft", default=None, help="draft folder (default: the draft shipped for the target)")
    p.add_argument("--speculative-num-steps", type=int, default=5, help="draft tree depth (default 5)")
    p.add_argument("--speculative-eagle-topk", type=int, default=1, help="branching per node (default 1, a chain)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=6,
                   help="tokens verified per step, counting the root (default 6)")
    p.add_argument("--num-prompts", type=int, default=6, help="bench prompts (default 6)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument("--probes", type=int, default=3, help="doctor probes (default 3)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for each server")
    p.add_argument("--out", default=None, help="keep the logs, bench.json and plots here (default: a temp dir)")
    p.set_defaults(func=run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``python -m eyas.serve`` child in its own session, logs in files."""

    def __init__(self, name: str, flags: list[str], logs: Path):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"{name}.log"
        cmd = [sys.executable, "-m", "eyas.serve", *flags, "--port", str(self.port), "--log-interval", "0",
               "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise EyasError(f"the {self.name} server exited with status {self.proc.returncode}:\n"
                                + self.log.read_text()[-3000:], "see the log above")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise EyasError(f"the {self.name} server did not answer /health within {timeout:.0f} s",
                        f"see {self.log}; raise --startup-timeout on a slow machine")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def _say(text: str = "") -> None:
    print(text, flush=True)


def _random_draft(model_path: str, folder: Path) -> Path:
    """Stand-in draft (random weights) when none ships: the demo still runs, and says it is not accepted."""
    from .models.draft import Eagle3Draft
    from .models.loading import load_target

    target = load_target(model_path)
    Eagle3Draft.for_target(target).save_pretrained(folder)
    return folder


def run(args) -> int:
    from .common.draft_registry import builtin_draft

    def on_term(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="eyas-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    servers: list[Server] = []
    try:
        return _demo(args, work, servers, builtin_draft)
    except KeyboardInterrupt:
        _say("\ninterrupted: stopping the servers")
        return 130
    finally:
        for s in servers:
            s.stop()
        signal.signal(signal.SIGTERM, previous)
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)


def _demo(args, work: Path, servers: list, builtin_draft) -> int:
    start = time.perf_counter()
    draft = args.draft or (str(builtin_draft(args.model_path)) if builtin_draft(args.model_path) else None)
    shipped = draft is not None and args.draft is None
    _say(f"== eyas demo: {args.model_path} + EAGLE-3 draft, on the CPU ==")
    if draft is None:
        _say("no trained draft ships with this checkout yet: using a RANDOMLY INITIALISED draft as a stand-in,\n"
             "so expect the doctor to report it as not accepted (that is the honest answer)")
        draft = str(_random_draft(args.model_path, work / "random-draft"))
    _say(f"draft: {draft}" + (" (shipped with eyas)" if shipped else ""))
    _say("\n[1/4] starting two servers on loopback: EAGLE3 with the draft, and a baseline without speculation")
    spec = Server("eagle3", ["--model-path", args.model_path, "--speculative-algorithm", "EAGLE3",
                             "--speculative-draft-model-path", draft,
                             "--speculative-num-steps", str(args.speculative_num_steps),
                             "--speculative-eagle-topk", str(args.speculative_eagle_topk),
                             "--speculative-num-draft-tokens", str(args.speculative_num_draft_tokens)], work)
    servers.append(spec)
    base = Server("baseline", ["--model-path", args.model_path, "--speculative-algorithm", "NONE"], work)
    servers.append(base)
    for s in servers:
        s.wait_ready(args.startup_timeout)
        _say(f"  {s.name:9s} {s.url} ready")

    from .bench.online import run_url
    from .bench.results import BenchResult, Level, table
    from .common.prompts import prompt_set

    prompts = prompt_set("chat")[: args.num_prompts]
    _say(f"\n[2/4] eyas bench --url {spec.url} --baseline-url {base.url} "
         f"--num-prompts {len(prompts)} --max-tokens {args.max_tokens}")
    key = os.environ.get("EYAS_API_KEY")  # the servers pick it up too
    from .bench.cli import progress_bar

    with progress_bar(len(prompts), "baseline   ", False) as bar:
        b = run_url(base.url, prompts, args.max_tokens, 0.0, 1, "baseline", progress=bar, api_key=key)
    with progress_bar(len(prompts), "speculative", False) as bar:
        s = run_url(spec.url, prompts, args.max_tokens, 0.0, 1, "speculative", progress=bar, api_key=key)
    bench = BenchResult("online", {"url": spec.url, "baseline_url": base.url, "prompts": "chat",
                                   "num_prompts": len(prompts), "max_tokens": args.max_tokens, "temperature": 0.0},
                        [Level(1, b, s)])
    _say(table(bench))
    if args.out:
        import json

        from .bench.plots import write_plots

        data = bench.as_dict()
        data["plots"] = [str(p) for p in write_plots(bench, work)]
        (work / "bench.json").write_text(json.dumps(data, indent=2) + "\n")

    from .doctor.live import LiveOptions, diagnose_live
    from .doctor.verdict import render

    _say(f"\n[3/4] eyas doctor --url {spec.url} --probes {args.probes} --baseline-url {base.url}")
    report = diagnose_live(spec.url, LiveOptions(probes=args.probes, max_tokens=args.max_tokens,
                                                 baseline_url=base.url, api_key=key))
    _say(render(report))
    _say(f"\n$ curl -s {spec.url}/metrics | grep accept | grep -v _bucket")
    for line in httpx.get(spec.url + "/metrics", timeout=30).text.splitlines():
        if "accept" in line and not line.startswith("#") and "_bucket" not in line:
            _say(line)
    for srv in servers:
        srv.stop()

    _say("\n[4/4] the story's mistake: the same EAGLE-3 draft with --speculative-algorithm EAGLE")
    flags = ["--model-path", args.model_path, "--speculative-algorithm", "EAGLE",
             "--speculative-draft-model-path", draft, "--port", str(free_port())]
    _say(f"$ eyas serve {' '.join(flags[:-2])}")
    mistake = subprocess.run([sys.executable, "-m", "eyas.serve", *flags], capture_output=True, text=True,
                             timeout=300, start_new_session=True)
    _say((mistake.stderr or mistake.stdout).strip())
    refused = mistake.returncode == 2
    _say(f"(exit status {mistake.returncode}: "
         + ("refused before any weight was loaded; SGLang would have served it at accept length 1.00)"
            if refused else "NOT refused: this is a bug in eyas)"))

    tau = report.figures.get("tau")
    speedup = bench.levels[0].speedup
    _say(f"\n== verdict: {report.verdict} ==")
    _say(f"tau {tau:.2f}" if tau is not None else "tau: not measured")
    if speedup:
        _say(f"bench speedup {speedup:.2f}x ({s.tokens_per_s:.1f} vs {b.tokens_per_s:.1f} tok/s, batch 1, "
             f"{len(prompts)} chat prompts x {args.max_tokens} tokens)")
    _say(f"demo took {time.perf_counter() - start:.0f} s; all servers stopped")
    accepted = report.verdict.startswith("working")
    return 0 if refused and accepted else 1
