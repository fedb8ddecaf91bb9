"""--api-key, checked route by route: every route the app has (read from ``app.routes``, so a route
added later is covered without editing this test) answers 401 without the key, except the open
paths (/health, the /dashboard page, and /metrics unless --metrics-require-key); with the key, none answers 401. The
OpenAPI document says the same."""

from __future__ import annotations

import re

import httpx
import pytest

KEY = "k3y"


def _routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route of ``app``, included routers' routes too; a path parameter is given the
    served model's name (``/v1/models/{model_id}``), so each route can answer 200."""
    try:  # recent FastAPI keeps an included router as one entry of app.routes and resolves it lazily
        from fastapi.routing import iter_route_contexts

        routes = list(iter_route_contexts(app.routes))
    except ImportError:
        routes = app.routes
    return sorted((method, re.sub(r"\{[^}]+\}", "tiny", r.path)) for r in routes if getattr(r, "methods", None)
                  for method in r.methods)


@pytest.mark.parametrize("metrics_require_key", [False, True])
def test_every_route_of_the_app_follows_the_auth_rule(inprocess, metrics_require_key):
    open_paths = {"/health", "/dashboard"} | (set() if metrics_require_key else {"/metrics"})
    with inprocess(api_key=KEY, metrics_require_key=metrics_require_key) as srv:
        routes = _routes(srv.app)
        paths = {path for _, path in routes}
        # the app's routes, not a list kept here: these must be among them for the test to mean anything
        assert paths >= {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/models", "/health",
                         "/health_generate", "/version", "/openapi.json", "/metrics", "/server_info"}
        for method, path in routes + [("GET", "/no/such/route")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = httpx.request(method, srv.url + path, json={} if method == "POST" else None, headers=headers,
                                  timeout=60)
                if path in open_paths:
                    assert r.status_code != 401, (method, path, headers)
                else:
                    assert r.status_code == 401, (method, path, headers, r.status_code)
                    if method != "HEAD":
                        assert r.json()["error"]["code"] == "invalid_api_key"
            r = httpx.request(method, srv.url + path, json={} if method == "POST" else None,
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
            assert r.status_code != 401, (method, path, r.status_code)
            if path == "/no/such/route":
                assert r.status_code == 404
            elif method == "GET":
                assert r.status_code == 200, (path, r.status_code, r.text[:200])
            elif method == "POST":
                assert r.status_code == 400  # {} is not a valid body: the route itself answered
        doc = httpx.get(srv.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
        for path, item in doc["paths"].items():
            for op in item.values():
                assert ("401" in op["responses"]) == (path not in open_paths), path


def test_without_a_key_every_route_is_open(inprocess):
    with inprocess() as srv:
        for method, path in _routes(srv.app):
            if method == "GET":
                assert httpx.get(srv.url + path, timeout=60).status_code == 200, path
