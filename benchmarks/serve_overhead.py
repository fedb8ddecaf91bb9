#!/usr/bin/env python3
"""What the server itself costs: eyas serve with the device's work replaced by sleeps, under streaming load.

    python benchmarks/serve_overhead.py --step-ms 0.5 --out benchmarks/results/serve-overhead-cpu.json

The real ``eyas serve`` stack (uvicorn, the OpenAI routes, the scheduler thread, the event loop's
detokenizing and SSE framing) over a real target's tokenizer and chat template (``--model-path``,
default the embedded SmolLM2), with the engine's device work replaced: a step sleeps ``--step-ms``
(the interpreter lock free, as it is while a replay runs) and gives every row one token; a prefill
sleeps ``--prefill-ms`` and gives each new row its first token. With the overlap schedule (on unless
``--no-overlap-schedule``, as ``eyas serve``) a step is launched onto a queue that frees ``--step-ms``
after the step before it ends, and collecting it sleeps until then, as a GPU's stream would. Nothing
runs on a device, so any machine measures how much a served step costs beyond the device's own time:
the inter-token latency over ``--step-ms`` and the tokens per second against ``clients x k x 1000 / step-ms``
(``--tokens-per-step`` k: each step hands every row k tokens, as a speculative step that accepted k - 1 does;
``--spread``: 1 to 2k - 1 of them, so rows end apart and the batch changes often, ``--membership-wait-steps``).
The load is ``serve_load.py``'s (closed-loop streaming chat clients, ``ignore_eos``), in the same process as the
client, so on a small machine the two share its cores: compare runs of one machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def serve(args) -> None:
    """The server, its engine's device work replaced by sleeps (``--serve``: the subprocess)."""
    import uvicorn

    from eyas.engine.batch import Batch
    from eyas.pipeline import EngineArgs, build_engine
    from eyas.serve.app import ServeOptions, create_app

    engine = build_engine(EngineArgs(model_path=args.model_path, speculative_algorithm="NONE", device="cpu",
                                     max_batch=args.max_running_requests))
    vocab = engine.target.info.vocab_size
    tokens = list(range(vocab // 2, vocab // 2 + min(100, vocab // 4)))  # ordinary tokens, mid-vocabulary

    spread = random.Random(0)

    def emit(seqs, k: int = 1) -> list[list[int]]:
        """``k`` tokens a row, as a speculative step that accepted ``k - 1`` draft tokens hands them over (with
        ``--spread``, 1 to 2k - 1 of them, k on average: rows then end at different steps, as a tree's do)."""
        out = []
        for i, s in enumerate(seqs):
            got = spread.randint(1, 2 * k - 1) if args.spread and k > 1 else k
            n = len(s.prompt_ids) + len(s.output_ids) + got
            if k > 1:  # the engine's per-row bookkeeping of a verify step (``Engine.collect``)
                s.stats.record(args.tokens_per_step, got - 1)
            out.append(s.emit([tokens[(n + i + j) % len(tokens)] for j in range(got)], engine._eos,
                              engine.context_limit))
        return out

    def prefill(seqs):
        time.sleep(args.prefill_ms / 1e3)
        emit(seqs)
        return Batch(list(seqs), None, None, None, None)

    def step(batch, setting=None):
        time.sleep(args.step_ms / 1e3)
        return emit(batch.seqs, args.tokens_per_step)

    device = {"free": 0.0}  # when the device's queue runs dry: steps launched ahead queue behind each other

    def launch(batch, setting=None, ahead=False):
        now = time.perf_counter()
        device["free"] = max(device["free"], now) + args.step_ms / 1e3
        return SimpleNamespace(batch=batch, start=now, done=device["free"])

    def collect(step):
        time.sleep(max(0.0, step.done - time.perf_counter()))
        return emit(step.batch.seqs, args.tokens_per_step)

    engine.prefill, engine.step, engine.launch, engine.collect = prefill, step, launch, collect
    engine.merge = lambda a, b: b if a is None or not len(a) else Batch(a.seqs + b.seqs, None, None, None, None)
    engine.filter = lambda batch, keep: Batch([batch.seqs[i] for i in keep], None, None, None, None)
    engine.prefill_groups = lambda seqs: [list(range(len(seqs)))] if seqs else []
    app = create_app(engine, ServeOptions(model_path=args.model_path, switch_interval_ms=args.switch_interval_ms,
                                          max_running_requests=args.max_running_requests,
                                          overlap_schedule=args.overlap_schedule,
                                          membership_wait_steps=args.membership_wait_steps))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


def measure(args) -> dict:
    import serve_load

    port = serve_load.free_port()
    cmd = [sys.executable, __file__, "--serve", "--port", str(port), "--model-path", args.model_path,
           "--step-ms", str(args.step_ms), "--prefill-ms", str(args.prefill_ms),
           "--max-running-requests", str(args.max_running_requests), "--tokens-per-step", str(args.tokens_per_step),
           "--switch-interval-ms", str(args.switch_interval_ms)]
    cmd += ["--overlap-schedule" if args.overlap_schedule else "--no-overlap-schedule"]
    cmd += ["--membership-wait-steps", str(args.membership_wait_steps)] + (["--spread"] if args.spread else [])
    log = Path(args.log)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        serve_load.wait_ready(url, proc, log)
        model = serve_load.served_model(url)
        prompts = serve_load.prompt_records(args.prompts)
        asyncio.run(serve_load.load(url, model, prompts[:1], 1, 1, 8, 0.0, True, 60.0))  # warm-up
        levels = []
        for c in (int(x) for x in args.clients.split(",")):
            level = {"clients": c, **serve_load.served_level(url, model, prompts, c, args, 0.0, 1.0)}
            level["ideal_tokens_per_s"] = round(c * args.tokens_per_step * 1000 / args.step_ms, 1)
            ms = lambda d: "-" if not d else f"{1000 * d['p50']:.3f}"  # noqa: E731 - no gaps: one chunk a request
            print(f"c={c:<3} {level['tokens_per_s']:>9.1f} tok/s of {level['ideal_tokens_per_s']:.0f}  ITL p50 "
                  f"{ms(level['itl_s'])} ms (step {args.step_ms} ms)  TTFT p50 {ms(level['ttft_s'])} ms", flush=True)
            levels.append(level)
        return {"settings": {k: v for k, v in vars(args).items() if k not in ("out", "serve", "port", "log", "note")},
                "note": args.note, "levels": levels}
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="smollm2-135m-instruct", help="the tokenizer and chat template's target")
    ap.add_argument("--step-ms", type=float, default=0.5, help="a step's device time (default 0.5)")
    ap.add_argument("--prefill-ms", type=float, default=2.0, help="a prefill's device time (default 2)")
    ap.add_argument("--tokens-per-step", type=int, default=1,
                    help="tokens a row each step emits (default 1; k > 1: a speculative step's host side, k - 1 "
                         "draft tokens accepted)")
    ap.add_argument("--spread", action="store_true",
                    help="with --tokens-per-step k > 1, each row each step gets 1 to 2k - 1 tokens (k on average), "
                         "so rows end at different steps, as a speculating server's do")
    ap.add_argument("--membership-wait-steps", type=int, default=8, help="as eyas serve's (default 8)")
    ap.add_argument("--switch-interval-ms", type=float, default=0.1, help="as eyas serve's (default 0.1)")
    ap.add_argument("--overlap-schedule", action=argparse.BooleanOptionalAction, default=True,
                    help="the overlap schedule (on, as eyas serve's default): a step's sleep runs while the host "
                         "handles the step before; --no-overlap-schedule: off")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--min-requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-running-requests", type=int, default=64)
    ap.add_argument("--prompts", default="chat")
    ap.add_argument("--stop-at-eos", action="store_true", help=argparse.SUPPRESS)  # serve_load's level reads it
    ap.add_argument("--top-p", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    ap.add_argument("--log", default="/tmp/serve-overhead.log", help="the server's log")
    ap.add_argument("--out", default=None)
    ap.add_argument("--note", default=None, help="kept in the JSON, e.g. which source tree ran (PYTHONPATH)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.set_defaults(output_len_spread=0.0)  # serve_load.served_level's: every answer max_tokens long
    args = ap.parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    data = measure(args)
    if args.out:
        from common import write

        write(args.out, "the served stack's own cost: engine device work replaced by sleeps, streaming load", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
