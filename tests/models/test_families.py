"""The story's own target family on the CPU: MLA + MoE (DeepSeek-V3, and the same nested in Kimi-K2.5's
multimodal wrapper), Qwen3-MoE and Mixtral, as tiny random fp32 models built from configs (DeepSeek-V3's
grouped-MoE kernel refuses float64). For each: aux capture at the reference layers, greedy speculation
equal to HF's own generate, sampled speculation that keeps the exact distribution, a few TTT steps of
the real trainer, export to SGLang, and the static doctor on a config-only target folder. Then the
real Kimi-K2.5 sizes, from a config alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import byte_tokenizer, reference_greedy, train_draft
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Kimi_K25Config,
    Kimi_K25ForConditionalGeneration,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from eyas.cli import main
from eyas.common.target_facts import read_target
from eyas.config import SpecConfig
from eyas.doctor.static import diagnose
from eyas.engine.engine import Engine
from eyas.engine.stats import SpecStats
from eyas.models.loading import load_target
from eyas.models.target import Target
from eyas.sample.sampling import SamplingParams, probs
from eyas.train.ttt import target_states

FAMILIES = ["deepseek_v3", "kimi_k25", "qwen3_moe", "mixtral"]
LAYERS_PATH = {"kimi_k25": "model.language_model.layers"}  # the others: model.layers
FIXTURES = Path(__file__).parents[1] / "fixtures"
TOK = byte_tokenizer()

# Kimi-K2.5's language model in miniature: MLA (q and kv low-rank, decoupled rope), YaRN rope, one dense
# layer first (first_k_dense_replace) then MoE layers with grouped routing and a shared expert.
DEEPSEEK = {
    "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "qk_nope_head_dim": 16, "num_key_value_heads": 4,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                        "rope_theta": 50000.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                        "mscale_all_dim": 1.0},
}


def family_model(name: str, seed: int = 0, vocab: int = 320, layers: int = 8, peak: float = 3.0, **extra):
    """A tiny random model of the family, fp32, eval mode; ``peak`` scales lm_head (peakier next tokens)."""
    common = {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
              "initializer_range": 0.08, "tie_word_embeddings": False, "eos_token_id": TOK.eos_token_id,
              "bos_token_id": TOK.bos_token_id, "pad_token_id": TOK.pad_token_id}
    if vocab < 259:
        common.update(eos_token_id=None, bos_token_id=None, pad_token_id=None)
    common.update(extra)
    torch.manual_seed(seed)
    if name == "deepseek_v3":
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**common, **DEEPSEEK}))
    elif name == "kimi_k25":  # the vision tower has as many layers as the language model: found by structure
        vision = {"num_hidden_layers": layers, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
                  "patch_size": 2, "pos_emb_height": 4, "pos_emb_width": 4}
        text = {**common, **DEEPSEEK, "model_type": "deepseek_v3"}
        model = Kimi_K25ForConditionalGeneration(Kimi_K25Config(text_config=text, vision_config=vision,
                                                                 projection_hidden_size=16, tie_word_embeddings=False))
    elif name == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, moe_intermediate_size=32, num_experts=8,
                                                   num_experts_per_tok=2, head_dim=16))
    else:
        model = MixtralForCausalLM(MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(peak)
    return model.float().eval()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(name, target, trained draft) for one family."""
    target = Target(family_model(request.param), TOK, name=request.param)
    return request.param, target, train_draft(target, steps=60, ttt_steps=3)


def test_capture_is_the_input_of_the_reference_layers(family):
    name, target, _ = family
    assert target.layers_name == LAYERS_PATH.get(name, "model.layers")
    assert target.info.num_layers == 8 and target.aux_layer_ids == [2, 4, 5]  # [2, N//2, N-3]
    ids = torch.tensor([[5, 9, 200, 31, 7, 7, 1, 64]])
    aux, logits = target_states(target, ids)
    ref = target.model(ids, output_hidden_states=True)
    h = target.info.hidden_size
    for j, layer in enumerate([2, 4, 5]):
        torch.testing.assert_close(aux[..., j * h:(j + 1) * h], ref.hidden_states[layer], rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-4)


