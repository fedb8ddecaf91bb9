"""eyas train takes the opt-in flags its refusals name: a pickle target, a pickle draft.init_from."""

import pytest
import torch
from helpers import save_tiny_model, tiny_target
from safetensors.torch import load_file
from train_fixtures import make_data, tiny_recipe

from eyas.errors import EyasError
from eyas.models.draft import Eagle3Draft
from eyas.train.trainer import Trainer


def to_pickle(folder, prefix=""):
    """The folder's safetensors weights as a pytorch_model.bin, as older releases ship them."""
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_pickle_target_and_a_pickle_init_from_load_with_allow_pickle(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=16)
    folder = to_pickle(save_tiny_model(tmp_path / "target"))
    recipe = tiny_recipe(data, tmp_path / "run", target=str(folder))
    with pytest.raises(EyasError, match="pickle checkpoint") as e:
        Trainer(recipe)
    assert "--allow-pickle" in e.value.fix
    Trainer(recipe, allow_pickle=True)  # the target loads (still with weights_only)

    init = to_pickle(Eagle3Draft.for_target(target, draft_vocab_size=300).save_pretrained(tmp_path / "init"))
    warm = tiny_recipe(data, tmp_path / "warm", **{"draft.init_from": str(init)})
    with pytest.raises(EyasError, match="--allow-pickle"):
        Trainer(warm, target=target)
    Trainer(warm, target=target, allow_pickle=True)
