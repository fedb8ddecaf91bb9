"""``eyas doctor``: static checks on a draft/target pair, or a live check of a server's acceptance.

    eyas doctor --draft ./draft --target ./target [--speculative-algorithm EAGLE3] [--json]
    eyas doctor --url http://127.0.0.1:30000 [--probes 5 | --no-probe] [--expect-tau 2.8]
                [--baseline-url URL | --baseline-tps 40] [--json]

Exit status 0 when no check is a problem, 1 otherwise (2 for unusable arguments), so it can gate
a deployment in CI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..common.urls import server_url
from ..errors import EyasError
from ..models.loading import SMOLLM2


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check a draft/target pair before serving, or a live server's acceptance",
                       description="Static: --draft PATH --target PATH. Live: --url URL (eyas, SGLang or vLLM).")
    s = p.add_argument_group("static checks (files)")
    s.add_argument("--draft", "--speculative-draft-model-path", dest="draft", default=None,
                   help="draft folder: eyas, SGLang/SpecForge, speculators or official EAGLE-3 "
                        "(default: the draft shipped for the target)")
    s.add_argument("--target", "--model-path", dest="target", default=None,
                   help=f"target: HF folder, .gguf file or {SMOLLM2!r} (default: the one the draft records, else "
                        f"{SMOLLM2!r})")
    s.add_argument("--speculative-algorithm", default=None, type=str.upper,
                   help="the flag you serve with (NONE, EAGLE, EAGLE3), checked against the draft's kind")
    s.add_argument("--context-length", type=int, default=None, help="serving context (default: the target's)")
    s.add_argument("--trust-remote-code", action="store_true",
                   help="allow code shipped in the target's folder (auto_map) to run; refused by default")
    s.add_argument("--allow-pickle", action="store_true",
                   help="read a .bin/.pt pickle draft or target (with weights_only); refused by default: "
                        "unpickling can run code")
    live = p.add_argument_group("live checks (a running server)")
    live.add_argument("--url", default=None, type=server_url,
                      help="base URL of an eyas, SGLang or vLLM server (host:port means http://host:port)")
    live.add_argument("--probes", type=int, default=5, help="chat requests sent at temperature 0 (default 5)")
    live.add_argument("--no-probe", action="store_true", help="only read the metrics (lifetime figures)")
    live.add_argument("--max-tokens", type=int, default=64, help="tokens per probe (default 64)")
    live.add_argument("--model", default=None, help="model id for the probes (default: the first in /v1/models)")
    live.add_argument("--expect-tau", default=None,
                      help="expected tau: a number, or the JSON written by `eyas eval --json-out`")
    live.add_argument("--tau-tolerance", type=float, default=0.1, help="relative shortfall allowed (default 0.1)")
    live.add_argument("--baseline-url", default=None, type=server_url,
                      help="the same model without speculation, probed alike")
    live.add_argument("--baseline-tps", type=float, default=None, help="baseline tokens/s, if measured elsewhere")
    live.add_argument("--timeout", type=float, default=300.0, help="seconds per HTTP request (default 300)")
    live.add_argument("--api-key", default=os.environ.get("EYAS_API_KEY"),
                      help="the server's --api-key, sent as a Bearer token (default: $EYAS_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    # dest -> (flag, default) of what each mode reads and the other would drop (its target itself apart)
    flags = lambda group, own: {a.dest: (a.option_strings[0], a.default)  # noqa: E731
                                for a in group._group_actions if a.dest not in own}
    p.set_defaults(func=run, mode_flags={"live": flags(live, ("url", "api_key")),
                                         "static": flags(s, ("draft", "target"))})


def run(args) -> int:
    if args.url and (args.draft or args.target):
        raise EyasError("--url checks a running server; --draft/--target check files. Pass one or the other",
                        "run eyas doctor twice: once on the files, once on the server")
    if not args.timeout > 0:
        raise EyasError(f"--timeout {args.timeout} leaves no time for an answer", "give seconds, e.g. --timeout 60")
    if args.probes < 0 or args.max_tokens < 1:
        raise EyasError("--probes must be >= 0 and --max-tokens >= 1", "e.g. --probes 5 --max-tokens 64")
    if not 0 <= args.tau_tolerance < 1:  # NaN fails too; 1 or more would never call a tau degraded
        raise EyasError(f"--tau-tolerance {args.tau_tolerance} must be a fraction in [0, 1)", "e.g. 0.1 (10 %)")
    if args.baseline_tps is not None and not 0 < args.baseline_tps < float("inf"):  # NaN fails too
        raise EyasError(f"--baseline-tps {args.baseline_tps} is not a rate a server could have measured",
                        "give the baseline's tokens per second, e.g. --baseline-tps 90, or --baseline-url URL")
    if args.context_length is not None and args.context_length < 1:
        raise EyasError(f"--context-length {args.context_length} must be at least 1",
                        "pass the serving context, e.g. --context-length 4096, or leave it out for the target's")
    if args.baseline_url and args.baseline_tps is not None:
        raise EyasError("--baseline-url and --baseline-tps both name the baseline",
                        "pass one: --baseline-url URL to probe a NONE server alike, or --baseline-tps RATE measured "
                        "elsewhere")
    if args.url and (args.no_probe or args.probes == 0) and (args.baseline_url or args.baseline_tps is not None):
        raise EyasError(f"{'--baseline-url' if args.baseline_url else '--baseline-tps'} compares the probes' tokens/s, "
                        f"and {'--no-probe' if args.no_probe else '--probes 0'} sends none: the comparison would be "
                        "dropped", "drop --no-probe (or give --probes N), or drop the baseline")
    other = [flag for dest, (flag, default) in args.mode_flags["static" if args.url else "live"].items()
             if getattr(args, dest) != default]
    if other:  # a check the other mode runs: dropped without a word, a CI gate would pass without it
        raise EyasError(f"{', '.join(other)} {'are' if len(other) > 1 else 'is'} for "
                        f"{'a running server (--url)' if not args.url else 'the static checks (--draft/--target)'}, "
                        f"and this run {'checks files' if not args.url else 'checks the server at ' + args.url}",
                        "add --url URL to check a server live" if not args.url else
                        "drop them, or run eyas doctor --draft/--target for the static checks")
    if args.url:
        from .live import LiveOptions, diagnose_live, read_expect_tau

        opts = LiveOptions(probes=args.probes, no_probe=args.no_probe or args.probes == 0,
                           max_tokens=args.max_tokens, expect_tau=read_expect_tau(args.expect_tau),
                           tau_tolerance=args.tau_tolerance, baseline_url=args.baseline_url,
                           baseline_tps=args.baseline_tps, model=args.model, timeout=args.timeout,
                           api_key=args.api_key)
        report = diagnose_live(args.url, opts)
    else:
        from ..common.draft_registry import builtin_draft
        from .static import diagnose, draft_as_target, draft_layout

        layout = args.target and not args.draft and draft_layout(args.target)
        if layout:  # a draft given as the target: the static checks would read it as a 1-layer model
            raise EyasError(*draft_as_target(args.target, layout))
        target = args.target or (args.draft and recorded_target(args.draft, args.allow_pickle)) or SMOLLM2
        draft = args.draft or (str(builtin_draft(target)) if builtin_draft(target) else None)
        if draft is not None and builtin_draft(draft) is not None and not Path(draft).expanduser().exists():
            draft = str(builtin_draft(draft))  # a shipped draft given by name
        if draft is None:
            raise EyasError(f"no --draft given and no draft ships with eyas for {target!r}",
                            "pass --draft PATH (a draft folder), or --url URL to check a running server")
        report = diagnose(draft, target, args.speculative_algorithm, args.context_length, args.trust_remote_code,
                          allow_pickle=args.allow_pickle)
    from .verdict import render

    print(report.to_json() if args.json else render(report))
    sys.stdout.flush()
    return report.exit_code


def recorded_target(draft: str, allow_pickle: bool = False) -> str | None:
    """The target a draft records (``eyas train``'s, or an import's verifier) where none is given: its path as
    written or beside the draft's folder; None where the draft records none or cannot be read (the checks
    then say why). A recorded target that is nowhere here is an error: checked against another target, a
    good draft would read as broken."""
    from ..formats import names, read

    try:
        name = names.recorded_target(read.read_config(Path(draft).expanduser(), allow_pickle))
    except EyasError:
        return None
    if not name or name.lower() == SMOLLM2:
        return name
    for place in (Path(name).expanduser(), Path(draft).expanduser() / name, Path(draft).expanduser().parent / name):
        try:
            if place.exists():
                return str(place)
        except (OSError, ValueError):  # a recorded name no path can be (too long, a NUL byte)
            continue
    raise EyasError(f"no --target given, and the draft at {draft} records its target as {name!r}, which is not "
                    "on this machine", "pass --target PATH (the target's folder or .gguf file)")
