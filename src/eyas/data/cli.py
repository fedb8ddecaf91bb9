"""``eyas prepare``: conversations -> (regenerated) tokenized training data with a held-out split."""

from __future__ import annotations

import errno
import json
from dataclasses import replace

from ..common.outputs import check_output_folder
from ..errors import EyasError


def register(sub) -> None:
    p = sub.add_parser("prepare", help="build training data: sources, regeneration, chat rendering, loss mask")
    p.add_argument("--model-path", "--model", default="smollm2-135m-instruct", help="the target model")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--input", action="extend", nargs="+", default=[], metavar="PATH",
                   help="conversations or prompts: a JSONL or JSON-array file (gzipped or not), a folder of them "
                        "or a glob; ShareGPT, OpenAI messages (content parts too), SpecForge, UltraChat or "
                        "{\"prompt\": ...} records (e.g. ../shared/data/chat-prompts); a file's stem names its source")
    p.add_argument("--source", action="append", default=[], choices=["chatterbot", "pydoc", "self", "magpie"],
                   help="built-in offline prompt source (repeat): chatterbot conversations, questions on Python's "
                        "own documentation, questions the target writes on a topic list (self), or user "
                        "messages the target writes from its template's opening of a user turn (magpie)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many prompts per built-in source (self and magpie: asked of the target)")
    p.add_argument("--self-per-topic", type=int, default=8, help="prompts the target writes per topic (source self)")
    p.add_argument("--magpie-prompts", type=int, default=2000,
                   help="user turns the target is asked to write (source magpie); duplicates are dropped")
    p.add_argument("--exclude", action="append", default=[],
                   help="drop every conversation whose user turn is in this prompt set: bench (every built-in "
                        "set), chat, code, reasoning, all, or a file, folder or glob of prompts such as an "
                        "earlier holdout-prompts.jsonl (repeat); keeps evaluation prompts out of training")
    p.add_argument("--source-weights", action="append", default=[], metavar="SPEC",
                   help="the mix per source (a file stem or built-in source): NAME=W a relative weight (default 1, "
                        "0 drops it), NAME:N at most N prompts, comma-separated (repeat), e.g. "
                        "sharegpt-v3-pypi=3,math-test=0.2,gsm8k-train:2000; without --max-prompts the heaviest "
                        "sources are kept whole and the rest in proportion")
    p.add_argument("--max-prompts", type=int, default=None,
                   help="total prompts the mix keeps, shared by the weights (default: as the weights give)")
    p.add_argument("--holdout-prompts", type=int, default=0, metavar="N",
                   help="set N single-turn prompts aside, spread over source categories, as a chat evaluation "
                        "set no training sees: written to OUT/holdout-prompts.jsonl (pass it to --exclude later)")
    p.add_argument("--holdout-sources", default=None, metavar="NAMES",
                   help="comma-separated sources the holdout draws from (default: every source)")
    p.add_argument("--holdout-seed", type=int, default=0,
                   help="seed of the holdout's choice (kept apart from --seed so the set stays put across runs)")
    p.add_argument("--select-only", action="store_true",
                   help="choose the prompts and stop, loading no model: train/heldout.jsonl (prompts only), "
                        "holdout-prompts.jsonl and selection.json with the per-source summary; the same flags "
                        "with a model and --regenerate choose the same prompts")
    p.add_argument("--held-out", type=float, default=0.02,
                   help="fraction of prompts kept out of training as the held-out split (by a hash of the prompt)")
    p.add_argument("--max-length", type=int, default=None,
                   help="truncate rendered conversations to this many tokens (default: min(2048, target context))")
    p.add_argument("--regenerate", action="store_true", help="answer every prompt with the target itself")
    p.add_argument("--regenerate-url", default=None, metavar="URL",
                   help="answer every prompt through an OpenAI-compatible server of the target (SGLang, vLLM, "
                        "eyas serve) instead of loading it here: --model-path then needs only config.json and the "
                        "tokenizer; answers are saved in OUT/answers.jsonl as they arrive and a rerun skips them")
    p.add_argument("--concurrency", type=int, default=32, help="with --regenerate-url: requests in flight")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="with --regenerate-url: seconds one request may take before it is retried")
    p.add_argument("--retry-for", type=float, default=600.0, metavar="S",
                   help="with --regenerate-url: seconds one request keeps retrying a failing or unreachable server "
                        "(connection errors, 429, 5xx) before the run stops")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="with --regenerate-url: the server's model id to use when its name differs from "
                        "--model-path's (vocabulary and template are still checked)")
    p.add_argument("--api-key", default=None, help="with --regenerate-url: the server's API key (Bearer)")
    p.add_argument("--keep-answers", action="store_true",
                   help="with --regenerate: keep each conversation's own answer as well as the target's "
                        "(e.g. answers sampled at 0.8 from an earlier prepare, plus greedy ones)")
    p.add_argument("--temperature", type=float, default=0.8, help="regeneration: sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="regeneration: nucleus sampling mass")
    p.add_argument("--max-new-tokens", type=int, default=512, help="regeneration: answer tokens at most")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per generate call")
    p.add_argument("--seed", type=int, default=0, help="seed of the mix's sampling and of regeneration")
    p.add_argument("--system-prompt", default=None, help="system turn to add (default: the template's own choice)")
    p.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="pass enable_thinking to the chat template (Qwen3-style templates)")
    p.add_argument("--template-kwargs", default="{}", help="JSON of extra chat-template options")
    p.add_argument("--regen-engine", choices=["auto", "native", "generic"], default="auto",
                   help="what answers the prompts, greedy or sampled: auto runs eyas's engine where the native "
                        "path does (CUDA, Llama family), native forces it, generic uses HF generate")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when a GPU is visible)")
    p.add_argument("--dtype", default="auto", help="the target's dtype: auto (bf16 on the GPU), float32, bfloat16")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow Python code shipped in the target's folder (auto_map) to run; refused by default")
    p.add_argument("--allow-pickle", action="store_true",
                   help="load a target whose weights are .bin/.pt pickles (refused by default: unpickling runs code)")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        return _run(args)
    except OSError as e:  # a full disk or a read-only --out, met when the splits are written
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        raise EyasError(f"could not write {e.filename or args.out}: {e.strerror}",
                        "free disk space there or choose another --out, then run the same command again"
                        + (" (the answers saved in OUT/answers.jsonl are reused)" if args.regenerate_url else "")
                        ) from None


