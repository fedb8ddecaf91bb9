"""draft.init_from: a run starts from a saved draft's weights and vocabulary (grown or shrunk around the saved
draft's tokens where the run asks for another size), and refuses drafts that do not fit (another target, width
or aux layers) with errors that say so."""

import numpy as np
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


def _tokens(draft) -> list[int]:
    return (draft.d2t + torch.arange(len(draft.d2t))).tolist()


@pytest.mark.parametrize("size", [280, 120])
def test_another_vocabulary_size_keeps_the_saved_tokens_and_their_rows(trained, size):
    """Grown, every saved token stays with its trained row and the new ones are the data's most frequent others,
    starting from the target's own output rows; shrunk, the data's most frequent saved tokens stay."""
    target, data, tmp, first, _ = trained
    run = Trainer(tiny_recipe(data, tmp / f"v{size}", **{"draft.vocab_size": size,
                                                         "draft.init_from": str(tmp / "first" / "draft")}),
                  target=target)
    old, new = _tokens(first.draft), _tokens(run.draft)
    assert len(new) == size and new == sorted(new) and int(run.draft.t2d.sum()) == size
    assert run.draft.t2d[new].all()
    counts = np.load(data / "vocab_counts.npy")
    rest = sorted(set(range(len(counts))) - set(old), key=lambda t: (-counts[t], t))
    want = set(old) | set(rest[:size - len(old)]) if size > len(old) else set(
        sorted(old, key=lambda t: (-counts[t], t))[:size])
    assert set(new) == want
    head = target.model.get_output_embeddings().weight.float()
    for d, t in enumerate(new):
        expected = first.draft.lm_head.weight[old.index(t)] if t in old else head[t]
        assert torch.equal(run.draft.lm_head.weight[d], expected), t
    saved = first.draft.state_dict()
    for name, value in run.draft.state_dict().items():
        if name not in ("lm_head.weight", "d2t", "t2d") and not name.startswith("rotary_emb."):
            assert torch.equal(value, saved[name]), name


def test_warm_start_refuses_what_does_not_fit(trained):
    target, data, tmp, _, _ = trained
    init = str(tmp / "first" / "draft")
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


def test_warm_start_refuses_vocabulary_maps_that_serving_refuses(trained):
    from safetensors.torch import load_file, save_file

    target, data, tmp, _, _ = trained
    bad = tmp / "bad-maps"
    bad.mkdir(exist_ok=True)
    (bad / "config.json").write_text((tmp / "first" / "draft" / "config.json").read_text())
    state = load_file(str(tmp / "first" / "draft" / "model.safetensors"))
    state["d2t"][1] = state["d2t"][0] - 1  # draft id 1 -> the target id of draft id 0
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EyasError, match="vocabulary maps are broken: d2t maps two draft ids to the same target id"):
        Trainer(tiny_recipe(data, tmp / "from-bad", **{"draft.vocab_size": 200, "draft.init_from": str(bad)}),
                target=target)
