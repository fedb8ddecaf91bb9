"""Every command that reads a draft and refuses a pickle names --allow-pickle, and takes it."""

from __future__ import annotations

import json

from interop_helpers import write_official_fixture

from eyas.cli import main


def test_export_of_an_official_pickle_release_takes_the_flag_its_refusal_names(tmp_path, capsys):
    src = write_official_fixture(tmp_path / "official", weights="pytorch_model.bin")
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "a")]) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "b"), "--allow-pickle"]) == 0
    assert (tmp_path / "b" / "model.safetensors").is_file()


def test_doctor_on_an_official_pickle_release_takes_the_flag_its_refusal_names(tmp_path, capsys):
    from helpers import save_tiny_model

    target = save_tiny_model(tmp_path / "target")
    src = write_official_fixture(tmp_path / "official", weights="pytorch_model.bin")
    base = ["doctor", "--draft", str(src), "--target", str(target), "--json"]
    assert main(base) == 1
    fmt = json.loads(capsys.readouterr().out)["checks"][0]
    assert fmt["name"] == "format" and "--allow-pickle" in fmt["fix"]
    main(base + ["--allow-pickle"])
    report = json.loads(capsys.readouterr().out)
    assert report["checks"][0]["status"] == "ok" and report["figures"]["format"] == "eagle3"
