"""What every Triton kernel of eyas shares: the wait of programmatic dependent launch, and whether the
kernels run in Triton's interpreter.

Each kernel (``models.kernels``: norm, attention, linear; ``spec.tree_kernels``, ``spec.verify_kernels``)
calls ``_after_previous_kernel`` first. The launch side, ``triton_ops.TritonOps._launch``, which asks for
the dependent launch (unless its ``KernelSettings.pdl`` is off) and falls back to the plain one, sits with
``TritonOps``.
``_INTERPRETED``: the kernels were defined under ``TRITON_INTERPRET=1`` (how the CPU tests run them).
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control (Triton 3.4 on); without it the kernels launch the plain way
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _after_previous_kernel(PDL: tl.constexpr):
    """With ``PDL`` (programmatic dependent launch, Hopper on) a kernel's programs may start while
    the kernel before it in the stream still runs its last programs: each waits here, before it
    reads or writes anything, until that kernel has finished and its writes are visible, then lets
    the next kernel start the same way. Every kernel calls it first, so the order of effects
    is the stream's; what is gained is the launch gap between kernels (measured in docs/log/engine.md,
    "The plain step as one graph, dependent launch, silu after gate/up")."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


_INTERPRETED = type(_after_previous_kernel).__name__ == "InterpretedFunction"  # defined under TRITON_INTERPRET=1
