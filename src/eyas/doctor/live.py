"""``eyas doctor --url URL``: is the draft being accepted on a live eyas, SGLang or vLLM server?

1. ``GET /v1/models`` (the model id, ``owned_by``) and ``GET /metrics`` tell which server it is;
2. the acceptance metrics are read, ``--probes N`` chat requests are sent at temperature 0, and
   the metrics are read again (``--no-probe``: read once, lifetime figures);
3. tau, acceptance rate and per-position acceptance come from counter deltas where the server has
   counters (eyas, vLLM) and from the gauges otherwise (SGLang); tokens/s from the probes;
4. ``judge`` (``judge.py``) turns the figures into a verdict: working, NOT ACCEPTED, degraded,
   slower than baseline.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx

from ..common import server_metrics
from ..common.server_metrics import LABEL, server_root
from ..errors import EyasError
from . import server_config
from .judge import MAX_DRAFT_TOKENS, judge
from .live_view import LiveOptions, ProbeResult, ServerView
from .verdict import OK, PROBLEM, Report


def _get(client: httpx.Client, url: str) -> tuple[httpx.Response | None, str | None, bool]:
    """(response, None, False), or (None, what went wrong, whether it was a timeout)."""
    t = time.perf_counter()
    try:
        return client.get(url), None, False
    except httpx.TimeoutException:
        limit = client.timeout.read
        return None, (f"GET {url} timed out: no answer after {time.perf_counter() - t:.1f} s"
                      + (f" (--timeout {limit:g} s)" if limit is not None else "")), True
    except httpx.HTTPError as e:
        return None, f"nothing answers at {url} ({type(e).__name__}: {e})", False


def _read_models(r: httpx.Response, view: ServerView) -> str | None:
    """Fill ``view.model``/``owned_by`` from an OpenAI model list ({"data": [{"id": ...}, ...]}); what was received
    instead, in words, when the 200 answer is no such list (a login page, a proxy's JSON, another service)."""
    try:
        body = r.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        kind = r.headers.get("content-type", "no content type").split(";")[0]
        return f"{kind} that is not JSON ({r.text[:80].strip()!r})"
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        got = (f"a JSON {type(body).__name__}" if not isinstance(body, dict) else
               "JSON without a data list" if data is None else "JSON whose data is not a list")
        return f"{got} ({r.text[:80].strip()!r})"
    if not data:
        return "an empty model list: the server serves no model"
    first = data[0]
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        return f"a model list whose first entry has no id string ({json.dumps(first)[:80]})"
    view.model = first["id"]
    view.owned_by = first.get("owned_by") if isinstance(first.get("owned_by"), str) else None
    return None


def look(client: httpx.Client, url: str) -> tuple[ServerView, dict | None]:
    """What serves at ``url`` and its parsed metrics (None when /metrics is missing or unreadable)."""
    view = ServerView(url)
    r, view.error, view.timed_out = _get(client, url + "/v1/models")
    if r is None:
        return view, None
    view.models_status = r.status_code
    if r.status_code == 200:
        view.models_error = _read_models(r, view)
    m, view.metrics_error, _ = _get(client, url + "/metrics")
    view.metrics_status = m.status_code if m is not None else None
    samples = None
    if m is not None and m.status_code == 200:
        try:
            samples = server_metrics.parse(m.text)
        except ValueError as e:
            view.metrics_error = (f"GET {url}/metrics answered 200 with text that is not Prometheus exposition "
                                  f"format ({str(e)[:200]})")
    view.kind = server_metrics.detect(samples or {}, view.owned_by)
    return view, samples


def probe_one(client: httpx.Client, url: str, model: str | None, text: str, max_tokens: int,
              res: ProbeResult) -> None:
    """One chat request at temperature 0, added to ``res``."""
    body = {"model": model or "default", "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0}
    t = time.perf_counter()
    try:
        r = client.post(url + "/v1/chat/completions", json=body)
    except httpx.TimeoutException as e:  # the server is there (it listed its models) but slow or loaded
        res.timeouts += 1
        res.errors.append(f"no answer after {time.perf_counter() - t:.1f} s ({type(e).__name__}, --timeout "
                          f"{client.timeout.read:g} s)" if client.timeout.read is not None else f"{type(e).__name__}")
        return
    except httpx.HTTPError as e:
        res.errors.append(f"{type(e).__name__}: {e}")
        return
    dt = time.perf_counter() - t
    if r.status_code != 200:
        res.errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
        return
    try:
        usage = r.json().get("usage") or {}
        tokens = int(usage.get("completion_tokens") or 0)
        tau = usage.get("spec_accept_length")
        tau = float(tau) if tau is not None else None
    except (ValueError, TypeError, AttributeError):
        res.errors.append(f"HTTP 200 without a readable chat completion: {r.text[:200]}")
        return
    res.requests += 1
    res.seconds += dt
    res.completion_tokens += tokens
    if tau is not None:
        res.per_request_tau.append(tau)


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
    """``--expect-tau`` is a number, or the JSON ``eyas eval --json-out`` wrote (its accept_length); either way an
    acceptance length: finite and at least 1 (a NaN would compare false and never call a tau degraded)."""
    if value is None:
        return None
    try:
        tau = float(value)
    except ValueError:
        p = Path(value)
        if not p.is_file():
            raise EyasError(f"--expect-tau {value!r} is neither a number nor a file",
                            "pass the tau from `eyas eval`, e.g. --expect-tau 2.8, or its --json-out file") from None
        try:
            tau = float(json.loads(p.read_text())["accept_length"])
        except (ValueError, KeyError, TypeError) as e:
            raise EyasError(f"{p} has no accept_length ({e})", "pass the file `eyas eval --json-out` wrote") from None
    if not 1 <= tau <= 1 + MAX_DRAFT_TOKENS:  # above: no server drafts that much, and every run would be DEGRADED
        raise EyasError(f"--expect-tau {value!r} gives {tau}, which is no acceptance length: tau is at least 1 "
                        f"(the bonus token) and at most {1 + MAX_DRAFT_TOKENS} (no server drafts more than "
                        f"{MAX_DRAFT_TOKENS} tokens a step)", "pass the tau `eyas eval` printed, e.g. --expect-tau 2.8")
    return tau


def diagnose_live(url: str, opts: LiveOptions, client: httpx.Client | None = None,
                  baseline_client: httpx.Client | None = None) -> Report:
    from ..common.prompts import prompt_set

    url = server_root(url)
    own = client is None
    client = client or opts.client()
    try:
        view, samples = look(client, url)
        report = Report(f"{url}")
        if view.error:
            report.add("server", PROBLEM, view.error, "the server is up but does not answer: check its log and "
                       "load, or raise --timeout" if view.timed_out else
                       "start the server, or check --url (scheme, host, port)")
            report.verdict = f"{'TIMED OUT' if view.timed_out else 'UNREACHABLE'}: {view.error}"
            return report
        if view.models_status != 200:  # an OpenAI-compatible server lists its models; a key it wants: 401
            fix = ("pass the server's key: --api-key KEY (or EYAS_API_KEY)" if view.models_status in (401, 403) else
                   "check --url: it should be the address of an eyas, SGLang or vLLM server")
            report.add("server", PROBLEM, f"GET {url}/v1/models answered {view.models_status}: not an answer of an "
                       "OpenAI-compatible server", fix)
            report.verdict = f"NOT AN OPENAI-COMPATIBLE ANSWER: GET /v1/models answered {view.models_status}"
            return report
        if view.models_error:  # 200, but no model list: a login page, a proxy, another service
            report.add("server", PROBLEM, f"GET {url}/v1/models answered 200 with {view.models_error}, not the model "
                       'list of an OpenAI-compatible server ({"data": [{"id": ...}]})',
                       "check --url: it should reach the eyas, SGLang or vLLM server itself, not a login page, "
                       "proxy or other service in front of it (an HTML page usually means an auth proxy)")
            report.verdict = f"NOT AN OPENAI-COMPATIBLE ANSWER: GET /v1/models answered 200 with {view.models_error}"
            return report
        report.subject = f"{url} ({LABEL[view.kind]}, model {view.model or '?'})"
        report.add("server", OK, f"{LABEL[view.kind]} serving {view.model or '?'}"
                   + (f" (owned_by {view.owned_by})" if view.owned_by else ""))
        info = server_config.fetch(client, url, view.kind)
        configured = server_config.add_rows(report, view.kind, info)
        if configured:
            report.figures["server_algorithm"] = configured
        if info and info.get("setting_source"):  # eyas serve: what chose the setting, and why
            report.figures.update(server_setting_source=info["setting_source"],
                                  server_setting_reason=info.get("setting_reason"))
        if server_config.num_draft_tokens(view.kind, info):
            report.figures["server_num_draft_tokens"] = server_config.num_draft_tokens(view.kind, info)
        before = server_metrics.snapshot(samples, view.kind) if samples is not None else None
        chat = prompt_set("chat")
        prompts = [chat[i % len(chat)] for i in range(max(opts.probes, 0))]  # past the set, round again
        result, baseline = None, (opts.baseline_tps, "--baseline-tps") if opts.baseline_tps else (None, "")
        if not opts.no_probe and prompts:
            with _baseline_side(opts, baseline_client) as side:
                if side is not None and isinstance(side, str):
                    baseline = (None, side)
                    side = None
                result, base = probe(client, url, opts.model or view.model, prompts, opts.max_tokens, side)
                if base is not None:
                    where = server_root(opts.baseline_url)
                    baseline = (base.tokens_per_s, f"{where}, same probes interleaved") if base.tokens_per_s else \
                        (None, f"the baseline {where} measured no tokens/s: "
                         + (f"{len(base.errors)} of {len(prompts)} probes failed: {base.errors[0]}" if base.errors
                            else "its answers held no completion tokens"))
            view_after, samples_after = look(client, url)
            after = server_metrics.snapshot(samples_after, view.kind) if samples_after is not None else None
            if after is None:  # the second read failed: report how
                view.metrics_status = view_after.metrics_status
                view.metrics_error = view_after.metrics_error or view_after.error
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
    url = server_root(opts.baseline_url)
    own = client is None
    client = client or opts.client()
    try:
        view, _ = look(client, url)
        wrong = view.error or (f"GET {url}/v1/models answered {view.models_status}" if view.models_status != 200 else
                               f"GET {url}/v1/models answered 200 with {view.models_error}" if view.models_error else
                               None)
        yield f"baseline unusable: {wrong}" if wrong else (client, url, opts.model or view.model)
    finally:
        if own:
            client.close()
