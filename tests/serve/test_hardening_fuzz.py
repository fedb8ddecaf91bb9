"""Fuzzing: schemathesis drives every operation of the OpenAPI schema FastAPI publishes.

Bounded (a few dozen examples per operation) so CI stays short. The checks: no 5xx, every
response conforms to the schema (status code documented, body of the documented shape), and the
server is still alive and correct afterwards. A second run aims at what schemathesis rarely writes:
extreme floats (subnormal, huge, NaN and Infinity as Python's JSON reads them), integers past 64
bits, deep nesting and lone UTF-16 surrogates, spliced into each field as raw JSON text.
"""

from __future__ import annotations

import json

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance


def _bounded(case) -> None:
    """Keep generations short: the fuzzer is after shapes and values, not long outputs."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(key), int) and case.body[key] > 16:
                case.body[key] = 16
        sp = case.body.get("sampling_params")
        if isinstance(sp, dict) and isinstance(sp.get("max_new_tokens"), int) and sp["max_new_tokens"] > 16:
            sp["max_new_tokens"] = 16


def test_no_5xx_and_responses_match_the_schema(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/generate"}
    failures = []
    for op in operations:
        _fuzz(op, failures)
    assert not failures, failures[:5]


def _fuzz(op, failures: list) -> None:
    """25 generated requests to one operation; a 5xx is recorded, any other answer checked against the schema."""
    @given(data=st.data())
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def fuzz(data):
        case = data.draw(op.as_strategy())
        _bounded(case)
        response = case.call(timeout=60)
        if response.status_code >= 500:
            failures.append((op.method, op.path, response.status_code, response.text[:300], case.body))
            return
        case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])

    fuzz()


# -- values at JSON's edges, sent as raw text (json.dumps cannot write some of them) -----------------
EXTREME_FLOATS = st.one_of(
    st.sampled_from(["5e-324", "4.9e-324", "1e-310", "2.2250738585072014e-308", "1e-45", "6e-39", "1e-400", "-0.0",
                     "1e-5", "9.99e-6", "1.7976931348623157e308", "1e308", "1e999", "-1e999", "NaN", "Infinity",
                     "-Infinity"]),
    st.floats().map(json.dumps),  # subnormals, huge, nan and inf as Python's json spells them
)
BIG_INTS = st.one_of(  # beyond 32 bits, so a max_tokens or n among them never asks for a long generation
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**100]),
    st.integers(2**31, 2**80), st.integers(-(2**80), -(2**31)),
).map(str)
DEEP = st.one_of(st.integers(1, 3000).map(lambda d: "[" * d + "]" * d),
                 st.integers(1, 200).map(lambda d: '{"a": ' * d + "1" + "}" * d))
LONE = st.integers(0xD800, 0xDFFF).map(chr)
SURROGATE_TEXT = st.tuples(st.text(max_size=4), LONE, st.text(max_size=4), st.lists(LONE, max_size=2)).map(
    lambda t: json.dumps(t[0] + t[1] + t[2] + "".join(t[3])))  # ensure_ascii writes "\\udXXX"

BASES = {  # path: (a valid body, numeric fields, string fields, any field)
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                             ["temperature", "top_p", "top_k", "seed", "n", "max_tokens", "max_completion_tokens",
                              "presence_penalty", "logit_bias.5"],
                             ["messages.0.content", "messages.0.role", "model", "user", "stop", "metadata.k"],
                             ["messages", "messages.0.content", "stop", "chat_template_kwargs.x", "metadata", "tools"]),
    "/v1/completions": ({"prompt": "hi", "max_tokens": 2},
                        ["temperature", "top_p", "top_k", "seed", "n", "max_tokens", "prompt.0", "stop_token_ids.0"],
                        ["prompt", "prompt.0", "stop.0", "model", "suffix"],
                        ["prompt", "stop", "stream_options", "logit_bias"]),
    "/generate": ({"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                  ["sampling_params.temperature", "sampling_params.top_p", "sampling_params.top_k",
                   "sampling_params.seed", "sampling_params.n", "sampling_params.max_new_tokens",
                   "sampling_params.min_p", "input_ids.0"],
                  ["text", "text.0", "rid", "rid.0", "sampling_params.stop", "model"],
                  ["text", "input_ids", "sampling_params", "sampling_params.stop", "rid"]),
}


def _splice(body: dict, dotted: str, raw: str) -> bytes:
    """``body`` as JSON text with the value at ``dotted`` (created as needed) replaced by ``raw``."""
    body = json.loads(json.dumps(body))
    *parents, last = [int(p) if p.isdigit() else p for p in dotted.split(".")]
    node = body
    for p, nxt in zip(parents, [*parents[1:], last]):
        if isinstance(node, list):
            while len(node) <= p:
                node.append([] if isinstance(nxt, int) else {})
        elif not isinstance(node.get(p), (dict, list)):
            node[p] = [] if isinstance(nxt, int) else {}
        node = node[p]
    if isinstance(node, list):
        while len(node) <= last:
            node.append(None)
    node[last] = "@@VALUE@@"
    return json.dumps(body).replace('"@@VALUE@@"', raw).encode()


@st.composite
def edge_requests(draw):
    path = draw(st.sampled_from(sorted(BASES)))
    base, numeric, strings, anywhere = BASES[path]
    kind = draw(st.sampled_from(["float", "int", "deep", "surrogate"]))
    field, value = {
        "float": lambda: (draw(st.sampled_from(numeric)), draw(EXTREME_FLOATS)),
        "int": lambda: (draw(st.sampled_from(numeric)), draw(BIG_INTS)),
        "deep": lambda: (draw(st.sampled_from(anywhere)), draw(DEEP)),
        "surrogate": lambda: (draw(st.sampled_from(strings)), draw(SURROGATE_TEXT)),
    }[kind]()
    stream = draw(st.booleans())
    return path, _splice({**base, "stream": stream}, field, value), stream


def test_edge_values_never_get_a_5xx(server):
    """Extreme floats, big integers, deep nesting and lone surrogates in every field that takes them:
    a 4xx, or a correct answer (a stream ends with [DONE] and no error event); never a 5xx."""
    from serve_helpers import scrape

    errors_before = scrape(server.url).get('eyas:requests_total{outcome="error"}', 0)
    failures = []

    @given(edge_requests())
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def fuzz(request):
        path, body, stream = request
        r = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
        text = r.text
        if r.status_code >= 500:
            failures.append((path, r.status_code, text[:300], body[:300]))
        elif r.status_code >= 400:
            assert r.json()["error"]["message"], text[:300]
        elif stream and (not text.rstrip().endswith("data: [DONE]") or '"error"' in text):
            failures.append((path, "stream", text[-300:], body[:300]))

    fuzz()
    assert not failures, failures[:5]
    assert scrape(server.url).get('eyas:requests_total{outcome="error"}', 0) == errors_before


def test_server_alive_and_correct_after_fuzzing(server, reference):
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    ids = [5, 17, 99, 3, 42]
    r = httpx.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}, timeout=60)
    assert r.status_code == 200 and r.json()["output_ids"] == reference([ids], 12, ignore_eos=True)[0]
