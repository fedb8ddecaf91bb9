"""A preallocated KV cache: one tensor per model, written in place, never reallocated.

    buf [layers, 2 (k, v), rows, kv_heads, slots, head_dim]

It keeps ``eyas.models.kv_cache``'s invariant (slot == position; a step appends ``T`` slots at
``[used, used + T)`` for every row, ``commit`` moves the accepted ones down and the rest are
forgotten) and its operations, so the engine drives it exactly like the growing ``DynamicCache``.
What changes is that nothing is ever allocated: every forward writes into the same memory, which
is what lets a CUDA graph be captured once and replayed (see ``eyas.engine.graphs``).

Attention reads a *window* of slots ``[0, window)``: ``used + T`` in eager mode, or a fixed bucket
at least that wide under a graph, whose extra slots the mask hides. ``write_slots`` says where the
``T`` new keys go. Both are set by whoever runs the forward (``begin``; ``aim`` for a graph or a fused
step, with slots of its own), not by the layers; ``hold`` sets the live rows and slots a graphed
prefill wrote.

``kernels`` are the settings the forwards over this cache run the Triton kernels under (``ops.ops_for``):
the engine's, which builds its caches with them.

Prefill runs on a small ``DynamicCache`` first (prompts of any length, eagerly); ``adopt`` then
copies those rows into the preallocated buffer, and ``append_rows`` does the same when new
sequences join a running batch.
"""

from __future__ import annotations

import torch

from ..errors import EyasError
from . import consts
from .kernel_settings import KernelSettings


def move_slots(t: torch.Tensor, lengths: torch.Tensor, src: torch.Tensor) -> None:
    """In ``t`` shaped ``[..., rows, heads, slots, head_dim]``, copy row b's slots ``src[b]`` to
    ``lengths[b], lengths[b] + 1, ..``: one indexed read of those ``B x K`` entries, then one indexed
    write, touching nothing else (a ``scatter_`` over the slot axis copied the whole tensor on the CPU,
    110-150 ms a step for SmolLM2's static cache). Columns past a row's kept count land past its new
    length, where nothing reads them."""
    b, k = src.shape
    dst = lengths[:, None] + consts.arange(k, src.device)[None, :]
    rows = consts.arange(b, src.device)[:, None].expand(b, k)
    t[..., rows, :, dst, :] = t[..., rows, :, src, :]


