"""The EAGLE-3 draft model, parameter for parameter as SGLang's ``LlamaForCausalLMEagle3``.

    aux states  [B, T, n_aux * target_hidden] --fc--> h [B, T, H]
    x = cat(input_layernorm(embed(token)), hidden_norm(h))       [B, T, 2H] -> q/k/v
    h = h + o_proj(attn(x));  h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))                                    [B, T, draft_vocab]

The returned hidden state is the residual sum *before* ``norm``: that is what the next draft
step takes in place of the fused target state (SGLang feeds back the same). Token embeddings are
the target's, copied and frozen; ``d2t``/``t2d`` map the draft vocabulary (see ``vocab``).

Checkpoints are a ``config.json`` (a ``LlamaConfig`` with ``architectures:
["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``, ``target_hidden_size`` and ``eagle_config``)
plus ``model.safetensors`` with tensor names ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d``; ``embed_tokens.weight`` is optional (shared from the target).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from ..errors import EyasError
from ..layers import from_sglang, to_sglang
from .vocab import identity_vocab

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
# PretrainedConfig fields that mean nothing for a draft; left out of the config.json we write.
HF_NOISE = ("_name_or_path", "id2label", "label2id", "return_dict", "output_attentions", "output_hidden_states",
            "problem_type", "chunk_size_feed_forward", "is_encoder_decoder")


class Eagle3Attention(nn.Module):
    """Attention whose q/k/v read the 2H-wide cat(embed, hidden)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        self.q_proj = nn.Linear(2 * h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin, cache=None, mask=None):
        bsz, t, _ = x.shape
        q = self.q_proj(x).view(bsz, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, 0)
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, t, -1))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)

    def forward(self, embeds, hidden, cos, sin, cache=None, mask=None):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, cos, sin, cache, mask)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Draft(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.target_hidden_size = int(getattr(config, "target_hidden_size", None) or h)
        self.draft_vocab_size = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        eagle = getattr(config, "eagle_config", None) or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        self.aux_layer_ids = from_sglang(ids) if ids is not None else None  # None: target default
        self.num_aux = len(ids) if ids is not None else 3
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(self.num_aux * self.target_hidden_size, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        d2t, t2d = identity_vocab(config.vocab_size, self.draft_vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)

    # -- the four hooks the engine and the trainer are written against ---------------------------
    def embed(self, target_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, H]
        return self.embed_tokens(target_ids)

    def project(self, aux: torch.Tensor) -> torch.Tensor:  # [B, T, n_aux * Ht] -> [B, T, H]
        if aux.shape[-1] != self.fc.in_features:
            raise EyasError(
                f"the draft's fc expects aux states {self.num_aux} x {self.target_hidden_size} = "
                f"{self.fc.in_features} wide, got {aux.shape[-1]}",
                "capture exactly the draft's aux layers of the target it was trained for",
            )
        return self.fc(aux)

    def backbone(self, embeds, hidden, position_ids, cache=None, mask=None) -> torch.Tensor:
        """One draft step over ``[B, T]`` tokens; returns the pre-norm state ``[B, T, H]``."""
        cos, sin = self.rotary_emb(hidden, position_ids)
        return self.midlayer(embeds, hidden, cos, sin, cache, mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, draft_vocab]
        return self.lm_head(self.norm(hidden))

    def forward(self, input_ids, aux, position_ids, cache=None, mask=None):
        """Convenience: first step from target aux states. Returns (logits, pre-norm hidden)."""
        h = self.backbone(self.embed(input_ids), self.project(aux), position_ids, cache, mask)
        return self.logits(h), h

    # -- construction and checkpoints -------------------------------------------------------------
    @classmethod
    def config_for_target(cls, target, draft_vocab_size: int | None = None, aux_layer_ids=None) -> LlamaConfig:
        """A one-layer draft config shaped like the target (SGLang/SpecForge's default)."""
        tc = target.text_config
        info = target.info
        ids = list(aux_layer_ids if aux_layer_ids is not None else target.aux_layer_ids)
        config = LlamaConfig(
            architectures=[ARCHITECTURE],
            hidden_size=info.hidden_size,
            intermediate_size=int(tc.intermediate_size),
            num_attention_heads=int(tc.num_attention_heads),
            num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads),
            head_dim=int(getattr(tc, "head_dim", None) or info.hidden_size // tc.num_attention_heads),
            hidden_act=getattr(tc, "hidden_act", "silu"),
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
            max_position_embeddings=info.max_context or 2048,
            rope_parameters=dict(getattr(tc, "rope_parameters", None)
                                 or {"rope_type": "default", "rope_theta": 10000.0}),
            num_hidden_layers=1,
            vocab_size=info.vocab_size,
            tie_word_embeddings=False,
            bos_token_id=getattr(tc, "bos_token_id", None),
            eos_token_id=getattr(tc, "eos_token_id", None),
            pad_token_id=getattr(tc, "pad_token_id", None),
        )
        config.draft_vocab_size = int(draft_vocab_size or info.vocab_size)
        config.target_hidden_size = info.hidden_size
        config.eagle_config = {"eagle_aux_hidden_state_layer_ids": to_sglang(ids), "use_aux_hidden_state": True}
        name = info.name  # a folder as given relative to where training ran is recorded absolute (eyas doctor)
        name = str(Path(name).expanduser().resolve()) if name and Path(name).expanduser().exists() else name
        config.eyas = {"target": {"name": name, "architecture": info.architecture,
                                  "num_hidden_layers": info.num_layers, "hidden_size": info.hidden_size,
                                  "vocab_size": info.vocab_size}, "aux_layer_ids": ids}
        return config

    @classmethod
    def for_target(cls, target, draft_vocab_size: int | None = None, aux_layer_ids=None, seed: int = 0):
        """A randomly initialised draft with the target's embeddings (frozen) copied in."""
        torch.manual_seed(seed)
        draft = cls(cls.config_for_target(target, draft_vocab_size, aux_layer_ids))
        draft.embed_tokens.weight.data.copy_(target.embed_tokens.weight.data.float())
        return draft.to(device=target.device, dtype=target.dtype)

    def state_for_save(self, include_embeddings: bool = False) -> dict[str, torch.Tensor]:
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("rotary_emb.")}
        if not include_embeddings:
            state.pop("embed_tokens.weight")
        return {k: v.detach().contiguous().cpu() for k, v in state.items()}

    def save_pretrained(self, path, include_embeddings: bool = False, dtype: torch.dtype | None = None) -> Path:
        """Write the draft in eyas's format; ``eyas.formats.load_draft`` reads it back (and every other
        format eyas reads)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_for_save(include_embeddings)
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
        config = {k: v for k, v in self.config.to_dict().items() if k not in HF_NOISE}
        config["architectures"] = [ARCHITECTURE]
        config["torch_dtype"] = str(dtype or self.fc.weight.dtype).replace("torch.", "")
        (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return path
