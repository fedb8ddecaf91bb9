"""Penalties, logit_bias and min_p over HTTP reach the engine: a speculative server's greedy output with
penalties is plain decoding's with the same settings, on the OpenAI routes and on /generate."""

from __future__ import annotations

import httpx
import pytest

from eyas.config import Algorithm, SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.sampling import SamplingParams

PENALTIES = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def plain(engine):
    """ids -> plain decoding's greedy output with PENALTIES (and a bias) for 16 tokens."""
    none = Engine(engine.target, None, SpecConfig(Algorithm.NONE))
    return lambda ids, bias=None: none.generate([ids], SamplingParams(
        max_new_tokens=16, ignore_eos=True, logit_bias=bias or {}, **PENALTIES))[0].output_ids


def test_generate_with_penalties_is_plain_decodings_output(server, engine, plain):
    ids = engine.target.tokenizer("aaaa aaaa").input_ids
    r = httpx.post(server.url + "/generate", timeout=60, json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ignore_eos": True, **PENALTIES}}).json()
    assert r["output_ids"] == plain(ids)
    unpenalised = httpx.post(server.url + "/generate", timeout=60, json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}).json()
    assert unpenalised["output_ids"] != r["output_ids"]


def test_completions_take_logit_bias_and_penalties(server, engine, plain):
    tok = engine.target.tokenizer
    ids = tok("abab abab").input_ids
    banned = plain(ids)[0]
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logit_bias": {str(banned): -100},
        **PENALTIES})
    assert r.status_code == 200, r.text
    want = plain(ids, {banned: -100.0})
    assert banned not in want and r.json()["choices"][0]["text"] == tok.decode(want)
    forced = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": 5, "temperature": 1.0, "logit_bias": {"120": 100}, "ignore_eos": True}).json()
    assert forced["choices"][0]["text"] == tok.decode([120] * 5)  # +100 outweighs every other logit here


@pytest.mark.parametrize("body, param", [({"presence_penalty": 2.5}, "presence_penalty"),
                                         ({"frequency_penalty": -2.1}, "frequency_penalty"),
                                         ({"repetition_penalty": 0.0}, "repetition_penalty"),
                                         ({"logit_bias": {"5": 100.5}}, "logit_bias"),
                                         ({"logit_bias": {"x": 1}}, "logit_bias"),
                                         ({"logit_bias": {"99999999": 1}}, "logit_bias"),
                                         ({"min_p": 1.5}, "min_p"),
                                         ({"top_p": 0}, "top_p")])
def test_out_of_range_settings_are_refused_by_name(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert r.status_code == 400 and param in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == param, r.text  # clients read error.param (the openai SDK's e.param)


def test_generate_names_the_sampling_params_field(server):
    r = httpx.post(server.url + "/generate", timeout=60,
                   json={"text": "hi", "sampling_params": {"max_new_tokens": 2, "top_p": 0}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.top_p", r.text


def test_min_tokens_holds_back_stop_tokens_and_strings_exactly_as_plain_decoding(server, engine):
    tok = engine.target.tokenizer
    ids = tok("abab abab").input_ids
    none = Engine(engine.target, None, SpecConfig(Algorithm.NONE))
    free = none.generate([ids], SamplingParams(max_new_tokens=16, ignore_eos=True))[0].output_ids
    k = next(i for i in range(8) if free[i] not in free[:i])
    stop = free[k]  # the token a stop_token_ids request ends on, k + 1 tokens in
    for route, body in (("/v1/completions", {"prompt": ids, "max_tokens": 16, "min_tokens": k + 4}),
                        ("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 16,
                                                                             "min_new_tokens": k + 4}})):
        settings = body.get("sampling_params", body)
        settings.update(temperature=0, ignore_eos=True, stop_token_ids=[stop])
        r = httpx.post(server.url + route, timeout=60, json=body)
        assert r.status_code == 200, r.text
        got = r.json()["output_ids"] if route == "/generate" else tok(r.json()["choices"][0]["text"]).input_ids
        want = none.generate([ids], SamplingParams(max_new_tokens=16, ignore_eos=True, stop_token_ids=[stop],
                                                   min_tokens=k + 4))[0].output_ids
        assert want[:k] == free[:k] and want[k] != stop and stop not in want[:k + 4]  # held back, not before
        assert got[:len(want)] == want if route == "/generate" else r.json()["usage"]["completion_tokens"] == len(want)
    early = tok.decode(free[:k + 1])[-2:]  # a stop string the output reaches within k + 1 tokens
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": 16, "min_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [early]})
    assert r.json()["usage"]["completion_tokens"] >= 12, r.text  # a match before 12 tokens ends nothing


@pytest.mark.parametrize("body", [{"min_tokens": 9, "max_tokens": 4}, {"min_tokens": -1, "max_tokens": 4},
                                  {"min_tokens": 2, "max_tokens": 4, "response_format": {"type": "json_object"}}])
def test_min_tokens_out_of_range_or_beside_a_grammar_is_refused(server, body):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text


def test_generate_names_min_new_tokens_in_its_refusal(server):
    r = httpx.post(server.url + "/generate", timeout=60,
                   json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 9}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.min_new_tokens", r.text
