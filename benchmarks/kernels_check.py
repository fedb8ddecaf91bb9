#!/usr/bin/env python3
"""The projection kernels against the torch ops on this GPU, before any benchmark trusts them.

    python benchmarks/kernels_check.py

The CPU tests run the kernels in Triton's interpreter; this runs the compiled ones: every kind of
projection (norm, bias, residual, silu(gate) * up) at the row counts the engine gives them (1: a
decode step; 2-64: a draft level, the draft extend, a tree's verify) in bfloat16 and float32, on
SmolLM2's and the 8B shape's widths. Prints the largest difference of each and exits 1 on a
mismatch.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from common import ROOT  # noqa: F401 - puts src on the path

from eyas.models.kernel_settings import KernelSettings
from eyas.models.kernels.triton_ops import TritonOps, failures
from eyas.models.ops import TORCH

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (6144, 4096), (4096, 14336)]  # (N, K); gate/up: 2N
# every variant of the kernels, also those the engine leaves out
TRITON = TritonOps(replace(KernelSettings.from_env(), row_prologues=True))


def check(rows: int, n: int, k: int, dtype, kind: str) -> float:
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + n)
    x = torch.randn(rows, k, device="cuda", generator=g).to(dtype) * 2
    w = (torch.randn(2 * n if kind == "silu" else n, k, device="cuda", generator=g) / k ** 0.5).to(dtype)
    nrm = (torch.rand(k, device="cuda", generator=g).to(dtype) + 0.5, 1e-5)
    if kind == "residual":
        res = torch.randn(rows, n, device="cuda", generator=g).to(dtype)
        got, want = TRITON.linear_add(res, x, w), TORCH.linear_add(res.float(), x.float(), w.float())
    elif kind == "silu":
        got, want = TRITON.linear_silu(x, w, None, nrm), TORCH.linear_silu(x.float(), w.float(), None,
                                                                           (nrm[0].float(), nrm[1]))
    else:
        b = torch.randn(n, device="cuda", generator=g).to(dtype)
        got, want = TRITON.linear(x, w, b, nrm), TORCH.linear(x.float(), w.float(), b.float(), (nrm[0].float(), nrm[1]))
    return float(((got.float() - want).abs() / (want.abs() + 1)).max())


def main() -> int:
    bad = 0
    for dtype, tol in ((torch.bfloat16, 0.05), (torch.float32, 1e-4)):
        for rows in (1, 2, 8, 16, 48, 64):
            for n, k in SHAPES:
                for kind in ("norm-bias", "residual", "silu"):
                    err = check(rows, n, k, dtype, kind)
                    ok = err <= tol
                    bad += not ok
                    if not ok or rows in (1, 48):
                        print(f"{'ok ' if ok else 'BAD'} {str(dtype)[6:]:>8} rows {rows:>2} {n:>5} x {k:>5} {kind:<9} "
                              f"max rel diff {err:.2e}")
    print(f"kernel failures: {failures() or 'none'}; {bad} mismatches")
    return 1 if bad or failures() else 0


if __name__ == "__main__":
    sys.exit(main())
