"""``eyas bench``: baseline against speculation on the same prompts, in-process or over HTTP.

    eyas bench                                      # in-process: the shipped SmolLM2 pair
    eyas bench --model-path ./t --speculative-draft-model-path ./d --concurrency 1,4
    eyas bench --url http://gpu:30000 --baseline-url http://gpu:30001 --prompts code --concurrency 1,8,32
    eyas bench --temperature 0,0.7,1.0 --top-p 0.95 --concurrency 1,16   # greedy and sampled side by side

Writes ``bench.json`` and three PNGs (tokens/s, per-position acceptance, tau distribution) to
``--out``; ``--json`` prints the JSON instead of the table. Where the prompts have categories (a
built-in set's name, a JSONL line's ``category``), each speculative run also has tau per category
(``per_category``, as in ``eyas eval``), from the requests' own verify steps and accepted tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..common.outputs import check_output_folder
from ..common.prompts import prompt_records
from ..common.urls import server_url
from ..errors import EyasError
from ..pipeline import add_engine_arguments, engine_args_from
from .results import BenchResult, Level, category_tables, table


def register(sub) -> None:
    p = sub.add_parser("bench", help="tokens/s, TTFT, TPOT and acceptance: speculation vs baseline",
                       description="Benchmark speculative decoding against the same model without it, in-process "
                                   "(engine flags) or over HTTP (--url, --baseline-url).")
    before = len(p._actions)
    add_engine_arguments(p)
    p.set_defaults(engine_flags={a.dest: (a.option_strings[0], a.default) for a in p._actions[before:]})
    g = p.add_argument_group("benchmark")
    g.add_argument("--url", default=None, type=server_url,
                   help="OpenAI-compatible server with speculation (eyas, SGLang, vLLM; host:port means http://)")
    g.add_argument("--baseline-url", default=None, type=server_url,
                   help="the same model served without speculation")
    g.add_argument("--served-model-name", dest="model", default=None,
                   help="model id for HTTP requests (default: the first in /v1/models)")
    g.add_argument("--prompts", default="chat",
                   help="chat, code, reasoning, all, or a .jsonl file with \"prompt\" and optionally \"category\" "
                        "per line (default chat)")
    g.add_argument("--num-prompts", type=int, default=12, help="prompts per run (default 12; 0 = the whole set)")
    g.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    g.add_argument("--temperature", default="0", type=temperature_list,
                   help="comma-separated sampling temperatures, each run at every concurrency, e.g. 0,0.7,1.0 "
                        "(default 0: greedy)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus top-p of the sampled runs (default 1.0: off)")
    g.add_argument("--concurrency", default="1", type=level_list("--concurrency"),
                   help="comma-separated levels, e.g. 1,4,16 (default 1)")
    g.add_argument("--no-baseline", action="store_true", help="measure the speculative side only")
    g.add_argument("--out", default="eyas-bench", help="folder for bench.json and the plots (default eyas-bench)")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP request (default 600)")
    g.add_argument("--api-key", default=os.environ.get("EYAS_API_KEY"),
                   help="the servers' --api-key, sent as a Bearer token (default: $EYAS_API_KEY)")
    g.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def parse_levels(text, flag: str = "--concurrency") -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]: every item a positive integer; an empty item (``1,,4``) is a typo, not a skip."""
    if isinstance(text, list):  # already parsed by the flag's type
        return text
    items = [x.strip() for x in str(text).split(",")]
    levels = [_positive(x) for x in items]
    if None in levels:
        bad = items[levels.index(None)]
        raise EyasError(f"{flag} {text!r} is not a list of positive integers ({bad!r} is not one)",
                        f"e.g. {flag} 1,4,16")
    return levels


