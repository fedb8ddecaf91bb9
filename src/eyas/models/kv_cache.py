"""KV-cache bookkeeping shared by the target and the draft.

Both keep their keys and values in a Hugging Face ``DynamicCache`` (one layer for the draft):
tensors ``[batch, kv_heads, slots, head_dim]``. eyas keeps one invariant on top of it:

    slot == position. Row ``b`` holds its committed tokens in slots ``0 .. lengths[b] - 1``;
    slots from ``lengths[b]`` on are garbage for that row and masked out.

A step appends ``T`` slots for every row at ``[S, S + T)`` (``S`` = the cache's slot count), then
``commit`` copies the accepted ones down to ``lengths[b] ..`` and ``crop`` drops the rest. Rejected
tree nodes and padding thus never stay in the cache, and a static cache (write at ``position``) can later replace
this without changing the engine: ``StaticKV`` (``eyas.models.static_cache``) is that cache, and
every function here hands it its own in-place version of the operation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from . import consts
from .static_cache import StaticKV, move_slots


def new_cache() -> DynamicCache:
    # No config: every layer is a plain growing layer (no sliding-window cropping behind our back).
    return DynamicCache()


def _layers(cache: DynamicCache):
    return [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]


def num_slots(cache: DynamicCache) -> int:
    if isinstance(cache, StaticKV):
        return cache.num_slots()
    layers = _layers(cache)
    return 0 if not layers else int(layers[0].keys.shape[-2])


def crop(cache: DynamicCache, slots: int) -> None:
    if isinstance(cache, StaticKV):
        return cache.crop(slots)
    for layer in _layers(cache):
        layer.keys = layer.keys[..., :slots, :]
        layer.values = layer.values[..., :slots, :]


def commit(
    cache: DynamicCache,
    lengths: torch.Tensor,  # [B] committed slots per row before this step
    src: torch.Tensor,  # [B, K] absolute slots (appended this step) to keep, in order
    counts: torch.Tensor,  # [B] how many of src to keep per row (<= K)
) -> torch.Tensor:
    """Move the kept slots of each row down to ``lengths[b]..``; return the new lengths.

    The slot count is left as it was: cropping it to the new lengths' maximum needs that number on
    the host, and the engine reads it back once, at the end of its step, before it calls ``crop``."""
    if isinstance(cache, StaticKV):
        return cache.commit(lengths, src, counts)
    for layer in _layers(cache):
        for t in (layer.keys, layer.values):  # [B, H, S, D], in place (on a view after ``crop``: its base)
            move_slots(t, lengths.to(t.device), src.to(t.device))
    return lengths + counts


def select_rows(cache: DynamicCache, rows: torch.Tensor, slots: int) -> None:
    """Keep only ``rows`` (batch indices) and the first ``slots`` slots."""
    if isinstance(cache, StaticKV):
        return cache.select_rows(rows, slots)
    for layer in _layers(cache):
        layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))[..., :slots, :]
        layer.values = layer.values.index_select(0, rows.to(layer.values.device))[..., :slots, :]


def concat_rows(a: DynamicCache, b: DynamicCache) -> DynamicCache:
    """Stack two caches along the batch, padding the shorter one's slots (padding is masked)."""
    if isinstance(a, StaticKV):
        a.append_rows(b)
        return a
    la, lb = _layers(a), _layers(b)
    if not la:
        return b
    if not lb:
        return a
    s = max(la[0].keys.shape[-2], lb[0].keys.shape[-2])
    for x, y in zip(la, lb):
        for name in ("keys", "values"):
            tx, ty = getattr(x, name), getattr(y, name)
            tx = torch.nn.functional.pad(tx, (0, 0, 0, s - tx.shape[-2]))
            ty = torch.nn.functional.pad(ty, (0, 0, 0, s - ty.shape[-2]))
            setattr(x, name, torch.cat([tx, ty], dim=0))
    return a


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
