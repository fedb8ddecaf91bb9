"""A plain decode step (no draft) on the native path's static cache as one CUDA graph.

``Engine.step`` builds a step from parts: the mask, the target's graph replay, the argmax, the
commit and the gathers around it, each a launch from the host, which then waits for the one
readback. On the H200 at batch 1 that host work left the GPU idle for ~0.45 ms of a 4.3 ms
Llama-3.1-8B step (``benchmarks/decode_8b.py``: the one-token graph alone replays in 3.9 ms). For a
greedy batch without speculation the whole step is a function of three tensors (each row's length
and last token, and the slot the new keys go to), so it is captured whole, like the draft's tree
and extend (``drafter.py``): a step is a few input copies, one replay and the readback.
"""

from __future__ import annotations

import torch

from ..models import kv_cache
from ..models.graphs import BatchGraph, window_buckets


def decode_static(native, pool, lengths: torch.Tensor, root: torch.Tensor, live: torch.Tensor, prefix: torch.Tensor,
                  window: int):
    """Feed each row's last token ``root`` [B] at position ``lengths[b]``, its keys at slot ``prefix``
    (a 1-element tensor), keep them at ``lengths[b]``; return (the greedy next token [B], the new
    lengths [B]). The mask is ``window`` wide: the whole function is one graph per (rows, window).
    A row with ``live`` 0 (a bucket's padding, or the zeros a graph is warmed up with, maybe while
    row 0 is a real one) keeps its keys where they were written, never over committed slots."""
    slot = torch.arange(window, device=root.device)[None, :]
    allowed = (slot < lengths[:, None]) | (slot == prefix)  # [B, window]: the committed slots and its own
    mask = kv_cache.additive(allowed[:, None, :], pool.buf.dtype)  # [B, 1, 1, window]
    pool.window, pool.write_slots = window, prefix
    logits, _ = native(root[:, None], lengths[:, None], mask, pool, ())
    src = prefix.expand(len(root), 1)
    pool.commit(torch.where(live > 0, lengths, prefix), src, live)
    return logits[:, -1].argmax(dim=-1), lengths + 1


class StaticDecoder:
    """``decode_static`` as one graph replay per (rows, window) bucket."""

    def __init__(self, native, pool, rows: list[int], enabled: bool):
        self.native, self.pool = native, pool
        self.steps = 0  # steps run whole (the rest ran by parts)
        self._live = None
        self.graph = BatchGraph(self._fn, pool, rows, window_buckets(pool.capacity_slots), enabled,
                                name="decode step", example=self._example, top_slots=1)

    def _fn(self, inputs, window):
        return decode_static(self.native, self.pool, inputs["lengths"], inputs["root"], inputs["live"],
                             inputs["prefix"], window)

    def _example(self, rows: int):
        ids = torch.zeros(rows, dtype=torch.long, device=self.pool.buf.device)
        return {"lengths": ids, "root": ids, "live": ids}, {"prefix": ids[:1]}

    @torch.inference_mode()
    def __call__(self, lengths: torch.Tensor, root: torch.Tensor):
        """(next tokens [B], new lengths [B]), or None past the last bucket (run the step by parts)."""
        prefix = self.pool.used
        if self._live is None or len(self._live) != len(root):
            self._live = torch.ones_like(root)
        out = self.graph({"lengths": lengths, "root": root, "live": self._live},
                         {"prefix": torch.full((1,), prefix, dtype=torch.long, device=root.device)}, prefix + 1)
        if out is not None:
            self.pool.advance(1)
            self.steps += 1
        return out
