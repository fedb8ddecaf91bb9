"""The live verdict: from a server's acceptance figures and the probes to plain words and rows.

Rules, first match wins: no metrics (missing, failing, not Prometheus) -> UNVERIFIED; probes all
failed -> UNVERIFIED; SGLang's gauge still 0 under EAGLE/EAGLE3 (no decode log yet) -> UNVERIFIED;
speculation off -> SPECULATION OFF; no verify step -> UNVERIFIED; a figure no
decoder can produce (NaN or infinite, tau < 1 or above the tokens a step verifies, a rate outside
[0, 1]) -> IMPOSSIBLE FIGURES, never a pass; tau < 1.1 -> NOT ACCEPTED with the likely causes
in order (the algorithm flag first); otherwise working, then MISCONFIGURED where /get_server_info shows a
flag that gives the draft no aux states, DEGRADED against ``--expect-tau`` and SLOWER THAN (or NOT COMPARED
WITH) THE BASELINE against ``--baseline-url``/``--baseline-tps`` as further problems. A verdict never reads
"working" while a row is a problem: the exit status and the words agree.
"""

from __future__ import annotations

import math

from ..common import server_metrics
from ..common.server_metrics import EYAS, LABEL, SGLANG, VLLM, Acceptance
from . import server_config
from .live_view import LiveOptions, ProbeResult, ServerView
from .verdict import OK, PROBLEM, WARNING, Report

NOT_ACCEPTED_TAU = 1.1  # below this nearly every proposal is rejected
LOW_TAU = 1.5  # accepted, but too little to pay for drafting on most hardware
LOW_RATE = 0.05  # without tau: below this, even 2 draft tokens a step accept under 0.1 tokens
MAX_DRAFT_TOKENS = 64  # when the server does not say: more than any EAGLE tree verifies in a step


def _metrics_missing(report: Report, view: ServerView) -> None:
    status = view.metrics_status
    if view.metrics_error or status not in (None, 404, 401, 403):  # there, but it failed or is not Prometheus
        what = view.metrics_error or f"GET /metrics answered HTTP {status}: the server failed to produce its metrics"
        report.add("metrics", PROBLEM, f"{what}; acceptance cannot be read",
                   "check that --url is the server itself (not a proxy or another service) and read the server's "
                   "log for the error behind /metrics")
        report.verdict = f"UNVERIFIED: /metrics could not be read ({what})"
        return
    if status in (401, 403):
        report.add("metrics", PROBLEM, f"GET /metrics answered HTTP {status}: acceptance cannot be read",
                   "pass the server's key with --api-key")
        report.verdict = "UNVERIFIED: /metrics refused the request"
        return
    how = {SGLANG: "start SGLang with --enable-metrics", VLLM: "vLLM serves /metrics by default: check that "
           "nothing (a proxy, --disable-log-stats) hides it", EYAS: "eyas always serves /metrics: check the URL"}
    report.add("metrics", PROBLEM, f"GET /metrics answered {status or 'nothing'}: acceptance cannot be "
               "read", how.get(view.kind, "enable the server's Prometheus endpoint (SGLang --enable-metrics)"))
    report.verdict = "UNVERIFIED: the server exposes no metrics, so acceptance cannot be measured"


def impossible(acc: Acceptance, draft_tokens: int | None) -> list[str]:
    """The figures no speculative decoder can produce, each named with its value: non-finite numbers,
    tau below 1 or above what a step can accept, rates outside [0, 1]. Empty when all are plausible."""
    out = []
    if draft_tokens:  # the server's setting, counting the root: a step accepts at most this many tokens
        ceiling, why = float(draft_tokens), f"the server verifies {draft_tokens} tokens a step, root included"
    else:
        ceiling, why = 1.0 + MAX_DRAFT_TOKENS, f"no known server drafts more than {MAX_DRAFT_TOKENS} tokens a step"
    tau = acc.tau
    if not math.isfinite(tau):
        out.append(f"tau {tau} is not a finite number")
    elif tau < 1:
        out.append(f"tau {tau:.4g} is below 1 (every verify step emits at least one token)")
    elif tau > ceiling:
        out.append(f"tau {tau:.4g} is above {ceiling:g} ({why})")
    if acc.rate is not None and not 0 <= acc.rate <= 1:  # NaN fails both comparisons
        out.append(f"acceptance rate {acc.rate:.4g} is outside [0, 1]")
    for i, p in enumerate(acc.per_position):
        if not 0 <= p <= 1:
            out.append(f"acceptance at position {i} {p:.4g} is outside [0, 1]")
    return out


