"""Constant tensors made once per shape and device, not once per forward.

Inside a CUDA graph every ``torch.arange``, ``torch.full`` or ``torch.zeros`` is a kernel that runs
again on every replay; a speculative step had about 15 of them (each costs what any kernel at this
size costs: docs/engine.md, the native path). These are made on first use, which for a graph is its
warm-up run, outside capture, and kept (read-only: nothing writes into them). Kept for good: a
captured graph reads them by address, so a cache that evicted one would free memory a graph still
reads. There are few: one per shape the engine's buckets reach.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def arange(n: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(n, device=device)`` (int64)."""
    with torch.inference_mode(False):  # kept across calls and graph captures: a plain tensor
        return torch.arange(n, device=device)


@functools.cache
def full(shape: tuple[int, ...], value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.full(shape, value, dtype=dtype, device=device)``."""
    with torch.inference_mode(False):
        return torch.full(shape, value, dtype=dtype, device=device)


@functools.cache
def eye(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.eye(n, dtype=dtype, device=device)``."""
    with torch.inference_mode(False):
        return torch.eye(n, dtype=dtype, device=device)
