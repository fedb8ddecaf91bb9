"""eyas bench over HTTP with what users paste: an OpenAI base URL, a /metrics that is not Prometheus."""

import httpx
import pytest

from eyas.bench import online
from eyas.common.server_metrics import server_root


def test_an_openai_base_url_is_the_servers_root():
    assert server_root("http://gpu:8000/v1/") == server_root("http://gpu:8000") == "http://gpu:8000"
    assert server_root("http://gpu:8000/v1beta") == "http://gpu:8000/v1beta"  # only the OpenAI suffix


def test_metrics_that_are_not_prometheus_give_no_figures_not_a_traceback(monkeypatch):
    page = httpx.Response(200, text="<!DOCTYPE html><html><body>Sign in</body></html>")
    monkeypatch.setattr(online.httpx, "get", lambda *a, **k: page)
    assert online.scrape("http://proxy") == (None, None)


def test_a_url_where_nothing_answers_is_refused_before_timing(tmp_path, capsys):
    import socket

    from eyas.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--num-prompts", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"nothing answers at http://127.0.0.1:{port}" in err and "start the server first" in err
    assert not list(tmp_path.iterdir())  # no results of a run that never ran


def test_tune_names_the_flag_it_refuses(capsys):
    from eyas.cli import main

    with pytest.raises(SystemExit) as e:  # refused at parsing, before any model loads
        main(["tune", "--batch-sizes", "0"])
    assert e.value.code == 2 and "--batch-sizes: '0' is not a list of positive integers" in capsys.readouterr().err


def test_a_baseline_url_without_url_is_refused_not_dropped(tmp_path, capsys, monkeypatch):
    """Without --url the bench runs in-process: --baseline-url (or --served-model-name) would be ignored."""
    import eyas.bench.cli as bench_cli
    from eyas.cli import main

    monkeypatch.setattr(bench_cli, "bench_offline", lambda *a: fail("ran in-process"))
    code = main(["bench", "--baseline-url", "http://127.0.0.1:9", "--num-prompts", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--baseline-url belong to a served benchmark" in err and "add --url URL" in err


def fail(why):
    raise AssertionError(why)
