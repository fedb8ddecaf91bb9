"""draft.init_from: a run starts from a saved draft's weights and vocabulary, and refuses drafts
that do not fit (another vocabulary size, target, or aux layers) with errors that say so."""

import pytest
import torch
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe

from eyas.errors import EyasError
from eyas.train.trainer import Trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warm")
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp / "data", rows=32)
    run = Trainer(tiny_recipe(data, tmp / "first", **{"draft.vocab_size": 200, "train.max_steps": 12,
                                                      "log.eval_every": 12}), target=target)
    summary = run.fit()
    return target, data, tmp, run, summary


def test_warm_start_copies_weights_and_vocabulary(trained):
    target, data, tmp, first, summary = trained
    second = Trainer(tiny_recipe(data, tmp / "second", **{"draft.vocab_size": 200, "train.seed": 7,
                                                          "draft.init_from": str(tmp / "first" / "draft")}),
                     target=target)
    saved = first.draft.state_dict()
    for name, value in second.draft.state_dict().items():
        if not name.startswith("rotary_emb."):
            assert torch.equal(value, saved[name]), name
    assert second.evaluate()["loss"] == pytest.approx(summary["heldout"]["loss"], abs=1e-3)
    cold = Trainer(tiny_recipe(data, tmp / "cold", **{"draft.vocab_size": 200, "train.seed": 7}), target=target)
    assert cold.evaluate()["loss"] > summary["heldout"]["loss"] + 0.5  # the warm start is not a fresh init


def test_warm_start_refuses_what_does_not_fit(trained):
    target, data, tmp, _, _ = trained
    init = str(tmp / "first" / "draft")
    with pytest.raises(EyasError, match=r"does not fit.*lm_head.weight \(200, 64\) vs \(100, 64\)"):
        Trainer(tiny_recipe(data, tmp / "r1", **{"draft.vocab_size": 100, "draft.init_from": init}), target=target)
    with pytest.raises(EyasError, match="draft.init_head_from_target"):
        tiny_recipe(data, tmp / "r3", **{"draft.init_from": init, "draft.init_head_from_target": True}).validate()
    with pytest.raises(EyasError, match="neither a folder nor a draft shipped"):
        Trainer(tiny_recipe(data, tmp / "r4", **{"draft.init_from": str(tmp / "nowhere")}), target=target)
    # the shipped SmolLM2 draft, by name, onto the tiny target: another target's embeddings
    with pytest.raises(EyasError, match="built for another target"):
        Trainer(tiny_recipe(data, tmp / "r5", **{"draft.init_from": "smollm2-135m-instruct-eagle3"}), target=target)
    layers = list(target.aux_layer_ids)
    try:  # last: the trainer moves the shared target's capture to these layers
        with pytest.raises(EyasError, match="fuses target layers"):
            Trainer(tiny_recipe(data, tmp / "r2", **{"draft.vocab_size": 200, "draft.aux_layer_ids": [1, 3, 5],
                                                     "draft.init_from": init}), target=target)
    finally:
        target.set_aux_layers(layers)
