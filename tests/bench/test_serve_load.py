"""benchmarks/serve_load.py against two tiny servers on loopback: a few requests, the JSON it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serve_load_reports_each_level_with_tau_and_the_in_process_figure(http_pair, folders, tmp_path):
    spec_url, base_url = http_pair
    target, draft = folders
    out = tmp_path / "load.json"
    code = load_script().main([
        "--url", spec_url, "--baseline-url", base_url, "--clients", "1,3", "--temperatures", "0,0.7",
        "--requests-per-client", "1", "--max-tokens", "6", "--prompts", "code", "--out", str(out),
        "--in-process", "--model-path", target, "--speculative-draft-model-path", draft, "--dtype", "float64",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"])
    assert code == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert [(r["server"], r["temperature"], r["clients"]) for r in runs] == [
        (s, t, c) for s in ("EAGLE3", "NONE") for t in (0.0, 0.7) for c in (1, 3)]
    for r in runs:
        assert r["errors"] == [] and r["requests"] == r["clients"]
        assert r["output_tokens"] == 6 * r["clients"]  # ignore_eos: every request asks the same work
        assert abs(r["tokens_per_s"] - r["output_tokens"] / r["seconds"]) <= 0.01 * r["tokens_per_s"]
        for key in ("ttft_s", "itl_s", "tpot_s"):
            p = r[key]  # itl_s: None when every answer came as one chunk of text
            assert p is None if key == "itl_s" and p is None else 0 < p["p50"] <= p["p90"] <= p["p99"]
        inproc = r["in_process"]
        assert inproc["output_tokens"] == r["output_tokens"] and inproc["tokens_per_s"] > 0
        assert r["served_over_in_process"] == round(r["tokens_per_s"] / inproc["tokens_per_s"], 3)
        if r["server"] == "EAGLE3":  # counters over the level: 1 <= tau <= the tokens a step can verify
            assert 1.0 <= r["tau"] <= 4 and 1.0 <= inproc["tau"] <= 4
        else:
            assert r["tau"] is None and inproc["tau"] is None
    assert any(r["itl_s"] for r in runs)
    assert data["settings"]["max_tokens"] == 6 and data["settings"]["clients"] == "1,3"
