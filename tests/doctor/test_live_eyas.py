"""Live doctor against real eyas servers on loopback: healthy, never accepted, speculation off."""

from __future__ import annotations

import json

import httpx
import pytest

from eyas.cli import main
from eyas.doctor.live import LiveOptions, diagnose_live

OPTS = dict(probes=2, max_tokens=24)


def test_healthy_server_is_working_and_counters_match_the_responses(live):
    report = diagnose_live(live["trained"], LiveOptions(**OPTS))
    assert report.exit_code == 0, report.to_json()
    tau = report.figures["tau"]
    assert tau > 1.1 and report.verdict.startswith(f"working (tau {tau:.2f}")
    assert report.figures["source"] == "counters over the probes"
    config = next(c for c in report.checks if c.name == "configuration")
    assert config.message.startswith("EAGLE3, draft <in memory>, captured layers [2, 4, 5] (fc 192 -> 64)")
    assert len(report.figures["per_position"]) == 3  # num_steps 3: positions 0..2
    # the counters moved by exactly what the two responses reported
    per_request = report.figures["per_request_tau"]
    assert len(per_request) == 2 and min(per_request) <= tau + 1e-6 <= max(per_request) + 1e-6
    assert 0 < report.figures["completion_tokens"] <= 48 and report.figures["tokens_per_s"] > 0


def test_random_draft_for_the_right_target_is_not_accepted(live):
    report = diagnose_live(live["random"], LiveOptions(**OPTS))
    assert report.exit_code == 1
    assert report.verdict.startswith("NOT ACCEPTED (tau 1.0")
    causes = report.figures["likely_causes"]
    assert causes[0].startswith("eyas refuses EAGLE")  # the flag cannot be the cause on eyas
    assert "randomly initialised" in causes[2]


def test_server_without_speculation(live):
    report = diagnose_live(live["baseline"], LiveOptions(**OPTS))
    assert report.exit_code == 1 and report.verdict.startswith("SPECULATION OFF")
    assert "eyas:spec_info algorithm NONE" in next(c for c in report.checks if c.name == "speculation").message


def test_baseline_url_and_expected_tau(live):
    report = diagnose_live(live["trained"], LiveOptions(**OPTS, baseline_url=live["baseline"], expect_tau=50.0))
    names = {c.name: c.status for c in report.checks}
    assert names["expected tau"] == "problem" and report.verdict.startswith("DEGRADED (tau")
    assert "speed" in names and report.figures["baseline_tokens_per_s"] > 0 and report.figures["speedup"] > 0


def test_cli_no_probe_json(live, capsys):
    httpx.post(live["trained"] + "/v1/completions", json={"prompt": "hello", "max_tokens": 8, "temperature": 0},
               timeout=60)
    assert main(["doctor", "--url", live["trained"], "--no-probe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"].startswith("working") and out["figures"]["source"] == "lifetime counters"


def test_cli_refuses_url_with_files(live, capsys):
    assert main(["doctor", "--url", live["trained"], "--draft", "x"]) == 2
    assert "one or the other" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--probes", "--max-tokens"])
def test_cli_bad_numbers(flag, capsys):
    assert main(["doctor", "--url", "http://127.0.0.1:9", flag, "-1"]) == 2


def test_server_with_api_key(engine_for_key):
    from live_server import LiveServer

    with LiveServer(engine_for_key, api_key="s3cret") as srv:
        denied = diagnose_live(srv.url, LiveOptions(probes=1, max_tokens=8))
        assert denied.exit_code == 1 and "--api-key" in next(c for c in denied.checks if c.name == "server").fix
        ok = diagnose_live(srv.url, LiveOptions(probes=1, max_tokens=8, api_key="s3cret"))
        assert "configuration" in [c.name for c in ok.checks] and ok.figures["completion_tokens"] > 0


def test_a_server_that_is_not_openai_compatible_is_named_so():
    """A web server at the address (here: one that answers 404 everywhere) is not 'ok'; host:port gets http://."""
    import http.server
    import threading

    from eyas.common.urls import server_url

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        report = diagnose_live(server_url(f"127.0.0.1:{srv.server_port}/"), LiveOptions(probes=1, max_tokens=8))
    finally:
        srv.shutdown()
    row = next(c for c in report.checks if c.name == "server")
    assert report.exit_code == 1 and row.status == "problem" and "answered 404" in row.message and "--url" in row.fix
    assert report.verdict.startswith("NOT AN OPENAI-COMPATIBLE ANSWER")
