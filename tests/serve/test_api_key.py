"""--api-key: /v1/* and /generate need the bearer key; /health and /metrics stay open."""

from __future__ import annotations

import httpx
import pytest


def test_api_key_guards_the_api_but_not_health_or_metrics(inprocess):
    openai = pytest.importorskip("openai")
    with inprocess(api_key="sekrit") as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.post(srv.url + "/generate", json={"text": "a"},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 200
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit", max_retries=0)
        assert ok.completions.create(model="tiny", prompt="a", max_tokens=2, temperature=0).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_the_bearer_scheme_is_case_insensitive_and_the_key_is_not(inprocess):
    with inprocess(api_key="sekrit") as srv:
        def status(auth):
            return httpx.get(srv.url + "/v1/models", headers={"Authorization": auth}).status_code

        assert status("bearer sekrit") == 200 and status("BEARER sekrit") == 200  # RFC 9110: scheme case-insensitive
        assert status("Bearer SEKRIT") == 401 and status("sekrit") == 401 and status("Basic sekrit") == 401
        assert status("Bearer sekrit2") == 401 and status("Bearer") == 401