PROMPTS = [[72, 101, 108, 108, 111], [7] * 13, list(range(30, 50))]


def test_greedy_speculation_equals_hf_generate(family):
    """Chain and tree; the tree's accepted paths are committed to the family's KV cache (MLA's keys and
    values differ in width) and the rejected ones dropped, and the output is HF's token for token."""
    _, target, draft = family
    refs = [reference_greedy(target.model, p, 32) for p in PROMPTS]
    accepted = {}
    for label, spec in (("chain", SpecConfig("EAGLE3", 4, 1, 5)), ("tree", SpecConfig("EAGLE3", 3, 3, 8))):
        outs = Engine(target, draft, spec).generate(PROMPTS, SamplingParams(max_new_tokens=32, ignore_eos=True))
        assert [o.output_ids for o in outs] == refs, label
        total = SpecStats()
        for o in outs:
            total.add(o.stats)
        assert total.accepted < total.draft_tokens
        accepted[label] = total.accepted
    assert accepted["tree"] > 0, accepted  # accepted and rejected proposals both exercised


# -- sampling: the exact distribution of the first tokens, by enumeration over a 16-token vocabulary ----
V, N = 16, 1500
PROMPT = [3, 1, 4, 1, 5]


def chi2_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    from scipy.stats import chisquare

    counts, exp = counts.double().flatten(), expected.flatten() * counts.sum()
    big = exp >= 5
    obs, ex = torch.cat([counts[big], counts[~big].sum()[None]]), torch.cat([exp[big], exp[~big].sum()[None]])
    keep = ex > 0
    obs, ex = obs[keep], ex[keep]
    return float(chisquare(obs.numpy(), ex.numpy() * obs.sum().item() / ex.sum().item()).pvalue)


@pytest.mark.parametrize("name", FAMILIES)
def test_sampled_speculation_keeps_the_target_distribution(name):
    model = family_model(name, seed=3, vocab=V, layers=6, peak=4.0)
    target = Target(model, TOK, name=name, aux_layer_ids=[1, 3, 4])
    draft = train_draft(target, steps=40, ttt_steps=3)
    params = SamplingParams(temperature=1.0)
    with torch.no_grad():
        p1 = probs(model(torch.tensor([PROMPT])).logits[0, -1], params).double()
        p2 = probs(model(torch.tensor([PROMPT + [a] for a in range(V)])).logits[:, -1], params).double()
    joint = p1[:, None] * p2  # P(t1, t2)
    engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 6))
    rows, stats = [], SpecStats()
    for start in range(0, N, 500):
        ps = [SamplingParams(max_new_tokens=2, temperature=1.0, seed=1000 + start + i, ignore_eos=True)
              for i in range(500)]
        for o in engine.generate([PROMPT] * 500, ps):
            rows.append(o.output_ids[:2])
            stats.add(o.stats)
    assert stats.accepted >= 200 and stats.draft_tokens - stats.accepted >= 200, stats.as_dict()
    rows = torch.tensor(rows)
    counts = torch.zeros(V, V).index_put_((rows[:, 0], rows[:, 1]), torch.ones(N), accumulate=True)
    assert chi2_pvalue(counts, joint) > 1e-3
    # the test can fail: the same first tokens followed by the greedy second token are refused
    greedy = torch.zeros(V, V).index_put_((rows[:, 0], p2.argmax(1)[rows[:, 0]]), torch.ones(N), accumulate=True)
    assert chi2_pvalue(greedy, joint) < 1e-6


def test_a_few_ttt_steps_of_the_trainer_lower_the_loss(family, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from train_fixtures import make_data, tiny_recipe

    from eyas.train.trainer import Trainer

    _, target, _ = family
    data = make_data(target, tmp_path / "data", rows=24, new=28)
    recipe = tiny_recipe(data, tmp_path / "run", **{"train.max_steps": 8, "log.every": 1})
    summary = Trainer(recipe, target=target).fit()
    assert summary["steps"] == 8
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()
              if json.loads(line).get("event") == "train"]
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) < sum(losses[:3])


