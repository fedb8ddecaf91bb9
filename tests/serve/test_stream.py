"""The engine thread -> event loop hand-over (``stream.py``): one wake-up per turn, text made on the loop,
stop strings exact and ending rows promptly, one request's failure its own, streams under load lossless."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from helpers import byte_tokenizer
from serve_helpers import InProcessServer

from eyas.engine.batch import Sequence
from eyas.engine.stats import SpecStats
from eyas.sample.sampling import SamplingParams
from eyas.serve.metrics import ServeMetrics
from eyas.serve.scheduler import Work
from eyas.serve.stream import Delta, Ended, Failed, Finished, Outbox, Receiver

TOK = byte_tokenizer()


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False).input_ids


class CountingLoop:
    """An event loop whose thread-safe wake-ups are counted."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.wakeups = 0

    def call_soon_threadsafe(self, fn, *args):
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(fn, *args)

    def run_pending(self):
        self.loop.run_until_complete(asyncio.sleep(0))


def works(box: Outbox, n: int, stop: list[str] | None = None) -> list[Work]:
    return [Work(Sequence([1, 2], SamplingParams()), Receiver(box, asyncio.Queue(), i, stop or [], True))
            for i in range(n)]


def events(w: Work) -> list:
    out = []
    while not w.receiver.queue.empty():
        out.append(w.receiver.queue.get_nowait()[1])
    return out


def test_one_wakeup_for_many_rows_and_turns_and_text_made_on_the_loop():
    cl = CountingLoop()
    metrics = ServeMetrics(0, 0, speculative=False)
    box = Outbox(cl, TOK, metrics)
    ws = works(box, 16)
    text = "héllo wörld"  # multi-byte characters split across turns

    def engine_thread():
        for turn in range(0, len(ids(text)), 3):
            box.post([(w, ids(text)[turn:turn + 3]) for w in ws])  # one post per turn, as the scheduler does

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert cl.wakeups == 1  # 16 rows x 5 turns, the loop busy elsewhere: one wake-up, one drain
    cl.run_pending()
    for w in ws:
        got = events(w)
        assert all(isinstance(e, Delta) for e in got)
        assert "".join(e.text for e in got) == text
        assert [t for e in got for t in e.token_ids] == ids(text)
    assert metrics.generation_tokens._value.get() == 16 * len(ids(text))
    box.post([(ws[0], ids("!"))])
    assert cl.wakeups == 2  # drained: the next post wakes the loop again
    cl.run_pending()
    assert [e.text for e in events(ws[0])] == ["!"]
    cl.loop.close()


def test_stop_string_found_on_the_loop_stops_the_row_and_keeps_the_output_exact():
    cl = CountingLoop()
    box = Outbox(cl, TOK, ServeMetrics(0, 0, speculative=False))
    (w,) = works(box, 1, stop=["STOP"])
    box.post([(w, ids("abc ST")), (w, ids("OP and more")), (w, ids("even more"))])
    box.post([(w, Ended("length", SpecStats()))])  # the engine had run on and hit max_tokens in the same turn
    cl.run_pending()
    assert w.stopped  # what the engine thread reads before its next step
    got = events(w)
    assert "".join(e.text for e in got if isinstance(e, Delta)) == "abc "
    fin = got[-1]
    assert isinstance(fin, Finished) and fin.reason == "stop" and fin.matched == "STOP"
    assert fin.output_ids == ids("abc STOP") and fin.text == "abc "  # kept up to the token that completed it
    cl.loop.close()


def test_a_request_whose_text_fails_fails_alone():
    class Fragile:
        def decode(self, ids, **kw):
            if 7 in ids:
                raise ValueError("undecodable")
            return TOK.decode(ids, **kw)

    cl = CountingLoop()
    metrics = ServeMetrics(0, 0, speculative=False)
    box = Outbox(cl, Fragile(), metrics)
    good, bad = works(box, 2)
    box.post([(bad, [7]), (good, ids("fine")), (bad, ids("more")), (bad, Ended("length", SpecStats())),
              (good, Ended("length", SpecStats()))])
    cl.run_pending()
    assert bad.cancelled  # the engine drops the row before its next step
    got = events(bad)
    assert len(got) == 1 and isinstance(got[0], Failed) and "undecodable" in got[0].message
    got = events(good)
    assert got[0].text == "fine" and isinstance(got[-1], Finished) and got[-1].text == "fine"
    assert metrics.requests.labels(outcome="error")._value.get() == 1
    cl.loop.close()


def _stream_completion(url: str, body: dict) -> tuple[str, dict]:
    text, last = "", {}
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                text += "".join(c["text"] for c in event["choices"])
                last = event
    return text, last


