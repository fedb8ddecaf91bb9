"""vLLM's ``/tokenize`` and ``/detokenize`` over real HTTP: a prompt's ids are the tokenizer's, a chat's count
is the ``usage.prompt_tokens`` the same messages get on ``/v1/chat/completions``, ids come back as the text,
and every malformed request is a JSON 4xx naming its field."""

from __future__ import annotations

import httpx
import pytest


def post(server, path: str, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_a_prompt_is_tokenized_as_the_tokenizer_does(server, engine):
    tok = engine.target.tokenizer
    text = "Speculative decoding, token by token."
    r = post(server, "/tokenize", {"model": "tiny", "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok(text).input_ids and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == engine.max_context
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])
    plain = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == tok(text, add_special_tokens=False).input_ids and "token_strs" not in plain


def test_a_chats_count_is_what_chat_completions_reports(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]
    counted = post(server, "/tokenize", {"messages": messages}).json()
    chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0}).json()
    assert counted["count"] == chat["usage"]["prompt_tokens"] == len(counted["tokens"])
    continued = post(server, "/tokenize", {"messages": messages + [{"role": "assistant", "content": "Red,"}],
                                           "continue_final_message": True}).json()
    assert continued["count"] > counted["count"]


def test_ids_come_back_as_their_text(server, engine):
    ids = engine.target.tokenizer("round trip of a sentence", add_special_tokens=False).input_ids
    r = post(server, "/detokenize", {"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": "round trip of a sentence"}


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/tokenize", {}, 400, "messages"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, 400, "add_generation_prompt"),
    ("/tokenize", {"prompt": 7}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4o"}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens.1"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "extra": 1}, 400, "extra"),
])
def test_bad_requests_get_a_json_4xx_naming_the_field(server, path, body, status, param):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error
    assert post(server, "/detokenize", {"tokens": [1, 2]}).status_code == 200  # the server goes on


def test_a_key_guards_them_like_the_other_routes(inprocess):
    with inprocess(api_key="k") as srv:
        assert httpx.post(srv.url + "/tokenize", json={"prompt": "a"}).status_code == 401
        ok = httpx.post(srv.url + "/tokenize", json={"prompt": "a"}, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.json()["count"] >= 1
