"""A draft whose weights are stored in FP8 (a quantised export) is refused by name, not loaded nor a traceback."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.errors import EyasError
from eyas.formats import load_draft, read_draft

FP8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None]


@pytest.fixture(scope="module")
def saved_draft(draft, tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8") / "draft"
    draft.save_pretrained(path)
    return path


def _with(saved_draft, tmp_path, edit):
    folder = tmp_path / "draft"
    shutil.copytree(saved_draft, folder)
    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("name", ["fc.weight", "midlayer.self_attn.q_proj.weight"])
def test_fp8_tensor_is_named_with_its_dtype_and_fix(saved_draft, tmp_path, target, dtype, name):
    folder = _with(saved_draft, tmp_path, lambda s: s.__setitem__(name, s[name].float().to(dtype)))
    kind = str(dtype).replace("torch.", "")
    for load in (lambda: read_draft(folder),
                 lambda: load_draft(folder, embed_weight=target.embed_tokens.weight, dtype=torch.bfloat16)):
        with pytest.raises(EyasError) as e:
            load()
        assert f"{name} is stored as {kind}" in e.value.problem and "no scale tensors" in e.value.problem
        assert "bfloat16, float16 or float32" in e.value.fix


def test_fp8_with_scales_is_a_quantised_checkpoint(saved_draft, tmp_path):
    def quantise(s):
        s["fc.weight"] = s["fc.weight"].float().to(FP8[0])
        s["fc.weight_scale"] = torch.ones(())
    folder = _with(saved_draft, tmp_path, quantise)
    with pytest.raises(EyasError) as e:
        read_draft(folder)
    assert "quantised checkpoint" in e.value.problem and "fc.weight_scale" in e.value.problem
    assert "unquantised" in e.value.fix


def test_doctor_reports_fp8_as_a_format_problem(saved_draft, tmp_path, target):
    from eyas.doctor.static import diagnose

    folder = _with(saved_draft, tmp_path, lambda s: s.__setitem__("fc.weight", s["fc.weight"].float().to(FP8[0])))
    tfolder = tmp_path / "target"
    target.model.save_pretrained(tfolder)
    target.tokenizer.save_pretrained(tfolder)
    report = diagnose(folder, str(tfolder))
    assert report.checks[0].status == "problem" and "float8_e4m3fn" in report.checks[0].message
