"""Offline (engine) and online (HTTP) runs, results, plots and the CLI."""

from __future__ import annotations

import json
import sys

import pytest

from eyas.bench.offline import run_engine
from eyas.bench.online import run_url
from eyas.bench.plots import write_plots
from eyas.bench.results import BenchResult, Level, Request, table
from eyas.cli import main
from eyas.common.prompts import prompt_set
from eyas.sample.sampling import SamplingParams

PNG = b"\x89PNG\r\n\x1a\n"


def test_offline_runs_count_tokens_and_acceptance(engine_pair):
    spec, base = engine_pair
    prompts = [[65 + i, 66, 67, 68] for i in range(3)]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    s = run_engine(spec, prompts, params, 2, "speculative")
    b = run_engine(base, prompts, params, 2, "baseline")
    assert [r.tokens for r in s.requests] == [12, 12, 12] == [r.tokens for r in b.requests]
    assert all(r.ttft is not None and 0 < r.ttft <= r.e2e for r in s.requests)
    acc = s.acceptance
    assert acc["tau"] >= 1.0 and len(acc["per_position"]) == 3 and acc["verify_steps"] > 0
    # every token after the first came from a verify step (the last step's surplus is cut at max_new_tokens)
    assert sum(r.tokens - 1 for r in s.requests) <= acc["tau"] * acc["verify_steps"] + 1e-6
    assert b.acceptance == {} and s.tokens_per_s > 0


def test_online_run_against_real_servers(http_pair):
    spec_url, base_url = http_pair
    prompts = prompt_set("code")[:3]
    s = run_url(spec_url, prompts, 16, 0.0, 2, "speculative")
    b = run_url(base_url, prompts, 16, 0.0, 2, "baseline")
    assert not s.errors and not b.errors
    assert len(s.requests) == 3 and all(0 < r.tokens <= 16 and r.ttft is not None for r in s.requests)
    assert all(r.tau is not None for r in s.requests) and all(r.tau is None for r in b.requests)
    acc = s.acceptance
    assert acc["source"] == "counters over the probes" and acc["tau"] >= 1.0 and len(acc["per_position"]) == 3
    assert b.acceptance == {}
    level = Level(2, b, s)
    assert level.speedup == pytest.approx(s.tokens_per_s / b.tokens_per_s)


def test_online_reports_failures(http_pair):
    run = run_url(http_pair[0], ["hi"], 10**7, 0.0, 1, "speculative")  # max_tokens beyond the context: 400
    assert run.errors and "HTTP 400" in run.errors[0] and run.requests == []
    assert "max_tokens" in run.errors[0] and '{"error"' not in run.errors[0]  # the server's message, not its JSON


def test_an_html_answer_is_named_not_printed():
    from eyas.bench.online import error_text

    page = b"<!DOCTYPE HTML>\n<html><head><title>Error response</title></head><body>501</body></html>"
    assert "not an OpenAI-compatible answer" in error_text(page) and "<html" not in error_text(page)
    assert error_text(b'{"error": {"message": "too long", "type": "invalid_request_error"}}') == "too long"


