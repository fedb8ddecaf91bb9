"""Hardening: keys on every route, request limits, timeouts, request ids and the request log,
and a storm of clients that drop mid-stream."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest
import torch
from serve_helpers import scrape, wait_idle

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]
ROUTES = [  # (method, path, body, status with the right key)
    ("POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 2}, 200),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, 200),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}, 200),
    ("GET", "/v1/models", None, 200),
    ("GET", "/server_info", None, 200),
    ("GET", "/get_server_info", None, 200),
    ("GET", "/health_generate", None, 200),
    ("GET", "/version", None, 200),
]


@pytest.mark.parametrize("metrics_require_key", [False, True])
def test_every_route_needs_the_key_but_health(inprocess, metrics_require_key):
    with inprocess(api_key="k3y", metrics_require_key=metrics_require_key) as srv:
        for method, path, body, ok in ROUTES + [("GET", "/metrics", None, 200)]:
            guarded = path != "/metrics" or metrics_require_key
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k3y"}):
                r = httpx.request(method, srv.url + path, json=body, headers=headers, timeout=60)
                if guarded:
                    assert r.status_code == 401, (path, headers, r.status_code)
                    assert r.json()["error"]["code"] == "invalid_api_key"
            r = httpx.request(method, srv.url + path, json=body, headers={"Authorization": "Bearer k3y"}, timeout=60)
            assert r.status_code == ok, (path, r.status_code, r.text[:200])
        assert httpx.get(srv.url + "/health").status_code == 200  # open, for load balancers


def test_switch_interval_holds_while_serving_and_is_restored(inprocess):
    import sys

    before = sys.getswitchinterval()
    with inprocess(switch_interval_ms=0.25) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    assert sys.getswitchinterval() == before


def test_public_bind_without_a_key_warns():
    from eyas.serve.cli import public_bind_warning

    assert public_bind_warning("127.0.0.1", None) is None
    assert public_bind_warning("::1", None) is None
    assert public_bind_warning("localhost", None) is None
    assert public_bind_warning("0.0.0.0", "k") is None
    assert "--api-key" in public_bind_warning("0.0.0.0", None)


def test_limits_answer_4xx_naming_the_flag(inprocess):
    from eyas.serve.limits import Limits

    limits = Limits(max_request_bytes=2000, max_prompt_tokens=40, max_stop_strings=2, max_stop_length=5)
    with inprocess(limits=limits) as srv:
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        r = httpx.post(srv.url + CHAT, json=big)
        assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        r = httpx.post(srv.url + CHAT, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "word " * 60, "max_tokens": 2})
        assert r.status_code == 400 and "--max-prompt-tokens" in r.json()["error"]["message"]
        r = httpx.post(srv.url + CHAT, json={"messages": MSG, "stop": ["a", "b", "c"], "max_tokens": 2})
        assert r.status_code == 400 and "--max-stop-strings" in r.json()["error"]["message"]
        r = httpx.post(srv.url + CHAT, json={"messages": MSG, "stop": ["abcdefgh"], "max_tokens": 2})
        assert r.status_code == 400 and "--max-stop-length" in r.json()["error"]["message"]
        r = httpx.post(srv.url + CHAT, json={"messages": MSG, "stop": ["ab"], "max_tokens": 2})
        assert r.status_code == 200  # within every limit


def test_a_compressed_body_is_decoded_within_the_limit_or_refused_by_its_coding(inprocess):
    """gzip and deflate bodies are served as if sent plain; --max-request-bytes holds for the decoded body (a zip
    bomb is a 413, not inflated); any other Content-Encoding is a 415 naming it, never "not valid UTF-8"."""
    import gzip
    import zlib

    from eyas.serve.limits import Limits

    body = {"messages": MSG, "max_tokens": 3, "temperature": 0}
    raw = json.dumps(body).encode()
    gz = gzip.compress(raw)
    with inprocess(limits=Limits(max_request_bytes=2000)) as srv:
        def post(data, coding, **kw):
            return httpx.post(srv.url + CHAT, content=data, timeout=60, **kw,
                              headers={"content-type": "application/json", "content-encoding": coding})

        want = httpx.post(srv.url + CHAT, json=body, timeout=60).json()["choices"][0]["message"]
        for coding, data in [("gzip", gz), ("deflate", zlib.compress(raw)), ("GZip", gz),
                             ("gzip", iter([gz[:10], gz[10:]]))]:  # chunked: no Content-Length
            r = post(data, coding)
            assert r.status_code == 200, (coding, r.text)
            assert r.json()["choices"][0]["message"] == want
        bomb = gzip.compress(json.dumps({"messages": [{"role": "user", "content": " " * 10**6}]}).encode())
        assert len(bomb) < 2000
        r = post(bomb, "gzip")
        assert r.status_code == 413 and "once decoded" in r.json()["error"]["message"], r.text
        for data in (b"not gzip at all", gz[:-12], gz + b"junk"):
            r = post(data, "gzip")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encoding", r.text
            assert "UTF-8" not in r.json()["error"]["message"]
        for coding in ("br", "zstd", "gzip, gzip"):
            r = post(b"\x8b\x00compressed", coding)
            err = r.json()["error"]
            assert r.status_code == 415 and err["param"] == "Content-Encoding", r.text
            assert coding in err["message"] and "uncompressed" in err["message"]
            assert r.headers["accept-encoding"] == "gzip, deflate"
        r = httpx.post(srv.url + CHAT, content=gz, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400 and "'Content-Encoding: gzip'" in r.json()["error"]["message"]  # header left out
        assert httpx.post(srv.url + CHAT, json=body, timeout=60).status_code == 200  # nothing else was touched


def test_stream_limit_answers_429(inprocess):
    from eyas.serve.limits import Limits

    with inprocess(step_delay=0.05, limits=Limits(max_concurrent_streams=1)) as srv:
        body = {"messages": MSG, "max_tokens": 300, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.url + CHAT, json=body, timeout=60) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept referenced: a dropped iterator closes the stream
            next(lines)
            r = httpx.post(srv.url + CHAT, json=body, timeout=60)
            assert r.status_code == 429 and "--max-concurrent-streams" in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert r.headers["retry-after"] == "1"
        deadline = time.time() + 20
        while time.time() < deadline:  # the slot comes back when the first stream ends
            r = httpx.post(srv.url + CHAT, json={**body, "max_tokens": 2}, timeout=60)
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200
        outcomes = counted(srv.url, lambda m: m["length"] >= 1 and m["abort"] >= 1)
        # each request once: the 429s as rejected, the first stream (closed by its client) as an abort
        assert outcomes["rejected"] >= 1 and outcomes["abort"] == 1 and outcomes["invalid"] == 0, outcomes


def counted(url: str, settled, timeout: float = 20) -> dict[str, float]:
    """``eyas:requests_total`` by outcome, once ``settled(outcomes)`` (a cancelled request ends a step later)."""
    deadline = time.time() + timeout
    while True:
        outcomes = {k.split('"')[1]: v for k, v in scrape(url).items() if k.startswith("eyas:requests_total{")}
        if settled(outcomes) or time.time() > deadline:
            return outcomes
        time.sleep(0.1)


def test_request_timeout_cancels_cleanly(inprocess):
    from eyas.serve.limits import Limits

    with inprocess(step_delay=0.05, limits=Limits(request_timeout=0.5)) as srv:
        body = {"messages": MSG, "max_tokens": 200, "ignore_eos": True}
        r = httpx.post(srv.url + CHAT, json=body, timeout=60)
        assert r.status_code == 408 and "--request-timeout" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "timeout_error"
        with httpx.stream("POST", srv.url + CHAT, json={**body, "stream": True}, timeout=60) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["error"]["code"] == "request_timeout"
        deadline = time.time() + 10
        while httpx.get(srv.url + "/health").json()["running"] and time.time() < deadline:
            time.sleep(0.1)
        assert httpx.get(srv.url + "/health").json() == {"status": "ok", "running": 0, "queued": 0}
        assert httpx.post(srv.url + CHAT, json={"messages": MSG, "max_tokens": 2}).status_code == 200
        outcomes = counted(srv.url, lambda m: m["timeout"] >= 2)
        assert outcomes["timeout"] == 2 and outcomes["abort"] == outcomes["invalid"] == 0, outcomes  # each once


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


@pytest.mark.parametrize("with_text", [False, True])
def test_request_ids_and_one_structured_line_per_request(inprocess, with_text):
    handler = Lines()
    logger = logging.getLogger("eyas.serve.requests")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with inprocess(log_requests=with_text) as srv:
            r = httpx.post(srv.url + CHAT, json={"messages": [{"role": "user", "content": "secret words"}],
                                                 "max_tokens": 4}, headers={"X-Request-Id": "abc-123"})
            assert r.headers["x-request-id"] == "abc-123"
            r2 = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True})
            rid2 = r2.headers["x-request-id"]
            assert len(rid2) == 32
            bad = httpx.post(srv.url + CHAT, json={"messages": []}, headers={"X-Request-Id": "bad id;drop"})
            assert bad.status_code == 400 and bad.headers["x-request-id"] != "bad id;drop"
            time.sleep(0.3)
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(m) for m in handler.records]
    by_id = {line["request_id"]: line for line in lines}
    first = by_id["abc-123"]
    assert first["status"] == 200 and first["completion_tokens"] >= 1 and first["prompt_tokens"] > 3
    assert "spec_accept_length" in first and first["latency_s"] > 0
    assert by_id[rid2]["status"] == 200 and by_id[rid2]["completion_tokens"] >= 1  # a stream, logged at its end
    assert any(line["status"] == 400 for line in lines)
    assert len([line for line in lines if line["request_id"] == "abc-123"]) == 1
    text = json.dumps(lines)
    assert ("secret words" in text) == with_text


def test_client_storm_leaves_nothing_behind(server):
    """Hundreds of streams opened and dropped mid-flight: running back to 0, memory flat, no errors."""
    before_rss = server.rss_kb()
    body = {"prompt": "storm", "max_tokens": 64, "stream": True, "ignore_eos": True}
    dropped = []

    def client(i):
        try:
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as s:
                for n, _ in enumerate(s.iter_lines()):
                    if n >= i % 3:  # drop after 0, 1 or 2 events
                        break
            dropped.append(s.status_code)
        except httpx.HTTPError as e:
            dropped.append(type(e).__name__)

    for _wave in range(4):
        threads = [threading.Thread(target=client, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(dropped) == 200
    assert set(dropped) <= {200, 503}, set(dropped)
    assert wait_idle(server.url) == {"status": "ok", "running": 0, "queued": 0}
    m = scrape(server.url)
    assert m["eyas:num_requests_running"] == 0
    assert m.get('eyas:requests_total{outcome="error"}', 0) == 0
    assert server.rss_kb() - before_rss < 200 * 1024  # no growth beyond allocator noise
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "after", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200
    log = server.stderr()
    assert "Traceback" not in log and " ERROR " not in log


class OomOnLongPrompts:
    """The real engine, except that a prefill holding a prompt over 200 tokens runs out of memory."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def prefill(self, seqs):
        if any(len(s.prompt_ids) > 200 for s in seqs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return self._engine.prefill(seqs)


def test_a_request_that_cannot_fit_fails_alone(inprocess, reference, engine):
    from eyas.common.prompts import chat_ids

    results = {}

    def call(name, content, n):
        r = httpx.post(inprocess_url[0] + CHAT, json={"messages": [{"role": "user", "content": content}],
                                                     "max_tokens": n, "temperature": 0}, timeout=120)
        results[name] = r

    inprocess_url = []
    with inprocess(step_delay=0.02, wrap=OomOnLongPrompts) as srv:
        inprocess_url.append(srv.url)
        threads = [threading.Thread(target=call, args=(f"ok{i}", f"short {i}", 24)) for i in range(4)]
        threads.append(threading.Thread(target=call, args=("huge", "word " * 60, 8)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        huge = results["huge"]
        assert huge.status_code == 503 and huge.json()["error"]["code"] == "out_of_memory", huge.text
        assert "does not fit" in huge.json()["error"]["message"]
        tok = engine.target.tokenizer
        for i in range(4):
            r = results[f"ok{i}"]
            assert r.status_code == 200
            want = reference([chat_ids(tok, f"short {i}")], 24)[0]
            assert r.json()["usage"]["completion_tokens"] == len(want)
        assert httpx.get(srv.url + "/health").json() == {"status": "ok", "running": 0, "queued": 0}
