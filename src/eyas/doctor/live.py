"""``eyas doctor --url URL``: is the draft being accepted on a live eyas, SGLang or vLLM server?

1. ``GET /v1/models`` (the model id, ``owned_by``) and ``GET /metrics`` tell which server it is;
2. the acceptance metrics are read, ``--probes N`` chat requests are sent at temperature 0, and
   the metrics are read again (``--no-probe``: read once, lifetime figures);
3. tau, acceptance rate and per-position acceptance come from counter deltas where the server has
   counters (eyas, vLLM) and from the gauges otherwise (SGLang); tokens/s from the probes;
4. ``judge`` turns the figures into a verdict: working, NOT ACCEPTED, degraded, slower than baseline.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..errors import EyasError
from . import server_config, servers
from .servers import EYAS, LABEL, SGLANG, VLLM, Acceptance
from .verdict import OK, PROBLEM, WARNING, Report

NOT_ACCEPTED_TAU = 1.1  # below this nearly every proposal is rejected
LOW_TAU = 1.5


@dataclass
class ProbeResult:
    requests: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    per_request_tau: list[float] = field(default_factory=list)  # where responses carry spec_accept_length

    @property
    def tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.seconds if self.seconds > 0 and self.completion_tokens else None


@dataclass
class ServerView:
    url: str
    kind: str = servers.UNKNOWN
    model: str | None = None
    owned_by: str | None = None
    metrics_status: int | None = None
    error: str | None = None


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        return client.get(url)
    except httpx.HTTPError:
        return None


def look(client: httpx.Client, url: str) -> tuple[ServerView, dict | None]:
    """What serves at ``url`` and its parsed metrics (None when /metrics is missing)."""
    view = ServerView(url)
    r = _get(client, url + "/v1/models")
    if r is None:
        view.error = f"nothing answers at {url}"
        return view, None
    if r.status_code == 200:
        try:
            data = (r.json().get("data") or [{}])[0]
            view.model, view.owned_by = data.get("id"), data.get("owned_by")
        except (ValueError, AttributeError, IndexError):
            pass
    m = _get(client, url + "/metrics")
    view.metrics_status = m.status_code if m is not None else None
    samples = None
    if m is not None and m.status_code == 200:
        try:
            samples = servers.parse(m.text)
        except ValueError:
            samples = None
    view.kind = servers.detect(samples or {}, view.owned_by)
    return view, samples


def probe_one(client: httpx.Client, url: str, model: str | None, text: str, max_tokens: int,
              res: ProbeResult) -> None:
    """One chat request at temperature 0, added to ``res``."""
    body = {"model": model or "default", "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0}
    t = time.perf_counter()
    try:
        r = client.post(url + "/v1/chat/completions", json=body)
    except httpx.HTTPError as e:
        res.errors.append(f"{type(e).__name__}: {e}")
        return
    dt = time.perf_counter() - t
    if r.status_code != 200:
        res.errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
        return
    usage = r.json().get("usage") or {}
    res.requests += 1
    res.seconds += dt
    res.completion_tokens += int(usage.get("completion_tokens") or 0)
    if usage.get("spec_accept_length") is not None:
        res.per_request_tau.append(float(usage["spec_accept_length"]))


def probe(client: httpx.Client, url: str, model: str | None, prompts: list[str], max_tokens: int,
          baseline: tuple | None = None) -> tuple[ProbeResult, ProbeResult | None]:
    """Chat requests one at a time; with ``baseline`` = (client, url, model) each prompt goes to the
    baseline right after, so both sides see the same machine load (a shared host drifts)."""
    res, base = ProbeResult(), (ProbeResult() if baseline else None)
    for text in prompts:
        probe_one(client, url, model, text, max_tokens, res)
        if baseline:
            probe_one(*baseline, text, max_tokens, base)
    return res, base


def read_expect_tau(value: str | None) -> float | None:
    """``--expect-tau`` is a number, or the JSON ``eyas eval --json-out`` wrote (its accept_length)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    p = Path(value)
    if not p.is_file():
        raise EyasError(f"--expect-tau {value!r} is neither a number nor a file",
                        "pass the tau from `eyas eval`, e.g. --expect-tau 2.8, or its --json-out file")
    try:
        return float(json.loads(p.read_text())["accept_length"])
    except (ValueError, KeyError, TypeError) as e:
        raise EyasError(f"{p} has no accept_length ({e})", "pass the file `eyas eval --json-out` wrote") from None


