"""benchmarks/serve_overhead.py: the real server with its device work replaced by sleeps, loaded over HTTP."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serve_overhead_measures_each_level_against_the_step(folders, tmp_path):
    spec = importlib.util.spec_from_file_location("serve_overhead", ROOT / "benchmarks" / "serve_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "overhead.json"
    assert module.main(["--model-path", folders[0], "--clients", "1,3", "--min-requests", "3", "--max-tokens", "8",
                        "--step-ms", "2", "--prompts", "code", "--log", str(tmp_path / "server.log"),
                        "--out", str(out)]) == 0
    levels = json.loads(out.read_text())["levels"]
    assert [lv["clients"] for lv in levels] == [1, 3]
    for lv in levels:
        assert lv["errors"] == [] and lv["requests"] == 3 and lv["output_tokens"] == 8 * 3
        assert lv["ideal_tokens_per_s"] == lv["clients"] * 500 and 0 < lv["tokens_per_s"] < lv["ideal_tokens_per_s"]
