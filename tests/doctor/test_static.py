"""Static doctor: every check, positive and negative, on folders eyas writes and hand-made ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import save_tiny_model, tiny_target
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from eyas import formats
from eyas.cli import main
from eyas.common.training_record import template_sha
from eyas.doctor.static import diagnose
from eyas.formats import write as format_writers
from eyas.models.draft import Eagle3Draft


def row(report, name):
    return next(c for c in report.checks if c.name == name)


def statuses(report) -> dict:
    return {c.name: c.status for c in report.checks}


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(folder: Path, fn) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_healthy_pair_is_all_ok(saved):
    target, draft = saved
    report = diagnose(draft, str(target), "EAGLE3")
    assert report.exit_code == 0, report.to_json()
    assert set(statuses(report).values()) == {"ok"}
    assert list(statuses(report)) == ["format", "algorithm", "fc width", "layers", "vocabulary", "d2t/t2d",
                                      "embeddings", "context", "chat template"]
    assert report.verdict.startswith("ready to serve")


@pytest.mark.parametrize("alg,fix", [("EAGLE", "use --speculative-algorithm EAGLE3"), ("NONE", "EAGLE3"),
                                     ("nextn", "--speculative-algorithm EAGLE3")])  # SGLang runs NEXTN as EAGLE
def test_algorithm_flag(saved, alg, fix):
    target, draft = saved
    report = diagnose(draft, str(target), alg)
    assert report.exit_code == 1 and row(report, "algorithm").status == "problem"
    assert fix in row(report, "algorithm").fix
    assert row(report, "fc width").status == "ok"  # everything else is still checked


def test_aux_capture_switched_off_in_the_config_is_the_silent_failure(saved, tmp_path):
    """SGLang reads eagle_config.use_aux_hidden_state (default true): false captures nothing under EAGLE3."""
    target, draft = saved
    off = edit_config(copy(draft, tmp_path / "off"), lambda c: c["eagle_config"].update(use_aux_hidden_state=False))
    r = diagnose(off, str(target), "EAGLE3")
    assert r.exit_code == 1 and row(r, "algorithm").status == "problem"
    assert "use_aux_hidden_state is false" in row(r, "algorithm").message and "1.00" in row(r, "algorithm").message
    assert "use_aux_hidden_state to true" in row(r, "algorithm").fix


def test_unreadable_folders(saved, tmp_path):
    target, draft = saved
    empty = tmp_path / "empty"
    empty.mkdir()
    assert row(diagnose(empty, str(target)), "format").status == "problem"
    cut = copy(draft, tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    r = diagnose(cut, str(target))
    assert r.exit_code == 1 and "truncated" in row(r, "format").message


@pytest.mark.parametrize("name,value,needle", [
    ("midlayer.self_attn.q_proj.bias", torch.zeros(64), "does not have: midlayer.self_attn.q_proj.bias"),
    ("midlayer.mlp.up_proj.weight", torch.zeros(100, 64), "has shape (100, 64), its config implies (128, 64)"),
    ("fc.weight", torch.ones(64, 192, dtype=torch.int8), "fc.weight is stored as int8"),
])
def test_tensors_that_loading_refuses_are_not_ready(saved, tmp_path, name, value, needle):
    """The doctor said 'ready to serve' for a folder that eyas generate/serve then refused (or, for int8,
    cast to floats silently)."""
    target, draft = saved
    bad = copy(draft, tmp_path / "bad")
    state = load_file(str(bad / "model.safetensors"))
    state[name] = value
    save_file(state, str(bad / "model.safetensors"))
    r = diagnose(bad, str(target))
    assert r.exit_code == 1 and needle in row(r, "format").message and row(r, "format").fix


def test_draft_of_another_target(saved, tmp_path):
    target, _ = saved
    other = tiny_target(seed=1, hidden_size=32)
    Eagle3Draft.for_target(other).save_pretrained(tmp_path / "d")
    r = diagnose(tmp_path / "d", str(target))
    assert row(r, "fc width").status == "problem" and "a target of hidden 32" in row(r, "fc width").message
    assert row(r, "embeddings").status == "problem"


def test_every_hidden_state_concatenated(saved, target, tmp_path):
    Eagle3Draft.for_target(target, aux_layer_ids=list(range(8))).save_pretrained(tmp_path / "d")
    r = diagnose(tmp_path / "d", str(saved[0]))
    assert row(r, "fc width").status == "problem" and "exactly 3" in row(r, "fc width").message


def sglang_copy(draft: Path, out: Path, ids=None) -> Path:
    format_writers.write_sglang(formats.read_draft(draft), out)
    if ids is not None:
        def fn(cfg):  # a foreign draft with these ids: no eyas record of others
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
            cfg.pop("eagle_aux_hidden_state_layer_ids", None)
            cfg.get("eyas_record", {}).pop("aux_layer_ids", None)
        edit_config(out, fn)
    return out


def test_layers_out_of_range(saved, tmp_path):
    target, draft = saved
    r = diagnose(sglang_copy(draft, tmp_path / "s", ids=[1, 3, 40]), str(target))
    assert row(r, "layers").status == "problem" and "[41]" in row(r, "layers").message


def test_layers_of_another_depth_warn(saved, tmp_path):
    target, draft = saved
    r = diagnose(sglang_copy(draft, tmp_path / "s", ids=[1, 4, 6]), str(target))  # eyas [2, 5, 7]: 10 layers
    assert row(r, "layers").status == "warning" and "10-layer" in row(r, "layers").message
    assert r.exit_code == 0


def test_layers_disagree_with_training(saved, tmp_path):
    target, draft = saved
    d = edit_config(copy(draft, tmp_path / "d"),
                    lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]))
    r = diagnose(d, str(target))  # refused as it is read: eyas serve and eyas export would use the edited ids
    assert row(r, "format").status == "problem" and "trained on the inputs of target layers [2, 4, 5]" in \
        row(r, "format").message
    assert "eagle_aux_hidden_state_layer_ids to [1, 3, 4]" in row(r, "format").fix
    d2 = edit_config(copy(draft, tmp_path / "d2"), lambda c: c["eyas"]["target"].update(num_hidden_layers=12))
    assert "12-layer" in row(diagnose(d2, str(target)), "layers").message


def test_an_exported_draft_keeps_its_trained_layers_and_an_edit_shows(saved, tmp_path):
    """An export records the layers the draft was trained on (``eyas_record``): ids edited in the deployed folder,
    both keys alike, are a problem there as on eyas's own folder; an export writes the trained ids where the
    source config names none, and refuses a source whose config names others."""
    target, draft = saved
    out = sglang_copy(draft, tmp_path / "s")
    trained = json.loads((out / "config.json").read_text())["eyas_record"]["aux_layer_ids"]
    assert row(diagnose(out, str(target)), "layers").status == "ok"

    def shift(c):
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in
                                                                 c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        c["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in c["eagle_aux_hidden_state_layer_ids"]]
    edit_config(out, shift)
    r = diagnose(out, str(target))
    assert row(r, "layers").status == "problem" and f"trained on layers {trained}" in row(r, "layers").message
    assert main(["export", str(out), "--format", "speculators", "--out", str(tmp_path / "again")]) == 2
    bare = edit_config(copy(draft, tmp_path / "bare"), lambda c: c.pop("eagle_config"))  # the ids left to a default
    assert main(["export", str(bare), "--format", "sglang", "--out", str(tmp_path / "b")]) == 0
    written = json.loads((tmp_path / "b" / "config.json").read_text())["eagle_config"]
    assert written["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in trained]  # SGLang's ids: one lower


def test_vocabulary_mismatch(saved, tmp_path):
    _, draft = saved
    other = save_tiny_model(tmp_path / "t300", vocab_size=300)
    r = diagnose(draft, str(other))
    assert row(r, "vocabulary").status == "problem" and "320" in row(r, "vocabulary").message


def test_vocab_maps(saved, target, tmp_path):
    Eagle3Draft.for_target(target, draft_vocab_size=200).save_pretrained(tmp_path / "small")
    r = diagnose(tmp_path / "small", str(saved[0]))
    assert row(r, "d2t/t2d").status == "ok" and "200 draft ids" in row(r, "d2t/t2d").message
    state = load_file(str(tmp_path / "small" / "model.safetensors"))
    state["d2t"][1] = -1  # draft id 1 -> target id 0, as draft id 0
    save_file(state, str(tmp_path / "small" / "model.safetensors"))
    r = diagnose(tmp_path / "small", str(saved[0]))
    assert row(r, "d2t/t2d").status == "problem" and "same target id" in row(r, "d2t/t2d").message


def narrow_draft(target, out: Path, ship_embeddings: bool) -> Path:
    cfg = Eagle3Draft.config_for_target(target).to_dict()
    cfg.update(hidden_size=32, head_dim=8, intermediate_size=64)
    draft = Eagle3Draft(LlamaConfig.from_dict(cfg))
    return draft.save_pretrained(out, include_embeddings=ship_embeddings)


def test_embedding_width(saved, target, tmp_path):
    r = diagnose(narrow_draft(target, tmp_path / "shared", False), str(saved[0]))
    assert row(r, "embeddings").status == "problem" and "ship its own" in row(r, "embeddings").fix
    assert row(r, "fc width").status == "ok"  # fc still takes 3 x 64
    r = diagnose(narrow_draft(target, tmp_path / "own", True), str(saved[0]))
    assert row(r, "embeddings").status == "ok" and r.exit_code == 0


def run_folder(tmp_path: Path, draft: Path, template: str, max_length: int = 256) -> Path:
    """The layout `eyas train` leaves: <run>/draft, <run>/recipe.yaml, and the prepared data's meta.json."""
    data = tmp_path / "data"
    data.mkdir(parents=True)
    (data / "meta.json").write_text(json.dumps({"chat": {"template_sha256_16": template_sha(template),
                                                         "thinking": False}}))
    run = tmp_path / "run"
    copy(draft, run / "draft")
    (run / "recipe.yaml").write_text(yaml.safe_dump({"data": {"path": str(data), "max_length": max_length}}))
    return run / "draft"


