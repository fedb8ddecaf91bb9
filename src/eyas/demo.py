"""``eyas demo``: the whole story in one command, on a CPU, in a few minutes.

1. start ``eyas serve`` on loopback: SmolLM2-135M-Instruct as a user would start it (no speculative flag,
   so the setting eyas serve picks for the device: ``serve/defaults.py``) and the same target without
   speculation (the baseline); where the device's default does not speculate (the CPU), a third server runs
   the shipped EAGLE-3 draft at the chain 5/1/6, to show the draft accepted and what speculation costs there;
2. run ``eyas bench`` over HTTP against them, on the same chat prompts;
3. run the live ``eyas doctor`` against the server that speculates (probes, baseline) and print its
   verdict, then the lines ``curl /metrics | grep accept`` shows;
4. replay the story's mistake, ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft, and show
   eyas refusing it with its message.

When speculation does not pay on the machine, the demo says so with the measured reason (what a step that
drafts and verifies costs there in plain steps, against the tokens the draft gets accepted a step) and
reports the speedup of what eyas serve picked: plain decoding, 1.0x within noise.

Everything it starts it stops: the servers run in their own sessions and are terminated in
``finally``, also on Ctrl-C and SIGTERM. Without a shipped draft (a development checkout before
training), a randomly initialised draft stands in and the verdict says, truthfully, that it is
not accepted. Exit status 0 when the draft is accepted (the verdict starts with "working") and the
mistake was refused, 1 otherwise. Whether speculation pays is reported, not gated.
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
    p = sub.add_parser("demo", help="serve SmolLM2 + its draft, bench against a baseline, run the doctor "
                                    "(CPU, minutes)")
    p.add_argument("--model-path", default=SMOLLM2, help=f"target (default {SMOLLM2!r})")
    p.add_argument("--draft", default=None, help="draft folder (default: the draft shipped for the target)")
    p.add_argument("--speculative-num-steps", type=int, default=None,
                   help="draft tree depth (default: eyas serve's setting for the device)")
    p.add_argument("--speculative-eagle-topk", type=int, default=None, help="branching per node (1: a chain)")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens verified per step, counting the root")
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
        with open(self.log, "w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

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


TREE_ARGS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
SHOWN_TREE = (5, 1, 6)  # the chain the draft speculates with when the device's default does not (the CPU)


def _tree_flags(args) -> list[str]:
    """The demo's tree flags as eyas serve's (only those given; a chain fills the rest)."""
    given = {name: getattr(args, name) for name in TREE_ARGS if getattr(args, name) is not None}
    return [f for name, value in given.items() for f in ("--" + name.replace("_", "-"), str(value))]


def _choice(flags: list[str]):
    """The setting ``eyas serve FLAGS`` will run, with its reason, decided as the server decides it."""
    from .cli import build_parser
    from .serve.cli import pasted_flags, served_choice

    args = build_parser().parse_args(["serve", *flags])
    pasted_flags(args)
    return served_choice(args)[1]


def _bench(url: str, prompts: list[str], args, label: str, key: str | None):
    from .bench.cli import progress_bar
    from .bench.online import run_url

    with progress_bar(len(prompts), f"{label:11s}", False) as bar:
        return run_url(url, prompts, args.max_tokens, 0.0, 1, label, progress=bar, api_key=key)


def _interleaved(a_url: str, b_url: str, prompts: list[str], args, key: str | None):
    """(run on a, run on b), prompt by prompt in turn, so that a busy machine slows both alike (plain decoding
    on both sides: no acceptance to merge)."""
    from .bench.online import run_url
    from .bench.results import Run

    runs = {a_url: Run("baseline", 1, 0.0), b_url: Run("default", 1, 0.0)}
    for i, prompt in enumerate(prompts):
        for url in ((a_url, b_url) if i % 2 == 0 else (b_url, a_url)):
            one = run_url(url, [prompt], args.max_tokens, 0.0, 1, runs[url].label, api_key=key)
            runs[url].seconds += one.seconds
            runs[url].requests += one.requests
            runs[url].errors += one.errors
    return runs[a_url], runs[b_url]


def step_cost(spec_run, base_run) -> float | None:
    """What one speculative step costs in plain decoding steps, from a bench at one client: the seconds per
    step (tau tokens) over the seconds per plain token. Speculation pays only where tau exceeds it."""
    tau = spec_run.acceptance.get("tau")
    if not tau or not spec_run.tokens_per_s or not base_run.tokens_per_s:
        return None
    return tau * base_run.tokens_per_s / spec_run.tokens_per_s


def why_not(tree: tuple[int, int, int], cost: float | None, tau: float | None, speedup: float | None) -> str:
    """The plain words for a machine where speculation does not pay, with the figures measured on it."""
    steps, topk, tokens = tree
    shape = f"the chain {steps}/{topk}/{tokens}" if topk == 1 else f"the tree {steps}/{topk}/{tokens}"
    if cost is None or tau is None:
        return f"speculation was not measured here ({shape}: no acceptance figures)"
    return (f"speculation does not pay on this machine: a step of {shape} ({steps} draft forwards, then verifying "
            f"{tokens} tokens) costs {cost:.1f}x a plain decoding step here, and the draft accepts {tau:.2f} tokens "
            f"a step on these prompts ({speedup or 0:.2f}x): it pays only above {cost:.1f} tokens a step. "
            "On the 2-core CPU verifying 6 tokens costs 1.6x one and each draft forward is eager Python; "
            "benchmarks/results/cpu-default-smollm2.json")


def _demo(args, work: Path, servers: list, builtin_draft) -> int:
    start = time.perf_counter()
    draft = args.draft or (str(builtin_draft(args.model_path)) if builtin_draft(args.model_path) else None)
    shipped = draft is not None and args.draft is None
    _say(f"== eyas demo: {args.model_path} + EAGLE-3 draft ==")
    if draft is None:
        _say("no trained draft ships with this checkout yet: using a RANDOMLY INITIALISED draft as a stand-in,\n"
             "so expect the doctor to report it as not accepted (that is the honest answer)")
        draft = str(_random_draft(args.model_path, work / "random-draft"))
    _say(f"draft: {draft}" + (" (shipped with eyas)" if shipped else ""))
    tree = _tree_flags(args)
    # The server as a user starts it: the shipped draft needs no flag, so the device's default applies.
    default_flags = ["--model-path", args.model_path] + ([] if shipped else ["--speculative-draft-model-path", draft])
    choice = _choice(default_flags + tree)
    speculates = choice.setting != "0"
    _say(f"eyas serve's {choice.line()}")
    shown = tuple(getattr(args, n) or d for n, d in zip(TREE_ARGS, SHOWN_TREE))
    _say("\n[1/4] starting servers on loopback: a baseline without speculation, "
         + ("and EAGLE3 with the draft at that setting" if speculates else
            "eyas serve with its default (plain decoding here), and EAGLE3 with the draft at the chain "
            f"{'/'.join(map(str, shown))}, to show what speculation does on this machine"))
    base = Server("baseline", ["--model-path", args.model_path, "--speculative-algorithm", "NONE"], work)
    servers.append(base)
    default = Server("eagle3" if speculates else "default", default_flags + tree, work)
    servers.append(default)
    spec = default
    if not speculates:
        spec = Server("eagle3", ["--model-path", args.model_path, "--speculative-algorithm", "EAGLE3",
                                 "--speculative-draft-model-path", draft, "--speculative-num-steps", str(shown[0]),
                                 "--speculative-eagle-topk", str(shown[1]),
                                 "--speculative-num-draft-tokens", str(shown[2])], work)
        servers.append(spec)
    for s in servers:
        s.wait_ready(args.startup_timeout)
        _say(f"  {s.name:9s} {s.url} ready")

    from .bench.results import BenchResult, Level, table
    from .common.prompts import prompt_set

    prompts = prompt_set("chat")[: args.num_prompts]
    _say(f"\n[2/4] eyas bench --url {spec.url} --baseline-url {base.url} "
         f"--num-prompts {len(prompts)} --max-tokens {args.max_tokens}"
         )
    key = os.environ.get("EYAS_API_KEY")  # the servers pick it up too
    b = _bench(base.url, prompts, args, "baseline", key)
    s = _bench(spec.url, prompts, args, "speculative", key)
    settings = {"num_prompts": len(prompts), "max_tokens": args.max_tokens, "temperature": 0.0, "prompts": "chat"}
    bench = BenchResult("online", {"url": spec.url, "baseline_url": base.url, **settings}, [Level(1, b, s)])
    _say(table(bench))
    picked, d = bench, s
    if not speculates:
        _say(f"eyas serve's default (plain decoding, {default.url}) against the baseline, prompt by prompt in turn:")
        b2, d = _interleaved(base.url, default.url, prompts, args, key)
        picked = BenchResult("online", {"url": default.url, "baseline_url": base.url, **settings}, [Level(1, b2, d)])
        _say(table(picked))
    if args.out:
        import json

        from .bench.plots import write_plots

        data = bench.as_dict()
        data["plots"] = [str(p) for p in write_plots(bench, work)]
        data["default"] = {"setting": choice.setting, "source": choice.source, "why": choice.why,
                           "bench": picked.as_dict()}
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

    refused = _mistake(args, draft)
    tau = report.figures.get("tau")
    _say(f"\n== verdict: {report.verdict} ==")
    _say(f"tau {tau:.2f}" if tau is not None else "tau: not measured")
    if bench.levels[0].speedup:
        _say(f"bench speedup {bench.levels[0].speedup:.2f}x ({s.tokens_per_s:.1f} vs {b.tokens_per_s:.1f} tok/s, "
             f"batch 1, {len(prompts)} chat prompts x {args.max_tokens} tokens)")
    if not speculates:
        _say(why_not(shown, step_cost(s, b), s.acceptance.get("tau"), bench.levels[0].speedup))
        speedup = picked.levels[0].speedup
        _say(f"picked for this machine: plain decoding (eyas serve's {choice.source}): "
             + (f"{speedup:.2f}x ({d.tokens_per_s:.1f} vs {picked.levels[0].baseline.tokens_per_s:.1f} tok/s, the "
                "same setting as the baseline, so 1.0x within noise)" if speedup else "not measured"))
    _say(f"demo took {time.perf_counter() - start:.0f} s; all servers stopped")
    accepted = report.verdict.startswith("working")
    return 0 if refused and accepted else 1


def _mistake(args, draft: str) -> bool:
    """The story's mistake, replayed: True when eyas refuses it (exit status 2) before loading weights."""
    _say("\n[4/4] the story's mistake: the same EAGLE-3 draft with --speculative-algorithm EAGLE")
    flags = ["--model-path", args.model_path, "--speculative-algorithm", "EAGLE",
             "--speculative-draft-model-path", draft, "--port", str(free_port())]
    _say(f"$ eyas serve {' '.join(flags[:-2])}")
    mistake = subprocess.run([sys.executable, "-m", "eyas.serve", *flags], capture_output=True, text=True,
                             timeout=300, check=False, start_new_session=True)
    _say((mistake.stderr or mistake.stdout).strip())
    refused = mistake.returncode == 2
    _say(f"(exit status {mistake.returncode}: "
         + ("refused before any weight was loaded; SGLang would have served it at accept length 1.00)"
            if refused else "NOT refused: this is a bug in eyas)"))
    return refused
