"""``eyas tune``: a measured sweep over batch sizes and tree settings, and its recommendation."""

from __future__ import annotations

import json

import pytest

from eyas.bench.tune import parse_candidate, recommend_schedule, sweep
from eyas.cli import main
from eyas.config import SpecConfig, parse_schedule
from eyas.errors import EyasError


def test_sweep_measures_every_candidate_at_every_batch_size(target, draft, monkeypatch):
    """Every batch size runs the same prompts (repeated to a multiple of the largest batch), that
    many at a time, twice (the first pass captures the graphs)."""
    from eyas.engine.engine import Engine

    batches = []
    generate = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, ps, params=None: (
        batches.append((self.config.max_batch, len(ps), self.spec.speculative)), generate(self, ps, params))[1])
    prompts = [[65, 66, 67], [70, 71], [80, 81, 82, 83], [90, 91]]
    cands = [parse_candidate("3,1,4"), parse_candidate("2,2,4")]
    rows = sweep(target, draft, prompts, [1, 3], cands, new_tokens=8, log=lambda s: None)
    assert [r["batch"] for r in rows] == [1, 3]
    # 4 prompts repeated to 6 (a multiple of 3); one at a time, then three: twice each (the first pass warms)
    assert batches == ([(1, 1, False)] * 12 + [(1, 1, True)] * 24 + [(3, 3, False)] * 4 + [(3, 3, True)] * 8)
    for r in rows:
        assert r["baseline"]["prompts"] == 6 and all(c["prompts"] == 6 for c in r["candidates"])
        assert r["baseline"]["tok_s"] > 0 and [c["spec"] for c in r["candidates"]] == ["3,1,4", "2,2,4"]
        assert all(c["tau"] >= 1.0 and c["speedup"] == pytest.approx(c["tok_s"] / r["baseline"]["tok_s"], rel=1e-2)
                   for c in r["candidates"])
        paying = [c for c in r["candidates"] if c["tau"] > 1.0 and c["tok_s"] > r["baseline"]["tok_s"]]
        assert r["best"] == (max(paying, key=lambda c: c["tok_s"])["spec"] if paying else "NONE")


def test_a_draft_that_accepts_nothing_is_never_recommended(target, draft, monkeypatch):
    """tau 1.00 cannot pay: a timing that says it does (noise) recommends no speculation."""
    from eyas.bench import tune

    def faked(engine, prompts, new_tokens, batch):  # speculation "faster" but accepting nothing
        return {"tok_s": 200.0 if engine.spec.speculative else 100.0, "seconds": 1.0, "prompts": len(prompts),
                **({"tau": 1.0} if engine.spec.speculative else {})}
    monkeypatch.setattr(tune, "measure", faked)
    rows = sweep(target, draft, [[65, 66]], [1], [parse_candidate("3,1,4")], new_tokens=2, log=lambda s: None)
    assert rows[0]["best"] == "NONE" and rows[0]["best_speedup"] == 1.0


def test_cli_prints_flags_per_batch_size_and_writes_json(folders, tmp_path, capsys):
    t, d = folders
    out = tmp_path / "tune.json"
    rc = main(["tune", "--model-path", t, "--speculative-draft-model-path", d, "--dtype", "float64",
               "--batch-sizes", "1,2", "--candidates", "3,1,4", "--num-prompts", "3", "--max-new-tokens", "6",
               "--json-out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "batch   1: --speculative-" in text and "batch   2: --speculative-" in text
    data = json.loads(out.read_text())
    assert [r["batch"] for r in data["batches"]] == [1, 2]
    assert f"all batch sizes: --speculative-batch-schedule '{data['schedule']}'" in text if data["schedule"] else \
        "all batch sizes: --speculative-algorithm NONE" in text


def test_recommended_schedule_is_the_flag_syntax_with_equal_neighbours_merged():
    rows = [{"batch": b, "best": best} for b, best in
            [(16, "3,1,4"), (1, "6,8,48"), (4, "3,1,4"), (32, "NONE"), (64, "NONE")]]
    text = recommend_schedule(rows)
    assert text == "1:6,8,48;16:3,1,4;64:0"
    SpecConfig("EAGLE3", schedule=parse_schedule(text))  # pastes back as a valid flag
    assert recommend_schedule([{"batch": 1, "best": "NONE"}]) is None


def test_bad_candidates_are_refused(folders, capsys):
    with pytest.raises(EyasError, match="num_steps,eagle_topk,num_draft_tokens"):
        parse_candidate("5x1")
    t, d = folders
    # a tree that cannot be built from these settings fails the engine's own check, by name
    assert main(["tune", "--model-path", t, "--speculative-draft-model-path", d, "--dtype", "float64",
                 "--candidates", "2,1,9"]) == 2
    assert "--speculative-num-draft-tokens 9 is larger than the tree can hold" in capsys.readouterr().err


def test_no_prompts_is_refused_before_loading(capsys):
    assert main(["tune", "--model-path", "/nonexistent", "--num-prompts", "0"]) == 2
    assert "--num-prompts must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("value, bad", [("1,,2", "''"), ("1,0", "'0'"), ("-4", "'-4'"), ("1,x", "'x'")])
def test_batch_sizes_that_are_not_positive_integers_are_refused_at_parsing(value, bad, capsys):
    """An empty item (1,,2) was skipped without a word."""
    with pytest.raises(SystemExit) as e:
        main(["tune", "--model-path", "/nonexistent", "--batch-sizes", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument --batch-sizes: {value!r} is not a list of positive integers" in err
    assert f"({bad} is not one)" in err
