"""/v1/responses: OpenAI's Responses API for text, through the openai SDK, equal to the chat route's output."""

from __future__ import annotations

import json
import time

import httpx
import pytest

openai = pytest.importorskip("openai")


def chat_text(srv, messages, **kw) -> str:
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": messages, "temperature": 0, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_a_response_is_the_chat_completion_of_the_same_conversation(inprocess):
    with inprocess() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = client.responses.create(model="tiny", input="hello there", instructions="be brief", max_output_tokens=6,
                                    temperature=0)
        want = chat_text(srv, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
                         max_tokens=6)
        assert r.output_text == want and r.object == "response" and r.id.startswith("resp_")
        assert r.usage.output_tokens <= 6 and r.usage.input_tokens > 0
        if r.usage.output_tokens == 6:  # cut by max_output_tokens (the tiny model may also end at EOS)
            assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        history = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hey",
                                                                         "annotations": []}]},
                   {"role": "user", "content": "again"}]
        r2 = client.responses.create(model="tiny", input=history, max_output_tokens=5, temperature=0)
        assert r2.output_text == chat_text(srv, [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "hey"},
                                                 {"role": "user", "content": "again"}], max_tokens=5)


def test_a_streamed_response_sends_the_events_in_order_and_the_same_text(inprocess):
    with inprocess() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        events = list(client.responses.create(model="tiny", input="stream me", max_output_tokens=8, temperature=0,
                                              stream=True))
        kinds = [e.type for e in events]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"]
        assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                                "response.output_item.done"]
        assert kinds[-1] in ("response.completed", "response.incomplete")
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == events[-1].response.output_text == chat_text(srv, [{"role": "user", "content": "stream me"}],
                                                                    max_tokens=8)


@pytest.mark.parametrize("field, value", [("tools", [{"type": "function", "name": "f", "parameters": {}}]),
                                          ("previous_response_id", "resp_1"), ("background", True),
                                          ("reasoning", {"effort": "low"}), ("truncation", "auto")])
def test_what_it_cannot_do_is_refused_by_name(inprocess, field, value):
    with inprocess() as srv:
        r = httpx.post(srv.url + "/v1/responses", json={"input": "x", field: value}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        for tokens in ("5", 0, 10**6):  # a type, a value, more than the context holds: each names the field
            bad = httpx.post(srv.url + "/v1/responses", json={"input": "x", "max_output_tokens": tokens}, timeout=60)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_output_tokens", bad.text
        assert httpx.post(srv.url + "/v1/responses", json={"input": []}, timeout=60).status_code == 400
        gone = httpx.get(srv.url + "/v1/responses/resp_1", timeout=60)  # store is false: nothing to retrieve
        assert gone.status_code == 404 and "not stored" in gone.json()["error"]["message"], gone.text


def test_structured_output_through_text_format(inprocess):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with inprocess() as srv:
        r = httpx.post(srv.url + "/v1/responses", json={
            "input": "json please", "temperature": 0, "max_output_tokens": 40,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}}}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        if body["status"] == "completed":
            assert isinstance(json.loads(body["output"][0]["content"][0]["text"])["a"], int)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/a.png"}]}]},
     "input"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}, "input"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     "messages.0.content"),
])
def test_an_image_or_other_non_text_input_is_refused_saying_text_only(inprocess, path, body, param):
    """What a client sends to a vision or tool-using model: a 400 that says what the field may hold and that this
    server takes text only, never that a list of messages "should be a valid string"."""
    with inprocess() as srv:
        r = httpx.post(srv.url + path, json={**body, "max_tokens" if "messages" in body else "max_output_tokens": 2},
                       timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "text only" in err["message"], err
        assert "should be a valid string" not in err["message"], err


def test_a_response_cancelled_at_shutdown_is_incomplete_not_completed(inprocess):
    """Cancelled under way (shutdown past its grace: the chat route's finish_reason "abort"), a response is
    "incomplete" with reason "abort", streamed or not: never "completed" with half a text."""
    import threading

    body = {"input": "tell me a long story", "max_output_tokens": 400, "temperature": 0}
    with inprocess(step_delay=0.05) as srv:
        scheduler = srv.app.state.eyas.scheduler
        long = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": body["input"]}], "max_tokens": 30, "temperature": 0})
        assert long.json()["choices"][0]["finish_reason"] == "length", long.text  # greedy: no early EOS
        plain: dict = {}
        waiter = threading.Thread(target=lambda: plain.update(
            httpx.post(srv.url + "/v1/responses", json=body, timeout=60).json()))
        waiter.start()
        kinds, last = [], None
        with httpx.stream("POST", srv.url + "/v1/responses", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                    if kinds[-1] == "response.output_text.delta" and kinds.count(kinds[-1]) == 2:
                        end = time.time() + 30
                        while scheduler.counts()[0] < 2 and time.time() < end:  # the other one runs too
                            time.sleep(0.01)
                        scheduler.abort_all()
                elif line.startswith("data: "):
                    last = json.loads(line[6:])
        waiter.join(60)
        assert kinds[-1] == "response.incomplete", kinds
        for response in (last["response"], plain):
            assert response["status"] == "incomplete", response
            assert response["incomplete_details"] == {"reason": "abort"}
            assert response["output"][0]["status"] == "incomplete"