def test_export_to_sglang_and_the_static_doctor_on_a_config_only_target(family, tmp_path):
    _name, target, draft = family
    draft.save_pretrained(tmp_path / "draft")
    assert main(["export", str(tmp_path / "draft"), "--format", "sglang", "--out", str(tmp_path / "sglang")]) == 0
    cfg = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # eyas [2, 4, 5] - 1
    assert cfg["target_hidden_size"] == 64
    # The target as a user has it: the full folder loads (wrapper included) and gives the same logits ...
    full = tmp_path / "target"
    target.model.save_pretrained(full)
    TOK.save_pretrained(full)
    loaded = load_target(str(full))
    assert loaded.layers_name == target.layers_name and loaded.aux_layer_ids == [2, 4, 5]
    ids = torch.tensor([[5, 9, 200, 31]])
    torch.testing.assert_close(target_states(loaded, ids)[1], target_states(target, ids)[1])
    # ... and the doctor needs only its config and tokenizer.
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    for f in full.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, config_only / f.name)
    report = diagnose(tmp_path / "sglang", str(config_only), "EAGLE3")
    assert report.exit_code == 0, report.to_json()
    status = {c.name: c.status for c in report.checks}
    assert all(status[k] == "ok" for k in ("algorithm", "fc width", "layers", "vocabulary", "d2t/t2d", "embeddings"))
    assert status["context"] == "warning"  # an SGLang folder does not record the training length
    eagle = diagnose(tmp_path / "sglang", str(config_only), "EAGLE")
    assert eagle.exit_code == 1 and next(c for c in eagle.checks if c.name == "algorithm").status == "problem"


# -- the real sizes, from a config alone -------------------------------------------------------------------

def test_kimi_k25_sizes_and_the_eagle_mistake_refused_before_loading(tmp_path, monkeypatch, capsys):
    """Kimi-K2.5's published sizes: layers [2, 30, 58] (SGLang [1, 29, 57]), fc 3 x 7168 = 21504; and
    --speculative-algorithm EAGLE with such a draft is refused before any weight is read."""
    from eyas.models.draft import Eagle3Draft
    from eyas.train.plan import meta_target, read_shapes
    from eyas.train.recipe import load_recipe

    kimi = FIXTURES / "kimi-k2.5"
    facts = read_target(str(kimi))
    assert (facts.num_layers, facts.hidden_size, facts.vocab_size) == (61, 7168, 163840)
    shapes = read_shapes(load_recipe(None, [f"target={kimi}", "draft.vocab_size=32000"]))
    assert shapes.aux_layer_ids == [2, 30, 58] and shapes.fc_in == 21504 and shapes.draft_hidden == 7168
    assert 1.0e12 < shapes.target_params < 1.05e12  # about 1.03T parameters
    # The draft eyas would train for it, as its config.json alone (SGLang layout; no weights).
    draft = tmp_path / "kimi-draft"
    draft.mkdir()
    config = Eagle3Draft.config_for_target(meta_target(str(kimi)), 32000).to_dict()
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    (draft / "config.json").write_text(json.dumps(config))

    def never(*a, **k):
        raise AssertionError("the target was loaded before the checks refused the configuration")

    monkeypatch.setattr("eyas.pipeline.load_target", never)
    args = ["generate", "--model-path", str(kimi), "--speculative-draft-model-path", str(draft), "--prompt", "hi"]
    assert main(args + ["--speculative-algorithm", "EAGLE"]) == 2
    err = capsys.readouterr().err
    assert "3 x 7168 = 21504" in err and "fix: use --speculative-algorithm EAGLE3" in err
    with pytest.raises(AssertionError, match="the target was loaded"):  # EAGLE3 passes the checks
        main(args + ["--speculative-algorithm", "EAGLE3"])
