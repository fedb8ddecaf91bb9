"""eyas bench over HTTP with what users paste: an OpenAI base URL, a /metrics that is not Prometheus."""

import httpx

from eyas.bench import online
from eyas.common.server_metrics import server_root


def test_an_openai_base_url_is_the_servers_root():
    assert server_root("http://gpu:8000/v1/") == server_root("http://gpu:8000") == "http://gpu:8000"
    assert server_root("http://gpu:8000/v1beta") == "http://gpu:8000/v1beta"  # only the OpenAI suffix


def test_metrics_that_are_not_prometheus_give_no_figures_not_a_traceback(monkeypatch):
    page = httpx.Response(200, text="<!DOCTYPE html><html><body>Sign in</body></html>")
    monkeypatch.setattr(online.httpx, "get", lambda *a, **k: page)
    assert online.scrape("http://proxy") == (None, None)
