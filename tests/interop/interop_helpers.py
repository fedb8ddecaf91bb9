"""Hand-written draft folders, one per format, shaped for ``helpers.tiny_target()``.

Configs are written out literally from each project's documented config (not produced by eyas's
writers), with small random tensors of the right names and shapes:

- SGLang/SpecForge: a SpecForge-style ``LlamaForCausalLMEagle3`` config (keys read by
  sgl-project/sglang python/sglang/srt/models/llama_eagle3.py), bf16 weights with SGLang's optional
  ``model.`` prefix, SpecForge's default layer ids ``[1, N//2 - 1, N - 4]``.
- speculators: the ``Eagle3SpeculatorConfig`` fields of vllm-project/speculators
  src/speculators/models/eagle3/config.py, ``layers.0.*`` tensors, non-default layer ids.
- official EAGLE-3: SafeAILab/EAGLE eagle/traineagle3/config.json (``LlamaForCausalLM``, no layer
  ids, legacy ``rope_theta``), weights in ``pytorch_model.bin`` as ``EaModel.from_pretrained`` loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.models.vocab import build_vocab

# the tiny target of tests/helpers.py
VOCAB, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 320, 64, 128, 4, 2, 16, 8
DRAFT_VOCAB = 160


def sglang_tensors(seed: int = 0, draft_vocab: int = DRAFT_VOCAB, fc_in: int = 3 * HIDDEN) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    def norm():
        return 1.0 + 0.1 * torch.randn(HIDDEN, generator=g)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    d2t, t2d = build_vocab(torch.rand(VOCAB, generator=g), draft_vocab)
    return {
        "fc.weight": w(HIDDEN, fc_in),
        "midlayer.self_attn.q_proj.weight": w(q, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w(kv, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w(kv, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w(HIDDEN, q),
        "midlayer.mlp.gate_proj.weight": w(INTER, HIDDEN),
        "midlayer.mlp.up_proj.weight": w(INTER, HIDDEN),
        "midlayer.mlp.down_proj.weight": w(HIDDEN, INTER),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "norm.weight": norm(),
        "lm_head.weight": w(draft_vocab, HIDDEN),
        "d2t": d2t,
        "t2d": t2d,
    }


def _write(path: Path, config: dict, tensors: dict, weights: str = "model.safetensors") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if weights.endswith(".bin"):
        torch.save(tensors, path / weights)
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / weights))
    return path


def write_sglang_fixture(path: Path, tensors: dict | None = None, **config_overrides) -> Path:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 1024,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": HIDDEN,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # SpecForge's default for an 8-layer target: [1, 8 // 2 - 1, 8 - 4]
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
    }
    config.update(config_overrides)
    tensors = sglang_tensors() if tensors is None else tensors
    prefixed = {f"model.{k}" if k.startswith("midlayer.") else k: v.to(torch.bfloat16) if v.is_floating_point() else v
                for k, v in tensors.items()}
    return _write(path, config, prefixed)


def write_speculators_fixture(path: Path, tensors: dict | None = None, **config_overrides) -> Path:
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": None, "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {
            "model_type": "llama",
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "intermediate_size": INTER,
            "num_hidden_layers": 1,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
        },
        "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": False,
        "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": [1, 4, 6],  # vLLM indexing = inputs of layers 1, 4, 6
        "dtype": "float32",
    }
    config.update(config_overrides)
    tensors = sglang_tensors(seed=1) if tensors is None else tensors
    renamed = {("layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k: v for k, v in tensors.items()}
    return _write(path, config, renamed)


def write_official_fixture(path: Path, tensors: dict | None = None, weights: str = "model.safetensors",
                           **config_overrides) -> Path:
    """The release layout; its weights were a pickle ``pytorch_model.bin``, which eyas loads only with
    ``allow_pickle`` (the safetensors conversion is what users are told to make)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 256,
        "eos_token_id": 257,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "max_position_embeddings": 1024,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
    }
    config.update(config_overrides)
    tensors = sglang_tensors(seed=2) if tensors is None else tensors
    return _write(path, config, tensors, weights=weights)


WRITERS = {"sglang": write_sglang_fixture, "speculators": write_speculators_fixture, "eagle3": write_official_fixture}
