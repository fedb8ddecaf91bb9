"""vLLM's chat-template arguments: ``continue_final_message`` (assistant prefill) and ``add_generation_prompt``,
top-level or in ``chat_template_kwargs``; the arguments the server sets itself are a 400 naming the key."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
PREFILL = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the cat"}]


def _chat(server, **body):
    return httpx.post(server.url + CHAT, timeout=60, json={"max_tokens": 6, "temperature": 0, **body})


@pytest.mark.parametrize("fields", [{"continue_final_message": True},
                                    {"chat_template_kwargs": {"continue_final_message": True,
                                                              "add_generation_prompt": False}}])
def test_continue_final_message_continues_the_assistants_text(server, engine, fields):
    tok = engine.target.tokenizer
    text = tok.apply_chat_template(PREFILL, continue_final_message=True, add_generation_prompt=False, tokenize=False)
    ids = tok(text, add_special_tokens=False).input_ids
    r = _chat(server, messages=PREFILL, **fields)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    want = httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"prompt": ids, "max_tokens": 6, "temperature": 0}).json()["choices"][0]["text"]
    assert r.json()["choices"][0]["message"]["content"] == want


def test_add_generation_prompt_false_renders_without_the_turn(server, engine):
    tok = engine.target.tokenizer
    msgs = PREFILL[:1]
    r = _chat(server, messages=msgs, chat_template_kwargs={"add_generation_prompt": False})
    assert r.status_code == 200, r.text  # was a 400 blaming the messages: the flag was passed twice
    text = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert r.json()["usage"]["prompt_tokens"] == len(tok(text, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("body, param, words", [
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize", "set by the server"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages", "set by the server"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt", "one of them"),
    ({"chat_template_kwargs": {"continue_final_message": "yes"}}, "chat_template_kwargs.continue_final_message",
     "true or false"),
])
def test_template_arguments_the_server_owns_or_that_conflict_are_named(server, body, param, words):
    r = _chat(server, messages=PREFILL, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.text, r.text


def test_continue_final_message_needs_an_assistant_message_last(server):
    r = _chat(server, messages=PREFILL[:1], continue_final_message=True)
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
    assert "assistant" in r.json()["error"]["message"]
