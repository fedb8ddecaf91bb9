"""Draft checkpoints: SGLang's names, a faithful round trip, and clear errors for broken files."""

import json

import pytest
import torch
from safetensors import safe_open

from eyas.errors import EyasError
from eyas.formats import load_draft
from eyas.models.draft import Eagle3Draft
from eyas.models.vocab import build_vocab, draft_to_target, target_to_draft

SGLANG_NAMES = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


def test_saved_draft_has_sglang_names_shapes_and_config(tmp_path, target, draft):
    draft.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in names}
    assert names == SGLANG_NAMES  # embeddings are the target's: not saved
    h = target.info.hidden_size
    assert shapes["fc.weight"] == (h, 3 * h)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4 * 16, 2 * h)
    assert shapes["midlayer.self_attn.k_proj.weight"] == (2 * 16, 2 * h)
    assert shapes["lm_head.weight"] == (draft.draft_vocab_size, h)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["num_hidden_layers"] == 1 and cfg["target_hidden_size"] == h
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang's indexing of [2, 4, 5]
    assert cfg["draft_vocab_size"] == draft.draft_vocab_size and cfg["vocab_size"] == 320


def test_round_trip_gives_identical_logits(tmp_path, target, draft):
    draft.save_pretrained(tmp_path)
    loaded = load_draft(tmp_path, embed_weight=target.embed_tokens.weight)
    assert loaded.aux_layer_ids == [2, 4, 5]
    for k, v in draft.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    ids = torch.randint(0, 320, (2, 9))
    aux = torch.randn(2, 9, 3 * target.info.hidden_size, dtype=target.dtype)
    pos = torch.arange(9)[None].expand(2, 9)
    with torch.no_grad():
        a, ha = draft(ids, aux, pos)
        b, hb = loaded(ids, aux, pos)
    assert torch.equal(a, b) and torch.equal(ha, hb)


def test_truncated_weights_get_a_clear_message(tmp_path, draft):
    draft.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: 1000])
    with pytest.raises(EyasError, match="truncated or not a weight file"):
        load_draft(tmp_path, embed_weight=torch.zeros(320, 64))


def test_missing_tensor_and_wrong_shape_are_named(tmp_path, target):
    from safetensors.torch import load_file, save_file

    Eagle3Draft.for_target(target, draft_vocab_size=100).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["d2t"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(EyasError, match=r"missing d2t"):
        load_draft(tmp_path, embed_weight=torch.zeros(320, 64))
    state["d2t"] = torch.zeros(7, dtype=torch.long)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(EyasError, match=r"d2t has shape \(7,\)"):
        load_draft(tmp_path, embed_weight=torch.zeros(320, 64))


def test_embeddings_of_another_target_are_refused(tmp_path, draft):
    draft.save_pretrained(tmp_path)
    with pytest.raises(EyasError, match="built for another target"):
        load_draft(tmp_path, embed_weight=torch.zeros(500, 64))


def test_vocab_mapping_round_trip():
    counts = torch.tensor([5, 0, 9, 9, 1, 0, 3, 7])
    d2t, t2d = build_vocab(counts, 4)
    target_ids = draft_to_target(d2t, torch.arange(4))
    assert target_ids.tolist() == [0, 2, 3, 7]  # the 4 most frequent, in id order
    assert t2d.tolist() == [True, False, True, True, False, False, False, True]
    back = target_to_draft(t2d)[target_ids]
    assert back.tolist() == [0, 1, 2, 3]
    assert (target_to_draft(t2d)[~t2d] == -1).all()
