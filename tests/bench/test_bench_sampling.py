"""``eyas bench --temperature 0,0.7 --top-p P``: one run per temperature, each sent to the server."""

from __future__ import annotations

import json

import pytest

from eyas.cli import main


def test_each_temperature_runs_and_reaches_the_server(http_pair, engine_pair, tmp_path, capsys, monkeypatch):
    spec = engine_pair[0]
    seen, make = [], spec.new_sequence

    def recording(prompt, params):
        seen.append((params.temperature, params.top_p))
        return make(prompt, params)

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
    assert main(["bench", "--url", "http://127.0.0.1:9", *flags]) != 0
    assert words in capsys.readouterr().err
