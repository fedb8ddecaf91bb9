"""``eyas bench --temperature 0,0.7 --top-p P``: one run per temperature, each sent to the server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from eyas.cli import main
from eyas.config import SpecConfig
from eyas.engine.engine import Engine


def test_each_temperature_runs_and_reaches_the_server(http_pair, engine_pair, tmp_path, capsys, monkeypatch):
    spec = engine_pair[0]
    seen, make = [], spec.new_sequence

    def recording(prompt, params, compiled=None):
        seen.append((params.temperature, params.top_p))
        return make(prompt, params, compiled)

    monkeypatch.setattr(spec, "new_sequence", recording)
    rc = main(["bench", "--url", http_pair[0], "--no-baseline", "--num-prompts", "2", "--max-tokens", "6",
               "--temperature", "0,0.7", "--top-p", "0.9", "--concurrency", "1,2", "--out", str(tmp_path), "--json",
               "--no-plots"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [(lv["temperature"], lv["concurrency"]) for lv in data["levels"]] == [(0, 1), (0, 2), (0.7, 1), (0.7, 2)]
    assert all(lv["speculative"]["requests"] == 2 and lv["speculative"]["acceptance"]["tau"] >= 1
               for lv in data["levels"])
    assert data["setup"]["temperatures"] == [0, 0.7] and data["setup"]["top_p"] == 0.9
    assert sorted(set(seen)) == [(0.0, 0.9), (0.7, 0.9)] and len(seen) == 8


@pytest.mark.parametrize("flags, words", [(["--temperature", "0,hot"], "--temperature"),
                                          (["--temperature", "3"], "--temperature"),
                                          (["--top-p", "0"], "--top-p")])
def test_bad_sampling_flags_are_refused(flags, words, capsys):
    try:
        rc = main(["bench", "--url", "http://127.0.0.1:9", *flags])
    except SystemExit as e:  # --temperature is refused at parsing (argparse), --top-p when the run starts
        rc = e.code
    assert rc == 2
    assert words in capsys.readouterr().err


def test_pair_benchmark_samples_at_the_given_temperature(target, draft, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import pair

    prompts = [[72, 101, 108, 108, 111], [65, 66, 67]]
    engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 6))
    greedy = pair.run_all(engine, prompts, 12)
    monkeypatch.setitem(pair.SAMPLING, "temperature", 1.0)
    monkeypatch.setitem(pair.SAMPLING, "top_p", 0.95)
    sampled = pair.run_all(engine, prompts, 12)
    assert sampled["outputs"] != greedy["outputs"] and sampled["tau"] >= 1
    assert pair.run_all(engine, prompts, 12)["outputs"] == sampled["outputs"]  # seeded per prompt