def test_context(saved, target, tmp_path):
    tf, draft = saved
    short = edit_config(copy(draft, tmp_path / "short"), lambda c: c.update(max_position_embeddings=512))
    r = diagnose(short, str(tf))
    assert row(r, "context").status == "problem" and "--context-length 512" in row(r, "context").fix
    assert row(diagnose(short, str(tf), context_length=512), "context").status == "ok"
    trained = run_folder(tmp_path, draft, target.tokenizer.chat_template, max_length=256)
    r = diagnose(trained, str(tf))
    assert row(r, "context").status == "warning" and "at most 256 tokens" in row(r, "context").message
    assert row(diagnose(trained, str(tf), context_length=256), "context").status == "ok"


def test_chat_template(saved, target, tmp_path):
    tf, draft = saved
    same = run_folder(tmp_path / "a", draft, target.tokenizer.chat_template)
    r = diagnose(same, str(tf))
    assert row(r, "chat template").status == "ok" and "thinking off" in row(r, "chat template").message
    other = run_folder(tmp_path / "b", draft, "{{ messages }}")
    r = diagnose(other, str(tf))
    assert row(r, "chat template").status == "problem" and r.exit_code == 1
    recorded = edit_config(copy(draft, tmp_path / "c"), lambda c: c["eyas"].update(
        training={"max_length": 2048, "chat_template_sha256_16": "0" * 16}))
    assert row(diagnose(recorded, str(tf)), "chat template").status == "problem"