@dataclass
class LiveOptions:
    probes: int = 5
    no_probe: bool = False
    max_tokens: int = 64
    expect_tau: float | None = None
    tau_tolerance: float = 0.1  # relative
    baseline_url: str | None = None
    baseline_tps: float | None = None
    model: str | None = None
    timeout: float = 300.0
    api_key: str | None = None  # sent as "Authorization: Bearer KEY" (eyas/SGLang/vLLM --api-key)

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return httpx.Client(timeout=self.timeout, headers=headers)


def diagnose_live(url: str, opts: LiveOptions, client: httpx.Client | None = None,
                  baseline_client: httpx.Client | None = None) -> Report:
    from ..bench.prompts import prompt_set

    url = url.rstrip("/")
    own = client is None
    client = client or opts.client()
    try:
        view, samples = look(client, url)
        report = Report(f"{url}")
        if view.error:
            report.add("server", PROBLEM, view.error, "start the server, or check --url (scheme, host, port)")
            report.verdict = f"UNREACHABLE: {view.error}"
            return report
        report.subject = f"{url} ({LABEL[view.kind]}, model {view.model or '?'})"
        report.add("server", OK, f"{LABEL[view.kind]} serving {view.model or '?'}"
                   + (f" (owned_by {view.owned_by})" if view.owned_by else ""))
        configured = server_config.add_rows(report, view.kind, server_config.fetch(client, url, view.kind))
        if configured:
            report.figures["server_algorithm"] = configured
        before = servers.snapshot(samples, view.kind) if samples is not None else None
        prompts = prompt_set("chat")[: max(opts.probes, 0)]
        result, baseline = None, (opts.baseline_tps, "--baseline-tps") if opts.baseline_tps else (None, "")
        if not opts.no_probe and prompts:
            with _baseline_side(opts, baseline_client) as side:
                if side is not None and isinstance(side, str):
                    baseline = (None, side)
                    side = None
                result, base = probe(client, url, opts.model or view.model, prompts, opts.max_tokens, side)
                if base is not None:
                    baseline = (base.tokens_per_s, f"{opts.baseline_url.rstrip('/')}, same probes interleaved")
            _, samples_after = look(client, url)
            after = servers.snapshot(samples_after, view.kind) if samples_after is not None else None
        else:
            after, before = before, None
        judge(report, view, before, after, result, opts, baseline)
        return report
    finally:
        if own:
            client.close()


@contextlib.contextmanager
def _baseline_side(opts: LiveOptions, client: httpx.Client | None):
    """(client, url, model) of the baseline server to interleave probes with; a message if unreachable."""
    if opts.baseline_tps is not None or not opts.baseline_url:
        yield None
        return
    url = opts.baseline_url.rstrip("/")
    own = client is None
    client = client or opts.client()
    try:
        view, _ = look(client, url)
        yield f"baseline unreachable: {view.error}" if view.error else (client, url, opts.model or view.model)
    finally:
        if own:
            client.close()


def _metrics_missing(report: Report, view: ServerView) -> None:
    how = {SGLANG: "start SGLang with --enable-metrics", VLLM: "vLLM serves /metrics by default: check that "
           "nothing (a proxy, --disable-log-stats) hides it", EYAS: "eyas always serves /metrics: check the URL"}
    report.add("metrics", PROBLEM, f"GET /metrics answered {view.metrics_status or 'nothing'}: acceptance cannot be "
               "read", how.get(view.kind, "enable the server's Prometheus endpoint (SGLang --enable-metrics)"))
    report.verdict = "UNVERIFIED: the server exposes no metrics, so acceptance cannot be measured"


def _causes(kind: str, configured: str | None = None) -> list[str]:
    flag = ("eyas refuses EAGLE for an EAGLE-3 draft, so not the flag here" if kind == EYAS else
            "the algorithm flag: an EAGLE-3 draft needs --speculative-algorithm EAGLE3 (SGLang; EAGLE silently "
            "skips the aux states) or method eagle3 (vLLM)")
    if kind == SGLANG and configured == "EAGLE":
        flag = "the algorithm flag, CONFIRMED by /get_server_info: SGLang runs --speculative-algorithm EAGLE; " \
               "an EAGLE-3 draft needs EAGLE3"
    elif kind == SGLANG and configured == "EAGLE3":
        flag = "not the flag: /get_server_info shows EAGLE3"
    return [flag,
            "a draft of another target, or captured layer ids shifted by one (SGLang ids = eyas ids - 1): "
            "run eyas doctor --draft DRAFT --target TARGET",
            "an untrained or randomly initialised draft, or one trained on too little data (eyas eval shows its tau)",
            "chat template or thinking mode different from training",
            "prompts longer than the context the draft was trained at"]


