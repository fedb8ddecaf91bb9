"""Aux-state capture: the layers eyas captures, checked against hand computation."""

import pytest
import torch
from helpers import byte_tokenizer, tiny_config
from torch import nn
from transformers import LlamaModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from eyas.engine.engine import Engine
from eyas.errors import EyasError
from eyas.layers import check_aux_layers, default_aux_layers, from_sglang, to_sglang
from eyas.models import kv_cache
from eyas.models.target import Target, find_decoder_layers
from eyas.sample.sampling import SamplingParams
from eyas.train.ttt import target_states


def test_default_layers_follow_the_reference_convention():
    assert default_aux_layers(30) == [2, 15, 27]  # SmolLM2-135M
    assert default_aux_layers(61) == [2, 30, 58]  # the story's 61-layer target
    assert default_aux_layers(32) == [2, 16, 29]  # Llama-3.1-8B
    # SGLang/SpecForge write the output-of-layer index and add 1 on capture.
    assert to_sglang([2, 15, 27]) == [1, 14, 26]
    assert from_sglang([1, 14, 26]) == [2, 15, 27]
    assert to_sglang(default_aux_layers(32)) == [1, 32 // 2 - 1, 32 - 4]  # SpecForge's default


def test_out_of_range_layers_are_refused():
    with pytest.raises(EyasError, match=r"outside the target's 0\.\.7"):
        check_aux_layers([2, 4, 8], 8)
    with pytest.raises(EyasError, match="outside"):
        check_aux_layers([-1, 2, 3], 8)


def test_capture_is_the_input_of_layers_2_4_5(target):
    n, h = target.info.num_layers, target.info.hidden_size
    assert n == 8 and target.aux_layer_ids == [2, 4, 5]
    ids = torch.tensor([[5, 9, 200, 31, 7, 7, 1]])
    aux, logits = target_states(target, ids)
    assert aux.shape == (1, 7, 3 * h)
    ref = target.model(ids, output_hidden_states=True)
    hs = ref.hidden_states  # hs[i] is the input of decoder layer i
    for j, layer in enumerate([2, 4, 5]):
        torch.testing.assert_close(aux[..., j * h:(j + 1) * h], hs[layer], rtol=0, atol=1e-10)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-10)


def test_capture_matches_a_hand_computed_forward(target):
    """Run embedding + decoder layers 0 and 1 by hand: their output is what layer id 2 captures."""
    m = target.model.model
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    pos = torch.arange(6)[None]
    with torch.no_grad():
        x = m.embed_tokens(ids)
        pe = m.rotary_emb(x, pos)
        for layer in m.layers[:2]:
            out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
            x = out[0] if isinstance(out, tuple) else out
    aux, _ = target_states(target, ids)
    torch.testing.assert_close(aux[..., : target.info.hidden_size], x, rtol=0, atol=1e-10)