def test_target_without_chat_template(saved, tmp_path):
    tf, draft = saved
    bare = copy(tf, tmp_path / "bare")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        f = bare / name
        if f.is_file() and name.endswith(".json"):
            cfg = json.loads(f.read_text())
            cfg.pop("chat_template", None)
            f.write_text(json.dumps(cfg))
        elif f.is_file():
            f.unlink()
    assert row(diagnose(draft, str(bare)), "chat template").status == "warning"


def test_template_digest_is_the_one_eyas_prepare_records(target):
    from eyas.data.prepare import template_hash

    assert template_sha(target.tokenizer.chat_template) == template_hash(target.tokenizer)


def test_sglang_and_speculators_exports_pass(saved, tmp_path):
    target, draft = saved
    folder = formats.read_draft(draft)
    sgl = format_writers.write_sglang(folder, tmp_path / "sgl")
    spec = format_writers.write_speculators(folder, tmp_path / "spec", verifier=str(target))
    for name, out in (("sglang", sgl), ("speculators", spec)):
        r = diagnose(out, str(target), "EAGLE3")
        assert r.exit_code == 0, (name, r.to_json())
        assert r.figures["format"] == name


def official(draft: Path, out: Path, fc_width: int | None = None) -> Path:
    """A hand-made official EAGLE-3 folder: LlamaForCausalLM config, no layer ids, SGLang tensor names."""
    out.mkdir()
    state = load_file(str(draft / "model.safetensors"))
    state.pop("t2d")
    state.pop("d2t")
    if fc_width is not None:
        state["fc.weight"] = torch.zeros(64, fc_width)
    save_file(state, str(out / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 320,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_official_release_pass_and_eagle1_refused(saved, tmp_path):
    target, draft = saved
    r = diagnose(official(draft, tmp_path / "official"), str(target), "EAGLE3")
    assert r.figures["format"] == "eagle3" and r.exit_code == 0, r.to_json()
    assert "not written" in row(r, "layers").message
    r = diagnose(official(draft, tmp_path / "eagle1", fc_width=128), str(target))
    assert row(r, "format").status == "problem" and "EAGLE-1/2" in row(r, "format").message


def test_cli_json_and_exit_codes(saved, capsys):
    target, draft = saved
    assert main(["doctor", "--draft", str(draft), "--target", str(target), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["exit_code"] == 0 and len(out["checks"]) == 9
    assert main(["doctor", "--draft", str(draft), "--target", str(target), "--speculative-algorithm", "EAGLE"]) == 1
    text = capsys.readouterr().out
    assert "PROBLEM" in text and "fix: use --speculative-algorithm EAGLE3" in text and "exit status 1" in text


def test_recipe_named_in_the_config(saved, tmp_path):
    """The shipped draft records ``eyas.recipe`` relative to the repository it was trained in."""
    tf, draft = saved
    repo = tmp_path / "repo"
    (repo / "recipes").mkdir(parents=True)
    (repo / "recipes" / "r.yaml").write_text(yaml.safe_dump({"data": {"path": "data/x", "max_length": 128}}))
    d = edit_config(copy(draft, repo / "src" / "pkg" / "drafts" / "d"),
                    lambda c: c["eyas"].update(recipe="recipes/r.yaml"))
    r = diagnose(d, str(tf))
    assert row(r, "context").status == "warning" and "at most 128 tokens" in row(r, "context").message
    assert row(r, "chat template").status == "ok" and "meta.json is not here" in row(r, "chat template").message


def test_a_speculators_folder_silent_on_norm_before_residual_is_a_warning(saved, tmp_path):
    """vLLM reads an absent norm_before_residual as true, eyas and speculators as false: the doctor says so."""
    target, draft = saved
    out = format_writers.write_speculators(formats.read_draft(draft), tmp_path / "spec")
    assert "norm_before_residual" not in statuses(diagnose(out, str(target), "EAGLE3"))  # written by eyas: false
    edit_config(out, lambda c: c.pop("norm_before_residual"))
    report = diagnose(out, str(target), "EAGLE3")
    assert row(report, "norm_before_residual").status == "warning" and report.exit_code == 0
    assert '"norm_before_residual": false' in row(report, "norm_before_residual").fix


def test_without_target_the_draft_is_checked_against_the_target_it_records(saved, tmp_path, capsys):
    """``eyas doctor --draft D`` alone used to check any draft against SmolLM2: a good draft of another target
    read as NOT SERVABLE. It takes the target the draft records, and says so where that is not here."""
    target, draft = saved
    recorded = copy(draft, tmp_path / "recorded")
    edit_config(recorded, lambda c: c.setdefault("eyas", {}).setdefault("target", {}).update(name=str(target)))
    assert main(["doctor", "--draft", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert f"for target {target}" in out and "ready to serve" in out
    away = edit_config(copy(draft, tmp_path / "away"),
                       lambda c: c.setdefault("eyas", {}).setdefault("target", {}).update(name="/no/such/target"))
    assert main(["doctor", "--draft", str(away)]) == 2
    err = capsys.readouterr().err
    assert "records its target as '/no/such/target', which is not on this machine" in err
    assert "fix: pass --target PATH" in err
    assert main(["doctor", "--draft", str(away), "--target", str(target)]) == 0  # a given target wins


def test_a_draft_records_its_target_folder_absolute(saved, tmp_path, monkeypatch):
    """Training from ``--model ../t`` recorded '../t', which names another folder from anywhere else."""
    from eyas.models.loading import load_target

    target, _ = saved
    monkeypatch.chdir(target.parent)
    config = Eagle3Draft.config_for_target(load_target(target.name))
    assert config.eyas["target"]["name"] == str(target.resolve())


def test_a_pickled_target_serve_would_refuse_is_not_ready(saved, tmp_path):
    """A target folder with pickled weights only was 'ready to serve' (the doctor read its config alone) while eyas
    serve refused it. One without weights at all is checked from its config (large targets: test_families)."""
    target, draft = saved
    pickled = copy(target, tmp_path / "pickled")
    (pickled / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, pickled / "pytorch_model.bin")
    report = diagnose(draft, str(pickled), "EAGLE3")
    assert "is a pickle checkpoint" in row(report, "target").message and "--allow-pickle" in row(report, "target").fix
    report = diagnose(draft, str(pickled), "EAGLE3", allow_pickle=True)  # trusted: the pair is checked as usual
    assert "target" not in statuses(report) and report.exit_code == 0