def _causes(kind: str, configured: str | None = None) -> list[str]:
    flag = ("eyas refuses EAGLE for an EAGLE-3 draft, so not the flag here" if kind == EYAS else
            "the algorithm flag: an EAGLE-3 draft needs --speculative-algorithm EAGLE3 (SGLang; EAGLE silently "
            "skips the aux states) or method eagle3 (vLLM)")
    if kind == SGLANG and configured == "EAGLE":
        flag = "the algorithm flag, CONFIRMED by /get_server_info: SGLang runs --speculative-algorithm EAGLE; " \
               "an EAGLE-3 draft needs EAGLE3"
    elif kind == SGLANG and configured == server_config.EAGLE_UNCHECKED:
        flag = "the algorithm flag, likely: /get_server_info shows --speculative-algorithm EAGLE, which skips the " \
               "aux states of an EAGLE-3 draft (its draft could not be read here: check it with eyas doctor --draft)"
    elif kind == SGLANG and configured == "EAGLE with an EAGLE-1/2 draft":
        flag = "not the flag: /get_server_info shows EAGLE with an EAGLE-1/2 draft, which EAGLE serves"
    elif kind == SGLANG and configured == "EAGLE3 without aux states":
        flag = "the aux states, CONFIRMED by the draft's config.json: eagle_config.use_aux_hidden_state is false, so " \
               "SGLang captures none even under EAGLE3; set it to true"
    elif kind == SGLANG and configured == "EAGLE3":
        flag = "not the flag: /get_server_info shows EAGLE3"
    return [flag,
            ("a draft of another target, or captured layer ids shifted by one (SGLang ids = eyas ids - 1): "
             "run eyas doctor --draft DRAFT --target TARGET"),
            "an untrained or randomly initialised draft, or one trained on too little data (eyas eval shows its tau)",
            "chat template or thinking mode different from training",
            "prompts longer than the context the draft was trained at"]


def judge(report: Report, view: ServerView, before, after, result: ProbeResult | None, opts: LiveOptions,
          baseline: tuple[float | None, str]) -> None:
    _judge(report, view, before, after, result, opts, baseline)
    if not report.verdict.startswith("working"):
        return
    told = {"speed"} if "BASELINE" in report.verdict else set()  # "but SLOWER THAN / NOT COMPARED WITH THE BASELINE"
    untold = [c for c in report.problems if c.name not in told]
    if untold:  # the verdict and the exit status must agree
        report.verdict += ("; " if " but " in report.verdict else " but ") \
            + "; ".join(f"{c.name.upper()} PROBLEM" for c in untold)


def _slow_fix(opts: LiveOptions) -> str:
    return (f"the server listed its models but did not finish a {opts.max_tokens}-token chat request within --timeout "
            f"{opts.timeout:g} s: it is slow or busy. Check its load and queue (other clients, long prefills, a cold "
            "start still compiling) and its log; or raise --timeout, or lower --max-tokens")


