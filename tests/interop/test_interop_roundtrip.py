"""eyas -> sglang -> eyas and eyas -> speculators -> eyas: identical tensors, identical logits."""

from __future__ import annotations

import json
import re

import pytest
import torch
from interop_helpers import DRAFT_VOCAB, WRITERS, sglang_tensors
from safetensors import safe_open

from eyas import formats
from eyas.cli import main
from eyas.formats import names as format_names
from eyas.formats import write as format_writers
from eyas.models.draft import Eagle3Draft

AUX = [1, 3, 6]  # eyas ids (inputs of decoder layers 1, 3, 6), deliberately not the default


@pytest.fixture(scope="module")
def eyas_dir(target, tmp_path_factory):
    draft = Eagle3Draft.for_target(target, draft_vocab_size=DRAFT_VOCAB, aux_layer_ids=AUX)
    state = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in sglang_tensors(seed=5).items()}
    draft.load_state_dict(state, strict=False)
    return draft.save_pretrained(tmp_path_factory.mktemp("src") / "eyas", dtype=torch.float32)


def _file_tensors(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _logits(draft, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 320, (2, 9), generator=g)
    aux = torch.randn(2, 9, 3 * 64, generator=g, dtype=torch.float64)
    pos = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        return draft(ids, aux, pos)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_round_trip(target, eyas_dir, tmp_path, fmt):
    src = formats.read_draft(eyas_dir)
    assert src.format == format_names.EYAS and src.aux_layer_ids == AUX
    out = format_writers.WRITERS[fmt](src, tmp_path / fmt)
    back = formats.read_draft(out)
    assert back.format == fmt and back.aux_layer_ids == AUX
    assert set(back.state) == set(src.state)
    for k, v in src.state.items():
        assert back.state[k].dtype == v.dtype and torch.equal(back.state[k], v), k
    embed = target.embed_tokens.weight
    a, b = (formats.build_draft(f, embed, dtype=torch.float64) for f in (src, back))
    (la, ha), (lb, hb) = _logits(a), _logits(b)
    assert torch.equal(la, lb) and torch.equal(ha, hb)
    again = formats.read_draft(b.save_pretrained(tmp_path / "again", dtype=torch.float32))  # back to eyas
    assert again.format == format_names.EYAS and again.aux_layer_ids == AUX
    assert all(torch.equal(again.state[k], v) for k, v in src.state.items()) and set(again.state) == set(src.state)


def test_sglang_export_layout(eyas_dir, tmp_path):
    out = format_writers.write_sglang(formats.read_draft(eyas_dir), tmp_path / "sg")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and "eyas" not in config
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 2, 5], "use_aux_hidden_state": True}
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX  # what vLLM reads, in its own indexing
    shape = (config["num_hidden_layers"], config["draft_vocab_size"], config["target_hidden_size"])
    assert shape == (1, DRAFT_VOCAB, 64)
    assert config["rope_theta"] == 10000.0  # for transformers-4 readers
    tensors = _file_tensors(out)
    assert set(tensors) == set(sglang_tensors())  # fc, midlayer.*, norm, lm_head, d2t, t2d; no embeddings
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


def test_speculators_export_layout(eyas_dir, tmp_path):
    out = format_writers.write_speculators(formats.read_draft(eyas_dir), tmp_path / "sp")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Eagle3Speculator"] and config["speculators_model_type"] == "eagle3"
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["verifier"] == {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}
    layer = config["transformer_layer_config"]
    shape = (layer["model_type"], layer["vocab_size"], layer["hidden_size"], layer["num_hidden_layers"])
    assert shape == ("llama", 320, 64, 1)
    assert config["norm_before_residual"] is False  # explicit: vLLM assumes True when absent
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX
    assert (config["draft_vocab_size"], config["target_hidden_size"]) == (DRAFT_VOCAB, 64)
    names = set(_file_tensors(out))
    assert "layers.0.hidden_norm.weight" in names and not any(n.startswith("midlayer.") for n in names)


@pytest.mark.parametrize("source", ["sglang", "speculators", "eagle3"])
@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_any_format_exports_to_any(tmp_path, source, fmt):
    src = formats.read_draft(WRITERS[source](tmp_path / source))
    back = formats.read_draft(format_writers.WRITERS[fmt](src, tmp_path / fmt))
    assert back.aux_layer_ids == src.aux_layer_ids
    assert all(torch.equal(back.state[k], v) for k, v in src.state.items()) and set(back.state) == set(src.state)


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_export_command_prints_eagle3_launch_lines(eyas_dir, tmp_path, capsys, fmt):
    out = tmp_path / "out"
    assert main(["export", str(eyas_dir), "--format", fmt, "--out", str(out), "--target", "org/tiny-llama"]) == 0
    printed = capsys.readouterr().out
    assert formats.detect_format(out) == fmt
    algorithms = re.findall(r"--speculative-algorithm (\S+)", printed)
    methods = re.findall(r'"method": "(\w+)"', printed)
    assert methods == ["eagle3"] and set(algorithms) <= {"EAGLE3"}
    assert bool(algorithms) == (fmt == "sglang")  # SGLang does not read speculators folders
    assert "vllm serve org/tiny-llama --speculative-config" in printed
    if fmt == "sglang":
        launch = ("--model-path org/tiny-llama --speculative-algorithm EAGLE3 "
                  f"--speculative-draft-model-path {out.resolve()}")
        assert launch in printed
    assert main(["export", str(eyas_dir), "--format", fmt, "--out", str(out)]) == 2  # never overwrites
    # --include-embeddings of a draft that shares its target's: read from the target, checked against the draft
    from helpers import save_tiny_model, tiny_target

    target_dir = save_tiny_model(tmp_path / "target")
    assert main(["export", str(eyas_dir), "--format", fmt, "--out", str(tmp_path / "b"), "--include-embeddings",
                 "--target", str(target_dir)]) == 0
    embed = formats.read_draft(tmp_path / "b").state["embed_tokens.weight"]
    assert torch.equal(embed.float(), tiny_target(dtype=torch.float32).embed_tokens.weight.float())
    wide = save_tiny_model(tmp_path / "wide", vocab_size=400)
    assert main(["export", str(eyas_dir), "--format", fmt, "--out", str(tmp_path / "c"), "--include-embeddings",
                 "--target", str(wide)]) == 2
    assert "vocab_size 400" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["sglang", "speculators"])
def test_an_export_keeps_what_eyas_recorded_of_target_and_training(eyas_dir, tmp_path, fmt):
    """The folder users deploy is the exported one: it keeps the training record (``eyas_record``, a key SGLang
    and vLLM ignore), so ``eyas doctor`` still compares the template and depth there (once it said "not
    recorded; cannot compare" and passed a mismatch it flagged on the source folder)."""
    import json
    import shutil

    from eyas.common.training_record import read_record

    src_dir = tmp_path / "src"
    shutil.copytree(eyas_dir, src_dir)
    config = json.loads((src_dir / "config.json").read_text())
    config["eyas"]["training"] = {"chat_template_sha256_16": "0123456789abcdef", "max_length": 512, "thinking": None}
    (src_dir / "config.json").write_text(json.dumps(config))
    out = format_writers.WRITERS[fmt](formats.read_draft(src_dir), tmp_path / fmt)
    assert formats.detect_format(out) == fmt  # still the foreign layout, not eyas's own
    back = formats.read_config(out)
    record = read_record(out, back)
    assert (record.template_sha, record.max_length) == ("0123456789abcdef", 512)
    assert back.eyas["target"] == config["eyas"]["target"]
