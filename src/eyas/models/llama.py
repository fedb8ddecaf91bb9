"""The native path for the Llama family: one hand-written forward over the HF model's own weights.

Llama 2/3, Mistral (without a sliding window), Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm)
and SmolLM share one decoder block, so one forward serves them all. It differs from HF's in
what an engine needs and nothing else:

- q/k/v and gate/up are fused into one matrix each (two matmuls fewer per layer; the HF modules
  are re-pointed at views of the fused weights, so memory is not doubled);
- keys and values go to whatever cache is passed: a ``DynamicKV`` for eager prefill, or the
  preallocated ``StaticKV`` that CUDA graphs replay against;
- grouped-query attention folds the query heads of one KV head into the query axis
  (``[B, Hkv, rep * T, D]``), so SDPA reads each key once, with no repeat of the cache;
- the aux hidden states EAGLE-3 needs are taken inline (no hooks, so it can be graph-captured);
- fewer kernels per layer: the projections and everything between them go through ``ops``: on the
  GPU's static cache Triton kernels (``models.kernels``: RMSNorm, rotary + cache write, attention,
  silu * up, and for a one-row step each projection with its norm, activation and residual add
  inside; about 8 kernels a layer at batch 1), elsewhere the torch reference (``F.rms_norm``,
  residual adds as the GEMMs' accumulators, rotary on q and k in one pass; about 20). Under CUDA graphs a small kernel
  still costs a few microseconds, so at batch 1 the kernel count, not the arithmetic, is what a
  forward costs beside its GEMMs.

Embeddings, norms, rotary embeddings (every rope scaling HF implements) and the LM head are HF's
own modules or their weights, so the maths is HF's. ``native_support`` says why a model cannot
take this path; the engine then keeps the generic one.
"""

from __future__ import annotations

import torch
from torch import nn

from . import consts
from .ops import ops_for
from .torch_ops import TorchOps

FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def native_support(model: nn.Module) -> str | None:
    """None when ``model`` can run natively, else the reason it cannot."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "")
    if kind not in FAMILY:
        return f"model type {kind!r} is not in the native Llama family ({', '.join(FAMILY)})"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not laid out as model.layers + lm_head"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} (the native path implements silu)"
    if getattr(cfg, "mlp_bias", False):
        return "MLP biases"
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", kind == "mistral")
    if window and uses_window and window < (getattr(cfg, "max_position_embeddings", 0) or 0):
        return f"sliding-window attention ({window})"
    rope = (getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in ("dynamic", "longrope"):
        return f"rope type {rope_type!r} changes with the sequence length"
    return None


class NativeLlama(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        why = native_support(model)
        if why is not None:
            raise ValueError(f"no native path: {why}")
        cfg = model.config
        inner = model.model
        self.embed_tokens, self.layers, self.norm = inner.embed_tokens, inner.layers, inner.norm
        self.rotary_emb, self.lm_head = inner.rotary_emb, model.lm_head
        attn = self.layers[0].self_attn
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn, "head_dim", None) or cfg.hidden_size // self.num_heads)
        self.scaling = float(getattr(attn, "scaling", self.head_dim ** -0.5))
        self.qk_norm = hasattr(attn, "q_norm")
        self.heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        self.rope = RopeTable(self.rotary_emb)
        self.qkv, self.qkv_bias, self.gate_up = [], [], []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(_fuse([a.q_proj, a.k_proj, a.v_proj]))
            self.qkv_bias.append(_fuse([a.q_proj, a.k_proj, a.v_proj], "bias"))
            self.gate_up.append(_fuse([m.gate_proj, m.up_proj]))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        mask: torch.Tensor,  # [B, 1, T, W] additive, W = the keys the cache returns
        cache,  # DynamicKV or StaticKV (anything with update(k, v, layer) -> (keys, values))
        aux_layer_ids: tuple[int, ...] = (),
        logits_at: torch.Tensor | None = None,  # [K] token indices whose logits are needed
        last: torch.Tensor | None = None,  # [B] or one token index per row (a ragged prefill's last)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T or K or 1, vocab]`` and the aux states ``[B, T, n * hidden]`` (None if no ids)."""
        h = self.embed_tokens(input_ids)
        ops = ops_for(cache, h, self.rope)
        rot = ops.rotation(self.rope, h, position_ids)
        mask = ops.fold_mask(mask, self.num_heads // self.num_kv_heads)
        aux = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                aux[i] = h
            a = layer.self_attn
            norms = (a.q_norm, a.k_norm) if self.qk_norm else None
            h = attention(ops, h, h, self.qkv[i], self.qkv_bias[i], a.o_proj, self.heads, self.scaling, rot, cache, i,
                          mask, norms, _norm(layer.input_layernorm))
            h = mlp(ops, h, layer.post_attention_layernorm, self.gate_up[i], layer.mlp.down_proj)
        aux[self.num_layers] = h
        if last is not None:
            h = h[consts.arange(h.shape[0], h.device), last][:, None]
        elif logits_at is not None:
            h = h[:, logits_at]
        head = self.lm_head
        logits = ops.linear(h, head.weight, head.bias, _norm(self.norm))
        return logits, (torch.cat([aux[i] for i in aux_layer_ids], dim=-1) if aux_layer_ids else None)


class NativeEagle3:
    """An EAGLE-3 draft (``models.draft.Eagle3Draft``) for inference, on the same block as the
    target: fused q/k/v and gate/up (views of the draft's own weights), the same ``ops`` (Triton
    kernels on the GPU's static cache), folded grouped-query attention. About 20 kernels per draft
    step instead of about 60 (HF's RMSNorm alone is 8), fewer with the kernels, and a tree drafts
    ``num_steps`` of them. It offers the draft's
    inference hooks (``embed``, ``project``, ``backbone``, ``logits``), so the engine uses it in the
    draft's place; training keeps the draft's own modules."""

    def __init__(self, draft: nn.Module):
        self.draft = draft
        layer = draft.midlayer
        a, m = layer.self_attn, layer.mlp
        self.heads = (a.num_heads, a.num_kv_heads, a.head_dim)
        self.scaling = a.head_dim ** -0.5
        self.qkv = _fuse([a.q_proj, a.k_proj, a.v_proj])
        self.gate_up = _fuse([m.gate_proj, m.up_proj])
        self.rope = RopeTable(draft.rotary_emb)
        d2t = draft.d2t  # the target id of draft id i is i + d2t[i]: one lookup a level, not two
        self.to_target = d2t + torch.arange(len(d2t), device=d2t.device)

    def __getattr__(self, name: str):  # config, fc, d2t, draft_vocab_size, embed, project...
        return getattr(self.__dict__["draft"], name)

    def backbone(self, embeds, hidden, position_ids, cache, mask) -> torch.Tensor:
        """``Eagle3Draft.backbone`` (same maths, HF's rotary module): the pre-norm state ``[B, T, H]``."""
        layer = self.draft.midlayer
        ops = ops_for(cache, hidden, self.rope)
        rot = ops.rotation(self.rope, hidden, position_ids)
        x = ops.rms_norm_cat([(embeds, *_norm(layer.input_layernorm)), (hidden, *_norm(layer.hidden_norm))])
        mask = ops.fold_mask(mask, self.heads[0] // self.heads[1])
        h = attention(ops, x, hidden, self.qkv, None, layer.self_attn.o_proj, self.heads, self.scaling, rot, cache, 0,
                      mask)
        return mlp(ops, h, layer.post_attention_layernorm, self.gate_up, layer.mlp.down_proj)

    def logits(self, hidden: torch.Tensor, cache=None) -> torch.Tensor:
        """The draft's logits of ``hidden``; its norm as a kernel where ``cache`` is a GPU's static one."""
        head = self.draft.lm_head
        return ops_for(cache, hidden, self.rope).linear(hidden, head.weight, head.bias, _norm(self.draft.norm))


class RopeTable:
    """The rotary module's cos and sin, looked up in a table of every position once ``extend`` has
    built it (one gather instead of about 10 kernels a forward: a draft tree runs ``num_steps``
    forwards). The table is the module's own output for positions ``0..size``, so the values are
    the same; until then, and for positions an engine never sized it for, call the module."""

    def __init__(self, rotary: nn.Module):
        self.rotary, self.table, self.size = rotary, None, 0
        self.kept = []  # earlier tables: CUDA graphs captured against them still read them

    def extend(self, size: int, like: torch.Tensor) -> None:
        """Cover positions ``0..size - 1`` (never shrinks; every static pool calls it for its slots before
        capturing)."""
        if size <= self.size:
            return
        with torch.no_grad():
            cos, sin = self.rotary(like, torch.arange(size, device=like.device)[None])
        if self.table is not None:
            self.kept.append(self.table)
        self.table, self.size = torch.cat([cos[0], sin[0]], dim=-1), size  # [size, 2 D]

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.table is None:
            return self.rotary(x, position_ids)
        return self.table[position_ids].chunk(2, dim=-1)  # [B, T, D] each


def attention(ops: TorchOps, x, residual, qkv_w, qkv_b, o_proj, heads: tuple[int, int, int], scaling: float, rot,
              cache, layer: int, mask, qk_norms=None, norm=None) -> torch.Tensor:
    """``residual + o_proj(attn(x))`` for ``x`` ``[B, T, in]`` (RMS-normed by ``norm``, a pair (weight,
    eps), when given): fused q/k/v, then ``ops`` rotates q and k (after Qwen3's per-head norms) and
    stores keys and values in ``cache`` as ``layer``; grouped-query attention is folded into the query
    axis (``mask`` already folded by ``ops.fold_mask``)."""
    q, keys, values = ops.qkv_to_cache(ops.linear(x, qkv_w, qkv_b, norm), heads, rot, cache, layer, qk_norms)
    return ops.linear_add(residual, ops.attend(q, keys, values, mask, scaling, heads), o_proj.weight, o_proj.bias)


def mlp(ops: TorchOps, h: torch.Tensor, norm: nn.Module, gate_up: torch.Tensor, down: nn.Linear) -> torch.Tensor:
    """``h + down(silu(gate) * up)`` of ``norm(h)``, gate and up in one GEMM."""
    return ops.linear_add(h, ops.linear_silu(h, gate_up, None, _norm(norm)), down.weight, down.bias)


def _norm(norm: nn.Module) -> tuple[torch.Tensor, float]:
    """An HF RMSNorm (``weight * x / rms(x)``, the family's only norm) as the pair ``ops`` takes."""
    return norm.weight, norm.variance_epsilon


def _fuse(linears: list[nn.Linear], name: str = "weight") -> torch.Tensor | None:
    """One tensor holding the linears' weights (or biases) end to end; the linears then view it (and
    keep their ``requires_grad``: a draft can be served and trained in one process, its optimizer
    then updates the fused tensor in place)."""
    parts = [getattr(lin, name) for lin in linears]
    if any(p is None for p in parts):
        return None
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for lin, p in zip(linears, parts):
        n = p.shape[0]
        setattr(lin, name, nn.Parameter(fused[start : start + n], requires_grad=p.requires_grad))
        start += n
    return fused
