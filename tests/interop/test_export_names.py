"""``eyas export`` names the target as SGLang and vLLM can resolve it: the Hugging Face name of the built-in target,
a local path made absolute; never the eyas-only ``smollm2-135m-instruct``, in the launch lines or in speculators'
verifier."""

from __future__ import annotations

import json
import re

import pytest

from eyas.cli import main

HF = "HuggingFaceTB/SmolLM2-135M-Instruct"


def model_names(printed: str) -> set[str]:
    """The targets the printed launch lines serve."""
    return set(re.findall(r"--model-path (\S+)", printed) + re.findall(r"vllm serve (\S+)", printed))


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_the_shipped_draft_exports_with_the_hugging_face_name(tmp_path, capsys, fmt):
    out = tmp_path / fmt
    assert main(["export", "smollm2-135m-instruct-eagle3", "--format", fmt, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    names = model_names(printed)
    assert HF in names and "smollm2-135m-instruct" not in names, printed
    assert "TARGET" not in printed
    if fmt == "speculators":
        verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
        assert verifier["name_or_path"] == HF


def test_a_local_target_is_named_by_its_absolute_path(tmp_path, capsys, monkeypatch):
    (tmp_path / "my-target").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["export", "smollm2-135m-instruct-eagle3", "--format", "speculators", "--out", str(out),
                 "--target", "./my-target"]) == 0
    names = model_names(capsys.readouterr().out)
    assert str(tmp_path / "my-target") in names and "./my-target" not in names
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(tmp_path / "my-target")
