"""One request never fails another (issue 26: items 1, 5, 6 and 11), over real HTTP on loopback.

- Faults inside the engine end the request that caused them alone: a row whose keys hold a NaN
  (what an overflow leaves), a row that makes the step raise, and settings that used to overflow
  (temperature 6e-39, top_p 1e-300). Streams running meanwhile finish with the answers they would
  have had alone, and every request writes exactly one log line with its true outcome.
- Limits name their flags; a request larger than the whole capacity is a 400, not a 503.
- A queued request that is refused or whose client hangs up frees its queue slot at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serve_helpers import scrape

NAN_MARK, RAISE_MARK = 250, 251  # prompt tokens that make the engine fail for that request
BYSTANDERS = [[72, 101, 108, 108], [7, 8, 9], [40, 41, 42, 43, 44, 45]]
LONG = 200


class Faulty:
    """The real engine, except that a row whose prompt holds NAN_MARK gets a NaN in its keys once it has
    two output tokens (its next forward's logits are NaN), and a batch holding a RAISE_MARK row raises."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, batch):
        time.sleep(0.02)  # keeps the bystanders in flight while the faulty requests come and go
        if any(RAISE_MARK in s.prompt_ids for s in batch.seqs):
            raise RuntimeError("simulated fault of one request's inputs")
        with torch.inference_mode():
            for i, s in enumerate(batch.seqs):
                if NAN_MARK in s.prompt_ids and len(s.output_ids) >= 2:
                    for layer in batch.target_cache.hf.layers:
                        layer.keys[i, :, 0] = float("nan")
        return self._engine.step(batch)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(json.loads(record.getMessage()))


@pytest.fixture
def request_log():
    handler = Lines()
    logger = logging.getLogger("eyas.serve.requests")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def _stream_ids(url: str, rid: str, body: dict) -> tuple[list[int], dict | None, float]:
    """(output ids, the error event if one came, when it ended) of a /generate stream."""
    ids, error = [], None
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, headers={"X-Request-Id": rid},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
            else:
                ids = event["output_ids"]
    return ids, error, time.monotonic()


def test_faults_inside_the_engine_end_their_own_request_alone(inprocess, reference, request_log):
    greedy = {"temperature": 0, "ignore_eos": True}
    alone = reference(BYSTANDERS, LONG, ignore_eos=True)
    odd_prompt = [30, 31, 32]
    with inprocess(wrap=Faulty) as srv, ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(_stream_ids, srv.url, f"bystander-{i}",
                               {"input_ids": p, "sampling_params": {**greedy, "max_new_tokens": LONG}})
                   for i, p in enumerate(BYSTANDERS)]
        state = srv.app.state.eyas
        end = time.time() + 30
        while state.scheduler.counts()[0] < len(BYSTANDERS) and time.time() < end:
            time.sleep(0.01)

        def post(rid, path, body):
            return httpx.post(srv.url + path, json=body, headers={"X-Request-Id": rid}, timeout=120)

        # one at a time, so that each faulty request is the only one joining its turn
        nan_stream = pool.submit(_stream_ids, srv.url, "nan-stream", {
            "input_ids": [NAN_MARK, 5, 6], "sampling_params": {**greedy, "max_new_tokens": 30}}).result()
        nan_plain = post("nan-plain", "/v1/completions",
                         {"prompt": [5, NAN_MARK], "max_tokens": 30, **greedy})
        raised = post("raise-plain", "/v1/completions", {"prompt": [RAISE_MARK, 9], "max_tokens": 30, **greedy})
        tiny_t = post("tiny-temperature", "/generate", {"input_ids": odd_prompt, "sampling_params": {
            "max_new_tokens": 12, "temperature": 6e-39, "ignore_eos": True}})
        tiny_p = post("tiny-top-p", "/generate", {"input_ids": odd_prompt, "sampling_params": {
            "max_new_tokens": 12, "temperature": 0.9, "top_p": 1e-300, "ignore_eos": True, "seed": 1}})
        odd_done = time.monotonic()
        results = [s.result() for s in streams]
        m = scrape(srv.url)
        assert state.scheduler.counts() == (0, 0) and state.scheduler._inflight == 0
    # the bystanders: untouched, and still running when the faults happened
    assert [ids for ids, _, _ in results] == alone
    assert all(error is None for _, error, _ in results)
    assert all(ended > odd_done for _, _, ended in results)
    # each faulty request failed alone, with its cause
    ids, error, _ = nan_stream
    assert len(ids) >= 2 and "not finite" in error["message"] and error["code"] == "engine_error"
    assert nan_plain.status_code == 500 and "not finite" in nan_plain.json()["error"]["message"]
    assert raised.status_code == 500 and "simulated fault" in raised.json()["error"]["message"]
    # the settings that used to overflow are greedy (6e-39) or keep the top token (top_p 1e-300)
    want = reference([odd_prompt], 12, ignore_eos=True)[0]
    assert tiny_t.status_code == 200 and tiny_t.json()["output_ids"] == want
    assert tiny_p.status_code == 200 and tiny_p.json()["output_ids"] == want
    assert m['eyas:requests_total{outcome="error"}'] == 3
    # one log line per request, with its true outcome
    by_id = {}
    for line in request_log:
        by_id.setdefault(line["request_id"], []).append(line)
    assert all(len(lines) == 1 for lines in by_id.values()), by_id
    for i in range(len(BYSTANDERS)):
        line = by_id[f"bystander-{i}"][0]
        assert line["outcome"] == "ok" and line["completion_tokens"] == LONG
    line = by_id["nan-stream"][0]
    assert line["status"] == 200 and line["outcome"] == "error" and "not finite" in line["error"]
    assert line["completion_tokens"] == len(ids)
    assert by_id["nan-plain"][0]["status"] == 500 and by_id["nan-plain"][0]["outcome"] == "error"
    assert by_id["raise-plain"][0]["outcome"] == "error"
    assert by_id["tiny-temperature"][0]["outcome"] == "ok"


