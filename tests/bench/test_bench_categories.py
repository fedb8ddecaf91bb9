"""``eyas bench --url``: tau per prompt category from each response's usage, consistent with the overall tau."""

from __future__ import annotations

import json

import pytest

from eyas.cli import main


def weighted_tau(rows: dict) -> float:
    """The overall tau from the categories: their tau weighted by their verify steps."""
    steps = sum(r["drafts"] for r in rows.values())
    return sum(r["accept_length"] * r["drafts"] for r in rows.values()) / steps


def test_served_bench_reports_tau_per_builtin_set(http_pair, tmp_path, capsys):
    rc = main(["bench", "--url", http_pair[0], "--no-baseline", "--prompts", "all", "--num-prompts", "6",
               "--max-tokens", "8", "--concurrency", "2", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    spec = json.loads((tmp_path / "bench.json").read_text())["levels"][0]["speculative"]
    rows = spec["per_category"]
    assert list(rows) == ["chat", "code", "reasoning"] and all(r["prompts"] == 2 for r in rows.values())
    for r in rows.values():  # eyas eval's shape and definition: tau = 1 + accepted / steps
        assert set(r) == {"prompts", "drafts", "accepted_tokens", "accept_length"} and r["drafts"] > 0
        assert r["accept_length"] == pytest.approx(1 + r["accepted_tokens"] / r["drafts"], abs=1e-4)
    # the same steps the server's /metrics counted over the run, and the same overall tau
    acc = spec["acceptance"]
    assert sum(r["drafts"] for r in rows.values()) == acc["verify_steps"]
    assert weighted_tau(rows) == pytest.approx(acc["tau"], abs=1e-3)
    per_request = spec["per_request"]
    for name, r in rows.items():
        mine = [q for q in per_request if q["category"] == name]
        assert sum(q["verify_steps"] for q in mine) == r["drafts"]
        assert sum(q["accepted"] for q in mine) == r["accepted_tokens"]
    assert "tau per category, T=0 c=2:" in out and "reasoning" in out.split("tau per category")[1]


def test_served_bench_groups_a_jsonl_file_by_its_category_field(http_pair, tmp_path, capsys):
    lines = [{"prompt": "Add 2 and 3.", "category": "math/gsm8k"}, {"prompt": "What is 7 times 8?", "category": "math"},
             {"prompt": "Write a Python loop.", "category": "code"}, {"prompt": "Say hello."}]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc = main(["bench", "--url", http_pair[0], "--no-baseline", "--prompts", str(path), "--max-tokens", "6",
               "--no-plots", "--json", "--out", str(tmp_path / "o")])
    assert rc == 0
    spec = json.loads(capsys.readouterr().out)["levels"][0]["speculative"]
    rows = spec["per_category"]
    assert {g: r["prompts"] for g, r in rows.items()} == {"(none)": 1, "code": 1, "math": 2}
    assert weighted_tau(rows) == pytest.approx(spec["acceptance"]["tau"], abs=1e-3)


def test_a_baseline_server_has_no_categories_to_report(http_pair, tmp_path, capsys):
    rc = main(["bench", "--url", http_pair[0], "--baseline-url", http_pair[1], "--prompts", "code",
               "--num-prompts", "1", "--max-tokens", "4", "--no-plots", "--json", "--out", str(tmp_path)])
    assert rc == 0
    level = json.loads(capsys.readouterr().out)["levels"][0]
    assert level["baseline"]["per_category"] is None and list(level["speculative"]["per_category"]) == ["code"]
