"""The operations of a Llama-family block other than its GEMMs, behind one interface.

``TorchOps`` is the reference: plain PyTorch, any device, autograd-safe. ``models.kernels`` holds
``TritonOps``, the same operations as fused Triton kernels for the GPU's static-cache path, where
at batch 1 a forward costs its kernel count more than its arithmetic. ``NativeLlama`` and
``NativeEagle3`` ask ``ops_for`` which one a forward uses; both compute the same maths in
float32 and round once or twice to the model's dtype, so they agree to a rounding.

    rotation(rope, x, positions)   -> what ``qkv_to_cache`` needs to rotate q and k at ``positions``
    rms_norm(x, weight, eps)       -> weight * x / rms(x)
    silu_mul(x)                    -> silu(gate) * up, for x = [gate | up]
    qkv_to_cache(qkv, heads, rot, cache, layer, norms)
                                   -> (q folded for GQA, the cache's keys, its values)
    fold_mask(mask, rep)           -> the additive mask as ``attend`` takes it
    attend(q, keys, values, mask, scale, heads)
                                   -> attention output [B, T, Hq * D]
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..errors import EyasError
from .static_cache import StaticKV


class TorchOps:
    name = "torch"

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        cos, sin = rope(x, positions)  # [B, T, D] each
        return cos[:, None], sin[:, None]  # broadcast over heads

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        """From the fused projection ``[B, T, (Hq + 2 Hkv) D]``: Qwen3's per-head norms (``norms``, a
        pair of RMSNorm modules), rotary on q and k in one pass, keys and values into ``cache`` as
        ``layer``. Returns q as ``[B, Hkv, rep * T, D]`` (the query heads that share a KV head along
        the query axis, so SDPA reads each key once) and the keys and values to attend to."""
        bsz, t = qkv.shape[:2]
        hq, hkv, d = heads
        nq, nkv = hq * d, hkv * d
        if norms is not None:
            qk = torch.cat([self.rms_norm(qkv[..., :nq].view(bsz, t, hq, d), norms[0].weight, norms[0].variance_epsilon),
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
        # PyTorch picks cuDNN's attention on the H200 here; its memory-efficient kernel avoids the strided
        # K/V copies cuDNN makes (34 -> 4 copies a step) but measured slower (1.97 vs 1.57 ms busy a step).
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return o.reshape(bsz, hq, t, d).transpose(1, 2).reshape(bsz, t, hq * d)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF's rotate-half convention, on q and k heads at once."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat([-x[..., half:], x[..., :half]], dim=-1), sin)


TORCH = TorchOps()
KERNELS = ("auto", "torch", "triton")


def ops_for(cache, x: torch.Tensor, rope) -> TorchOps:
    """The ops a forward of ``x`` over ``cache`` uses. ``EYAS_KERNELS`` picks: ``auto`` (the default)
    takes the Triton kernels on a GPU's static cache (the CUDA-graph path) and the torch ops
    everywhere else (prefill, the CPU, training, a rope table not yet built); ``torch`` never takes
    the kernels; ``triton`` takes them on the CPU too, in Triton's interpreter (for tests)."""
    mode = os.environ.get("EYAS_KERNELS", "auto").lower()
    if mode not in KERNELS:
        raise EyasError(f"EYAS_KERNELS={mode!r} is not one of {', '.join(KERNELS)}",
                        "unset it (auto), or set torch to run without the Triton kernels")
    if (mode == "torch" or not isinstance(cache, StaticKV) or getattr(rope, "table", None) is None
            or (torch.is_grad_enabled() and x.requires_grad) or (mode == "auto" and not x.is_cuda)):
        return TORCH
    triton_ops = triton_kernels()
    if triton_ops is None and mode == "triton":
        raise EyasError("EYAS_KERNELS=triton but Triton is not installed", "pip install triton, or unset EYAS_KERNELS")
    if triton_ops is None or (triton_ops.failed and mode == "auto"):  # a kernel failed earlier: see kernels.TritonOps
        return TORCH
    return triton_ops


def triton_kernels() -> TorchOps | None:
    """``kernels.TRITON``, or None where Triton is not installed."""
    try:
        from .kernels import TRITON
    except ImportError:
        return None
    return TRITON
