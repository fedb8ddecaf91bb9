"""Admission and cancellation: 503 with Retry-After past capacity; disconnects free their slots."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import scrape

LONG = {"prompt": "long", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}  # never finishes here


def wait_idle(scheduler, timeout: float = 30) -> tuple[int, int]:
    end = time.time() + timeout
    while time.time() < end and scheduler.counts() != (0, 0):
        time.sleep(0.05)
    return scheduler.counts()


def test_past_capacity_the_server_answers_503_with_retry_after(inprocess):
    with inprocess(step_delay=0.05, max_running_requests=1, max_queued_requests=1) as srv:
        state = srv.app.state.eyas
        with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:  # noqa: SIM117 - order matters
            with a.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}) as first:
                # keep the iterator: a dropped one is finalised (at a gc pass) and closes the connection
                lines = first.iter_lines()
                next(lines)  # running
                with b.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}) as second:
                    end = time.time() + 10
                    while state.scheduler.counts() != (1, 1) and time.time() < end:
                        time.sleep(0.02)
                    assert state.scheduler.counts() == (1, 1)
                    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
                    assert r.status_code == 503
                    assert int(r.headers["Retry-After"]) >= 1
                    assert r.json()["error"]["type"] == "overloaded_error"
                    assert "--max-running-requests" in r.json()["error"]["message"]
                    assert second.status_code == 200
        # both streams were closed early by the client: their slots come back
        assert wait_idle(state.scheduler) == (0, 0)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200
        m = scrape(srv.url)
        assert m['eyas:requests_total{outcome="rejected"}'] == 1
        assert m['eyas:requests_total{outcome="abort"}'] == 2


def _hang_up(url: str, i: int) -> str:
    """Mixed clients: streams closed after a chunk, non-streaming calls that time out, normal calls."""
    body = {"prompt": f"c{i}", "max_tokens": 12 + i % 40, "temperature": 0, "ignore_eos": True}
    kind = i % 3
    try:
        if kind == 0:
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
                for _ in r.iter_lines():
                    break
            return "closed"
        if kind == 1:
            httpx.post(url + "/generate", json={"text": f"c{i}", "sampling_params": {
                "max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}, timeout=0.3)
            return "finished"
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        return "ok" if r.status_code == 200 else f"status {r.status_code}"
    except httpx.TimeoutException:
        return "timed out"


def test_cancellations_leave_no_leaked_slots_or_sequences(inprocess):
    from eyas.engine.batch import Sequence

    # Only what this test creates counts: other tests in the session may hold their own.
    engines_before = {t.ident for t in threading.enumerate() if t.name == "eyas-engine"}
    gc.collect()
    seqs_before = {id(o) for o in gc.get_objects() if type(o) is Sequence}
    with inprocess(step_delay=0.01, max_running_requests=8, max_queued_requests=64) as srv:
        state = srv.app.state.eyas
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda i: _hang_up(srv.url, i), range(36)))
        assert "timed out" in outcomes and "closed" in outcomes
        assert all(o in ("closed", "timed out", "finished", "ok") for o in outcomes), outcomes
        assert wait_idle(state.scheduler) == (0, 0)
        sched = state.scheduler
        assert sched._batch is None and not sched._running and not sched._waiting and sched._inflight == 0
        m = scrape(srv.url)
        assert m["eyas:num_requests_running"] == 0 and m["eyas:num_requests_waiting"] == 0
        assert m['eyas:requests_total{outcome="abort"}'] >= outcomes.count("timed out")
        assert m['eyas:requests_total{outcome="error"}'] == 0
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "after", "max_tokens": 3}, timeout=60)
        assert ok.status_code == 200
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Sequence and id(o) not in seqs_before]
    assert not [t for t in threading.enumerate() if t.name == "eyas-engine" and t.ident not in engines_before]


def test_real_server_under_load_with_cancellations_stays_flat(server):
    def rounds() -> list[str]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda i: _hang_up(server.url, i), range(24)))

    rounds()  # warm: allocator pools, batch shapes
    rss_before = server.rss_kb()
    for _ in range(2):
        outcomes = rounds()
        assert all(o in ("closed", "timed out", "finished", "ok") for o in outcomes), outcomes
    end = time.time() + 30
    while time.time() < end:
        m = scrape(server.url)
        if m["eyas:num_requests_running"] == 0 and m["eyas:num_requests_waiting"] == 0:
            break
        time.sleep(0.1)
    assert m["eyas:num_requests_running"] == 0 and m["eyas:num_requests_waiting"] == 0
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "running": 0, "queued": 0}
    growth_mb = (server.rss_kb() - rss_before) / 1024
    assert growth_mb < 64, f"resident memory grew {growth_mb:.1f} MB over two load rounds"
    log = server.stderr()
    assert "Traceback" not in log and " ERROR " not in log and "ERROR:" not in log, log[-3000:]


def test_a_client_that_hangs_up_mid_body_is_an_abort_not_a_server_error(inprocess, caplog):
    """A client (or proxy) that sends part of its body and leaves: counted and logged as ``abort``, no 500,
    no traceback; the server answers the next request."""
    import json
    import logging
    import socket

    with inprocess() as srv, caplog.at_level(logging.INFO):
        for path in ("/v1/chat/completions", "/v1/completions", "/generate"):
            with socket.create_connection(("127.0.0.1", srv.port)) as s:
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          'Content-Length: 100\r\n\r\n{"prompt": '.encode())
                time.sleep(0.2)  # the route is reading the body
        end = time.time() + 10
        while time.time() < end and scrape(srv.url).get('eyas:requests_total{outcome="abort"}', 0) < 3:
            time.sleep(0.05)
        m = scrape(srv.url)
        assert m['eyas:requests_total{outcome="abort"}'] == 3
        assert m['eyas:requests_total{outcome="error"}'] == 0
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "after", "max_tokens": 2}).status_code == 200
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "eyas.serve.requests"]
    assert [line["outcome"] for line in logged if line["path"] != "/metrics"][:3] == ["abort"] * 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


def test_the_503_reports_the_numbers_admission_compared():
    """A request taken for admission is neither running nor queued for a moment (the engine thread has popped it,
    the batch does not hold it yet), but submit counts it: the 503 must say in-flight of capacity, not
    "(0 running, 1 queued)" at a capacity of 2."""
    from eyas.serve.api_errors import overloaded
    from eyas.serve.metrics import ServeMetrics
    from eyas.serve.scheduler import Overloaded, Scheduler, Work

    s = Scheduler(None, ServeMetrics(0, 0, speculative=False), max_running=1, max_queued=1)
    s.submit([Work(None, None), Work(None, None)])
    s._waiting.popleft()  # being admitted
    with pytest.raises(Overloaded) as e:
        s.submit([Work(None, None)])
    msg = overloaded(e.value).message
    assert "2 sequences in flight (running, being prefilled or queued) of the 2 it holds" in msg, msg
    assert "1 --max-running-requests + 1 --max-queued-requests" in msg and "needs 1 more" in msg, msg
    s._stopping_admissions = True  # shutting down (abort_all): said so, not "at capacity"
    with pytest.raises(Overloaded) as e:
        s.submit([Work(None, None)])
    assert "shutting down" in overloaded(e.value).message