def _judge(report: Report, view: ServerView, before, after, result: ProbeResult | None, opts: LiveOptions,
           baseline: tuple[float | None, str]) -> None:
    kind = view.kind
    if after is None:
        _metrics_missing(report, view)
        return
    if result is not None:
        if result.errors and not result.requests:
            auth = any(e.startswith(("HTTP 401", "HTTP 403")) for e in result.errors)
            slow = result.timeouts == len(result.errors)
            report.add("probes", PROBLEM, f"all {len(result.errors)} probe requests "
                       f"{'timed out' if slow else 'failed'}: {result.errors[0]}",
                       "pass the server's key with --api-key" if auth else _slow_fix(opts) if slow else
                       "check --model (the id in /v1/models) and the server log")
            report.verdict = f"UNVERIFIED: the probe requests {'timed out' if slow else 'failed'}"
            return
        tps = result.tokens_per_s
        report.add("probes", OK if not result.errors else WARNING,
                   f"{result.requests} chat requests at temperature 0: {result.completion_tokens} tokens in "
                   f"{result.seconds:.2f} s" + (f" = {tps:.1f} tok/s" if tps else "")
                   + (f"; {len(result.errors)} failed: {result.errors[0]}" if result.errors else ""),
                   _slow_fix(opts) if result.timeouts else "see the server log for the failed requests")
        report.figures.update(probe_requests=result.requests, completion_tokens=result.completion_tokens,
                              probe_seconds=round(result.seconds, 3), tokens_per_s=round(tps, 2) if tps else None)
    source = report.figures.get("server_setting_source") or ""
    if kind == EYAS and after.algorithm == "NONE" and source.startswith("default"):
        report.add("speculation", WARNING, f"speculation is off on this server by eyas serve's {source}: "
                   f"{report.figures.get('server_setting_reason')}. Not a misconfiguration, and no acceptance "
                   "to judge", "to check the draft's acceptance here, start the server with "
                   "--speculative-algorithm EAGLE3 (adaptive) or a tree (--speculative-num-steps ...)")
        report.verdict = f"SPECULATION OFF by choice (the {source}: plain decoding is faster here)"
        return
    configured = str(report.figures.get("server_algorithm") or "")
    if kind == SGLANG and after.gauge_length == 0.0 and configured.upper().startswith("EAGLE"):
        report.add("speculation", PROBLEM, f"/get_server_info shows {configured}, but "
                   "sglang:spec_accept_length is still 0: SGLang sets it at its decode log (every "
                   "--decode-log-interval steps, 40 by default), and none has been written yet",
                   "probe longer (--probes, --max-tokens) or lower the server's --decode-log-interval")
        report.verdict = "UNVERIFIED: no decode interval logged yet"
        return
    if kind == EYAS and after.algorithm == "NONE" or (kind == SGLANG and after.gauge_length == 0.0):
        report.add("speculation", PROBLEM, "speculation is off on this server"
                   + (" (eyas:spec_info algorithm NONE)" if kind == EYAS else " (sglang:spec_accept_length is 0)"),
                   "start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT")
        report.verdict = "SPECULATION OFF: the server decodes without a draft"
        return
    if not after.has_spec_metrics:
        if kind == VLLM:
            msg = ("no vllm:spec_decode_* metrics: vLLM registers them only when speculative decoding is "
                   "configured, so speculation is off")
            fix = ("start vLLM with --speculative-config "
                   "'{\"method\": \"eagle3\", \"model\": DRAFT, \"num_speculative_tokens\": 3}'")
            report.verdict = "SPECULATION OFF: vLLM has no speculative_config"
        else:
            msg = f"{LABEL[kind]} exposes no acceptance metrics (no spec_accept_length, no spec_decode counters)"
            fix = "use a server version that exports them (SGLang >= 0.4 with --enable-metrics, vLLM v1, eyas)"
            report.verdict = "UNVERIFIED: no acceptance metrics to read"
        report.add("speculation", PROBLEM, msg, fix)
        return
    acc = server_metrics.acceptance(before, after)
    if acc is not None and acc.tau is None and acc.rate is not None:
        _rate_only(report, kind, acc, result, opts, baseline)
        return
    if acc is None or acc.tau is None:
        why = acc.source if acc else "no figures"
        report.add("acceptance", PROBLEM, f"no verify step was recorded ({why}), although speculation metrics exist",
                   "run the doctor again once the server stays up (check its log for the restart)"
                   if why == server_metrics.BACKWARDS else
                   "send traffic (drop --no-probe) and check that requests reach this server")
        report.verdict = "UNVERIFIED: no speculative step was observed"
        return
    bad = impossible(acc, report.figures.get("server_num_draft_tokens"))
    if bad:
        report.figures.update(impossible=bad, source=acc.source)
        report.add("acceptance", PROBLEM, f"the server reports figures no speculative decoder produces ({acc.source}): "
                   + "; ".join(bad), "this is not a pass: the metrics are broken (a server bug, a proxy rewriting "
                   "them, or counters reset by a restart between the two reads); check the server's version and log, "
                   "then run the doctor again")
        report.verdict = f"IMPOSSIBLE FIGURES ({bad[0]}): acceptance cannot be judged"
        return
    _acceptance_rows(report, kind, acc, result, opts, baseline)


