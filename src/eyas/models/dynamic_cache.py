"""The growing cache: transformers' ``DynamicCache`` behind the interface of ``StaticKV``.

The generic path (any HF model) and every eager prefill keep their keys and values in a
``DynamicCache`` (tensors ``[batch, kv_heads, slots, head_dim]``, one layer for the draft) that grows
as forwards append to it. ``DynamicKV`` holds one and offers the engine's cache operations under the
same names and meanings as ``StaticKV`` (``eyas.models.kv_cache`` states the invariant both keep), so
the engine calls ``cache.commit(...)`` whichever cache a batch holds. An HF model's forward takes the
raw ``DynamicCache``: ``hf`` hands it over.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .static_cache import move_slots


class DynamicKV:
    kernels = None  # the forwards over a growing cache run the torch ops (``ops.kernels_for``)

    def __init__(self):
        # No config: every layer is a plain growing layer (no sliding-window cropping behind our back).
        self.hf = DynamicCache()

    def _layers(self):
        return [layer for layer in self.hf.layers if getattr(layer, "is_initialized", False)]

    # -- what a forward does -----------------------------------------------------------------
    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
        """Append the new keys/values ``[B, H, T, D]``; return the layer's whole keys and values."""
        return self.hf.update(k, v, layer)

    # -- where a forward writes: a growing cache appends its keys, so there is nothing to set ----
    def begin(self, tokens: int) -> None:
        """``StaticKV.begin``: the next forward's ``tokens`` keys go at the end, where this cache grows."""

    def aim(self, window: int, write_slots: torch.Tensor) -> None:
        """``StaticKV.aim``: callers aim at the end (``write_slots`` from ``num_slots()``, ``window`` the
        slots after the forward), which is where ``update`` appends."""

    def advance(self, tokens: int) -> None:
        """``StaticKV.advance``: the forward's ``update`` has grown the cache already."""

    # -- the engine's operations (``StaticKV``'s, same names) ----------------------------------
    def num_slots(self) -> int:
        layers = self._layers()
        return 0 if not layers else int(layers[0].keys.shape[-2])

    def num_rows(self) -> int:
        layers = self._layers()
        return 0 if not layers else int(layers[0].keys.shape[0])

    def crop(self, slots: int) -> None:
        for layer in self._layers():
            layer.keys = layer.keys[..., :slots, :]
            layer.values = layer.values[..., :slots, :]

    def commit(self, lengths: torch.Tensor, src: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``StaticKV.commit``: move row b's kept slots ``src[b, :counts[b]]`` to ``lengths[b]..``."""
        for layer in self._layers():
            for t in (layer.keys, layer.values):  # [B, H, S, D], in place (on a view after ``crop``: its base)
                move_slots(t, lengths.to(t.device), src.to(t.device))
        return lengths + counts

    def select_rows(self, keep: list[int], slots: int) -> None:
        rows = torch.tensor(keep, dtype=torch.long)
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))[..., :slots, :]
            layer.values = layer.values.index_select(0, rows.to(layer.values.device))[..., :slots, :]

    def concat_rows(self, other: DynamicKV) -> DynamicKV:
        """Stack ``other``'s rows after these, padding the shorter one's slots (padding is masked)."""
        la, lb = self._layers(), other._layers()
        if not la:
            return other
        if not lb:
            return self
        s = max(la[0].keys.shape[-2], lb[0].keys.shape[-2])
        for x, y in zip(la, lb):
            for name in ("keys", "values"):
                tx, ty = getattr(x, name), getattr(y, name)
                tx = torch.nn.functional.pad(tx, (0, 0, 0, s - tx.shape[-2]))
                ty = torch.nn.functional.pad(ty, (0, 0, 0, s - ty.shape[-2]))
                setattr(x, name, torch.cat([tx, ty], dim=0))
        return self

    def copy_into(self, dst: torch.Tensor) -> None:
        """Write every row and slot into ``dst`` ``[layers, 2, rows, H, slots, D]`` (a ``StaticKV``'s
        buffer, from its adopting or appending these rows)."""
        for i, layer in enumerate(self._layers()):
            dst[i, 0] = layer.keys
            dst[i, 1] = layer.values

    def scrub(self, rows: list[int]) -> None:
        """Nothing: a growing cache drops a row's slots when the row leaves (``StaticKV.scrub``)."""