class StaticKV:
    def __init__(self, layers: int, rows: int, kv_heads: int, slots: int, head_dim: int,
                 dtype: torch.dtype, device, kernels: KernelSettings | None = None):
        self.kernels = kernels or KernelSettings()
        self.buf = torch.zeros((layers, 2, rows, kv_heads, slots, head_dim), dtype=dtype, device=device)
        self.capacity_rows, self.capacity_slots = rows, slots
        self.n = 0  # live rows (the first n of the buffer)
        self.used = 0  # slots before the uncommitted region (the DynamicCache's slot count)
        self.window = 0
        self.write_slots = torch.zeros(0, dtype=torch.long, device=device)

    def reset(self) -> None:
        """Empty, zeroed, as built (after a warm-up wrote into it)."""
        self.buf.zero_()
        self.n = self.used = self.window = 0
        self.write_slots = self.write_slots[:0]

    # -- what a forward does -----------------------------------------------------------------
    def begin(self, tokens: int) -> None:
        """Eager forward of ``tokens`` new slots per row: write at ``[used, used + tokens)``."""
        self._check_room(self.used + tokens)
        self.aim(self.used + tokens, torch.arange(self.used, self.used + tokens, device=self.buf.device))

    def aim(self, window: int, write_slots: torch.Tensor) -> None:
        """The next forwards attend over slots ``[0, window)`` and write their keys at ``write_slots``
        (``[T]``, or a graph's own tensor: set before capture, refilled before each replay)."""
        self.window, self.write_slots = window, write_slots

    def hold(self, rows: int = 0, slots: int = 0) -> None:
        """Hold ``rows`` live rows of ``slots`` slots: what a forward that wrote them (a graphed prefill,
        which writes at positions) left, or empty before it."""
        self.n, self.used = rows, slots

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
        """Store the new keys/values ``[B, H, T, D]``; return the attended window ``[B, H, W, D]``."""
        kb, vb = self.layer_buffers(layer, k.shape[0])
        kb.index_copy_(2, self.write_slots, k)
        vb.index_copy_(2, self.write_slots, v)
        return self.window_of(layer, k.shape[0])

    def layer_buffers(self, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of ``layer`` for the first ``rows`` rows, every slot ``[B, H, slots, D]``
        (where a fused kernel writes the step's keys, at ``write_slots``)."""
        return self.buf[layer, 0, :rows], self.buf[layer, 1, :rows]

    def window_of(self, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The attended keys and values of ``layer``: slots ``[0, window)``."""
        return self.buf[layer, 0, :rows, :, : self.window], self.buf[layer, 1, :rows, :, : self.window]

    def advance(self, tokens: int) -> None:
        self.used += tokens

    def _check_room(self, slots: int) -> None:
        if slots > self.capacity_slots:
            raise EyasError(
                f"the KV cache holds {self.capacity_slots} positions per sequence; this step needs {slots}",
                "raise --context-length (the cache is sized from it) or send shorter requests",
            )

    # -- the engine's operations (``DynamicKV``'s too) -------------------------------------------
    def num_slots(self) -> int:
        return self.used

    def crop(self, slots: int) -> None:
        self.used = slots

    def commit(self, lengths: torch.Tensor, src: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Move row b's kept slots ``src[b, :counts[b]]`` to ``lengths[b]..`` (``move_slots``)."""
        move_slots(self.buf, lengths, src)
        return lengths + counts

    def select_rows(self, keep: list[int], slots: int) -> None:
        """Row i becomes row ``keep[i]`` (``slots`` of it): only the rows whose place changes are copied (a
        batch keeps its rows in place where it can, ``batch.in_place``)."""
        moved = [(i, r) for i, r in enumerate(keep) if r != i]
        if moved:
            dst, src = (torch.tensor(x, device=self.buf.device) for x in zip(*moved))
            self.buf[:, :, dst, :, :slots] = self.buf[:, :, src, :, :slots]
        self.n, self.used = len(keep), slots

    def num_rows(self) -> int:
        return self.n

    def concat_rows(self, other) -> StaticKV:
        """Append ``other``'s rows after these (``append_rows``); this cache holds them all."""
        self.append_rows(other)
        return self

    def append_rows(self, cache) -> None:
        """Copy the rows of ``cache`` (a ``DynamicKV``, or a ``StaticKV``: a graphed prefill's) after the live
        rows."""
        rows, slots = cache.num_rows(), cache.num_slots()
        if self.n + rows > self.capacity_rows:
            raise EyasError(f"the batch would hold {self.n + rows} sequences; the KV cache was sized for "
                            f"{self.capacity_rows}", "raise --max-running-requests or send fewer at once")
        self._check_room(slots)
        cache.copy_into(self.buf[:, :, self.n : self.n + rows, :, :slots])
        self.n += rows
        self.used = max(self.used, slots)

    def copy_into(self, dst: torch.Tensor) -> None:
        """Write the live rows' slots into ``dst`` ``[layers, 2, rows, H, slots, D]``: one copy for every layer."""
        dst.copy_(self.buf[:, :, : self.n, :, : self.used])

    def adopt(self, cache) -> StaticKV:
        """Become the cache of ``cache``'s rows alone (the buffer's earlier rows are forgotten)."""
        self.hold()
        self.append_rows(cache)
        return self

    def scrub(self, rows: list[int]) -> None:
        """Zero ``rows``, every slot: a later row in their place would otherwise attend over a NaN in a masked
        slot (0 x NaN is NaN)."""
        self.buf[:, :, torch.tensor(rows, device=self.buf.device)] = 0
