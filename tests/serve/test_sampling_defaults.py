"""Sampling defaults: a request's left-out fields take the model's generation_config.json, as vLLM serves."""

from __future__ import annotations

import json

import httpx
import pytest

from eyas.errors import EyasError
from eyas.serve.sampling_defaults import OPENAI, SamplingDefaults, sampling_defaults


def folder(tmp_path, config: dict):
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_models_recommendation_is_read_as_vllm_reads_it(tmp_path):
    # Qwen2.5-Instruct's file, with fields that are not sampling defaults beside them
    path = folder(tmp_path, {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                             "repetition_penalty": 1.05, "max_new_tokens": 512, "max_length": 32768,
                             "num_beams": 1, "bos_token_id": 151643})
    d = sampling_defaults("auto", path)
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty, d.max_tokens, d.min_p) == (0.7, 0.8, 20, 1.05,
                                                                                              512, 0.0)
    assert "generation_config.json" in d.describe() and "temperature 0.7" in d.describe()
    assert sampling_defaults("model", path) == d  # SGLang's spelling
    for openai in ("vllm", "openai", "none"):  # OpenAI's defaults, whatever the model says
        assert sampling_defaults(openai, path).changed() == {}
    assert sampling_defaults(path, None).changed() == d.changed()  # a folder named
    assert sampling_defaults("auto", folder(tmp_path, {"top_k": -1, "bos_token_id": 1})).top_k == 0  # -1: off


def test_models_without_a_generation_config_keep_openais_defaults(tmp_path):
    for target in ("smollm2-135m-instruct", str(tmp_path), str(tmp_path / "model.gguf"), "org/not-cached", None):
        d = sampling_defaults("auto", target)
        assert d.changed() == {} and d.temperature == 1.0 and d.top_p == 1.0
    assert "OpenAI's" in sampling_defaults("auto", str(tmp_path)).describe()


def test_the_override_sets_fields_over_either(tmp_path):
    path = folder(tmp_path, {"temperature": 0.7, "top_p": 0.8})
    d = sampling_defaults("auto", path, '{"temperature": 0.2, "max_new_tokens": 64}')
    assert (d.temperature, d.top_p, d.max_tokens) == (0.2, 0.8, 64)
    assert sampling_defaults("vllm", path, '{"min_p": 0.05}').changed() == {"min_p": 0.05}


@pytest.mark.parametrize("override, words", [
    ('{"temperature": 5}', ["temperature", "[0, 2]"]),
    ('{"top_p": 0}', ["top_p", "(0, 1]"]),
    ('{"top_k": 2.5}', ["top_k"]),
    ('{"max_new_tokens": 0}', ["max_tokens", "at least 1"]),
    ('{"temperature": true}', ["temperature"]),
    ('{"seed": 1}', ["seed", "not sampling defaults"]),
    ("[0.5]", ["JSON object"]),
    ("temperature=0.5", ["not JSON"]),
])
def test_an_override_that_cannot_be_used_is_refused_naming_the_fix(override, words):
    with pytest.raises(EyasError) as e:
        sampling_defaults("vllm", None, override)
    assert all(w in e.value.problem for w in words) and "--override-generation-config" in str(e.value)


def test_a_models_file_out_of_range_is_refused_at_startup_naming_the_way_out(tmp_path):
    with pytest.raises(EyasError) as e:
        sampling_defaults("auto", folder(tmp_path, {"temperature": -1}))
    assert "generation_config.json" in e.value.problem and "--generation-config vllm" in e.value.fix
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(EyasError, match="JSON"):
        sampling_defaults("auto", str(tmp_path))


def completion(srv, **body) -> dict:
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hello there", "ignore_eos": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_request_leaving_fields_out_samples_with_the_served_defaults(inprocess):
    greedy_by_default = SamplingDefaults(temperature=0.0, max_tokens=5, source="a test")
    with inprocess(sampling=greedy_by_default) as srv:
        implicit = completion(srv, seed=3)  # no temperature, no max_tokens: the defaults' greedy, 5 tokens
        assert implicit["usage"]["completion_tokens"] == 5
        assert implicit["choices"][0]["text"] == completion(srv, temperature=0, max_tokens=5)["choices"][0]["text"]
        sampled = completion(srv, temperature=1.0, seed=3, max_tokens=12)["choices"][0]["text"]  # its own field wins
        assert sampled != completion(srv, max_tokens=12)["choices"][0]["text"]
        chat = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "ignore_eos": True}, timeout=60).json()
        assert chat["usage"]["completion_tokens"] == 5  # the default max_tokens, where chat would fill the context
        info = httpx.get(srv.url + "/get_server_info").json()["default_sampling_params"]
        assert info["temperature"] == 0.0 and info["max_tokens"] == 5 and info["source"] == "a test"
    with inprocess() as srv:  # OpenAI's: temperature 1 where the request says nothing, 16 tokens on /v1/completions
        left_out = completion(srv, seed=3)
        assert left_out["usage"]["completion_tokens"] == 16
        assert left_out["choices"][0]["text"] == completion(srv, seed=3, temperature=1.0, max_tokens=16)[
            "choices"][0]["text"]
        assert httpx.get(srv.url + "/get_server_info").json()["default_sampling_params"]["temperature"] == 1.0
    assert OPENAI.changed() == {}
