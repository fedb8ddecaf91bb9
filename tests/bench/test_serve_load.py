"""benchmarks/serve_load.py against two tiny servers on loopback: a few requests, the JSON it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process(folders) -> list[str]:
    """The flags that load the tiny pair here too (``--in-process``), as the loopback servers run it."""
    target, draft = folders
    return ["--in-process", "--model-path", target, "--speculative-draft-model-path", draft, "--dtype", "float64",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_serve_load_reports_each_level_with_tau_and_the_in_process_figure(http_pair, folders, tmp_path):
    spec_url, base_url = http_pair
    target, draft = folders
    out = tmp_path / "load.json"
    code = load_script().main([
        "--url", spec_url, "--baseline-url", base_url, "--clients", "1,3", "--temperatures", "0,0.7",
        "--requests-per-client", "1", "--min-requests", "2", "--max-tokens", "6", "--prompts", "code",
        "--out", str(out), *in_process(folders)])
    assert code == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert [(r["server"], r["temperature"], r["clients"]) for r in runs] == [
        (s, t, c) for t in (0.0, 0.7) for c in (1, 3) for s in ("EAGLE3", "NONE")]  # the servers side by side
    for r in runs:
        assert r["errors"] == [] and r["requests"] == max(2, r["clients"])  # --min-requests 2: 2 from one client
        assert "steps_per_setting" not in r  # fixed settings: no auto counters
        assert r["output_tokens"] == 6 * r["requests"]  # ignore_eos: every request asks the same work
        assert abs(r["tokens_per_s"] - r["output_tokens"] / r["seconds"]) <= 0.01 * r["tokens_per_s"]
        for key in ("ttft_s", "itl_s", "tpot_s"):
            p = r[key]  # itl_s: None when every answer came as one chunk of text
            assert p is None if key == "itl_s" and p is None else 0 < p["p50"] <= p["p90"] <= p["p99"]
        # the engine thread's seconds in the level: stepping took some, not more than the wall. A turn is booked
        # when it ends, so one under way as the level began counts in it whole: here the in-process engine runs in
        # this process between levels and can hold the GIL for a second, so its host part is not bounded
        thread = r["engine_thread"]
        assert 0 < thread["step"] <= r["seconds"] + 0.5 and thread["steps"] >= 1
        inproc = r["in_process"]
        assert inproc["output_tokens"] == r["output_tokens"] and inproc["tokens_per_s"] > 0
        assert r["served_over_in_process"] == round(r["tokens_per_s"] / inproc["tokens_per_s"], 3)
        if r["server"] == "EAGLE3":  # counters over the level: 1 <= tau <= the tokens a step can verify
            assert 1.0 <= r["tau"] <= 4 and 1.0 <= inproc["tau"] <= 4
            assert list(r["per_category"]) == ["code"] == list(inproc["per_category"])  # the built-in set's name
            assert r["per_category"]["code"]["accept_length"] == pytest.approx(r["tau"], abs=1e-3)
        else:
            assert r["tau"] is None and inproc["tau"] is None
            assert r["per_category"] is None and inproc["per_category"] is None
    assert any(r["itl_s"] for r in runs)
    assert data["settings"]["max_tokens"] == 6 and data["settings"]["clients"] == "1,3"


def test_serve_load_sends_top_p_and_reports_tau_per_category(http_pair, engine_pair, tmp_path, monkeypatch):
    spec = engine_pair[0]
    seen, make = [], spec.new_sequence

    def recording(prompt, params, compiled=None):  # what the server's engine was asked for, request by request
        seen.append((params.temperature, params.top_p))
        return make(prompt, params, compiled)

    monkeypatch.setattr(spec, "new_sequence", recording)
    out = tmp_path / "load.json"
    code = load_script().main(["--url", http_pair[0], "--clients", "3", "--temperatures", "0,0.7:0.95",
                               "--top-p", "0.9", "--requests-per-client", "2", "--max-tokens", "6", "--prompts", "all",
                               "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert data["complete"] is True  # written after every level too, "complete": false until the last
    assert [(r["temperature"], r["top_p"]) for r in runs] == [(0.0, 0.9), (0.7, 0.95)]  # the item's own top-p
    assert sorted(set(seen)) == [(0.0, 0.9), (0.7, 0.95)] and len(seen) == 1 + 2 * 6  # the warm-up, two levels
    for r in runs:  # 6 requests taking the interleaved set in turn: two of each
        rows = r["per_category"]
        assert {g: x["prompts"] for g, x in rows.items()} == {"chat": 2, "code": 2, "reasoning": 2}
        steps = sum(x["drafts"] for x in rows.values())
        assert sum(x["accept_length"] * x["drafts"] for x in rows.values()) / steps == pytest.approx(r["tau"], abs=1e-3)


def test_serve_load_refuses_a_top_p_out_of_range(capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--url", "http://127.0.0.1:9", "--top-p", "0"])
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_script().parse_args(["--url", "http://127.0.0.1:9", "--temperatures", "0,0.7:0"])
    assert "'0.7:0': a temperature is >= 0 and a top-p in (0, 1]" in capsys.readouterr().err


def test_serve_load_reports_the_settings_auto_ran(target, draft, tmp_path):
    """Against an ``auto`` server each level records the steps each setting ran (from its /metrics counters),
    and they add up to the level's engine steps, and what its chooser believed; a fixed setting records none."""
    from live_server import LiveServer

    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine

    auto = Engine(target, draft, SpecConfig.auto("EAGLE3"), max_batch=4)
    out = tmp_path / "load.json"
    with LiveServer(auto) as srv:
        code = load_script().main(["--url", srv.url, "--clients", "1,3", "--temperatures", "0",
                                   "--requests-per-client", "1", "--max-tokens", "6", "--out", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert all(r["steps_per_setting"] and all(n > 0 for n in r["steps_per_setting"].values()) for r in runs)
    assert sum(sum(r["steps_per_setting"].values()) for r in runs) <= sum(auto.chooser.steps.values())
    assert set().union(*(r["steps_per_setting"] for r in runs)) <= {"0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"}
    tau = runs[-1]["chooser"]["tau"]  # what the chooser believed: tau per setting and kind of row
    assert tau["0"] == dict.fromkeys(("greedy", "t<=0.4", "t<=0.8", "t<=1", "t>1"), 1.0)
    assert set(tau) == {"0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"}
    assert "cost_ms" not in runs[-1]["chooser"]  # the CPU's costs are relative units: not exported as seconds


def test_the_in_process_level_reports_what_auto_ran_there(target, draft):
    """``--in-process`` beside an ``auto`` server: the engine here records the steps each of its settings ran
    during the level, and what its chooser believed after it, as the served level does."""
    from types import SimpleNamespace

    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine

    auto = Engine(target, draft, SpecConfig.auto("EAGLE3"), max_batch=4)
    args = SimpleNamespace(requests_per_client=2, min_requests=0, max_tokens=6, top_p=1.0, stop_at_eos=False,
                           output_len_spread=0.0)
    before = sum(auto.chooser.steps.values())
    level = load_script().in_process_level(auto, [[5, 6, 7], [8, 9]], 3, args, 0.0, 1.0)
    assert level["output_tokens"] == 6 * 6 and sum(level["steps_per_setting"].values()) == \
        sum(auto.chooser.steps.values()) - before > 0
    assert set(level["chooser"]["tau"]) == {"0", "3,1,4", "5,1,6", "4,4,16", "6,8,32"}
    assert "cost_ms" not in level["chooser"]  # relative units on the CPU, as the served level's


def test_observed_during_is_each_levels_own_steps_and_their_mean():
    """What a level's live steps measured: the difference of the chooser's tallies before and after it."""
    before = {"observed": {"0": {"sampled": {"64": [10.0, 0.015]}}}}
    after = {"observed": {"0": {"sampled": {"64": [14.0, 0.027]}},
                          "3,1,4": {"sampled": {"64": [5.0, 0.0165]}, "greedy": {"8": [2.0, 0.002]}}}}
    assert load_script().observed_during(before, after) == {
        "0": {"sampled": {"64": [4, 3.0]}}, "3,1,4": {"sampled": {"64": [5, 3.3]}, "greedy": {"8": [2, 1.0]}}}
    assert load_script().observed_during(after, after) == {}


def test_serve_load_starts_its_own_server_and_keeps_its_log_where_asked(folders, tmp_path):
    """Without --url it starts ``eyas serve`` from the flags; --logs keeps the server's log (its banner, what was
    chosen and built) for after the run."""
    out, logs = tmp_path / "load.json", tmp_path / "logs"
    code = load_script().main(["--model-path", folders[0], "--speculative-algorithm", "NONE", "--device", "cpu",
                               "--dtype", "float32", "--clients", "1", "--temperatures", "0", "--requests-per-client",
                               "1", "--max-tokens", "3", "--max-running-requests", "2", "--prompts", "chat",
                               "--logs", str(logs), "--out", str(out)])
    assert code == 0
    [run] = json.loads(out.read_text())["runs"]
    assert run["errors"] == [] and run["output_tokens"] == 3
    assert "serving" in (logs / "main.log").read_text()


def test_serve_load_spreads_the_answer_lengths_alike_for_every_server(http_pair, folders, tmp_path, capsys):
    """``--output-len-spread``: each request its own length, the same list for both servers and in-process, so
    that a NONE server's rows do not all end in the same step (real answers do not)."""
    script = load_script()
    lengths = script.output_lengths(20, 0.5, 200)
    assert lengths == script.output_lengths(20, 0.5, 200)  # the same draws wherever they are made
    assert min(lengths) == 10 and max(lengths) == 30 and len(set(lengths)) == 21  # the whole range, inclusive
    assert script.output_lengths(20, 0.0, 5) == [20] * 5
    spec_url, base_url = http_pair
    target, draft = folders
    out = tmp_path / "load.json"
    code = script.main([
        "--url", spec_url, "--baseline-url", base_url, "--clients", "3", "--temperatures", "0",
        "--requests-per-client", "2", "--max-tokens", "8", "--output-len-spread", "0.5", "--prompts", "code",
        "--out", str(out), *in_process(folders)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    want = sum(script.output_lengths(8, 0.5, 6))  # ignore_eos: each request runs to its own length
    assert want != 8 * 6
    for r in runs:
        assert r["errors"] == [] and r["output_tokens"] == want == r["in_process"]["output_tokens"]
    with pytest.raises(SystemExit):
        script.parse_args(["--url", spec_url, "--output-len-spread", "1"])
    assert "--output-len-spread must be in [0, 1), got 1.0" in capsys.readouterr().err


def test_serve_load_puts_static_servers_beside_the_first_and_sets_it_against_the_best(folders, tmp_path, capsys):
    """``--static-settings``: one static server per tree beside the first (here ``auto``), every level run on each,
    and the summary sets the first against NONE and the best static server, in the JSON and the output."""
    out = tmp_path / "load.json"
    code = load_script().main([
        "--model-path", folders[0], "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
        folders[1], "--speculative-batch-schedule", "auto", "--static-settings", "3,1,4", "--device", "cpu",
        "--dtype", "float32", "--clients", "2", "--temperatures", "0", "--requests-per-client", "1",
        "--max-tokens", "4", "--max-running-requests", "2", "--prompts", "code", "--out", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["server"] for r in data["runs"]] == ["EAGLE3", "NONE", "3,1,4"]
    assert all(r["errors"] == [] and r["output_tokens"] == 8 for r in data["runs"])
    [text] = data["summary"]
    assert "x NONE" in text and "the best static (3,1,4," in text and text in capsys.readouterr().out


def test_serve_load_refuses_static_settings_it_cannot_start(capsys):
    for argv in (["--url", "http://127.0.0.1:9", "--static-settings", "3,1,4"],
                 ["--model-path", "m", "--speculative-draft-model-path", "d", "--static-settings", "3,1"]):
        with pytest.raises(SystemExit):
            load_script().parse_args(argv)
        assert "--static-settings" in capsys.readouterr().err
