"""vLLM's and SGLang's structured-output fields on the OpenAI routes, over real HTTP on loopback (in-process
app, the tiny float64 pair): ``structured_outputs``, the flat ``guided_*`` fields and SGLang's flat ``regex``,
``ebnf``, ``json_schema`` each constrain the output (streamed too); a choice is exactly one of its strings,
whatever characters they hold; two constraints, a bad regex, an empty choice list and a whitespace pattern
are 400s naming the field.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from serve_helpers import InProcessServer

from eyas.serve.app import ServeOptions, create_app

REGEX = "[0-9]{3}-[a-z]{2}"
EBNF = 'root ::= [0-9] [0-9] [0-9] "-" [a-z] [a-z]'  # the same language as REGEX
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "ok": {"type": "boolean"}},
          "required": ["city", "ok"], "additionalProperties": False}
TRICKY = ['say "hi"', "back\\slash\\", "a.*b[c]+(d)?|^$", "été 漢字 🙂", "tab\tnew\nline"]
ROUTES = ["/v1/completions", "/v1/chat/completions"]


@pytest.fixture(scope="module")
def served(engine):
    with InProcessServer(create_app(engine, ServeOptions(served_model_name="tiny", log_interval=0))) as s:
        yield s


def _ask(server, route: str, max_tokens: int = 24, **kw) -> httpx.Response:
    body = {"prompt": "hi"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(server.url + route, json={**body, "temperature": 0, "max_tokens": max_tokens, **kw},
                      timeout=120)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fields", [
    {"structured_outputs": {"regex": REGEX}}, {"guided_regex": REGEX}, {"regex": REGEX},
    {"structured_outputs": {"grammar": EBNF}}, {"guided_grammar": EBNF}, {"ebnf": EBNF},
], ids=["so.regex", "guided_regex", "regex", "so.grammar", "guided_grammar", "ebnf"])
def test_regex_and_grammar_spellings_constrain_the_output(served, route, fields):
    assert re.fullmatch(REGEX, _text(_ask(served, route, **fields)))


@pytest.mark.parametrize("fields", [
    {"structured_outputs": {"json": SCHEMA}}, {"structured_outputs": {"json": json.dumps(SCHEMA)}},
    {"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar"}, {"guided_json": json.dumps(SCHEMA)},
    {"json_schema": json.dumps(SCHEMA)},
], ids=["so.json", "so.json-string", "guided_json", "guided_json-string", "json_schema"])
def test_json_schema_spellings_give_valid_json(served, fields):
    for route in ROUTES:
        out = json.loads(_text(_ask(served, route, max_tokens=40, **fields)))
        assert set(out) == {"city", "ok"} and out["city"] in ("Paris", "Rome") and isinstance(out["ok"], bool)


def test_json_object_gives_an_object(served):
    # a bias toward "}" ends the random model's object at once
    r = _ask(served, "/v1/chat/completions", structured_outputs={"json_object": True}, logit_bias={"125": 40})
    assert json.loads(_text(r)) == {}


@pytest.mark.parametrize("field", ["guided_choice", "structured_outputs"])
def test_a_choice_is_exactly_one_of_its_strings(served, field):
    def ask(choices, route="/v1/completions", **kw):
        body = {"guided_choice": choices} if field == "guided_choice" else {"structured_outputs": {"choice": choices}}
        return _text(_ask(served, route, max_tokens=40, **body, **kw))

    for s in TRICKY:  # each string alone: quotes, backslashes, regex metacharacters, non-ASCII, control characters
        assert ask([s]) == s
    for route in ROUTES:
        for seed in range(3):
            assert ask(TRICKY, route, temperature=1.0, seed=seed) in TRICKY


def test_streamed_output_holds_its_constraint(served):
    with httpx.stream("POST", served.url + "/v1/completions", timeout=120, json={
            "prompt": "hi", "max_tokens": 24, "temperature": 0, "stream": True, "guided_regex": REGEX}) as r:
        lines = [x for x in r.iter_lines() if x.startswith("data: {")]
    assert re.fullmatch(REGEX, "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines))
    with httpx.stream("POST", served.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0, "stream": True,
            "structured_outputs": {"choice": TRICKY}}) as r:
        deltas = [json.loads(x[6:])["choices"] for x in r.iter_lines() if x.startswith("data: {")]
    assert "".join(c[0]["delta"].get("content") or "" for c in deltas if c) in TRICKY


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}]


@pytest.mark.parametrize("fields, first, second", [
    ({"response_format": {"type": "json_object"}, "guided_regex": REGEX}, "response_format", "guided_regex"),
    ({"regex": REGEX, "guided_choice": ["a"]}, "guided_choice", "regex"),
    ({"structured_outputs": {"json": SCHEMA, "regex": REGEX}}, "structured_outputs.json",
     "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["a"]}, "ebnf": EBNF}, "structured_outputs.choice", "ebnf"),
    ({"tools": TOOLS, "tool_choice": "required", "json_schema": json.dumps(SCHEMA)}, "tool_choice", "json_schema"),
])
def test_two_constraints_are_a_400_naming_both(served, fields, first, second):
    r = _ask(served, "/v1/chat/completions", **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == second and first in err["message"] and "send one" in err["message"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fields, param", [
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"structured_outputs": {"regex": "(x"}}, "structured_outputs.regex"),
    ({"regex": "[a-"}, "regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"guided_grammar": "root ::= nowhere"}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"structured_outputs": {"json": {"type": "objec"}}}, "structured_outputs.json"),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": r"[ \n]*"}, "guided_whitespace_pattern"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ?"}}, "structured_outputs.whitespace_pattern"),
])
def test_bad_constraints_are_400s_naming_the_field(served, route, fields, param):
    r = _ask(served, route, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