def _rate_only(report: Report, kind: str, acc: Acceptance, result, opts: LiveOptions, baseline) -> None:
    """A server that counts draft and accepted tokens but not drafts (vLLM v0, early v1): the rate is exact,
    tau is not known (it needs the number of verify steps). Some tokens were accepted, so speculation works."""
    report.figures.update(accept_rate=round(acc.rate, 4), tau=None, source=acc.source)
    if not 0 <= acc.rate <= 1:
        bad = [f"acceptance rate {acc.rate:.4g} is outside [0, 1]"]
        report.figures["impossible"] = bad
        report.add("acceptance", PROBLEM, f"the server reports figures no speculative decoder produces ({acc.source}): "
                   + bad[0], "this is not a pass: check the server's version and log (or a restart between the "
                   "two reads), then run the doctor again")
        report.verdict = f"IMPOSSIBLE FIGURES ({bad[0]}): acceptance cannot be judged"
        return
    if acc.rate < LOW_RATE:
        causes = _causes(kind, report.figures.get("server_algorithm"))
        report.add("acceptance", PROBLEM, f"acceptance rate {acc.rate:.3f} ({acc.source}): the draft's proposals are "
                   "nearly all rejected", "likely causes, in order: "
                   + "; ".join(f"({i + 1}) {c}" for i, c in enumerate(causes)))
        report.figures["likely_causes"] = causes
        report.verdict = f"NOT ACCEPTED (acceptance rate {acc.rate:.3f}: nearly every proposal is rejected)"
        return
    report.add("acceptance", WARNING, f"acceptance rate {acc.rate:.3f} ({acc.source})",
               f"this {LABEL[kind]} version counts draft and accepted tokens but not verify steps, so tau and the "
               "per-position rates cannot be computed: upgrade to a vLLM whose /metrics has "
               "vllm:spec_decode_num_drafts_total")
    report.verdict = f"working (acceptance rate {acc.rate:.2f}; tau not exposed by this server)"
    if opts.expect_tau is not None:  # asked for and not judged: a CI gate would pass without it
        report.add("expected tau", PROBLEM, f"--expect-tau {opts.expect_tau:g} cannot be judged: this server does "
                   "not expose tau", "upgrade to a vLLM whose /metrics has vllm:spec_decode_num_drafts_total, or "
                   "drop --expect-tau")
    _speed_rows(report, None, result.tokens_per_s if result else None, baseline)


def _acceptance_rows(report: Report, kind: str, acc: Acceptance, result, opts: LiveOptions, baseline) -> None:
    tau = acc.tau
    per = ", ".join(f"{p:.2f}" for p in acc.per_position)
    rate = f", acceptance rate {acc.rate:.3f}" if acc.rate is not None else ""
    report.figures.update(tau=round(tau, 4), accept_rate=round(acc.rate, 4) if acc.rate is not None else None,
                          per_position=[round(p, 4) for p in acc.per_position], verify_steps=acc.drafts,
                          source=acc.source)
    if result is not None and result.per_request_tau:
        report.figures["per_request_tau"] = [round(t, 3) for t in result.per_request_tau]
    detail = f"tau {tau:.2f}{rate}" + (f", per position [{per}]" if per else ", per position not exposed") \
        + f" ({acc.source}" + (f", {acc.drafts:.0f} verify steps)" if acc.drafts else ")")
    if tau < NOT_ACCEPTED_TAU:
        causes = _causes(kind, report.figures.get("server_algorithm"))
        report.add("acceptance", PROBLEM, f"{detail}: the draft's proposals are (nearly) all rejected",
                   "likely causes, in order: " + "; ".join(f"({i + 1}) {c}" for i, c in enumerate(causes)))
        report.verdict = f"NOT ACCEPTED (tau {tau:.2f}: the draft's proposals are all rejected)"
        report.figures["likely_causes"] = causes
    else:
        report.add("acceptance", OK if tau >= LOW_TAU else WARNING, detail,
                   "low acceptance: check the chat template, thinking mode and context against training, "
                   "and the draft's offline tau (eyas eval)")
        report.verdict = f"working (tau {tau:.2f})"
    tps = result.tokens_per_s if result else None
    if opts.expect_tau is not None:
        floor = opts.expect_tau * (1 - opts.tau_tolerance)
        if tau < floor:
            report.add("expected tau", PROBLEM, f"tau {tau:.2f} is below the expected {opts.expect_tau:.2f} "
                       f"(eyas eval) by more than {opts.tau_tolerance:.0%}",
                       "serving differs from the evaluation: chat template, thinking mode, sampling temperature, "
                       "context length, or a different draft/target on the server")
            if tau >= NOT_ACCEPTED_TAU:
                report.verdict = f"DEGRADED (tau {tau:.2f}, expected {opts.expect_tau:.2f})"
        else:
            report.add("expected tau", OK, f"tau {tau:.2f} against the expected {opts.expect_tau:.2f}")
    _speed_rows(report, tau, tps, baseline)
    _misconfigured_yet_accepted(report, tau)


