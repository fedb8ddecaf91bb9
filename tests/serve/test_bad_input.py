"""Every bad input gets a 4xx with an OpenAI-style JSON error, and the next request succeeds."""

from __future__ import annotations

import json

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
LONG = "x" * 1100  # the tiny target's context is 1024 tokens, one byte = one token

CASES = [
    # (id, path, body (bytes are sent raw), status, words the message must contain)
    ("malformed json", CHAT, b'{"messages": [', 400, "not valid JSON"),
    ("not an object", CHAT, b"[1, 2]", 400, "JSON object"),
    ("invalid utf-8", COMP, b'{"prompt": "\xff\xfe", "max_tokens": 2}', 400, "UTF-8"),
    ("wrong type max_tokens", COMP, {"prompt": "a", "max_tokens": "ten"}, 400, "max_tokens"),
    ("bool is not a number", COMP, {"prompt": "a", "temperature": True}, 400, "temperature"),
    ("wrong type prompt", COMP, {"prompt": {"text": "a"}}, 400, "prompt"),
    ("missing prompt", COMP, {"max_tokens": 2}, 400, "'prompt' is required"),
    ("unknown field", COMP, {"prompt": "a", "max_token": 2}, 400, "max_token"),
    ("negative max_tokens", COMP, {"prompt": "a", "max_tokens": -5}, 400, "at least 1"),
    ("zero max_tokens", CHAT, {"messages": MSG, "max_tokens": 0}, 400, "at least 1"),
    ("absurd max_tokens", COMP, {"prompt": "a", "max_tokens": 10 ** 12}, 400, "maximum context length"),
    ("temperature too high", COMP, {"prompt": "a", "temperature": 1000.0}, 400, "temperature"),
    ("temperature negative", CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature"),
    ("top_p out of range", COMP, {"prompt": "a", "top_p": 1.5}, 400, "top_p"),
    ("prompt longer than context", COMP, {"prompt": LONG, "max_tokens": 1}, 400, "context"),
    ("chat longer than context", CHAT, {"messages": [{"role": "user", "content": LONG}]}, 400, "context"),
    ("unknown model", CHAT, {"model": "gpt-9", "messages": MSG}, 404, "gpt-9"),
    ("empty messages", CHAT, {"messages": []}, 400, "'messages' is empty"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("image part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "content"),
    ("empty prompt", COMP, {"prompt": ""}, 400, "empty"),
    ("token id out of range", COMP, {"prompt": [1, 2, 99999]}, 400, "token ids"),
    ("too many top_logprobs", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs must be in [0, 20]"),
    ("zero max_tokens without echo", COMP, {"prompt": "a", "max_tokens": 0}, 400, "echo"),
    ("penalty out of range", COMP, {"prompt": "a", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("n too large", COMP, {"prompt": "a", "n": 1000}, 400, "n must be"),
    ("empty stop string", COMP, {"prompt": "a", "stop": [""]}, 400, "stop"),
    ("stream_options without stream", CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("generate text and input_ids", "/generate", {"text": "a", "input_ids": [1]}, 400, "exactly one"),
    ("generate unknown sampling param", "/generate", {"text": "a", "sampling_params": {"max_new_token": 3}}, 400,
     "max_new_token"),
    ("generate negative max_new_tokens", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400,
     "max_new_tokens"),
    ("unknown route", "/v1/nothing", {}, 404, "no route"),
    ("a stored response's route", "/v1/responses/resp_0123/cancel", {}, 404, "not stored"),
]


@pytest.mark.parametrize("path,body,status,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_4xx_then_server_still_works(server, path, body, status, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"], err
    assert err["type"] in ("invalid_request_error", "not_found_error")
    ok = httpx.post(server.url + COMP, json={"prompt": "ok", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_openai_client_raises_its_own_error_types(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="a", temperature=500)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=MSG)


@pytest.mark.parametrize("path, body, param", [
    (CHAT, {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    (COMP, {"prompt": LONG, "max_tokens": 1}, "prompt"),
    ("/generate", {"text": LONG, "sampling_params": {"max_new_tokens": 1}}, "text"),
    ("/generate", {"input_ids": [1, 99999]}, "input_ids"),
])
def test_a_prompt_that_cannot_be_served_names_the_field_that_held_it(server, path, body, param):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("path, body, param", [
    (CHAT, {"messages": MSG, "stop_token_ids": [-5]}, "stop_token_ids"),
    (COMP, {"prompt": "a", "stop_token_ids": [2, 10 ** 9]}, "stop_token_ids"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [10 ** 9]}}, "sampling_params.stop_token_ids"),
])
def test_a_stop_token_id_outside_the_vocabulary_is_refused(server, path, body, param):
    r = httpx.post(server.url + path, json=body, timeout=60)  # it could never match: the output would run on
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "vocabulary" in r.json()["error"]["message"]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user"}], "messages.0.content"),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": None}], "messages.1.content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], "messages.1.content"),
])
def test_a_message_without_content_is_named_not_blamed_on_the_template(server, messages, param):
    r = httpx.post(server.url + CHAT, json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "content' is required" in r.json()["error"]["message"]
