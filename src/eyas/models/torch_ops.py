"""The operations of a Llama-family block other than its GEMMs, as plain PyTorch: ``TorchOps``.

``TorchOps`` is the reference: any device, autograd-safe. ``models.kernels.triton_ops`` holds
``TritonOps``, the same operations as fused Triton kernels for the GPU's static-cache path, where
at batch 1 a forward costs its kernel count more than its arithmetic. ``NativeLlama`` and
``NativeEagle3`` ask ``models.ops.ops_for`` which one a forward uses; both compute the same maths in
float32 and round once or twice to the model's dtype, so they agree to a rounding. (The token
tree's ops are ``eyas.spec.tree_ops``.)

    rotation(rope, x, positions)   -> what ``qkv_to_cache`` needs to rotate q and k at ``positions``
    rms_norm(x, weight, eps)       -> weight * x / rms(x)
    rms_norm_cat(parts)            -> the rms_norm of each (x, weight, eps), concatenated (last axis)
    linear(x, w, b, norm)          -> F.linear of x, RMS-normed first when norm = (weight, eps)
    linear_silu(x, w, b, norm)     -> silu_mul(linear(x, w, b, norm)), w = the MLP's [gate; up]
    linear_add(res, x, w, b)       -> res + F.linear(x, w, b)
    silu_mul(x)                    -> silu(gate) * up, for x = [gate | up]
    qkv_to_cache(qkv, heads, rot, cache, layer, norms)
                                   -> (q folded for GQA, the cache's keys, its values)
    fold_mask(mask, rep)           -> the additive mask as ``attend`` takes it
    attend(q, keys, values, mask, scale, heads)
                                   -> attention output [B, T, Hq * D]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    name = "torch"

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        cos, sin = rope(x, positions)  # [B, T, D] each
        return cos[:, None], sin[:, None]  # broadcast over heads

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def rms_norm_cat(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
        """``cat([rms_norm(x, weight, eps) for each part], -1)``: an EAGLE-3 draft's input (the token's
        embedding and the hidden state, each normed)."""
        return torch.cat([self.rms_norm(*part) for part in parts], dim=-1)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, of ``rms_norm(x, *norm)`` when ``norm`` is given."""
        return F.linear(x if norm is None else self.rms_norm(x, *norm), weight, bias)

    def linear_silu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """``silu_mul(linear(x, weight, bias, norm))``: the MLP's fused gate/up ``[gate; up]``, activated."""
        return self.silu_mul(self.linear(x, weight, bias, norm))

    def linear_add(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + F.linear(x, weight, bias)``; without a bias in one GEMM, the residual riding in
        as the accumulator."""
        if bias is not None:
            return residual + F.linear(x, weight, bias)
        shape = residual.shape
        return torch.addmm(residual.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), weight.t()).view(shape)

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        """From the fused projection ``[B, T, (Hq + 2 Hkv) D]``: Qwen3's per-head norms (``norms``, a
        pair of RMSNorm modules), rotary on q and k in one pass, keys and values into ``cache`` as
        ``layer``. Returns q as ``[B, Hkv, rep * T, D]`` (the query heads that share a KV head along
        the query axis, so SDPA reads each key once) and the keys and values to attend to."""
        bsz, t = qkv.shape[:2]
        hq, hkv, d = heads
        nq, nkv = hq * d, hkv * d
        if norms is not None:
            qk = torch.cat([self.rms_norm(qkv[..., :nq].view(bsz, t, hq, d), norms[0].weight,
                                          norms[0].variance_epsilon),
                            self.rms_norm(qkv[..., nq : nq + nkv].view(bsz, t, hkv, d), norms[1].weight,
                                          norms[1].variance_epsilon)], dim=2)
        else:
            qk = qkv[..., : nq + nkv].view(bsz, t, hq + hkv, d)
        qk = rope_rotate(qk.transpose(1, 2), *rot)  # [B, Hq + Hkv, T, D]
        v = qkv[..., nq + nkv :].view(bsz, t, hkv, d).transpose(1, 2)
        keys, values = cache.update(qk[:, hq:], v, layer)
        return qk[:, :hq].reshape(bsz, hkv, hq // hkv * t, d), keys, values

    def fold_mask(self, mask: torch.Tensor, rep: int) -> torch.Tensor:
        """``[B, 1, T, W]`` -> ``[B, 1, rep * T, W]``: one mask row per folded query row."""
        if rep == 1:
            return mask
        bsz, _, t, w = mask.shape
        return mask[:, :, None].expand(bsz, 1, rep, t, w).reshape(bsz, 1, rep * t, w)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
               heads: tuple[int, int, int]) -> torch.Tensor:
        """SDPA of the folded queries (``mask`` from ``fold_mask``), as ``[B, T, Hq * D]``."""
        hq, _, d = heads
        bsz, t = q.shape[0], q.shape[2] * q.shape[1] // hq
        # PyTorch picks cuDNN's attention here; its memory-efficient kernel avoids the strided K/V copies
        # cuDNN makes but measured slower (docs/log/engine.md, "Before the kernels").
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return o.reshape(bsz, hq, t, d).transpose(1, 2).reshape(bsz, t, hq * d)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF's rotate-half convention, on q and k heads at once."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat([-x[..., half:], x[..., :half]], dim=-1), sin)
