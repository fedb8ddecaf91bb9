"""A grammar that takes long to compile holds its own request alone: other requests (tokenizing, plain
generation, /tokenize) go on at once, it answers 408 at its --request-timeout, a client that leaves frees
its wait, and the engine gets the compiled grammar with the job (it never compiles on the event loop)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from eyas.sample.grammar import Grammars
from eyas.serve.limits import Limits

SLOW = "(a|b)*slow"  # the regex the patched compiler takes SECONDS over
SECONDS = 3.0


def slow_compiles(monkeypatch):
    """Grammars.compile sleeps SECONDS (holding its thread, as xgrammar does) for SLOW; counts compiles."""
    real, calls = Grammars.compile, []

    def compile(self, spec):
        calls.append((spec.source, threading.current_thread().name))
        if spec.source == SLOW:
            time.sleep(SECONDS)
        return real(self, spec)

    monkeypatch.setattr(Grammars, "compile", compile)
    return calls


def regex_body(regex):
    return {"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0, "guided_regex": regex}


def test_slow_grammars_hold_no_other_request(inprocess, monkeypatch):
    calls = slow_compiles(monkeypatch)
    with inprocess() as srv, httpx.Client(base_url=srv.url, timeout=60) as http, ThreadPoolExecutor(4) as pool:
        heavy = [pool.submit(http.post, "/v1/completions", json=regex_body(SLOW)) for _ in range(2)]
        time.sleep(0.3)  # both compiles running: on the preparing threads they held every other request
        t = time.perf_counter()
        light = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
        tok = http.post("/tokenize", json={"model": "tiny", "prompt": "hi"})
        waited = time.perf_counter() - t
        assert light.status_code == 200 and tok.status_code == 200
        assert waited < SECONDS / 2, waited
        assert [r.result().status_code for r in heavy] == [200, 200]
    assert {name.split("_")[0] for src, name in calls if src == SLOW} == {"eyas-grammar"}  # not a preparing thread


def test_a_slow_grammar_answers_408_at_its_deadline(inprocess, monkeypatch):
    slow_compiles(monkeypatch)
    with inprocess(limits=Limits(request_timeout=1.0)) as srv:
        t = time.perf_counter()
        r = httpx.post(srv.url + "/v1/completions", json=regex_body(SLOW), timeout=60)
        took = time.perf_counter() - t
    assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
    assert took < SECONDS - 0.5, took  # at the deadline, not when the compile ends


def test_a_client_that_leaves_frees_its_wait(inprocess, monkeypatch, caplog):
    slow_compiles(monkeypatch)
    caplog.set_level(logging.INFO, logger="eyas.serve.requests")
    with inprocess() as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        body = httpx.Request("POST", srv.url + "/v1/completions", json=regex_body(SLOW))
        raw = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body.content)}\r\n\r\n").encode() + body.content
        with socket.create_connection((host, int(port))) as s:
            s.sendall(raw)
            time.sleep(0.3)
        deadline = time.monotonic() + SECONDS / 2  # its request ends now, not when the compile does
        while time.monotonic() < deadline and not any('"status": 499' in r.message for r in caplog.records):
            time.sleep(0.05)
    lines = [json.loads(r.message) for r in caplog.records if '"status": 499' in r.message]
    assert lines and lines[0]["outcome"] == "abort" and lines[0]["latency_s"] < SECONDS - 1


def test_the_engine_gets_the_compiled_grammar_with_the_job(inprocess, monkeypatch):
    calls = slow_compiles(monkeypatch)
    with inprocess() as srv:
        r = httpx.post(srv.url + "/v1/completions", json=regex_body("(yes|no)"), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")
    assert [name.split("_")[0] for src, name in calls if src == "(yes|no)"] == ["eyas-grammar"]  # compiled once
