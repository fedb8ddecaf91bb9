"""Browsers on another origin can call the server (CORS, as vLLM and SGLang allow by default), over real HTTP
on loopback: preflights are answered before the API key is asked for, ``--allowed-origins`` narrows or turns
it off, and ``HEAD /health`` answers as ``GET`` does."""

from __future__ import annotations

import httpx

PREFLIGHT = {"Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_any_origin_by_default_and_the_key_still_guards_the_routes(inprocess):
    with inprocess(api_key="k") as srv:
        pre = httpx.options(srv.url + "/v1/chat/completions", headers=PREFLIGHT)
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        refused = httpx.post(srv.url + "/v1/chat/completions", json=BODY, headers={"Origin": "https://chat.example"})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"  # readable
        ok = httpx.post(srv.url + "/v1/chat/completions", json=BODY,
                        headers={"Origin": "https://chat.example", "Authorization": "Bearer k"}, timeout=60)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"
        assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
        head = httpx.head(srv.url + "/health")
        assert head.status_code == 200 and head.content == b""


def test_allowed_origins_narrow_it_and_an_empty_list_turns_it_off(inprocess):
    with inprocess(allowed_origins=["https://chat.example"]) as srv:
        assert httpx.options(srv.url + "/v1/models", headers=PREFLIGHT).status_code == 200
        other = httpx.options(srv.url + "/v1/models", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        got = httpx.get(srv.url + "/v1/models", headers={"Origin": "https://chat.example"})
        assert got.headers["access-control-allow-origin"] == "https://chat.example"
    with inprocess(allowed_origins=[]) as srv:
        got = httpx.get(srv.url + "/v1/models", headers={"Origin": "https://chat.example"})
        assert got.status_code == 200 and "access-control-allow-origin" not in got.headers
        assert httpx.options(srv.url + "/v1/models", headers=PREFLIGHT).status_code == 405