def _run(args) -> int:
    from ..common import dist
    from ..models.loading import load_target
    from . import mix
    from .prepare import PrepareConfig, prepare, select_only
    from .regenerate import RegenConfig

    try:
        kw = json.loads(args.template_kwargs)
    except json.JSONDecodeError as e:
        raise EyasError(f"--template-kwargs is not JSON: {e.msg}",
                        "e.g. --template-kwargs '{\"enable_thinking\": false}'") from None
    if not isinstance(kw, dict):
        raise EyasError(f"--template-kwargs must be a JSON object of chat-template options, got {args.template_kwargs}",
                        "e.g. --template-kwargs '{\"enable_thinking\": false}'")
    if args.thinking:
        kw["enable_thinking"] = args.thinking == "on"
    remote_flags = {"--served-model-name": args.served_model_name, "--api-key": args.api_key}
    given = [f for f, v in remote_flags.items() if v is not None]
    if given and not args.regenerate_url:
        raise EyasError(f"{', '.join(given)} only mean something with --regenerate-url", "add --regenerate-url URL")
    if args.regenerate_url:
        local = {"--batch-size": args.batch_size != 256, "--regen-engine": args.regen_engine != "auto",
                 "--device": args.device != "auto", "--dtype": args.dtype != "auto"}
        if any(local.values()):
            raise EyasError(f"{', '.join(f for f, v in local.items() if v)} set how the target runs here, but with "
                            "--regenerate-url the server runs it", "drop them, or pace the server with --concurrency")
        args.regenerate = True
        needs = sorted({"self", "magpie"} & set(args.source))
        if needs:
            raise EyasError(f"--regenerate-url answers prompts through a server, but source {', '.join(needs)} needs "
                            "the target loaded here to write prompts",
                            "write those prompts in an earlier prepare (--select-only or a GPU run) and pass its "
                            "train.jsonl with --input, or drop those sources")
    if args.keep_answers and not args.regenerate:
        raise EyasError("--keep-answers only means something with --regenerate",
                        "add --regenerate or drop --keep-answers")
    check_numbers(args)
    check_output_folder(args.out, "--out")  # under a file or read-only: said before any model loads
    if args.magpie_prompts < 1 and "magpie" in args.source:
        raise EyasError(f"--magpie-prompts must be at least 1, got {args.magpie_prompts}", "e.g. --magpie-prompts 2000")
    if args.max_prompts is not None and args.max_prompts < 1:
        raise EyasError(f"--max-prompts must be at least 1, got {args.max_prompts}", "e.g. --max-prompts 40000")
    if args.holdout_prompts < 0:
        raise EyasError(f"--holdout-prompts must be 0 or more, got {args.holdout_prompts}",
                        "e.g. --holdout-prompts 400")
    if not 0.0 <= args.held_out < 1.0:
        raise EyasError(f"--held-out {args.held_out} must be in [0, 1)", "e.g. --held-out 0.02")
    holdout_sources = [s.strip() for s in (args.holdout_sources or "").split(",") if s.strip()]
    cfg = PrepareConfig(inputs=args.input, sources=args.source, limit=args.limit, self_per_topic=args.self_per_topic,
                        magpie_prompts=args.magpie_prompts, exclude=args.exclude, held_out=args.held_out,
                        source_weights=mix.parse(args.source_weights), max_prompts=args.max_prompts,
                        mix_seed=args.seed, holdout_prompts=args.holdout_prompts, holdout_sources=holdout_sources,
                        holdout_seed=args.holdout_seed, max_length=args.max_length or 2048,
                        regenerate=args.regenerate, keep_answers=args.keep_answers)
    if args.select_only:
        select_only(cfg, args.out)
        return 0
    if args.regenerate_url:
        return run_remote(args, cfg, kw)
    if args.device != "auto":  # a GPU this machine lacks: said here, not as a traceback from torch
        from ..pipeline import check_device

        check_device(args.device)
    ctx = dist.init(args.device, backend="gloo" if args.device == "cpu" else None)
    target = load_target(args.model_path, device=ctx.device, dtype=args.dtype,
                         trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle)
    regen = RegenConfig(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, seed=args.seed + ctx.rank, system_prompt=args.system_prompt,
                        template_kwargs=kw, engine=args.regen_engine)
    cfg = replace(cfg, max_length=args.max_length or min(2048, target.info.max_context or 2048), regen=regen)
    prepare(target, cfg, args.out, ctx, log=print if ctx.main else (lambda *a: None))
    ctx.close()
    return 0