def _positive(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def parse_temperatures(text) -> list[float]:
    """``"0,0.7"`` -> [0.0, 0.7]: every item a temperature in [0, 2]; an empty item is refused."""
    if isinstance(text, list):
        return text
    items = [x.strip() for x in str(text).split(",")]
    try:
        temps = [float(x) for x in items]
    except ValueError:
        temps = []
    if not temps or not all(0.0 <= t <= 2.0 for t in temps):  # NaN fails too
        raise EyasError(f"--temperature {text!r} is not a list of temperatures in [0, 2]",
                        "e.g. --temperature 0,0.7,1.0")
    return temps


def level_list(flag: str):
    """An argparse ``type`` for a comma-separated list of positive integers: refused at parsing."""
    def parse(text: str) -> list[int]:
        try:
            return parse_levels(text, flag)
        except EyasError as e:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(f"{e.problem.removeprefix(flag + ' ')}; {e.fix}") from None

    return parse


def temperature_list(text: str) -> list[float]:
    try:
        return parse_temperatures(text)
    except EyasError as e:
        raise argparse.ArgumentTypeError(f"{e.problem.removeprefix('--temperature ')}; {e.fix}") from None


def progress_bar(total: int, desc: str, quiet: bool):
    """A tqdm bar on stderr (requests done)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=quiet, leave=False)


def run(args) -> int:
    levels = parse_levels(args.concurrency)
    args.temperatures = parse_temperatures(args.temperature)
    out = check_output_folder(args.out, "--out")  # before the run, not after it
    if not 0.0 < args.top_p <= 1.0:
        raise EyasError(f"--top-p must be in (0, 1], got {args.top_p}", "e.g. --top-p 0.95, or 1 for no filter")
    records = prompt_records(args.prompts)
    if args.num_prompts < 0:
        raise EyasError(f"--num-prompts must be 0 (the whole set) or more, got {args.num_prompts}",
                        "e.g. --num-prompts 12")
    if args.num_prompts:
        records = records[: args.num_prompts]
    prompts = [p for p, _ in records]
    args.categories = [c for _, c in records]
    if args.max_tokens < 1:
        raise EyasError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if not args.timeout > 0:
        raise EyasError(f"--timeout {args.timeout} leaves no time for an answer", "give seconds, e.g. --timeout 600")
    if args.url:  # the server runs as it was started: an engine flag here would be dropped without a word
        given = [flag for dest, (flag, default) in args.engine_flags.items() if getattr(args, dest, default) != default]
        if given:
            raise EyasError(f"--url benchmarks the server at {args.url} as it runs, so {', '.join(given)} would be "
                            "ignored", "drop them and start the server with them instead, or leave out --url to "
                            "benchmark in-process with them")
    if not args.url:  # in-process: the HTTP flags would be dropped without a word
        given = [flag for flag, value in (("--baseline-url", args.baseline_url), ("--served-model-name", args.model))
                 if value is not None]
        if given:
            raise EyasError(f"{', '.join(given)} belong to a served benchmark, and no --url names the server to load",
                            "add --url URL (the speculative server; --baseline-url is its NONE twin), or drop them "
                            "to benchmark in-process")
    result = bench_online(args, prompts, levels) if args.url else bench_offline(args, prompts, levels)
    out.mkdir(parents=True, exist_ok=True)
    data = result.as_dict()
    if not args.no_plots:
        from .plots import write_plots

        try:
            data["plots"] = [str(p) for p in write_plots(result, out)]
        except ImportError as e:  # no matplotlib: keep the measurements, skip the pictures
            print(f"no plots ({e}): pip install matplotlib, or pass --no-plots", file=sys.stderr)
    (out / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(table(result))
        if per_category := category_tables(result):
            print(per_category)
        print(f"results: {out / 'bench.json'}" + (f", plots: {', '.join(data['plots'])}" if data.get("plots") else ""))
    failed = [e for lv in result.levels for r in (lv.baseline, lv.speculative) if r for e in r.errors]
    if failed:
        print(f"{len(failed)} request(s) failed, first: {failed[0]}", file=sys.stderr)
    empty = [r.label for lv in result.levels for r in (lv.baseline, lv.speculative) if r and not r.output_tokens]
    if empty:  # 0 tok/s is no measurement: a target that ends every answer at once, or a server that sends nothing
        print(f"error: the {' and '.join(dict.fromkeys(empty))} run(s) generated no token: nothing was measured; "
              "check the target with eyas generate, or the server's log", file=sys.stderr)
    return 1 if failed or empty else 0


def bench_online(args, prompts: list[str], levels: list[int]) -> BenchResult:
    from .online import run_url

    setup = {"url": args.url, "baseline_url": args.baseline_url, "prompts": args.prompts,
             "num_prompts": len(prompts), "max_tokens": args.max_tokens, "temperatures": args.temperatures,
             "top_p": args.top_p}
    result = BenchResult("online", setup)
    quiet = args.json
    for t in args.temperatures:
        for c in levels:
            base = None
            if args.baseline_url and not args.no_baseline:
                with progress_bar(len(prompts), f"baseline    T={t:g} c={c}", quiet) as bar:
                    base = run_url(args.baseline_url, prompts, args.max_tokens, t, c, "baseline", args.model,
                                   args.timeout, bar, args.api_key, args.top_p, args.categories)
            with progress_bar(len(prompts), f"speculative T={t:g} c={c}", quiet) as bar:
                spec = run_url(args.url, prompts, args.max_tokens, t, c, "speculative", args.model, args.timeout, bar,
                               args.api_key, args.top_p, args.categories)
            result.levels.append(Level(c, base, spec, t))
    return result


def bench_offline(args, prompts: list[str], levels: list[int]) -> BenchResult:
    from ..common.prompts import chat_ids
    from ..pipeline import baseline_engine, build_engine
    from ..sample.sampling import SamplingParams
    from .offline import run_engine, warm_up

    print("loading ...", file=sys.stderr, flush=True)
    engine = build_engine(engine_args_from(args, rows=max(levels)))
    if not engine.spec.speculative:
        raise EyasError(f"nothing to compare: no draft is given or shipped for {args.model_path!r}, so the engine runs "
                        "without speculation", "pass --speculative-draft-model-path DRAFT, or --url/--baseline-url "
                        "to benchmark servers")
    tok = engine.target.tokenizer
    ids = [chat_ids(tok, p) for p in prompts]
    plain = baseline_engine(engine)
    warm_up(engine, ids[0])
    warm_up(plain, ids[0])
    setup = {"target": engine.target.name, "draft": getattr(engine.draft, "name_or_path", None),
             "algorithm": engine.spec.algorithm.value, "num_steps": engine.spec.num_steps,
             "eagle_topk": engine.spec.eagle_topk, "num_draft_tokens": engine.spec.num_draft_tokens,
             "device": str(engine.device), "prompts": args.prompts, "num_prompts": len(prompts),
             "max_tokens": args.max_tokens, "temperatures": args.temperatures, "top_p": args.top_p}
    result = BenchResult("offline", setup)
    quiet = args.json
    for t in args.temperatures:
        params = SamplingParams(max_new_tokens=args.max_tokens, temperature=t, top_p=args.top_p if t else 1.0)
        for c in levels:
            base = None
            if not args.no_baseline:
                with progress_bar(len(ids), f"baseline    T={t:g} c={c}", quiet) as bar:
                    base = run_engine(plain, ids, params, c, "baseline", bar)
            with progress_bar(len(ids), f"speculative T={t:g} c={c}", quiet) as bar:
                spec = run_engine(engine, ids, params, c, "speculative", bar, args.categories)
            result.levels.append(Level(c, base, spec, t))
    return result
