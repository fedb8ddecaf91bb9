"""Which kernels the native path's forwards run, as one frozen object: ``KernelSettings``.

The engine holds it as ``EngineConfig.kernels`` and builds its static caches with it (``StaticKV.kernels``);
``ops.ops_for`` gives a forward over such a cache the ``TritonOps`` made for these settings. ``EYAS_KERNELS``
is read once, by ``from_env`` (what an ``EngineConfig`` takes when it is given no settings), never per
forward. Benchmarks and tests build the settings they compare (``dataclasses.replace(settings,
row_linears=False)``) and pass them to the engine (``Engine(..., kernels=settings)``).

What a kernel that failed leaves behind is not a setting: ``kernels.triton_ops.FAILURES`` keeps it for
the process, whatever the settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import EyasError

MODES = ("auto", "torch", "triton")


@dataclass(frozen=True)
class KernelSettings:
    # auto: the Triton kernels on a GPU's static cache, the torch ops everywhere else; torch: never the
    # kernels; triton: the kernels on the CPU too (Triton's interpreter, for tests), and a kernel's error stands
    mode: str = "auto"
    measure: bool = True  # each projection shape runs what ``kernel_choice`` timed fastest; False: the built-in
    fused_linears: bool = True  # one-row projections as ``_linear_kernel`` (False: cuBLAS always)
    row_linears: bool = True  # and projections of 2..ROWS_MAX rows as ``_linear_rows_kernel`` (False: cuBLAS)
    # ... also those with a norm or silu(gate) * up inside. Off: measured slower than the norm kernel +
    # cuBLAS (docs/log/engine.md, "Draft v6, the norm inside the rows kernel in one pass")
    row_prologues: bool = False
    # With row_prologues off, a norm before a projection of 2..ROWS_MAX rows runs as the norm kernel and
    # the projection as _linear_rows_kernel (silu(gate) * up in its epilogue: no silu kernel). Off: the
    # norm kernel, cuBLAS, and the silu kernel, measured slower (docs/log/engine.md, "Fewer kernels a
    # speculative step"); pair.py flips it.
    row_norm_apart: bool = True
    pdl: bool = True  # programmatic dependent launch where the GPU has it (``pdl._after_previous_kernel``)

    def __post_init__(self):
        if self.mode not in MODES:
            raise EyasError(f"kernel mode {self.mode!r} is not one of {', '.join(MODES)}",
                            "use auto (the default), or torch to run without the Triton kernels")

    @property
    def forced(self) -> bool:
        """The kernels asked for everywhere (``triton``): a kernel that fails raises instead of falling back."""
        return self.mode == "triton"

    @classmethod
    def from_env(cls) -> KernelSettings:
        """The default settings in the mode ``EYAS_KERNELS`` names (auto when it is unset)."""
        mode = os.environ.get("EYAS_KERNELS", "auto").lower()
        if mode not in MODES:
            raise EyasError(f"EYAS_KERNELS={mode!r} is not one of {', '.join(MODES)}",
                            "unset it (auto), or set torch to run without the Triton kernels")
        return cls(mode=mode)
