"""Which ops a forward of ``NativeLlama`` or ``NativeEagle3`` uses: ``TORCH`` (``torch_ops.TorchOps``)
or ``TRITON`` (``kernels.triton_ops.TritonOps``), by ``EYAS_KERNELS``, the forward's cache, device
and autograd. ``spec.ops.ops_for`` makes the same choice for the engine, the token tree's ops added.
"""

from __future__ import annotations

import os

import torch

from ..errors import EyasError
from .static_cache import StaticKV
from .torch_ops import TorchOps

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
    if triton_ops is None or (triton_ops.failed and mode == "auto"):  # a kernel failed earlier: see TritonOps
        return TORCH
    return triton_ops


def triton_kernels() -> TorchOps | None:
    """``kernels.triton_ops.TRITON``, or None where Triton is not installed."""
    try:
        from .kernels.triton_ops import TRITON
    except ImportError:
        return None
    return TRITON
