"""Which ops a forward of ``NativeLlama`` or ``NativeEagle3`` uses: ``TORCH`` (``torch_ops.TorchOps``)
or the Triton kernels (``kernels.triton_ops.TritonOps``), by the cache's ``KernelSettings``
(``StaticKV.kernels``, the engine's), the forward's device and autograd. ``spec.ops.ops_for`` makes the
same choice for the engine, the token tree's ops added.
"""

from __future__ import annotations

import functools

import torch

from ..errors import EyasError
from .kernel_settings import KernelSettings
from .torch_ops import TorchOps

TORCH = TorchOps()


def kernels_for(cache, x: torch.Tensor, rope) -> KernelSettings | None:
    """The settings a forward of ``x`` over ``cache`` runs the Triton kernels under, or None for the
    torch ops. Only a static cache takes the kernels (a ``DynamicKV``'s ``kernels`` are None), by its
    ``kernels.mode``: ``auto`` (the default) on a GPU, ``torch`` never, ``triton`` on the CPU too, in
    Triton's interpreter (for tests). Never where the rope table is not yet built or autograd records
    (training), nor once the forward's kernels have failed in this process (``triton_ops.FAILURES``),
    unless the mode is ``triton``."""
    settings = None if cache is None else cache.kernels
    if (settings is None or settings.mode == "torch" or getattr(rope, "table", None) is None
            or (torch.is_grad_enabled() and x.requires_grad) or (settings.mode == "auto" and not x.is_cuda)):
        return None
    try:
        from .kernels import triton_ops
    except ImportError:
        if settings.forced:
            raise EyasError("EYAS_KERNELS=triton but Triton is not installed",
                            "pip install triton, or unset EYAS_KERNELS") from None
        return None
    return None if triton_ops.FAILURES.get("failed") and not settings.forced else settings


def ops_for(cache, x: torch.Tensor, rope) -> TorchOps:
    """The ops a forward of ``x`` over ``cache`` uses (``kernels_for``)."""
    settings = kernels_for(cache, x, rope)
    return TORCH if settings is None else _kernel_ops(settings)


@functools.cache
def _kernel_ops(settings: KernelSettings) -> TorchOps:
    """The block's kernels under ``settings``: one ``TritonOps`` each, kept for the process."""
    from .kernels.triton_ops import TritonOps

    return TritonOps(settings)