class NestedLM(nn.Module):
    """A multimodal-style wrapper: model.language_model holds the decoder, beside a vision tower
    with as many layers, and the wrapper's own lm_head."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.language_model = LlamaModel(config)
        self.model.vision_tower = nn.Module()
        self.model.vision_tower.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(config.num_hidden_layers))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def get_input_embeddings(self):
        return self.model.language_model.embed_tokens

    def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=True, logits_to_keep=0, **kw):
        out = self.model.language_model(input_ids=input_ids, position_ids=position_ids,
                                        attention_mask=attention_mask, use_cache=use_cache, **kw)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, torch.Tensor):
            h = h[:, logits_to_keep]
        return CausalLMOutputWithPast(logits=self.lm_head(h))


def test_wrapped_language_model_is_found_and_decodes_losslessly():
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg._attn_implementation = "sdpa"
    wrapped = NestedLM(cfg).double().eval()
    name, layers = find_decoder_layers(wrapped, cfg.num_hidden_layers)
    assert name == "model.language_model.layers"
    target = Target(wrapped, byte_tokenizer(), name="nested")
    assert target.aux_layer_ids == [2, 4, 5]
    # Reference: the wrapper's own full-recompute greedy loop.
    prompt = [10, 20, 30, 40]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(24):
            seq.append(int(wrapped(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    from eyas.config import SpecConfig
    from eyas.models.draft import Eagle3Draft

    d = Eagle3Draft.for_target(target)
    out = Engine(target, d, SpecConfig("EAGLE3", 3, 2, 5)).generate([prompt],
                                                                    SamplingParams(max_new_tokens=24, ignore_eos=True))
    assert out[0].output_ids == seq[len(prompt):]


def test_tree_forward_commits_only_the_accepted_path(target):
    """After a tree forward, committing path [0, 2] leaves exactly the cache a plain prefix run gives."""
    ids = torch.tensor([[7, 8, 9, 10]])
    cache = kv_cache.new_cache()
    visible = torch.tril(torch.ones(4, 4, dtype=torch.bool))[None]
    mask = kv_cache.attention_mask(torch.zeros(1, dtype=torch.long), 0, visible, target.dtype)
    target.forward(ids, torch.arange(4)[None], mask, cache)
    lengths = torch.tensor([4])
    # tree: root 11, children 12 (col 1) and 13 (col 2), grandchild 14 under 13 (col 3)
    tokens = torch.tensor([[11, 12, 13, 14]])
    tree_vis = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], dtype=torch.bool)
    depth = torch.tensor([[0, 1, 1, 2]])
    mask = kv_cache.attention_mask(lengths, 4, tree_vis, target.dtype)
    tree_logits, _ = target.forward(tokens, lengths[:, None] + depth, mask, cache)
    cache.commit(lengths, torch.tensor([[4, 6, 7]]), torch.tensor([3]))
    cache.crop(7)
    # the same tokens on a plain path
    plain = kv_cache.new_cache()
    ids2 = torch.tensor([[7, 8, 9, 10, 11, 13, 14]])
    visible = torch.tril(torch.ones(7, 7, dtype=torch.bool))[None]
    mask = kv_cache.attention_mask(torch.zeros(1, dtype=torch.long), 0, visible, target.dtype)
    plain_logits, _ = target.forward(ids2, torch.arange(7)[None], mask, plain)
    torch.testing.assert_close(tree_logits[0, [0, 2, 3]], plain_logits[0, 4:], rtol=0, atol=1e-10)
    for a, b in zip(cache.hf.layers, plain.hf.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-10)
    # and the next token after the committed path sees exactly the plain prefix
    nxt = torch.tensor([[15]])
    m1 = kv_cache.attention_mask(torch.tensor([7]), 7, torch.ones(1, 1, 1, dtype=torch.bool), target.dtype)
    l1, _ = target.forward(nxt, torch.tensor([[7]]), m1, cache)
    l2, _ = target.forward(nxt, torch.tensor([[7]]), m1, plain)
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", ["generic", "native"])
def test_a_target_too_shallow_for_the_default_capture_still_decodes(path):
    """Two decoder layers hold no three distinct layers to capture: the target loads and decodes without
    speculation (it could not be served at all before), and a capture is refused with the fix."""
    from helpers import reference_greedy, tiny_target

    from eyas.models.native import NativeTarget

    t = tiny_target(num_hidden_layers=2)
    assert t.aux_layer_ids is None
    model = t if path == "generic" else NativeTarget.from_target(t)
    out = Engine(model, cuda_graphs=False).generate([[5, 6, 7]], SamplingParams(max_new_tokens=8))[0]
    assert out.output_ids == reference_greedy(t.model, [5, 6, 7], 8)
    with pytest.raises(EyasError, match="has 2 decoder layers; an EAGLE-3 draft captures three") as e:
        t.set_aux_layers(None)
    assert "at least 3 decoder layers" in e.value.fix
    with pytest.raises(EyasError, match="repeat a layer"):  # three states of two layers: one twice
        t.set_aux_layers([0, 1, 1])
