"""Live doctor against recorded SGLang and vLLM /metrics texts (served by an httpx mock transport)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from eyas.doctor.live import LiveOptions, diagnose_live, read_expect_tau
from eyas.errors import EyasError

RECORDED = Path(__file__).parent / "recorded"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def fake_server(owned_by: str, metrics: list[str] | None, completion_tokens: int = 64, usage_extra=None,
                server_info: dict | None = None):
    """A transport answering /v1/models, /metrics (the texts in turn; None: 404) and chat completions."""
    calls = {"metrics": 0, "chat": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                        "owned_by": owned_by}]})
        if path == "/metrics":
            if metrics is None:
                return httpx.Response(404, text="Not Found")
            answer = metrics[min(calls["metrics"], len(metrics) - 1)]
            calls["metrics"] += 1
            if isinstance(answer, tuple):  # (status, body) as given
                return httpx.Response(answer[0], text=answer[1])
            return httpx.Response(200, text=(RECORDED / answer).read_text())
        if path == "/get_server_info" and server_info is not None:
            return httpx.Response(200, json=server_info)
        if path == "/v1/chat/completions":
            calls["chat"] += 1
            body = json.loads(request.content)
            assert body["temperature"] == 0 and body["model"] == MODEL
            usage = {"prompt_tokens": 20, "completion_tokens": completion_tokens, **(usage_extra or {})}
            return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}], "usage": usage})
        return httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://fake")
    return client, calls


def diagnose(owned_by, metrics, server_info=None, **opts):
    client, calls = fake_server(owned_by, metrics, server_info=server_info)
    report = diagnose_live("http://fake", LiveOptions(**{"probes": 2, **opts}), client=client)
    return report, calls


def test_vllm_working_exact_figures_from_counter_deltas():
    report, calls = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"])
    assert calls["chat"] == 2
    assert report.exit_code == 0, report.to_json()
    assert report.verdict == "working (tau 2.80)"
    f = report.figures
    assert f["tau"] == pytest.approx(2.8) and f["accept_rate"] == pytest.approx(0.6)
    assert f["per_position"] == pytest.approx([0.85, 0.60, 0.35])
    assert f["verify_steps"] == 100 and "vLLM" in report.subject


def test_vllm_never_accepted_names_the_algorithm_flag_first():
    report, _ = diagnose("vllm", ["vllm_rejected_before.prom", "vllm_rejected_after.prom"])
    assert report.exit_code == 1
    assert report.verdict.startswith("NOT ACCEPTED (tau 1.00")
    causes = report.figures["likely_causes"]
    assert "--speculative-algorithm EAGLE3" in causes[0] and "eagle3" in causes[0]
    assert report.figures["per_position"] == [0.0, 0.0, 0.0]


def test_vllm_without_speculation():
    report, _ = diagnose("vllm", ["vllm_no_spec.prom"])
    assert report.exit_code == 1
    assert report.verdict.startswith("SPECULATION OFF")
    row = next(c for c in report.checks if c.name == "speculation")
    assert "only when speculative decoding is configured" in row.message and "--speculative-config" in row.fix


def test_vllm_no_probe_reads_lifetime_counters():
    report, calls = diagnose("vllm", ["vllm_eagle3_after.prom"], no_probe=True)
    assert calls["chat"] == 0
    assert report.figures["tau"] == pytest.approx(1 + 880 / 500)
    assert report.figures["source"] == "lifetime counters"


def test_sglang_working_from_gauges():
    report, _ = diagnose("sglang", ["sglang_eagle3.prom"])
    assert report.exit_code == 0
    assert report.verdict == "working (tau 2.90)"
    assert report.figures["accept_rate"] == pytest.approx(0.475) and report.figures["per_position"] == []
    assert "per position not exposed" in next(c for c in report.checks if c.name == "acceptance").message


def test_sglang_accept_length_one_is_not_accepted():
    report, _ = diagnose("sglang", ["sglang_rejected.prom"])
    assert report.exit_code == 1 and report.verdict.startswith("NOT ACCEPTED")
    assert "EAGLE3" in report.figures["likely_causes"][0]


def test_sglang_speculation_off():
    report, _ = diagnose("sglang", ["sglang_spec_off.prom"])
    assert report.exit_code == 1 and report.verdict.startswith("SPECULATION OFF")


def test_sglang_without_spec_metrics():
    report, _ = diagnose("sglang", ["sglang_no_spec_metrics.prom"])
    assert report.exit_code == 1 and report.verdict.startswith("UNVERIFIED")


@pytest.mark.parametrize("owner,fix", [("sglang", "--enable-metrics"), ("vllm", "by default")])
def test_metrics_disabled(owner, fix):
    report, _ = diagnose(owner, None)
    assert report.exit_code == 1
    row = next(c for c in report.checks if c.name == "metrics")
    assert "404" in row.message and fix in row.fix


def test_degraded_against_expected_tau():
    report, _ = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], expect_tau=3.5)
    assert report.exit_code == 1 and report.verdict == "DEGRADED (tau 2.80, expected 3.50)"
    ok, _ = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], expect_tau=3.0)
    assert ok.exit_code == 0  # within the 10 % tolerance


def test_slower_than_baseline_tps():
    slow, _ = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], baseline_tps=1e9)
    assert slow.exit_code == 1 and slow.verdict.startswith("working (tau 2.80) but SLOWER THAN BASELINE (0.00x)")
    fast, _ = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], baseline_tps=1e-3)
    assert fast.exit_code == 0 and "faster than the baseline" in fast.verdict and fast.figures["speedup"] > 1


def test_unreachable_server():
    report = diagnose_live("http://127.0.0.1:9", LiveOptions(probes=1, timeout=2))
    assert report.exit_code == 1 and report.verdict.startswith("UNREACHABLE")


def test_expect_tau_reads_eval_json(tmp_path):
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"accept_length": 2.75, "accept_rate": 0.4}))
    assert read_expect_tau(str(f)) == 2.75 and read_expect_tau("3.1") == 3.1
    with pytest.raises(EyasError):
        read_expect_tau(str(tmp_path / "missing.json"))


SGLANG_ARGS = {"model_path": MODEL, "speculative_num_steps": 3, "speculative_eagle_topk": 1,
               "speculative_num_draft_tokens": 4, "enable_metrics": True}


def test_sglang_server_info_confirms_the_eagle_mistake(saved):
    _, draft = saved  # an EAGLE-3 draft readable here
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(draft)}
    report, _ = diagnose("sglang", ["sglang_rejected.prom"], server_info=info)
    row = next(c for c in report.checks if c.name == "configuration")
    assert row.status == "problem" and "EAGLE-3 draft" in row.message and "EAGLE3" in row.fix
    assert report.figures["likely_causes"][0].startswith("the algorithm flag, CONFIRMED")


def test_sglang_server_info_eagle_with_unreadable_draft_warns():
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "org/remote-draft"}
    report, _ = diagnose("sglang", ["sglang_eagle3.prom"], server_info=info)
    row = next(c for c in report.checks if c.name == "configuration")
    assert row.status == "warning" and "eyas doctor --draft org/remote-draft" in row.fix
    report, _ = diagnose("sglang", ["sglang_rejected.prom"], server_info=info)  # nothing accepted: likely, not sure
    cause = report.figures["likely_causes"][0]
    assert cause.startswith("the algorithm flag, likely") and "CONFIRMED" not in cause


def test_sglang_server_info_eagle3():
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d"}
    report, _ = diagnose("sglang", ["sglang_rejected.prom"], server_info=info)
    assert next(c for c in report.checks if c.name == "configuration").status == "ok"
    assert report.figures["likely_causes"][0].startswith("not the flag")


# -- figures no decoder can produce are never a pass; failures are reported as what they are ---------------------
@pytest.mark.parametrize("recorded,reasons", [
    ("sglang_nan.prom", ["tau nan is not a finite number"]),
    ("sglang_inf.prom", ["tau inf is not a finite number", "acceptance rate 2.5 is outside [0, 1]"]),
])
def test_non_finite_or_out_of_range_gauges_are_impossible_figures(recorded, reasons):
    report, _ = diagnose("sglang", [recorded])
    assert report.exit_code == 1, report.verdict
    assert report.verdict == f"IMPOSSIBLE FIGURES ({reasons[0]}): acceptance cannot be judged"
    assert report.figures["impossible"] == reasons and "tau" not in report.figures
    assert json.loads(report.to_json())["exit_code"] == 1  # strict JSON: no NaN or Infinity in it


def test_tau_above_the_tokens_a_step_verifies_is_impossible():
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE3", "speculative_num_draft_tokens": 2}
    report, _ = diagnose("sglang", ["sglang_eagle3.prom"], server_info=info)  # tau 2.9, but at most 2 a step
    assert report.exit_code == 1
    assert report.figures["impossible"] == ["tau 2.9 is above 2 (the server verifies 2 tokens a step, root included)"]



@pytest.mark.parametrize("info,most", [
    ({"num_draft_tokens": 4, "batch_schedule": "auto", "settings": ["0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"]}, 32),
    ({"num_draft_tokens": 4, "batch_schedule": "auto"}, 32),  # a server from before it listed its settings
    ({"num_draft_tokens": 4, "batch_schedule": "1:3,1,4;8:4,4,16;32:0"}, 16),
    ({"num_draft_tokens": 6, "batch_schedule": None}, 6),
])
def test_an_eyas_servers_ceiling_counts_every_tree_it_may_run(info, most):
    """``auto`` reports its smallest tree first (3,1,4): a tau of 5 from its 6,8,32 steps is no impossible figure."""
    from eyas.common.server_metrics import EYAS
    from eyas.doctor.server_config import num_draft_tokens

    assert num_draft_tokens(EYAS, info) == most


def test_counters_that_went_backwards_are_impossible_not_rejected():
    report, _ = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_impossible_after.prom"])
    assert report.exit_code == 1 and report.verdict.startswith("IMPOSSIBLE FIGURES (tau -1 is below 1")
    assert "likely_causes" not in report.figures
    assert "restart" in next(c for c in report.checks if c.name == "acceptance").fix


@pytest.mark.parametrize("answer,found", [
    ((500, "Internal Server Error"), "GET /metrics answered HTTP 500: the server failed to produce its metrics"),
    ((200, "<html><body>a login page</body></html>"), "answered 200 with text that is not Prometheus exposition"),
])
def test_metrics_that_fail_are_not_called_disabled(answer, found):
    report, _ = diagnose("sglang", [answer])
    row = next(c for c in report.checks if c.name == "metrics")
    assert report.exit_code == 1 and found in row.message and found in report.verdict
    assert "--enable-metrics" not in row.fix and "server's log" in row.fix


def test_a_hung_server_is_reported_as_a_timeout():
    import socket

    with socket.socket() as hung:  # accepts connections (the kernel's backlog) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        report = diagnose_live(url, LiveOptions(probes=1, timeout=0.5))
    assert report.exit_code == 1
    assert report.verdict.startswith(f"TIMED OUT: GET {url}/v1/models timed out: no answer after 0.")
    assert "(--timeout 0.5 s)" in report.verdict and "nothing answers" not in report.verdict
    assert "raise --timeout" in report.checks[0].fix


def test_vllm_counting_tokens_but_not_drafts_is_speculating_with_an_exact_rate():
    """Early vLLM v1 (and v0) register num_draft_tokens and num_accepted_tokens only: not 'speculation off'."""
    report, _ = diagnose("vllm", ["vllm_v1_no_drafts_before.prom", "vllm_v1_no_drafts_after.prom"])
    assert report.exit_code == 0, report.to_json()
    assert report.verdict == "working (acceptance rate 0.60; tau not exposed by this server)"
    assert report.figures["accept_rate"] == pytest.approx(0.6) and report.figures["tau"] is None
    row = next(c for c in report.checks if c.name == "acceptance")
    assert row.status == "warning" and "spec_decode_num_drafts" in row.fix
    v0, _ = diagnose("vllm", ["vllm_v0.prom"], no_probe=True)
    assert v0.verdict.startswith("working (acceptance rate 0.60") and v0.figures["source"].startswith("lifetime")


def test_vllm_counting_tokens_but_not_drafts_with_nothing_accepted_is_tau_one():
    report, _ = diagnose("vllm", ["vllm_v1_no_drafts_before.prom", "vllm_v1_no_drafts_rejected_after.prom"])
    assert report.exit_code == 1 and report.verdict.startswith("NOT ACCEPTED (tau 1.00")
    assert "EAGLE3" in report.figures["likely_causes"][0]


@pytest.mark.parametrize("flags", [["--expect-tau", "nan"], ["--expect-tau", "0.5"], ["--expect-tau", "inf"],
                                   ["--tau-tolerance", "1.5"], ["--tau-tolerance", "nan"],
                                   ["--baseline-tps", "-5"], ["--baseline-tps", "0"], ["--baseline-tps", "nan"]])
def test_expectations_that_could_never_fail_are_refused(flags, capsys):
    from eyas.cli import main

    assert main(["doctor", "--url", "http://127.0.0.1:9", *flags]) == 2
    assert "fix:" in capsys.readouterr().err


def test_more_probes_than_the_chat_set_holds_are_all_sent():
    """--probes 40 sends 40 (the built-in chat set holds 30: the rest were dropped without a word)."""
    _, calls = diagnose("vllm", ["vllm_eagle3_before.prom", "vllm_eagle3_after.prom"], probes=40)
    assert calls["chat"] == 40


@pytest.mark.parametrize("argv, words", [
    (["--draft", "d", "--expect-tau", "99"], "--expect-tau is for a running server (--url)"),
    (["--probes", "7", "--baseline-tps", "40"], "--probes, --baseline-tps are for a running server"),
    (["--url", "http://127.0.0.1:9", "--context-length", "4096"], "--context-length is for the static checks"),
    (["--url", "http://127.0.0.1:9", "--baseline-url", "http://127.0.0.1:8", "--baseline-tps", "40"],
     "--baseline-url and --baseline-tps both name the baseline"),
])
def test_a_flag_the_run_would_drop_is_refused(argv, words, capsys):
    """A live check asked of a static run (or the other way round) is refused: exit 0 without the check would
    pass a CI gate that asked for it."""
    from eyas.cli import main

    assert main(["doctor", *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_static_context_length_below_one_is_refused(capsys):
    from eyas.cli import main

    assert main(["doctor", "--context-length", "0"]) == 2
    assert "--context-length 0 must be at least 1" in capsys.readouterr().err


def test_an_openai_base_url_is_taken_to_the_server_root():
    """Users paste the base URL their OpenAI client has (http://host:8000/v1): not a 'metrics disabled' server."""
    client, _ = fake_server("vllm", ["vllm_eagle3_after.prom"])
    report = diagnose_live("http://fake/v1/", LiveOptions(no_probe=True), client=client)
    assert report.exit_code == 0 and report.verdict.startswith("working"), report.to_json()


def test_drafts_counter_going_backwards_is_a_restart_not_missing_traffic():
    report, _ = diagnose("vllm", ["vllm_eagle3_after.prom", "vllm_eagle3_before.prom"])  # 500 drafts, then 400
    row = next(c for c in report.checks if c.name == "acceptance")
    assert report.exit_code == 1 and "restarted between the two reads" in row.message and "stays up" in row.fix


def test_sglang_eagle3_with_aux_capture_switched_off_in_the_draft(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eagle_config": {"use_aux_hidden_state": False}}))
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(tmp_path)}
    report, _ = diagnose("sglang", ["sglang_rejected.prom"], server_info=info)
    assert next(c for c in report.checks if c.name == "configuration").status == "problem"
    assert "use_aux_hidden_state is false" in report.figures["likely_causes"][0]


def test_sglang_gauge_still_zero_under_eagle3_is_unverified_not_off():
    """SGLang writes spec_accept_length at its decode log (every 40 decode steps by default): a fresh EAGLE3
    server with short probes still shows 0, which is no evidence that speculation is off."""
    info = {**SGLANG_ARGS, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d"}
    report, _ = diagnose("sglang", ["sglang_spec_off.prom"], server_info=info)
    assert report.verdict.startswith("UNVERIFIED: no decode interval") and report.exit_code == 1
    assert "--decode-log-interval" in next(c for c in report.checks if c.name == "speculation").fix
    assert diagnose("sglang", ["sglang_spec_off.prom"])[0].verdict.startswith("SPECULATION OFF")  # no info: off


def test_sglang_ranks_that_have_not_decoded_are_left_out_of_the_mean():
    """Per-rank gauges (data parallel): an idle rank's stays 0, and averaging it in halved tau."""
    text = (RECORDED / "sglang_eagle3.prom").read_text()
    idle = "\n".join(line.replace('dp_rank="0"} 2.9', 'dp_rank="1"} 0.0').replace('dp_rank="0"} 0.475',
                                                                                  'dp_rank="1"} 0.0')
                     for line in text.splitlines() if "spec_accept" in line and not line.startswith("#"))
    report, _ = diagnose("sglang", [(200, text + "\n" + idle + "\n")])
    assert report.verdict == "working (tau 2.90)", report.to_json()
