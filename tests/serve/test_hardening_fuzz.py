"""Fuzzing: schemathesis drives every operation of the OpenAPI schema FastAPI publishes.

Bounded (a few dozen examples per operation) so CI stays short. The checks: no 5xx, every
response conforms to the schema (status code documented, body of the documented shape), and the
server is still alive and correct afterwards.
"""

from __future__ import annotations

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
    assert not failures, failures[:5]


def test_server_alive_and_correct_after_fuzzing(server):
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