def test_a_stop_string_ends_the_row_in_the_engine_within_a_step_or_two(server, engine, reference):
    tok = engine.target.tokenizer
    want = tok.decode(reference([tok("stop here").input_ids], 40, ignore_eos=True)[0], skip_special_tokens=True)
    stop = want[6:9]
    text, last = _stream_completion(server.url, {"prompt": "stop here", "max_tokens": 400, "temperature": 0,
                                                 "ignore_eos": True, "stop": [stop]})
    assert text == want[: want.index(stop)]
    meta = last["meta_info"]
    assert last["choices"][0]["finish_reason"] == "stop"
    # the row ran only the steps its kept tokens took, plus at most the steps already under way when the
    # loop found the stop string; running on to max_tokens would take 400 / 6 steps at the very least
    assert meta["spec_verify_ct"] <= meta["completion_tokens"] + 2


@pytest.fixture(scope="module")
def fp32_server(models):
    from eyas.pipeline import EngineArgs, build_engine
    from eyas.serve.app import ServeOptions, create_app

    tiny, draft = models
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float32",
                                     speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6))
    with InProcessServer(create_app(engine, ServeOptions(served_model_name="tiny", log_interval=0))) as s:
        yield s


def test_greedy_streams_of_16_concurrent_clients_equal_those_served_one_at_a_time(fp32_server):
    requests = []
    for i in range(16):
        content = f"client {i}: " + "xyz"[: i % 3] * i
        requests.append({"model": "tiny", "messages": [{"role": "user", "content": content}],
                         "max_tokens": 8 + (5 * i) % 21, "temperature": 0, "stream": True, "ignore_eos": True})

    async def one(client, body) -> tuple[str, str]:
        text, reason = "", None
        async with client.stream("POST", fp32_server.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text += c["delta"].get("content", "")
                        reason = c["finish_reason"] or reason
        return text, reason

    async def run(concurrent: bool):
        async with httpx.AsyncClient(timeout=300) as client:
            if concurrent:
                return await asyncio.gather(*(one(client, b) for b in requests))
            return [await one(client, b) for b in requests]

    for i, (text, _) in enumerate(asyncio.run(run(False))):
        if i % 4 == 3 and len(text) > 4:  # a stop string from the middle of its own answer
            requests[i]["stop"] = [text[len(text) // 2: len(text) // 2 + 2]]
    alone = asyncio.run(run(False))
    together = asyncio.run(run(True))
    assert together == alone
    assert sum(reason == "stop" for _, reason in alone) >= 3 and sum(len(text) for text, _ in alone) > 100


def test_the_stop_string_stays_with_include_stop_str_in_output(server, engine, reference):
    tok = engine.target.tokenizer
    want = tok.decode(reference([tok("stop here").input_ids], 40, ignore_eos=True)[0], skip_special_tokens=True)
    stop = want[6:9]
    body = {"prompt": "stop here", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    text, last = _stream_completion(server.url, {**body, "include_stop_str_in_output": True})
    assert text == want[: want.index(stop) + len(stop)]
    assert last["choices"][0]["stop_reason"] == stop
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    assert r["choices"][0]["text"] == want[: want.index(stop)] and r["choices"][0]["stop_reason"] == stop
    r = httpx.post(server.url + "/generate", timeout=120, json={
        "text": "stop here", "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True,
                                                 "stop": [stop], "no_stop_trim": True}}).json()
    assert r["text"] == want[: want.index(stop) + len(stop)] and r["meta_info"]["finish_reason"]["matched"] == stop


def test_a_stop_token_ends_the_output_counted_but_unwritten_unless_asked(server, engine, reference):
    """vLLM's rule for ``stop_token_ids`` (and EOS): the token that ended the output is in ``completion_tokens``,
    not in the text; ``stop_reason`` names it; ``include_stop_str_in_output`` writes it."""
    tok = engine.target.tokenizer
    out = reference([tok("stop here").input_ids], 40, ignore_eos=True)[0]
    k = next(i for i in range(4, len(out)) if tok.decode(out[i:i + 1]) and out[i] not in out[:i])
    body = {"prompt": "stop here", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stop_token_ids": [out[k]]}
    for keep in (False, True):
        r = httpx.post(server.url + "/v1/completions", json={**body, "include_stop_str_in_output": keep},
                       timeout=120).json()
        choice = r["choices"][0]
        assert choice["text"] == tok.decode(out[:k + 1] if keep else out[:k], skip_special_tokens=True)
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == out[k]
        assert r["usage"]["completion_tokens"] == k + 1
    r = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 3, "stop_token_ids": []},
                   timeout=120).json()
    assert r["choices"][0]["finish_reason"] == "length" and r["choices"][0]["stop_reason"] is None


def test_each_event_is_one_line_whichever_way_a_client_splits_lines(server):
    """A token that decodes to U+2028, U+2029 or U+0085 (JSON leaves them raw) is escaped in the event, so a client
    reading lines with str.splitlines' rules (httpx's iter_lines) still gets each event whole."""
    text = "a\u2028b\u2029c\x85d"
    body = {"model": "tiny", "prompt": "x", "max_tokens": 32, "temperature": 0, "stream": True,
            "guided_choice": [text]}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln.strip()]
    assert all(ln.startswith("data: ") for ln in lines), lines
    events = [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]
    assert "".join(c["text"] for e in events for c in e["choices"]) == text
