"""Constant tensors made once per shape and device, not once per forward.

Inside a CUDA graph every ``torch.arange``, ``torch.full`` or ``torch.zeros`` is a kernel that runs
again on every replay; a speculative step had about 15 of them (a few microseconds each on the
H200, the price of any kernel at this size). These are made on first use, which for a graph is its
warm-up run, outside capture, and kept (read-only: nothing writes into them).
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1024)
def arange(n: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(n, device=device)`` (int64)."""
    with torch.inference_mode(False):  # kept across calls and graph captures: a plain tensor
        return torch.arange(n, device=device)


@functools.lru_cache(maxsize=256)
def full(shape: tuple[int, ...], value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.full(shape, value, dtype=dtype, device=device)``."""
    with torch.inference_mode(False):
        return torch.full(shape, value, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def eye(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.eye(n, dtype=dtype, device=device)``."""
    with torch.inference_mode(False):
        return torch.eye(n, dtype=dtype, device=device)