def test_engine_flags_with_url_are_refused_not_dropped(capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9", "--speculative-num-steps", "9", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "--speculative-num-steps, --dtype would be ignored" in err and "leave out --url" in err


def test_online_reads_acceptance_from_a_server_whose_metrics_need_the_key(engine_pair):
    from helpers import InProcessServer

    from eyas.serve.app import ServeOptions, create_app

    opts = ServeOptions(served_model_name="tiny", log_interval=0, api_key="k", metrics_require_key=True)
    with InProcessServer(create_app(engine_pair[0], opts)) as srv:
        run = run_url(srv.url, prompt_set("code")[:1], 8, 0.0, 1, "speculative", api_key="k")
    assert not run.errors and run.acceptance["tau"] >= 1.0 and run.acceptance["verify_steps"] > 0


def fake_result() -> BenchResult:
    s = [Request(10, 0.1, 1.0, 2.5), Request(10, 0.2, 1.2, 3.0)]
    b = [Request(10, 0.1, 2.0), Request(10, 0.1, 2.2)]
    from eyas.bench.results import Run

    spec = Run("speculative", 1, 2.2, s, {"tau": 2.75, "accept_rate": 0.6, "per_position": [0.9, 0.6, 0.3]})
    return BenchResult("online", {}, [Level(1, Run("baseline", 1, 4.2, b), spec)])


def test_plots_and_table(tmp_path):
    result = fake_result()
    files = write_plots(result, tmp_path)
    assert [f.name for f in files] == ["throughput.png", "acceptance.png", "tau.png"]
    assert all(f.read_bytes().startswith(PNG) and f.stat().st_size > 5000 for f in files)
    text = table(result)
    assert "1.91x" in text and "2.75" in text and "[0.90, 0.60, 0.30]" in text
    summary = result.as_dict()["levels"][0]
    assert summary["speculative"]["tpot_mean_s"] == pytest.approx((0.9 / 9 + 1.0 / 9) / 2, abs=1e-5)


def test_cli_online_writes_json_and_plots(http_pair, tmp_path, capsys):
    spec_url, base_url = http_pair
    rc = main(["bench", "--url", spec_url, "--baseline-url", base_url, "--num-prompts", "2", "--max-tokens", "8",
               "--concurrency", "1,2", "--out", str(tmp_path), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert all(lv["speedup"] and lv["speculative"]["acceptance"]["tau"] >= 1 for lv in data["levels"])
    assert json.loads((tmp_path / "bench.json").read_text())["mode"] == "online"
    assert (tmp_path / "throughput.png").read_bytes().startswith(PNG)


def test_cli_without_matplotlib_still_writes_the_results(http_pair, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc = main(["bench", "--url", http_pair[0], "--no-baseline", "--num-prompts", "1", "--max-tokens", "4",
               "--out", str(tmp_path)])
    assert rc == 0 and "no plots" in capsys.readouterr().err
    assert json.loads((tmp_path / "bench.json").read_text())["levels"][0]["speculative"]["requests"] == 1
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("flag, value, bad", [("--concurrency", "0,x", "'0' is not one"),
                                             ("--concurrency", "1,,2", "'' is not one"),
                                             ("--concurrency", "4,-1", "'-1' is not one"),
                                             ("--concurrency", "", "'' is not one"),
                                             ("--temperature", "0,,0.7", "not a list of temperatures in [0, 2]")])
def test_cli_rejects_bad_lists_at_parsing(flag, value, bad, capsys):
    """An empty item (1,,2) was skipped without a word: a typo ran other levels than meant."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--url", "http://127.0.0.1:9", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: {value!r} is not a list" in err and bad in err


def test_cli_offline(folders, tmp_path, capsys):
    t, d = folders
    rc = main(["bench", "--model-path", t, "--speculative-draft-model-path", d, "--dtype", "float64",
               "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4", "--prompts", "reasoning",
               "--num-prompts", "2", "--max-tokens", "6", "--no-plots", "--json", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "offline" and data["setup"]["num_draft_tokens"] == 4
    level = data["levels"][0]
    # greedy speculation is lossless: both sides emit the same tokens
    assert 0 < level["baseline"]["output_tokens"] == level["speculative"]["output_tokens"] <= 12
    assert len(level["speculative"]["acceptance"]["per_position"]) == 3
    rows = level["speculative"]["per_category"]  # the in-process run groups by the built-in set too
    assert list(rows) == ["reasoning"] and rows["reasoning"]["drafts"] == level["speculative"]["acceptance"][
        "verify_steps"] and level["baseline"]["per_category"] is None


def test_cli_offline_without_a_draft_has_nothing_to_compare(folders, capsys):
    assert main(["bench", "--model-path", folders[0], "--speculative-algorithm", "NONE", "--no-plots"]) == 2
    assert "nothing to compare" in capsys.readouterr().err


def test_cli_a_run_that_generated_nothing_is_an_error_not_zero_tok_s(tmp_path, capsys, monkeypatch):
    """A server that ends every answer at once (or sends no text) gave a table of 0 tok/s and exit 0."""
    from eyas.bench import online
    from eyas.bench.results import Request, Run

    def empty(url, prompts, *args, **kwargs):
        label = "baseline" if url.endswith(":9") else "speculative"
        return Run(label, 1, 0.5, [Request(0, None, 0.1) for _ in prompts])

    monkeypatch.setattr(online, "run_url", empty)
    rc = main(["bench", "--url", "http://127.0.0.1:8", "--baseline-url", "http://127.0.0.1:9", "--num-prompts", "2",
               "--no-plots", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "the baseline and speculative run(s) generated no token: nothing was measured" in err
    assert (tmp_path / "bench.json").is_file()  # what was recorded is still written


def test_cli_rejects_a_negative_prompt_count(capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9", "--num-prompts", "-1"]) == 2
    assert "--num-prompts must be 0 (the whole set) or more, got -1" in capsys.readouterr().err
