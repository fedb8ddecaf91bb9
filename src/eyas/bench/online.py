"""Benchmark over HTTP against any OpenAI-compatible server (eyas, SGLang, vLLM, ...).

Each request streams ``/v1/chat/completions`` with ``stream_options.include_usage``
(``stream_chat``, also what ``benchmarks/serve_load.py`` sends): TTFT is the first chunk that carries
text, output tokens come from the final usage (chunks counted when a server sends no usage); a stream
with an ``error`` event is a failed request. ``concurrency`` requests are in flight at once.
Acceptance over the run comes from the server's ``/metrics`` before and after (exact counter deltas
on eyas and vLLM, the gauge on SGLang; see ``eyas.common.server_metrics``), and per request from
the usage's ``spec_accept_length``, ``spec_verify_ct`` and ``spec_accept_token_num`` where the server
reports them (eyas): summed per prompt category, they give ``Run.per_category``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from ..common import server_metrics
from ..errors import EyasError
from .results import Request, Run


@dataclass
class Streamed:
    """One streamed ``/v1/chat/completions`` as the client saw it (``time.perf_counter`` seconds)."""

    start: float
    end: float
    arrivals: list[float]  # when each chunk that carried text arrived
    usage: dict | None  # the last usage the stream carried (``stream_options.include_usage``)


def error_text(body: bytes) -> str:
    """What a refusal says: an OpenAI error's message, else a non-JSON body's first words (an HTML page is not an
    OpenAI-compatible server's answer, and says so)."""
    text = body.decode(errors="replace").strip()
    try:
        error = json.loads(text).get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:300]
    except (ValueError, AttributeError):
        pass
    if text[:200].lower().lstrip().startswith(("<!doctype html", "<html")):
        return "an HTML page, not an OpenAI-compatible answer: is --url the server's address?"
    return text[:200]


async def sse_lines(response: httpx.Response):
    """A server-sent event stream's lines, split where SSE ends a line (LF, CR LF) and nowhere else: httpx's
    ``aiter_lines`` also splits at U+2028, U+0085 and the like, which a server may send raw inside a JSON string
    (vLLM and SGLang do), cutting that event in two."""
    rest = ""
    async for text in response.aiter_text():
        *lines, rest = (rest + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if rest:
        yield rest.removesuffix("\r")


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict) -> Streamed:
    """POST ``body`` (with ``"stream": true``) and read its server-sent events to ``[DONE]``. A status other
    than 200 or an ``error`` event raises RuntimeError with the server's message."""
    start = time.perf_counter()
    arrivals, usage = [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code} from {url}/v1/chat/completions: {error_text(await r.aread())}")
        async for line in sse_lines(r):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {(event['error'] or {}).get('message')}")
            if event.get("usage"):
                usage = event["usage"]
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                arrivals.append(time.perf_counter())
    return Streamed(start, time.perf_counter(), arrivals, usage)


def _int(value) -> int | None:
    return int(value) if value is not None else None


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
               temperature: float, top_p: float, category: str | None = None) -> Request:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "stream": True, "stream_options": {"include_usage": True}}
    s = await stream_chat(client, url, body)
    usage = s.usage or {}
    tokens = int(usage["completion_tokens"]) if usage.get("completion_tokens") is not None else len(s.arrivals)
    tau = usage.get("spec_accept_length")
    ttft = s.arrivals[0] - s.start if s.arrivals else None
    return Request(tokens, ttft, s.end - s.start, float(tau) if tau is not None else None,
                   _int(usage.get("spec_verify_ct")), _int(usage.get("spec_accept_token_num")), category)


def _headers(api_key: str | None) -> dict | None:
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


async def _run(url: str, model: str, prompts: list[str], max_tokens: int, temperature: float, concurrency: int,
               timeout: float, progress, api_key: str | None, top_p: float,
               categories: list[str | None]) -> tuple[list[Request], list[str], float]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=_headers(api_key)) as client:
        async def task(p, category):
            async with sem:
                try:
                    return await _one(client, url, model, p, max_tokens, temperature, top_p, category)
                except (httpx.HTTPError, RuntimeError, ValueError) as e:
                    return f"{type(e).__name__}: {e}"
                finally:
                    if progress is not None:
                        progress.update(1)

        start = time.perf_counter()
        results = await asyncio.gather(*(task(p, c) for p, c in zip(prompts, categories, strict=True)))
        seconds = time.perf_counter() - start
    return [r for r in results if isinstance(r, Request)], [r for r in results if isinstance(r, str)], seconds


def served_model(url: str, timeout: float = 30.0, api_key: str | None = None) -> str:
    """The first model id in ``/v1/models`` (what clients must send); a URL where nothing answers is refused
    before any request is timed."""
    try:
        r = httpx.get(url + "/v1/models", timeout=timeout, headers=_headers(api_key))
        return r.json()["data"][0]["id"]
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise EyasError(f"nothing answers at {url}: {type(e).__name__}: {e}",
                        "start the server first (e.g. eyas serve --port 30000), or check the URL and port") from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"


def scrape(url: str, timeout: float = 30.0, api_key: str | None = None):
    """(kind, Snapshot) from ``/metrics``; (None, None) when the server has none (or refuses it)."""
    try:
        r = httpx.get(url + "/metrics", timeout=timeout, headers=_headers(api_key))
    except httpx.HTTPError:
        return None, None
    if r.status_code != 200:
        return None, None
    try:
        samples = server_metrics.parse(r.text)
    except ValueError:  # not Prometheus text (a proxy's HTML page): no acceptance figures, not a traceback
        return None, None
    kind = server_metrics.detect(samples)
    return kind, server_metrics.snapshot(samples, kind)


def run_url(url: str, prompts: list[str], max_tokens: int, temperature: float, concurrency: int, label: str,
            model: str | None = None, timeout: float = 600.0, progress=None, api_key: str | None = None,
            top_p: float = 1.0, categories: list[str | None] | None = None) -> Run:
    """One run of ``prompts`` at ``concurrency``, each request sampled with ``temperature`` and ``top_p``
    (sent in the body: 0 is greedy); ``categories`` (one per prompt) group ``Run.per_category``."""
    url = server_metrics.server_root(url)
    model = model or served_model(url, api_key=api_key)
    _, before = scrape(url, api_key=api_key)  # a server with --metrics-require-key needs the key here too
    categories = categories or [None] * len(prompts)
    requests, errors, seconds = asyncio.run(_run(url, model, prompts, max_tokens, temperature, concurrency,
                                                 timeout, progress, api_key, top_p, categories))
    _, after = scrape(url, api_key=api_key)
    run = Run(label, concurrency, seconds, requests, errors=errors)
    if after is not None and after.has_spec_metrics:
        acc = server_metrics.acceptance(before, after)
        if acc is not None and acc.tau is not None:
            run.acceptance = {"tau": round(acc.tau, 4),
                              "accept_rate": round(acc.rate, 4) if acc.rate is not None else None,
                              "per_position": [round(p, 4) for p in acc.per_position],
                              "verify_steps": acc.drafts, "source": acc.source}
    return run