MISCONFIGURED = {"EAGLE": "--speculative-algorithm EAGLE with an EAGLE-3 draft",
                 "EAGLE3 without aux states": "EAGLE3 with a draft whose eagle_config.use_aux_hidden_state is false"}


def _misconfigured_yet_accepted(report: Report, tau: float) -> None:
    """/get_server_info shows a flag that gives this draft no aux states (a PROBLEM row), yet drafts are accepted.
    Both are facts: the flag is still wrong (the figures come from something other than the setup it reports, or
    from a server that quietly corrects it), so the run fails, and the verdict says what was measured."""
    what = MISCONFIGURED.get(str(report.figures.get("server_algorithm")))
    if what is None or tau < NOT_ACCEPTED_TAU:
        return
    report.add("flag vs figures", PROBLEM, f"tau {tau:.2f}: drafts are accepted although /get_server_info shows "
               f"{what}, which captures no aux states and usually leaves tau at 1.00. The server either loaded "
               "another draft than the folder at that path here, or this version runs the draft as EAGLE3 by "
               "itself; either way its configuration does not say what it runs",
               "restart it with --speculative-algorithm EAGLE3 (and a draft config with use_aux_hidden_state true), "
               "then run the doctor again")
    rest = report.verdict
    tail = rest[rest.find(")") + 1:].replace(" but ", "; ", 1) if rest.startswith("working") else f"; {rest}"
    report.verdict = f"MISCONFIGURED ({what}; tau {tau:.2f} measured anyway){tail}"


def _speed_rows(report: Report, tau: float | None, tps: float | None, baseline: tuple[float | None, str]) -> None:
    """Against --baseline-url / --baseline-tps. Asked for and not made (baseline unusable, no tokens/s on either
    side) is a problem: a CI gate would otherwise pass without the comparison it asked for."""
    base_tps, base_src = baseline
    if not base_src:
        return
    if not (base_tps and tps):
        why = base_src if not base_tps else f"the probes measured no tokens/s on this server ({base_src})"
        report.add("speed", PROBLEM, f"no speed comparison, though one was asked for: {why}",
                   "start the baseline (the same model, --speculative-algorithm NONE) or correct --baseline-url, "
                   "and check that the probes get tokens back; or drop --baseline-url/--baseline-tps")
        if report.verdict.startswith(("working", "DEGRADED")):
            report.verdict += f"{' but' if report.verdict.startswith('working') else ';'} NOT COMPARED WITH THE " \
                              "BASELINE"
        return
    speedup = tps / base_tps
    report.figures.update(baseline_tokens_per_s=round(base_tps, 2), speedup=round(speedup, 3))
    if speedup < 1.0:
        report.add("speed", PROBLEM, f"{tps:.1f} tok/s against the baseline's {base_tps:.1f} ({base_src}): "
                   f"{speedup:.2f}x, slower than without speculation",
                   "at this tau the draft costs more than it saves: fewer draft tokens "
                   "(--speculative-num-draft-tokens), a smaller batch, or a better-trained draft")
        if report.verdict.startswith("DEGRADED"):
            report.verdict += f"; SLOWER THAN BASELINE ({speedup:.2f}x)"
        elif report.verdict.startswith("working"):  # accepted, yet it does not pay: both facts, in that order
            report.verdict += f" but SLOWER THAN BASELINE ({speedup:.2f}x)"
    else:
        report.add("speed", OK, f"{tps:.1f} tok/s against the baseline's {base_tps:.1f} ({base_src}): "
                   f"{speedup:.2f}x")
        if report.verdict.startswith("working") and tau is not None:
            report.verdict = f"working (tau {tau:.2f}, {speedup:.2f}x faster than the baseline)"
