"""The KV caches' shared invariant, their constructor and the attention masks over them.

Two caches hold the target's and the draft's keys and values, with one interface (``num_slots``,
``num_rows``, ``crop``, ``commit``, ``select_rows``, ``concat_rows``, ``copy_into``, ``scrub``,
``update``): ``DynamicKV`` (``eyas.models.dynamic_cache``), a growing Hugging Face ``DynamicCache``
for the generic path and eager prefill, and ``StaticKV`` (``eyas.models.static_cache``), preallocated
for the native path and its CUDA graphs. Both keep one invariant:

    slot == position. Row ``b`` holds its committed tokens in slots ``0 .. lengths[b] - 1``;
    slots from ``lengths[b]`` on are garbage for that row and masked out.

A step appends ``T`` slots for every row at ``[S, S + T)`` (``S`` = the cache's ``num_slots()``), then
``cache.commit`` copies the accepted ones down to ``lengths[b] ..`` and ``cache.crop`` drops the rest.
Rejected tree nodes and padding thus never stay in the cache, and the engine drives either cache
with the same calls.
"""

from __future__ import annotations

import torch

from . import consts
from .dynamic_cache import DynamicKV


def new_cache() -> DynamicKV:
    """An empty growing cache (``DynamicKV``: a ``DynamicCache`` with the static cache's operations)."""
    return DynamicKV()


def attention_mask(
    lengths: torch.Tensor,  # [B] committed slots visible to every new token of the row
    prefix_slots: int,  # S: slots before the uncommitted region
    new_mask: torch.Tensor,  # [B, T, N] bool: new token i may see uncommitted slot S + j
    dtype: torch.dtype,
) -> torch.Tensor:
    """Additive float mask ``[B, 1, T, S + N]`` (0 = visible, dtype-min = hidden).

    The uncommitted region holds the ``T`` tokens being appended, preceded (while a tree is being
    drafted) by the tree's earlier levels; ``N >= T``.
    """
    bsz, t, _ = new_mask.shape
    prefix = torch.arange(prefix_slots, device=lengths.device)[None, :] < lengths[:, None]
    allowed = torch.cat([prefix[:, None, :].expand(bsz, t, prefix_slots), new_mask], dim=-1)
    return additive(allowed, dtype)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T, S]`` bool visibility -> the additive float mask ``[B, 1, T, S]`` SDPA takes (0 visible,
    the dtype's min hidden; one kernel)."""
    return torch.where(allowed, consts.full((), 0.0, dtype, allowed.device), torch.finfo(dtype).min)[:, None]
