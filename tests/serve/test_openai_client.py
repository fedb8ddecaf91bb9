"""The official openai client against a real server: completions, streamed chat, greedy == target."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_greedy_equals_target(client, engine, reference):
    tok = engine.target.tokenizer
    prompt = "The quick brown fox"
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
    want = reference([tok(prompt).input_ids], 24)[0]
    choice = out.choices[0]
    assert choice.text == tok.decode(want, skip_special_tokens=True)
    assert out.usage.completion_tokens == len(want)
    assert choice.finish_reason == ("stop" if len(want) < 24 else "length")
    u = out.usage.model_dump()
    assert u["spec_verify_ct"] >= 1
    assert u["spec_accept_length"] == 1 + u["spec_accept_token_num"] / u["spec_verify_ct"]
    assert u["spec_accept_rate"] == u["spec_accept_token_num"] / u["spec_draft_token_num"]
    assert u["spec_draft_token_num"] == 5 * u["spec_verify_ct"]  # num_draft_tokens 6 counts the root
    assert sum(u["spec_accepted_per_position"]) == u["spec_accept_token_num"]


def test_streamed_chat_greedy_equals_target(client, engine, reference):
    from eyas.common.prompts import chat_ids

    tok = engine.target.tokenizer
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=40, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want = reference([chat_ids(tok, "Tell me a story.")], 40)[0]
    assert text == tok.decode(want, skip_special_tokens=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == len(want)
    assert usage.model_dump()["spec_verify_ct"] >= 1


def test_chat_non_streaming_and_n(client, engine, reference):
    from eyas.common.prompts import chat_ids

    tok = engine.target.tokenizer
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=12, temperature=0, n=2)
    want = tok.decode(reference([chat_ids(tok, "hi")], 12)[0], skip_special_tokens=True)
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.content == want for c in out.choices)
    assert out.choices[0].message.role == "assistant"


def test_sampling_with_seed_is_reproducible(client):
    kw = {"model": "tiny", "prompt": "abc", "max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_stop_string_cuts_the_text(server, engine, reference):
    tok = engine.target.tokenizer
    ids = tok("stop here").input_ids
    want = tok.decode(reference([ids], 30, ignore_eos=True)[0], skip_special_tokens=True)
    stop = want[5:8]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "stop here", "max_tokens": 30, "temperature": 0,
                                                          "ignore_eos": True, "stop": [stop]}, timeout=60).json()
    assert r["choices"][0]["text"] == want[: want.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_continuous_usage_counts_tokens_as_they_stream(server):
    lines = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "prompt": "count", "max_tokens": 10, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    bodies = [json.loads(x) for x in lines[:-1]]
    counts = [b["usage"]["completion_tokens"] for b in bodies]
    assert counts == sorted(counts) and counts[-1] == 10
    assert bodies[-1]["choices"] == [] and bodies[-1]["usage"]["spec_verify_ct"] >= 1
    # as vLLM: continuous usage only with include_usage; OpenAI's include_obfuscation accepted (nothing to pad)
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "prompt": "count", "max_tokens": 3, "stream": True, "stream_options": {
                "include_usage": False, "continuous_usage_stats": True, "include_obfuscation": False}}) as r:
        assert r.status_code == 200
        bodies = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert bodies and not any(b.get("usage") for b in bodies)
    # chat: every chunk carries usage, the role chunk first with no completion tokens yet (as vLLM)
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "count"}], "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        bodies = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert bodies[0]["choices"][0]["delta"]["role"] == "assistant"
    assert bodies[0]["usage"]["completion_tokens"] == 0 and bodies[0]["usage"]["prompt_tokens"] > 0
    assert all("usage" in b for b in bodies) and bodies[-1]["usage"]["completion_tokens"] == 4


def test_service_tier_takes_openais_values(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ok = httpx.post(server.url + "/v1/chat/completions", json={**body, "service_tier": "flex"}, timeout=60)
    bad = httpx.post(server.url + "/v1/chat/completions", json={**body, "service_tier": "bogus"}, timeout=60)
    assert ok.status_code == 200 and bad.status_code == 400 and "service_tier" in bad.json()["error"]["message"]


def test_small_endpoints(server):
    assert httpx.get(server.url + "/health_generate", timeout=60).json() == {"status": "ok"}
    assert httpx.get(server.url + "/version").json()["version"]
    info = httpx.get(server.url + "/server_info").json()
    assert info["aux_layer_ids"] == [2, 4, 5] and info["fc_in"] == 192 and info["num_draft_tokens"] == 6
    assert len(info["chat_template_sha256_16"]) == 16 and info["warnings"] == []
