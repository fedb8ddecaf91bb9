"""Live doctor: answers that are not what an OpenAI-compatible server sends, verdicts that must agree with the exit
status, and comparisons asked for that cannot be made. The fake servers are test_live_recorded's, with some paths
answering otherwise."""

from __future__ import annotations

import json

import httpx
import pytest
from test_live_recorded import RECORDED, SGLANG_ARGS, diagnose, fake_server

from eyas.cli import main
from eyas.doctor.live import LiveOptions, diagnose_live

VLLM_PAIR = ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"]


def overriding(owned_by: str, metrics: list, answers: dict):
    """test_live_recorded's fake server, with the paths in ``answers`` answered by those functions instead."""
    inner, calls = fake_server(owned_by, metrics)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in answers:
            return answers[request.url.path](request)
        r = inner.send(request)
        r.read()
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://fake"), calls


def sglang_at(tau: float) -> tuple[int, str]:
    return 200, (RECORDED / "sglang_eagle3.prom").read_text().replace("} 2.9", "} " + str(tau))


# -- 1. /v1/models answers 200 with something that is no model list ------------------------------------------------
@pytest.mark.parametrize("answer,received", [
    (httpx.Response(200, json={"data": 5}), "JSON whose data is not a list"),
    (httpx.Response(200, json=[1, 2]), "a JSON list"),
    (httpx.Response(200, json={"object": "list"}), "JSON without a data list"),
    (httpx.Response(200, json={"data": ["x"]}), "first entry has no id string"),
    (httpx.Response(200, json={"data": []}), "an empty model list"),
    (httpx.Response(200, text="<html><body>Sign in</body></html>", headers={"content-type": "text/html"}),
     "text/html that is not JSON ('<html><body>Sign in"),
])
def test_a_models_answer_that_is_no_model_list_is_a_problem_not_a_server(answer, received):
    client, calls = overriding("sglang", ["sglang_eagle3.prom"], {"/v1/models": lambda _: answer})
    report = diagnose_live("http://fake", LiveOptions(probes=2), client=client)
    assert report.exit_code == 1, report.to_json()
    assert [(c.name, c.status) for c in report.checks] == [("server", "problem")]
    assert received in report.checks[0].message and "login page" in report.checks[0].fix
    assert report.verdict.startswith("NOT AN OPENAI-COMPATIBLE ANSWER: GET /v1/models answered 200 with")
    assert calls["chat"] == 0


# -- 2. the verdict and the exit status agree ---------------------------------------------------------------------
def test_eagle_with_an_eagle3_draft_yet_accepted_is_misconfigured_not_working(saved):
    """SGLang says EAGLE with a readable EAGLE-3 draft, yet its gauge says 2.5: both facts are told, and the run
    fails (the flag is the story's mistake), with a verdict that does not say 'working'."""
    _, draft = saved
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(draft)}
    report, _ = diagnose("sglang", [sglang_at(2.5)], server_info=info)
    assert report.exit_code == 1
    assert report.verdict == ("MISCONFIGURED (--speculative-algorithm EAGLE with an EAGLE-3 draft; tau 2.50 measured "
                              "anyway)"), report.verdict
    assert {c.name: c.status for c in report.checks}["acceptance"] == "ok"  # the measured figure stands
    row = next(c for c in report.checks if c.name == "flag vs figures")
    assert row.status == "problem" and "EAGLE3" in row.fix and "drafts are accepted" in row.message


def test_eagle3_with_aux_states_switched_off_yet_accepted_is_misconfigured(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eagle_config": {"use_aux_hidden_state": False}}))
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(tmp_path)}
    report, _ = diagnose("sglang", [sglang_at(2.5)], server_info=info, baseline_tps=1e9)
    assert report.exit_code == 1
    assert report.verdict.startswith("MISCONFIGURED (EAGLE3 with a draft whose eagle_config.use_aux_hidden_state "
                                     "is false; tau 2.50 measured anyway); SLOWER THAN BASELINE"), report.verdict


# -- 3. a comparison asked for and not made fails ----------------------------------------------------------------
def test_an_unreachable_baseline_url_fails_the_run():
    report, _ = diagnose("vllm", VLLM_PAIR, baseline_url="http://127.0.0.1:9", timeout=2)
    row = next(c for c in report.checks if c.name == "speed")
    assert report.exit_code == 1 and row.status == "problem"
    assert "baseline unusable: nothing answers at http://127.0.0.1:9" in row.message and "--baseline-url" in row.fix
    assert report.verdict == "working (tau 2.80) but NOT COMPARED WITH THE BASELINE"


def test_a_baseline_whose_probes_all_fail_fails_the_run():
    client, _ = fake_server("vllm", VLLM_PAIR)
    base, _ = overriding("vllm", ["vllm_no_spec.prom"], {"/v1/chat/completions": lambda _: httpx.Response(500)})
    report = diagnose_live("http://fake", LiveOptions(probes=2, baseline_url="http://fake"), client=client,
                           baseline_client=base)
    row = next(c for c in report.checks if c.name == "speed")
    assert report.exit_code == 1 and row.status == "problem" and "2 of 2 probes failed: HTTP 500" in row.message


@pytest.mark.parametrize("flags", [["--no-probe", "--baseline-tps", "40"], ["--probes", "0", "--baseline-url", "h:1"]])
def test_a_baseline_without_probes_is_refused(flags, capsys):
    assert main(["doctor", "--url", "http://127.0.0.1:9", *flags]) == 2
    assert "the comparison would be dropped" in capsys.readouterr().err


def test_a_server_without_tau_fails_an_expected_tau_and_still_compares_speed():
    pair = ["vllm_v1_no_drafts_before.prom", "vllm_v1_no_drafts_after.prom"]
    report, _ = diagnose("vllm", pair, expect_tau=2.0, baseline_tps=1e-3)
    assert report.exit_code == 1 and next(c for c in report.checks if c.name == "expected tau").status == "problem"
    assert report.figures["speedup"] > 1 and "EXPECTED TAU PROBLEM" in report.verdict


# -- 4. probes that time out name the timeout, not --model ---------------------------------------------------------
def test_probe_timeouts_name_the_slow_server_and_the_timeout_flag():
    def hang(request):
        raise httpx.ReadTimeout("timed out", request=request)

    client, _ = overriding("vllm", VLLM_PAIR, {"/v1/chat/completions": hang})
    report = diagnose_live("http://fake", LiveOptions(probes=2, timeout=7), client=client)
    row = next(c for c in report.checks if c.name == "probes")
    assert report.exit_code == 1 and report.verdict == "UNVERIFIED: the probe requests timed out"
    assert "--model" not in row.fix and "raise --timeout" in row.fix and "load" in row.fix
    assert "--timeout 7 s" in row.fix and "timed out" in row.message


# -- 6. an expected tau no server can reach is refused ------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e9", "66", "-1"])
def test_an_expected_tau_no_server_reaches_is_refused(value, capsys):
    assert main(["doctor", "--url", "http://127.0.0.1:9", "--expect-tau", value]) == 2
    assert "no acceptance length" in capsys.readouterr().err
