"""Broken or foreign folders get a message naming the format they looked like and what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import sglang_tensors, write_official_fixture, write_sglang_fixture, write_speculators_fixture

from eyas import formats
from eyas.cli import main
from eyas.errors import EyasError


def _without(name):
    tensors = sglang_tensors()
    del tensors[name]
    return tensors


def _with(name, value):
    return {**sglang_tensors(), name: value}


def _truncate(path, name):
    f = path / name
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return path


CASES = {
    "sglang missing d2t": (
        lambda p: write_sglang_fixture(p, _without("d2t")),
        ["SGLang/SpecForge", "missing d2t", "draft vocabulary of 160 tokens"]),
    "speculators missing d2t": (
        lambda p: write_speculators_fixture(p, _without("d2t")),
        ["speculators (vLLM)", "missing d2t"]),
    "speculators missing a layer tensor, named as speculators names it": (
        lambda p: write_speculators_fixture(p, _without("midlayer.hidden_norm.weight")),
        ["speculators (vLLM)", "missing layers.0.hidden_norm.weight"]),
    "sglang fc of EAGLE-1 width": (
        lambda p: write_sglang_fixture(p, _with("fc.weight", torch.zeros(64, 128))),
        ["SGLang/SpecForge", "fc.weight is 64 x 128", "EAGLE-1/2"]),
    "sglang fc of another target's width": (
        lambda p: write_sglang_fixture(p, _with("fc.weight", torch.zeros(64, 3 * 96))),
        ["SGLang/SpecForge", "fc.weight is 64 x 288", "3 captured layers x target_hidden_size 64 = 192"]),
    "official fc of EAGLE-1 width": (
        lambda p: write_official_fixture(p, _with("fc.weight", torch.zeros(64, 128))),
        ["fc.weight is 128 = 2 x hidden 64", "EAGLE-1/2 draft"]),
    "official fc of a wrong width": (
        lambda p: write_official_fixture(p, _with("fc.weight", torch.zeros(64, 100))),
        ["official EAGLE-3", "fc.weight is 64 x 100", "must be 64 x 192"]),
    "plain Llama model given as the draft": (
        lambda p: write_official_fixture(p, {"layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}),
        ["LlamaForCausalLM and there is no fc.weight", "plain Llama model"]),
    "unknown architecture": (
        lambda p: write_sglang_fixture(p, architectures=["MistralForCausalLM"]),
        ["['MistralForCausalLM']", "LlamaForCausalLMEagle3", "Eagle3Speculator"]),
    "truncated safetensors": (
        lambda p: _truncate(write_sglang_fixture(p), "model.safetensors"),
        ["SGLang/SpecForge", "model.safetensors", "truncated"]),
    "truncated official weights": (
        lambda p: _truncate(write_official_fixture(p), "model.safetensors"),
        ["official EAGLE-3", "model.safetensors", "truncated"]),
    "official pickle .bin without --allow-pickle": (
        lambda p: write_official_fixture(p, weights="pytorch_model.bin"),
        ["pytorch_model.bin is a pickle checkpoint", "--allow-pickle", "safetensors"]),
    "speculators norm_before_residual variant": (
        lambda p: write_speculators_fixture(p, norm_before_residual=True),
        ["speculators (vLLM)", "norm_before_residual=true", "wrong logits"]),
    "speculators non-EAGLE-3 type": (
        lambda p: write_speculators_fixture(p, speculators_model_type="mtp"),
        ["speculators checkpoint of type 'mtp'"]),
    "speculators qwen3 layer": (
        lambda p: write_speculators_fixture(p, transformer_layer_config={"vocab_size": 320}),
        ["speculators (vLLM)", "'qwen3' decoder layer"]),
    "sglang two disagreeing layer sets": (
        lambda p: write_sglang_fixture(p, eagle_aux_hidden_state_layer_ids=[2, 3, 4]),
        ["two different captured layer sets", "[1, 3, 4]"]),
    "sglang lm_head of the wrong vocabulary": (
        lambda p: write_sglang_fixture(p, _with("lm_head.weight", torch.zeros(320, 64))),
        ["lm_head.weight is (320, 64)", "(160, 64)"]),
    "eagle_config not an object": (
        lambda p: write_sglang_fixture(p, eagle_config=[1, 3, 4]),
        ["eagle_config is [1, 3, 4], not an object"]),
    "layer ids that are not numbers": (
        lambda p: write_sglang_fixture(p, eagle_config={"eagle_aux_hidden_state_layer_ids": ["a", 3, 4]}),
        ["eagle_config.eagle_aux_hidden_state_layer_ids is ['a', 3, 4]", "distinct whole numbers"]),
    "layer ids a single number": (
        lambda p: write_sglang_fixture(p, eagle_config={"eagle_aux_hidden_state_layer_ids": 3}),
        ["eagle_aux_hidden_state_layer_ids is 3"]),
    "layer ids empty (SGLang would capture nothing)": (
        lambda p: write_sglang_fixture(p, eagle_config={"eagle_aux_hidden_state_layer_ids": []}),
        ["eagle_aux_hidden_state_layer_ids is []"]),
    "speculators layer ids that are not numbers": (
        lambda p: write_speculators_fixture(p, eagle_aux_hidden_state_layer_ids=[2, "x", 5]),
        ["speculators (vLLM)", "eagle_aux_hidden_state_layer_ids is [2, 'x', 5]"]),
    "unknown activation": (
        lambda p: write_sglang_fixture(p, hidden_act="evil"),
        ["hidden_act 'evil' is no activation"]),
    "layer count that is not a number": (
        lambda p: write_sglang_fixture(p, num_hidden_layers="one"),
        ["num_hidden_layers = 'one'"]),
    "NaN in fc": (
        lambda p: write_sglang_fixture(p, _with("fc.weight", torch.full((64, 192), float("nan")))),
        ["fc.weight holds 12288 NaN or infinite values", "accept length 1.00"]),
    "infinity in a speculators layer tensor, named as speculators names it": (
        lambda p: write_speculators_fixture(p, _with("midlayer.hidden_norm.weight", torch.full((64,), float("inf")))),
        ["layers.0.hidden_norm.weight holds 64 NaN or infinite values"]),
    "eyas draft whose eagle_config was edited away from the layers it was trained on": (
        lambda p: write_sglang_fixture(p, eyas={"aux_layer_ids": [2, 3, 4]}),
        ["trained on the inputs of target layers [2, 3, 4]", "capture [2, 4, 5]"]),
    "no weights": (
        lambda p: (write_sglang_fixture(p), (p / "model.safetensors").unlink(), p)[-1],
        ["SGLang/SpecForge", "holds no weights"]),
    "no config.json": (
        lambda p: (p.mkdir(), p)[-1],
        ["no config.json"]),
    "config.json not an object": (
        lambda p: (p.mkdir(), (p / "config.json").write_text(json.dumps([1, 2])), p)[-1],
        ["not a JSON object"]),
    "a float field written as an integer (transformers' strict config check)": (
        lambda p: write_sglang_fixture(p, rms_norm_eps=1),
        ["SGLang/SpecForge", "cannot be read as a Llama config", "rms_norm_eps"]),
    "an odd head_dim rope cannot rotate": (
        lambda p: write_sglang_fixture(p, head_dim=7),
        ["cannot be read as a Llama config", "head_dim"]),
    "a dtype torch does not have": (
        lambda p: write_sglang_fixture(p, dtype="float8"),
        ["cannot be read as a Llama config", "float8"]),
    "a tensor the draft does not have (read, not only loaded: the doctor and export see it)": (
        lambda p: write_sglang_fixture(p, _with("midlayer.self_attn.q_proj.bias", torch.zeros(64))),
        ["SGLang/SpecForge", "does not have: midlayer.self_attn.q_proj.bias"]),
    "a layer tensor of the wrong shape (read, not only loaded)": (
        lambda p: write_sglang_fixture(p, _with("midlayer.mlp.up_proj.weight", torch.zeros(100, 64))),
        ["midlayer.mlp.up_proj.weight has shape (100, 64), its config implies (128, 64)"]),
    "an integer (quantised) weight would be cast to float silently": (
        lambda p: write_sglang_fixture(p, _with("fc.weight", torch.ones(64, 192, dtype=torch.int8))),
        ["fc.weight is stored as int8", "floating-point"]),
    "d2t stored as floats would be truncated to other ids silently": (
        lambda p: write_sglang_fixture(p, _with("d2t", sglang_tensors()["d2t"].float() + 0.5)),
        ["d2t is stored as bfloat16", "whole numbers"]),
    "a .pth checkpoint is named as a pickle, not reported as no weights": (
        lambda p: _as_pickle(write_sglang_fixture(p), "model.pth"),
        ["model.pth is a pickle checkpoint", "--allow-pickle"]),
    "a .ckpt checkpoint is named as a pickle, not reported as no weights": (
        lambda p: _as_pickle(write_sglang_fixture(p), "draft.ckpt"),
        ["draft.ckpt is a pickle checkpoint", "--allow-pickle"]),
}


def _as_pickle(path, name):
    from safetensors.torch import load_file

    torch.save(load_file(path / "model.safetensors"), path / name)
    (path / "model.safetensors").unlink()
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_folder_message(tmp_path, case):
    make, needles = CASES[case]
    path = make(tmp_path / "draft")
    with pytest.raises(EyasError) as err:
        formats.read_draft(path)
    message = str(err.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert err.value.fix  # every message says how to fix it


def test_cli_prints_message_not_traceback(tmp_path, capsys):
    path = _truncate(write_sglang_fixture(tmp_path / "draft"), "model.safetensors")
    assert main(["export", str(path), "--format", "speculators", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eyas: error: ") and "truncated" in err and "fix:" in err
    assert "Traceback" not in err


def _d2t_without_t2d(edit):
    tensors = _without("t2d")  # SGLang ignores t2d and many SGLang folders leave it out
    tensors["d2t"] = edit(tensors["d2t"].clone())
    return tensors


@pytest.mark.parametrize("edit,needle", [
    (lambda d: (d.__setitem__(-1, 10_000), d)[1], "outside the target vocabulary 0..319"),
    (lambda d: (d.__setitem__(0, -500), d)[1], "to target ids -500"),
    (lambda d: d[:100], "d2t has shape (100,), its config implies (160,)"),
])
def test_a_d2t_without_t2d_that_does_not_fit_is_named_at_load(tmp_path, edit, needle):
    path = write_sglang_fixture(tmp_path / "draft", _d2t_without_t2d(edit))
    with pytest.raises(EyasError) as err:
        formats.load_draft(path, embed_weight=torch.zeros(320, 64))
    assert needle in str(err.value) and "SGLang/SpecForge" in str(err.value) and err.value.fix



def test_top_level_layer_ids_alone_are_the_ones_captured(tmp_path):
    """A draft with only vLLM's top-level eagle_aux_hidden_state_layer_ids (no eagle_config ids): vLLM captures
    those, and eyas took its default instead (and exported a folder SGLang would read the same wrong way)."""
    from eyas.layers import from_sglang

    folder = write_sglang_fixture(tmp_path / "d", eagle_config={"use_aux_hidden_state": True},
                                  eagle_aux_hidden_state_layer_ids=[1, 3, 6])
    config = formats.read_config(folder)
    assert from_sglang(config.eagle_config["eagle_aux_hidden_state_layer_ids"]) == [1, 3, 6]