def test_a_stream_whose_client_leaves_writes_its_log_line(inprocess, request_log):
    body = {"prompt": [5, 6], "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}
    with inprocess(step_delay=0.02) as srv:
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, headers={"X-Request-Id": "leaver"},
                          timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
        end = time.time() + 10
        while not any(line["request_id"] == "leaver" for line in request_log) and time.time() < end:
            time.sleep(0.05)
        time.sleep(0.3)  # and no second line after it
    lines = [line for line in request_log if line["request_id"] == "leaver"]
    assert len(lines) == 1, request_log
    assert lines[0]["outcome"] == "abort" and lines[0]["status"] == 200 and lines[0]["completion_tokens"] >= 1


def test_stop_strings_up_to_the_flag_and_messages_that_name_it(inprocess):
    from eyas.serve.limits import Limits

    stops = [f"zz{i}" for i in range(20)]
    body = {"prompt": "a", "max_tokens": 2, "temperature": 0}
    with inprocess(limits=Limits(max_stop_strings=32, max_n=20)) as srv:
        assert httpx.post(srv.url + "/v1/completions", json={**body, "stop": stops}, timeout=60).status_code == 200
        r = httpx.post(srv.url + "/v1/completions", json={**body, "n": 17}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 17
    with inprocess() as srv:
        r = httpx.post(srv.url + "/v1/completions", json={**body, "stop": stops[:17]}, timeout=60)
        assert r.status_code == 400 and "--max-stop-strings" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", json={**body, "n": 17}, timeout=60)
        assert r.status_code == 400 and "--max-n" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "n"
        r = httpx.post(srv.url + "/generate", json={"text": "a", "sampling_params": {"n": 17}}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.n"


def test_a_request_larger_than_the_capacity_is_a_400_not_a_retry(inprocess):
    with inprocess(max_running_requests=2, max_queued_requests=3) as srv:
        body = {"max_tokens": 2, "temperature": 0}
        for extra in ({"prompt": [[5, 6]] * 6}, {"prompt": [[5, 6]] * 2, "n": 3}):
            r = httpx.post(srv.url + "/v1/completions", json={**body, **extra}, timeout=60)
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            assert "--max-running-requests" in message and "--max-queued-requests" in message and "6" in message
            assert "Retry-After" not in r.headers
        r = httpx.post(srv.url + "/v1/completions", json={**body, "prompt": [[5, 6]] * 5}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 5  # the whole capacity fits


LONG_BODY = {"prompt": "long", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}


def _wait(predicate, timeout: float = 10) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_cancelled_queued_requests_free_their_queue_slot_at_once(inprocess):
    from eyas.serve.limits import Limits

    with inprocess(step_delay=0.05, max_running_requests=1, max_queued_requests=1,
                   limits=Limits(max_concurrent_streams=1)) as srv:
        sched = srv.app.state.eyas.scheduler
        with httpx.Client(timeout=60) as a, a.stream("POST", srv.url + "/v1/completions",
                                                     json={**LONG_BODY, "stream": True}) as running:
            lines = running.iter_lines()
            next(lines)
            assert sched.counts() == (1, 0)
            # queued, then refused by --max-concurrent-streams: its queue slot comes back with the 429
            r = httpx.post(srv.url + "/v1/completions", json={**LONG_BODY, "stream": True}, timeout=30)
            assert r.status_code == 429
            assert sched.counts() == (1, 0)
            # queued, then its client hangs up: the slot comes back now, not when it would have been admitted
            with pytest.raises(httpx.TimeoutException):
                httpx.post(srv.url + "/v1/completions", json=LONG_BODY, timeout=0.5)
            assert _wait(lambda: sched.counts() == (1, 0)), sched.counts()
            # so the next request is queued, not refused with a false 503
            results: list = []
            queued = threading.Thread(target=lambda: results.append(
                httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)))
            queued.start()
            assert _wait(lambda: sched.counts() == (1, 1) or bool(results)), sched.counts()
            assert not results or results[0].status_code != 503
        queued.join(60)  # the long stream closed: the queued request runs
        assert results[0].status_code == 200
        assert _wait(lambda: sched.counts() == (0, 0)) and sched._inflight == 0
