"""A crafted or corrupted training record (config.json ``eyas``) is a warning naming the field, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from eyas.common.training_record import read_record, record_of
from eyas.doctor.static import diagnose
from eyas.formats import names

CASES = [  # (edit of config.json's eyas dict, field named in the warning)
    (lambda e: e.__setitem__("training", [1]), "eyas.training"),
    (lambda e: e.__setitem__("training", "x"), "eyas.training"),
    (lambda e: e.__setitem__("training", {"max_length": "2048"}), "eyas.training.max_length"),
    (lambda e: e.__setitem__("training", {"max_length": -5}), "eyas.training.max_length"),
    (lambda e: e.__setitem__("training", {"max_length": None}), "eyas.training.max_length"),
    (lambda e: e.__setitem__("training", {"chat_template_sha256_16": [1]}), "eyas.training.chat_template_sha256_16"),
    (lambda e: e.__setitem__("training", {"thinking": "yes"}), "eyas.training.thinking"),
    (lambda e: e.__setitem__("recipe", ["a"]), "eyas.recipe"),
    (lambda e: e.__setitem__("recipe", 5), "eyas.recipe"),
    (lambda e: e.__setitem__("target", [1]), "eyas.target"),
    (lambda e: e.__setitem__("target", "tiny"), "eyas.target"),
    (lambda e: e["target"].__setitem__("num_hidden_layers", "eight"), "eyas.target.num_hidden_layers"),
    (lambda e: e["target"].__setitem__("num_hidden_layers", -8), "eyas.target.num_hidden_layers"),
    (lambda e: e["target"].__setitem__("name", ["x"]), "eyas.target.name"),
    (lambda e: e["target"].__setitem__("architecture", {"a": 1}), "eyas.target.architecture"),
    (lambda e: e.__setitem__("verifier", "x"), "eyas.verifier"),
    (lambda e: e.__setitem__("verifier", {"name_or_path": 3, "architectures": "Llama"}), "eyas.verifier"),
    (lambda e: e.__setitem__("training", {"max_length": {"a": [[[[[[1]]]]]]}}), "eyas.training.max_length"),
]


@pytest.mark.parametrize("edit,field", CASES, ids=[c[1] + f"-{i}" for i, c in enumerate(CASES)])
def test_unreadable_record_field_is_a_warning(saved, tmp_path, edit, field):
    target, draft = saved
    folder = tmp_path / "draft"
    shutil.copytree(draft, folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg["eyas"])
    (folder / "config.json").write_text(json.dumps(cfg))
    report = diagnose(folder, str(target), "EAGLE3")  # a traceback here was the defect
    by_name = {c.name: c for c in report.checks}
    assert "training record" in by_name, report.to_json()
    warning = by_name["training record"]
    assert warning.status == "warning" and f"config.json {field}" in warning.message and "expected" in warning.message
    assert report.exit_code == 0, report.to_json()  # the rest of the checks went on, and found nothing wrong
    assert {"format", "layers", "context", "chat template"} <= set(by_name)


@pytest.mark.parametrize("meta", [[1, 2], "x", 3, {"training": None, "target": None}])
def test_record_readers_take_any_json(meta):
    config = SimpleNamespace(eyas=meta)
    rec = read_record(".", config)
    assert rec.max_length is None and rec.template_sha is None
    assert names.eyas_target(config) == (None, ["LlamaForCausalLM"])
    assert isinstance(record_of(config)[0], dict)


def test_wellformed_record_gives_no_warning_and_keeps_its_values():
    config = SimpleNamespace(eyas={"training": {"max_length": 2048, "chat_template_sha256_16": "ab" * 8,
                                                "thinking": False}, "target": {"name": "t", "num_hidden_layers": 8}})
    rec = read_record(".", config)
    assert (rec.max_length, rec.template_sha, rec.thinking, rec.warnings) == (2048, "ab" * 8, False, [])
    assert names.eyas_target(config) == ("t", ["LlamaForCausalLM"])


def test_broken_recipe_and_meta_are_warnings(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text(json.dumps({"chat": {"template_sha256_16": 7, "thinking": "no"}}))
    (tmp_path / "recipe.yaml").write_text("data:\n  max_length: long\n  path: data\n")
    rec = read_record(tmp_path / "draft", SimpleNamespace(eyas={}))
    assert (rec.max_length, rec.template_sha, rec.thinking) == (None, None, None)
    fields = [w.split(" is ")[0].rsplit(" ", 1)[-1] for w in rec.warnings]
    assert fields == ["data.max_length", "chat.template_sha256_16", "chat.thinking"], rec.warnings


def test_config_nested_too_deep_is_refused_plainly(saved, tmp_path):
    target, draft = saved
    folder = tmp_path / "draft"
    shutil.copytree(draft, folder)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.rstrip()[:-1] + ', "junk": ' + "[" * 100000 + "]" * 100000 + "}")
    report = diagnose(folder, str(target))
    assert report.checks[0].name == "format" and report.checks[0].status == "problem"
    assert "nests" in report.checks[0].message