def judge(report: Report, view: ServerView, before, after, result: ProbeResult | None, opts: LiveOptions,
          baseline: tuple[float | None, str]) -> None:
    kind = view.kind
    if after is None:
        _metrics_missing(report, view)
        return
    if result is not None:
        if result.errors and not result.requests:
            auth = any(e.startswith(("HTTP 401", "HTTP 403")) for e in result.errors)
            report.add("probes", PROBLEM, f"all {len(result.errors)} probe requests failed: {result.errors[0]}",
                       "pass the server's key with --api-key" if auth else
                       "check --model (the id in /v1/models) and the server log")
            report.verdict = "UNVERIFIED: the probe requests failed"
            return
        tps = result.tokens_per_s
        report.add("probes", OK if not result.errors else WARNING,
                   f"{result.requests} chat requests at temperature 0: {result.completion_tokens} tokens in "
                   f"{result.seconds:.2f} s" + (f" = {tps:.1f} tok/s" if tps else "")
                   + (f"; {len(result.errors)} failed: {result.errors[0]}" if result.errors else ""),
                   "see the server log for the failed requests")
        report.figures.update(probe_requests=result.requests, completion_tokens=result.completion_tokens,
                              probe_seconds=round(result.seconds, 3), tokens_per_s=round(tps, 2) if tps else None)
    if kind == EYAS and after.algorithm == "NONE" or (kind == SGLANG and after.gauge_length == 0.0):
        report.add("speculation", PROBLEM, "speculation is off on this server"
                   + (" (eyas:spec_info algorithm NONE)" if kind == EYAS else " (sglang:spec_accept_length is 0)"),
                   "start it with --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT")
        report.verdict = "SPECULATION OFF: the server decodes without a draft"
        return
    if not after.has_spec_metrics:
        if kind == VLLM:
            msg, fix = ("no vllm:spec_decode_* metrics: vLLM registers them only when speculative decoding is "
                        "configured, so speculation is off", "start vLLM with --speculative-config "
                        "'{\"method\": \"eagle3\", \"model\": DRAFT, \"num_speculative_tokens\": 3}'")
            report.verdict = "SPECULATION OFF: vLLM has no speculative_config"
        else:
            msg, fix = (f"{LABEL[kind]} exposes no acceptance metrics (no spec_accept_length, no spec_decode "
                        "counters)", "use a server version that exports them (SGLang >= 0.4 with "
                        "--enable-metrics, vLLM v1, eyas)")
            report.verdict = "UNVERIFIED: no acceptance metrics to read"
        report.add("speculation", PROBLEM, msg, fix)
        return
    acc = servers.acceptance(before, after)
    if acc is None or acc.tau is None:
        why = acc.source if acc else "no figures"
        report.add("acceptance", PROBLEM, f"no verify step was recorded ({why}), although speculation metrics exist",
                   "send traffic (drop --no-probe) and check that requests reach this server")
        report.verdict = "UNVERIFIED: no speculative step was observed"
        return
    _acceptance_rows(report, kind, acc, result, opts, baseline)


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
    base_tps, base_src = baseline
    if base_tps and tps:
        speedup = tps / base_tps
        report.figures.update(baseline_tokens_per_s=round(base_tps, 2), speedup=round(speedup, 3))
        if speedup < 1.0:
            report.add("speed", PROBLEM, f"{tps:.1f} tok/s against the baseline's {base_tps:.1f} ({base_src}): "
                       f"{speedup:.2f}x, slower than without speculation",
                       "at this tau the draft costs more than it saves: fewer draft tokens "
                       "(--speculative-num-draft-tokens), a smaller batch, or a better-trained draft")
            if report.verdict.startswith("DEGRADED"):
                report.verdict += f"; SLOWER THAN BASELINE ({speedup:.2f}x)"
            elif tau >= NOT_ACCEPTED_TAU:  # accepted, yet it does not pay: both facts, in that order
                report.verdict += f" but SLOWER THAN BASELINE ({speedup:.2f}x)"
        else:
            report.add("speed", OK, f"{tps:.1f} tok/s against the baseline's {base_tps:.1f} ({base_src}): "
                       f"{speedup:.2f}x")
            if report.verdict.startswith("working"):
                report.verdict = f"working (tau {tau:.2f}, {speedup:.2f}x faster than the baseline)"
    elif base_src:
        report.add("speed", WARNING, f"no speed comparison: {base_src or 'no tokens/s measured'}",
                   "check --baseline-url")
