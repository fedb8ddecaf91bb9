"""``eyas serve`` (and ``python -m eyas.serve``): strict startup, then an OpenAI-compatible server.

Order: check the serving flags and that the port is free, build the engine (every target/draft/
algorithm check runs before any weight is used; on the native CUDA path every CUDA graph is captured
then, with a progress line), print what was loaded, warm it up with one short generation, and only
then bind the port. A refused configuration exits with status 2 and a
message that names the fix (``eyas.cli`` prints ``EyasError`` that way); nothing is ever served.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from ..errors import EyasError
from ..pipeline import add_engine_arguments, engine_args_from

DEFAULT_PORT = 30000  # SGLang's


def register(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible speculative server with Prometheus metrics",
                       description="Serve a target with its EAGLE-3 draft behind the OpenAI API (and SGLang's "
                                   "/generate), with acceptance metrics at /metrics.", config_file=True)
    add_serve_arguments(p)
    p.set_defaults(func=run)


def add_serve_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="the target, as vLLM's 'vllm serve MODEL' takes it: the same as --model-path")
    add_engine_arguments(p)
    p.set_defaults(model_path=None)  # None: not given (MODEL or the built-in target then); see pasted_flags
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    g.add_argument("--served-model-name", default=None, help="model id clients send (default: --model-path)")
    g.add_argument("--max-running-requests", "--max-num-seqs", type=int, default=32,
                   help="sequences decoded together (default 32)")
    g.add_argument("--max-queued-requests", type=int, default=256,
                   help="requests waiting for a slot before the server answers 503 (default 256)")
    g.add_argument("--chat-template", default=None,
                   help="chat template (a file or the Jinja text) replacing the tokenizer's; use the one the "
                        "draft was trained with")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health, "
                   "/dashboard and /metrics (see --metrics-require-key) (default: EYAS_API_KEY, else no key)")
    g.add_argument("--overlap-schedule", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before the last one's tokens are read back, so the server's own "
                        "work runs while the GPU computes (the native path's whole steps; on by default, "
                        "--no-overlap-schedule: each step read back before the next is launched)")
    g.add_argument("--membership-wait-steps", type=int, default=8,
                   help="with the overlap schedule, the most steps a finished row stays in the batch (done for its "
                        "client) and a new request waits to join it, so that the batch changes for several rows "
                        "at once: each change stops the overlap for a turn (default 8; 0: each change at once)")
    g.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="prompt tokens prefilled together in one engine turn; more waiting prompts join the "
                        "next turn (default 16384)")
    g.add_argument("--enable-metrics", action="store_true", help="accepted for SGLang compatibility; "
                   "/metrics is always on")
    g.add_argument("--metrics-window", type=int, default=1000,
                   help="engine steps behind the eyas:spec_accept_length/_rate gauges (default 1000)")
    g.add_argument("--log-interval", type=float, default=10.0,
                   help="seconds between decode log lines while busy; 0 turns them off (default 10)")
    g.add_argument("--log-requests", action="store_true",
                   help="add prompt and output text to the per-request log line (off by default: no text is "
                        "logged), and log each sequence's outcome and acceptance")
    g.add_argument("--metrics-require-key", action="store_true",
                   help="with --api-key, /metrics needs the key too (default: /metrics is open)")
    g.add_argument("--allowed-origins", type=origins, default=["*"], metavar="ORIGINS",
                   help="origins browsers may call the server from (CORS), comma-separated or a JSON list as vLLM "
                        "takes it; '' for none (default '*', any origin, as vLLM and SGLang)")
    lim = p.add_argument_group("limits (each violation is a 4xx naming the flag)")
    lim.add_argument("--max-request-bytes", type=int, default=4 * 2**20, help="request body size (default 4 MiB)")
    lim.add_argument("--max-prompt-tokens", type=int, default=None, help="prompt tokens (default: the context)")
    lim.add_argument("--max-stop-strings", type=int, default=16, help="stop strings per request (default 16)")
    lim.add_argument("--max-stop-length", type=int, default=256, help="characters per stop string (default 256)")
    lim.add_argument("--max-n", type=int, default=16, help="choices per request, n (default 16)")
    lim.add_argument("--max-concurrent-streams", type=int, default=256,
                     help="open streaming responses; more get 429 (default 256)")
    lim.add_argument("--request-timeout", type=float, default=600.0,
                     help="seconds per request before it is cancelled with a 408; 0 = none (default 600)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM before they are cancelled")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default info)")
    g.add_argument("--no-warmup", action="store_true", help="skip the short generation run before binding")
    g.add_argument("--switch-interval-ms", type=float, default=0.1, metavar="MS",
                   help="Python's thread switch interval while serving: the longest the engine thread waits for "
                        "the interpreter while the HTTP side runs (default 0.1; Python's own is 5, which cost "
                        "a third of the throughput at 16-64 clients)")
    add_pasted_arguments(p)


def add_pasted_arguments(p) -> None:
    """SGLang's and vLLM's flags that eyas reads with their meaning (``pasted_flags`` refuses the rest)."""
    g = p.add_argument_group("SGLang's and vLLM's launch flags (so their command lines work here)")
    g.add_argument("--config", metavar="FILE",
                   help="a YAML or JSON file of flags (SGLang's --config): keys are the flag names without dashes, "
                        "e.g. 'port: 30001', 'speculative-num-steps: 3'; flags on the command line override it")
    g.add_argument("--tp", "--tp-size", "--tensor-parallel-size", "-tp", dest="tp", type=int, default=1,
                   metavar="N", help="tensor parallelism: eyas runs on one GPU, so 1; above 1 it prints how to "
                                     "serve the draft with SGLang or vLLM across N GPUs")
    g.add_argument("--disable-overlap-schedule", dest="overlap_schedule", action="store_false", default=None,
                   help="SGLang's flag: the same as --no-overlap-schedule")
    g.add_argument("--chunked-prefill-size", type=int, default=None, metavar="N",
                   help="a prompt longer than N tokens is prefilled N tokens a turn, the running requests stepping "
                        "between its chunks; -1 prefills every prompt whole (SGLang's flag) (default: 2048 on a GPU, "
                        "512 on the CPU)")
    g.add_argument("--random-seed", "--seed", type=int, default=None, metavar="SEED",
                   help="seeds everything random at startup, and so the seeds of requests that bring none "
                        "(a server restarted with it answers the same unseeded requests, sent in the same order, "
                        "the same way); default: random")
    g.add_argument("--generation-config", "--sampling-defaults", default="auto", metavar="auto|vllm|FOLDER",
                   help="what an OpenAI request's left-out sampling fields take: auto (default; SGLang: model) the "
                        "model's generation_config.json, as vLLM and SGLang; vllm (SGLang: openai) OpenAI's; or a "
                        "folder's generation_config.json")
    g.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help="""sampling defaults over those, e.g. '{"temperature": 0.6, "top_p": 0.9}' (vLLM's flag)""")


CHUNK_DEFAULTS = {"cpu": 512}  # else 2048: on the CPU a 2048-token chunk held the running streams 8 s
# (benchmarks/results/long-prompt-cpu.json), 512 about 2.4 s, with the long prompt's TTFT no worse


def chunk_default(device) -> int:
    """``--chunked-prefill-size`` when not given, for the engine's device."""
    return CHUNK_DEFAULTS.get(getattr(device, "type", str(device)), 2048)


def origins(text: str) -> list[str]:
    """``--allowed-origins``: 'a,b', or vLLM's JSON list '["a", "b"]'; '' for none."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"not a JSON list of origins: {text!r} (e.g. '[\"https://a.example\"]')")
        return [v.strip() for v in value if v.strip()]
    return [v.strip() for v in text.split(",") if v.strip()]


def pasted_flags(args) -> None:
    """The positional MODEL, --tp and --chunked-prefill-size, resolved or refused with the way out."""
    from ..models.loading import SMOLLM2

    from_file = (getattr(args, "config_values", None) or {}).get("model_path")
    if args.model is not None:
        if args.model_path is not None and args.model_path not in (args.model, from_file):
            raise EyasError(f"the target is given twice: {args.model!r} (MODEL) and {args.model_path!r} "
                            "(--model-path)", "give one of them")
        args.model_path = args.model
    args.model_path = args.model_path or SMOLLM2
    if args.tp < 1:
        raise EyasError(f"--tp must be at least 1, got {args.tp}", "use 1: eyas runs on one GPU")
    if args.tp > 1:
        raise EyasError(*tensor_parallel_refusal(args))
    if args.chunked_prefill_size is not None and (args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1):
        raise EyasError(f"--chunked-prefill-size must be at least 1, or -1 to prefill every prompt whole; got "
                        f"{args.chunked_prefill_size}", "e.g. --chunked-prefill-size 2048 (the default)")


def served_choice(args):
    """(``EngineArgs``, ``SettingChoice``): the flags' settings, with the speculative setting the flags name or,
    when they name none, the device's default (``defaults.py``: adaptive on CUDA, plain decoding on the CPU)."""
    from .defaults import apply_choice, choose_setting

    engine_args = engine_args_from(args)
    choice = choose_setting(args, engine_args)
    return apply_choice(engine_args, choice), choice


def tensor_parallel_refusal(args) -> tuple[str, str]:
    """(problem, fix) for --tp N > 1: export the draft and serve it with SGLang or vLLM, the lines printed."""
    from ..common.draft_registry import BUILTIN_DRAFTS, builtin_draft
    from ..export import launch_lines, public_target
    from ..pipeline import speculative_flags

    flags = speculative_flags(args)
    shipped = BUILTIN_DRAFTS.get(args.model_path.lower()) if builtin_draft(args.model_path) else None
    draft = flags["speculative_draft_model_path"] or shipped
    target = public_target(args.model_path)
    if draft is None or flags["speculative_algorithm"] == "NONE":
        lines = ["", f"  python -m sglang.launch_server --model-path {target} --tp {args.tp}",
                 f"  vllm serve {target} --tensor-parallel-size {args.tp}"]
    else:
        out = "./draft-sglang"
        lines = ["", f"  eyas export {draft} --format sglang --out {out} --target {target}"]
        lines += ["  " + line if line else line for line in launch_lines("sglang", Path(out), target, tp=args.tp)]
    return (f"--tp {args.tp}: eyas runs a model on one GPU and has no tensor parallelism",
            "serve it across GPUs with SGLang or vLLM:" + "\n".join(lines))


def seed_everything(seed: int) -> None:
    """--random-seed: Python's, NumPy's and torch's generators; unseeded requests draw their seeds from
    Python's (``Sequence.seed``), so they follow from it too."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_server_flags(args) -> None:
    from ..models.loading import resolve_device
    from ..pipeline import check_device

    check_device(resolve_device(args.device))  # before anything loads
    for name, low in (("max_running_requests", 1), ("metrics_window", 1), ("max_prefill_tokens", 1),
                      ("max_queued_requests", 0), ("max_request_bytes", 1), ("max_stop_strings", 1),
                      ("max_stop_length", 1), ("max_n", 1), ("max_concurrent_streams", 1)):
        if getattr(args, name) < low:
            raise EyasError(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise EyasError(f"--port must be in 0..65535, got {args.port}")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise EyasError(f"--max-prompt-tokens must be at least 1, got {args.max_prompt_tokens}")
    if args.switch_interval_ms is not None and not 0 < args.switch_interval_ms <= 1000:
        raise EyasError(f"--switch-interval-ms must be in (0, 1000], got {args.switch_interval_ms}",
                        "give milliseconds, e.g. 0.5 (the default is 0.1; Python's own is 5)")
    if args.membership_wait_steps < 0:
        raise EyasError(f"--membership-wait-steps must be 0 (each change at once) or more, got "
                        f"{args.membership_wait_steps}")
    if args.request_timeout < 0:
        raise EyasError(f"--request-timeout must be 0 (none) or more seconds, got {args.request_timeout}")


def public_bind_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server listens beyond this machine with no key."""
    import ipaddress

    if api_key:
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        if host == "localhost":
            return None
    return (f"WARNING: listening on {host} without --api-key: anyone who can reach this address can use the "
            "server; pass --api-key KEY (or set EYAS_API_KEY), or bind 127.0.0.1")


def check_port_free(host: str, port: int) -> None:
    """Fail before the (slow) model load rather than after it; the port is released again at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:  # the host, not the port
                fix = "pass an address of this machine: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
            else:
                fix = "stop whatever holds the port, or pick another --port"
            raise EyasError(f"cannot listen on {host}:{port}: {e.strerror or e}", fix) from None


def run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pasted_flags(args)
    check_server_flags(args)
    check_port_free(args.host, args.port)
    try:
        import uvicorn

        from .app import ROUTES, ServeOptions, create_app
        from .limits import Limits
    except ImportError as e:
        raise EyasError(f"eyas serve needs {e.name}, which is not installed", "pip install 'eyas[serve]'") from None
    from ..pipeline import build_engine
    from .banner import banner_lines, overlap_line
    from .sampling_defaults import sampling_defaults

    _quiet_progress_bars()
    if args.random_seed is not None:
        seed_everything(args.random_seed)
        print(f"random seed: {args.random_seed}", flush=True)
    print(f"eyas serve: loading {args.model_path} ...", flush=True)
    start = time.perf_counter()
    engine_args, choice = served_choice(args)
    sampling = sampling_defaults(args.generation_config, args.model_path, args.override_generation_config)
    engine = build_engine(engine_args)
    engine.setting_choice = choice  # the banner and /get_server_info say what runs and why
    loaded = time.perf_counter() - start
    if args.chat_template:
        set_chat_template(engine.target.tokenizer, args.chat_template)
    for line in banner_lines(engine, args.max_running_requests, args.max_queued_requests):
        print(line, flush=True)
    print(sampling.describe(), flush=True)
    print(f"loaded in {loaded:.1f} s", flush=True)
    if not args.no_warmup:
        warmup(engine)
    options = ServeOptions(served_model_name=args.served_model_name, model_path=args.model_path,
                           max_running_requests=args.max_running_requests,
                           max_queued_requests=args.max_queued_requests, metrics_window=args.metrics_window,
                           max_prefill_tokens=args.max_prefill_tokens, log_requests=args.log_requests,
                           chunked_prefill_size=args.chunked_prefill_size or chunk_default(engine.device),
                           overlap_schedule=args.overlap_schedule is not False,
                           membership_wait_steps=args.membership_wait_steps,
                           log_interval=args.log_interval,
                           api_key=args.api_key or os.environ.get("EYAS_API_KEY") or None,
                           metrics_require_key=args.metrics_require_key, allowed_origins=args.allowed_origins,
                           limits=Limits(max_request_bytes=args.max_request_bytes,
                                         max_prompt_tokens=args.max_prompt_tokens,
                                         max_stop_strings=args.max_stop_strings,
                                         max_stop_length=args.max_stop_length, max_n=args.max_n,
                                         max_concurrent_streams=args.max_concurrent_streams,
                                         request_timeout=args.request_timeout or None),
                           switch_interval_ms=args.switch_interval_ms, sampling=sampling)
    app = create_app(engine, options)
    chunk = options.chunked_prefill_size
    print(f"prefill: a prompt over {chunk} tokens in chunks of {chunk}, the running requests stepping between them"
          if chunk > 0 else "prefill: every prompt whole (--chunked-prefill-size -1)", flush=True)
    line = overlap_line(engine, options.overlap_schedule, args.overlap_schedule is True, options.membership_wait_steps)
    if line:
        print(line, flush=True)
    warning = public_bind_warning(args.host, options.api_key)
    if warning:
        print(warning, flush=True)
    print(f"serving {app.state.eyas.served_names[0]!r} on http://{args.host}:{args.port} ({', '.join(ROUTES)})",
          flush=True)
    # access_log off: eyas.serve.requests logs each request once (middleware.RequestLog); uvicorn's own line
    # would say it again, on the event loop, per request
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                            timeout_graceful_shutdown=args.shutdown_timeout + 10, lifespan="on")
    server = graceful_server(uvicorn, config, app.state.eyas.scheduler, args.shutdown_timeout)
    # uvicorn handles SIGTERM/SIGINT gracefully and then re-raises the signal under the handler it
    # found at start. With these no-op handlers that re-raise returns, so a clean shutdown exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if server.started:
        print("eyas serve: shut down cleanly", flush=True)
    return 0 if server.started else 1


def set_chat_template(tokenizer, value: str) -> None:
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # a template text too long to be a path
        is_file = False
    text = path.read_text() if is_file else value
    if "{" not in text:
        raise EyasError(f"--chat-template {value!r} is neither a file nor a Jinja template",
                        "pass the path of a .jinja file, or the template text itself")
    tokenizer.chat_template = text


def _quiet_progress_bars() -> None:
    """Weight-loading progress bars only clutter a server log."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception as e:  # noqa: BLE001 - cosmetic only
        logging.getLogger("eyas.serve").debug("could not turn off progress bars: %s", e)


def graceful_server(uvicorn, config, scheduler, grace: float):
    """A uvicorn server that, once shutdown starts, gives in-flight requests ``grace`` seconds and then
    cancels them through the scheduler, so their streams end with finish_reason "abort" and
    ``[DONE]`` instead of being cut by uvicorn's own (later) task cancellation."""
    import asyncio

    class Server(uvicorn.Server):
        async def shutdown(self, *args, **kwargs):
            logging.getLogger("eyas.serve").info("shutting down: in-flight requests have %.0f s to finish", grace)
            timer = asyncio.get_running_loop().call_later(grace, scheduler.abort_all)
            try:
                await super().shutdown(*args, **kwargs)
            finally:
                timer.cancel()

    return Server(config)


def warmup(engine) -> None:
    """One short generation, so a broken device or kernel fails here and not on the first request."""
    from ..sample.sampling import SamplingParams

    start = time.perf_counter()
    prompt = engine.target.tokenizer("warm-up", add_special_tokens=False).input_ids or [0]
    engine.generate([prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))
    print(f"warm-up: ok ({time.perf_counter() - start:.2f} s)", flush=True)