def check_numbers(args) -> None:
    """Counts and sampling settings no run can use, refused before any model loads: a batch of 0 crashed in
    range(), --max-new-tokens 0 in transformers, and a negative --max-length or --limit emptied the data with
    a message about assistant turns; a negative temperature or a top-p outside (0, 1] was taken silently."""
    for flag, value in (("--max-length", args.max_length), ("--limit", args.limit), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens), ("--self-per-topic", args.self_per_topic),
                        ("--concurrency", args.concurrency)):
        if value is not None and value < 1:
            raise EyasError(f"{flag} must be at least 1, got {value}", f"pass a positive {flag}, or leave it out")
    if args.limit is not None and not args.source:  # it caps built-in sources only: files kept every prompt
        raise EyasError(f"--limit {args.limit} caps each built-in --source, and no --source is given: it would "
                        "not cap the --input files",
                        f"cap the whole mix with --max-prompts {args.limit}, or one input with --source-weights "
                        f"NAME:{args.limit} (its file's stem)")
    if not 0 <= args.temperature <= 100:  # NaN too
        raise EyasError(f"--temperature {args.temperature} must be in [0, 100]", "0 is greedy; 0.8 is the usual")
    if not 0 < args.top_p <= 1:
        raise EyasError(f"--top-p {args.top_p} must be in (0, 1]", "1.0 keeps the whole distribution")
    if not args.request_timeout > 0 or not args.retry_for >= 0:
        raise EyasError(f"--request-timeout {args.request_timeout} must be positive and --retry-for "
                        f"{args.retry_for} at least 0", "e.g. --request-timeout 600 --retry-for 600")


def run_remote(args, cfg, template_kwargs: dict) -> int:
    """--regenerate-url: the target's tokenizer here, its answers from the server."""
    from .prepare import prepare
    from .regenerate import RegenConfig
    from .remote import RemoteConfig, RemoteRegenerator
    from .tokenizer_target import load_tokenizer_target

    remote_cfg = RemoteConfig(args.regenerate_url, concurrency=args.concurrency, request_timeout=args.request_timeout,
                              retry_for=args.retry_for, api_key=args.api_key, served_model_name=args.served_model_name)
    target = load_tokenizer_target(args.model_path, args.trust_remote_code)
    regen = RegenConfig(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                        seed=args.seed, system_prompt=args.system_prompt, template_kwargs=template_kwargs)
    remote = RemoteRegenerator(target, regen, remote_cfg, args.out, args.model_path)
    cfg = replace(cfg, max_length=args.max_length or min(2048, target.info.max_context or 2048), regen=regen)
    prepare(target, cfg, args.out, remote=remote)
    return 0
