"""A target folder whose shards repeat a tensor, whose weights hold tensors its config does not declare, or whose
rotary scaling factor is not positive is refused with a message; the extra tensors real checkpoints carry load."""

import json
import shutil

import pytest
import torch
from helpers import save_tiny_model
from safetensors.torch import load_file, save_file

from eyas.errors import EyasError
from eyas.models.loading import load_target


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("t") / "m")


def copy_with(src, dst, tensors: dict[str, dict], index: bool = False):
    """``src`` with its weights replaced by ``tensors`` (file name -> tensors), indexed where ``index``."""
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    for name, state in tensors.items():
        save_file(state, str(dst / name), metadata={"format": "pt"})
    if index:
        weight_map = {k: name for name, state in tensors.items() for k in state}
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.mark.parametrize("index", [True, False])
def test_a_tensor_in_two_shards_is_refused(tiny_folder, tmp_path, index):
    state = load_file(str(tiny_folder / "model.safetensors"))
    other = {"model.norm.weight": torch.full_like(state["model.norm.weight"], 7.0)}
    path = copy_with(tiny_folder, tmp_path / "dup", {"model-00001-of-00002.safetensors": state,
                                                     "model-00002-of-00002.safetensors": other}, index)
    with pytest.raises(EyasError, match="model.norm.weight .model-00001-of-00002.safetensors and "
                                        "model-00002-of-00002.safetensors.") as e:
        load_target(str(path), dtype="float32")
    assert "last" in e.value.problem and "exactly one shard" in e.value.fix


def test_a_tensor_the_config_does_not_declare_is_refused(tiny_folder, tmp_path):
    state = load_file(str(tiny_folder / "model.safetensors"))
    state["model.layers.8.mlp.up_proj.weight"] = torch.zeros(128, 64)  # a ninth layer; config.json says 8
    path = copy_with(tiny_folder, tmp_path / "extra", {"model.safetensors": state})
    with pytest.raises(EyasError, match="does not declare .model.layers.8.mlp.up_proj.weight") as e:
        load_target(str(path), dtype="float32")
    assert "config.json the weights were saved with" in e.value.fix


def test_the_extra_tensors_real_checkpoints_carry_still_load(tiny_folder, tmp_path):
    state = load_file(str(tiny_folder / "model.safetensors"))
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # older Llama exports
    load_target(str(copy_with(tiny_folder, tmp_path / "inv", {"model.safetensors": state})), dtype="float32")
    tied = save_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    state = load_file(str(tied / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()  # written beside tied embeddings
    save_file(state, str(tied / "model.safetensors"), metadata={"format": "pt"})
    load_target(str(tied), dtype="float32")


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": -4.0}, {"rope_type": "dynamic", "factor": 0},
                                  {"rope_type": "linear", "factor": "4"}])
def test_a_rope_factor_that_is_not_positive_is_refused(tiny_folder, tmp_path, rope):
    path = tmp_path / "rope"
    shutil.copytree(tiny_folder, path)
    config = json.loads((path / "config.json").read_text())
    config["rope_scaling"] = rope
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EyasError, match=r"rope_scaling.factor = .*positive number") as e:
        load_target(str(path), dtype="float32")
    assert "rope_scaling" in e.value.fix
