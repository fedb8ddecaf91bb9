"""Forwards over a ``StaticKV``, eager or replayed from CUDA graphs captured per shape bucket.

A forward over the static cache has a shape ``(B rows, T new tokens, W attended slots)``. The
runner rounds each up to a bucket, copies the real inputs into fixed buffers of the bucket's shape
(zeros elsewhere), and replays the graph captured for that bucket the first time it was seen.
Padding is harmless by construction:

- padded rows live in rows of the cache buffer that hold no sequence;
- padded tokens write their keys past the real ones, into slots the next forward overwrites and
  that no real token can see (the mask hides every slot from ``used + T`` on);
- padded mask rows see everything, so no row is all ``-inf`` (no NaN anywhere).

Without CUDA (``capture=False``) the very same padding and buffers run eagerly: that is how the
CPU tests check the graph path's logic against the plain eager path.

``plan()`` lists every bucket a runner can hit and ``warm(key)`` builds (captures) one ahead of use:
``Engine.warm_up`` does that for all of them at startup, so no request pays for a capture.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from dataclasses import dataclass

import torch

from .static_cache import StaticKV

log = logging.getLogger("eyas.graphs")


def buckets(limit: int, start: int = 1, factor: int = 2) -> list[int]:
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= factor
    return out + [limit]


def window_buckets(slots: int) -> list[int]:
    """Attention-window buckets of a cache of ``slots``: 256, x4 each, up to the whole cache."""
    return buckets(slots, 256, 4)


def _pick(options: list[int], n: int) -> int | None:
    i = bisect_left(options, n)
    return options[i] if i < len(options) else None


def capture(fn, pool, device):
    """(graph, its outputs, memory pool) for ``fn()``, after two warm-up runs on a side stream."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs, graph.pool()


def capture_or_not(owner, fn, device):
    """``capture`` for a runner; if capture fails, the runner stays eager from then on (and says so)."""
    try:
        return capture(fn, owner.pool, device)
    except Exception as e:  # noqa: BLE001 - an op that cannot be captured must not take a server down
        owner.capture = False
        log.warning("%s: CUDA graph capture failed (%s: %s); running this part eagerly", owner.name,
                    type(e).__name__, e)
        torch.cuda.synchronize(device)
        return None, None, owner.pool


@dataclass
class _Graph:
    inputs: dict[str, torch.Tensor]
    mask: torch.Tensor
    slots: torch.Tensor
    outputs: tuple | None = None
    graph: object = None
    filled: int = 0  # BatchGraph: rows of the input buffers from here on are zeros
    holds: object = None  # BatchGraph: the state token its last replay left in the input buffers (``carry``)


class GraphRunner:
    """Runs ``fn(inputs, mask)`` over ``cache``; ``fn`` returns tensors shaped ``[B, T, ...]``.

    ``inputs`` maps names to ``[B, T, ...]`` tensors; ``mask`` is the engine's additive mask
    ``[B, 1, T, used + T]``. ``enabled=False`` keeps everything eager and unpadded (the reference).
    """

    def __init__(self, fn, cache: StaticKV, rows: list[int], tokens: list[int], windows: list[int],
                 enabled: bool = True, capture: bool | None = None, name: str = "forward", example=None):
        self.fn, self.cache, self.name = fn, cache, name
        self.example = example  # (rows, tokens) -> (inputs, mask) of that shape: what ``warm`` builds from
        self.rows, self.tokens, self.windows = rows, tokens, windows
        self.enabled = enabled
        self.capture = cache.buf.is_cuda if capture is None else capture
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool = None
        self.replays = self.eager_calls = 0

    def plan(self) -> list[tuple[int, int, int]]:
        """Every (rows, tokens, window) bucket a forward can hit (a window holds the tokens and a prefix)."""
        return [(b, t, w) for b in self.rows for t in self.tokens for w in self.windows if t < w]

    def warm(self, key: tuple[int, int, int]) -> None:
        if key not in self.graphs:
            self._build(key, *self.example(key[0], key[1]))

    def _key(self, b: int, t: int) -> tuple[int, int, int] | None:
        need = self.cache.used + t
        key = (_pick(self.rows, b), _pick(self.tokens, t), _pick(self.windows, need))
        if None in key or self.cache.used + key[1] > self.cache.capacity_slots:
            return None
        return key

    def __call__(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> tuple:
        b, t = mask.shape[0], mask.shape[2]
        key = self._key(b, t) if self.enabled else None
        if key is None:
            return self._eager(inputs, mask, t)
        g = self.graphs.get(key) or self._build(key, inputs, mask)
        need = self.cache.used + t
        padded = (b, t) != (key[0], key[1])  # a full bucket is overwritten whole: no zeroing launches
        for name, x in inputs.items():
            buf = g.inputs[name]
            if padded:
                buf.zero_()
            buf[:b, :t].copy_(x)
        if padded:
            g.mask.zero_()
        g.mask[:b, :, :t, :need].copy_(mask)
        g.mask[:b, :, :t, need:].fill_(torch.finfo(g.mask.dtype).min)
        torch.arange(self.cache.used, self.cache.used + key[1], out=g.slots)
        outputs = self._run(g, key)
        self.cache.advance(t)
        return tuple(o[:b, :t].clone() for o in outputs)

    def _eager(self, inputs, mask, t):
        self.eager_calls += 1
        self.cache.begin(t)
        out = self.fn(inputs, mask)
        self.cache.advance(t)
        return out

    def _run(self, g: _Graph, key) -> tuple:
        self.cache.aim(key[2], g.slots)
        if g.graph is not None:
            self.replays += 1
            g.graph.replay()
            return g.outputs
        return self.fn(g.inputs, g.mask)

    def _build(self, key, inputs, mask) -> _Graph:
        rows, tokens, window = key
        dev = mask.device
        bufs = {n: torch.zeros((rows, tokens) + x.shape[2:], dtype=x.dtype, device=dev) for n, x in inputs.items()}
        g = _Graph(bufs, torch.zeros((rows, 1, tokens, window), dtype=mask.dtype, device=dev),
                   torch.zeros(tokens, dtype=torch.long, device=dev))
        # Warm up (and capture) with keys written to the top slots, which hold nothing. Without
        # CUDA the warm-up still runs once, so CPU tests exercise exactly what capture will run.
        top = self.cache.capacity_slots - tokens
        torch.arange(top, top + tokens, out=g.slots)
        self.cache.aim(window, g.slots)
        if self.capture:
            g.graph, g.outputs, self.pool = capture_or_not(self, lambda: self.fn(g.inputs, g.mask), dev)
            log.debug("captured %s graph rows=%d tokens=%d window=%d", self.name, rows, tokens, window)
        else:
            self.fn(g.inputs, g.mask)
        self.graphs[key] = g
        return g


class BatchGraph:
    """A whole function of per-row inputs ``[B, ...]`` (plus a few slot numbers, each a 1-element
    tensor inside the graph, ``fixed``) as one graph
    per (rows, window) bucket: how the engine drafts a tree in one replay. ``__call__`` returns
    None when no bucket fits (the caller then runs its eager path).

    The rows of a bucket past the batch's are zeros in every input buffer (the caller's padding rows
    are harmless on zeros). ``carry(inputs, outputs) -> {input name: [bucket rows, ...]}``, applied inside
    the graph after ``fn``, writes what a step leaves for the next (a decode step's new lengths and last
    tokens) into the input buffers: a caller that steps the same batch through the same bucket again names
    that state (``__call__``'s ``state``) and no input is copied from the host's side. The caller keeps
    the padding rows at zero in what it carries (``live``). A graph with a carry returns views of its
    output buffers, not copies: its caller steps one batch, whose next step reads them (or their carry)
    before the next replay overwrites them."""

    def __init__(self, fn, cache: StaticKV, rows: list[int], windows: list[int], enabled: bool = True,
                 capture: bool | None = None, name: str = "batch", example=None, top_slots: int = 0, carry=None):
        self.fn, self.cache, self.name = fn, cache, name  # fn(inputs, window) -> tuple of [B, ...] tensors
        self.example, self.top_slots = example, top_slots  # example(rows) -> (inputs, fixed), for ``warm``
        self.carry = carry
        self.carried = 0  # calls that found their inputs carried in the buffers already
        self._carries: set[str] = set()  # the inputs (and fixed slot numbers) the carry writes
        self.rows, self.windows, self.enabled = rows, windows, enabled
        self.capture = cache.buf.is_cuda if capture is None else capture
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool = None

    def plan(self) -> list[tuple[int, int]]:
        return [(b, w) for b in self.rows for w in self.windows if self.top_slots <= w]

    def warm(self, key: tuple[int, int]) -> None:
        if key not in self.graphs:
            self._build(key, *self.example(key[0]))

    def __call__(self, inputs: dict[str, torch.Tensor], fixed: dict[str, int], need: int,
                 state: tuple | None = None) -> tuple | None:
        """The outputs' first ``B`` rows for ``inputs`` (``[B, ...]`` each). ``state``: (the token of what
        ``inputs`` hold, the token of what this step leaves), e.g. a batch and its step count: where this
        bucket's last replay carried the first token into its buffers, ``inputs`` are not copied again."""
        b = next(iter(inputs.values())).shape[0]
        key = (_pick(self.rows, b), _pick(self.windows, need))
        if not self.enabled or None in key or need > self.cache.capacity_slots:
            return None
        g = self.graphs.get(key) or self._build(key, inputs, fixed)
        carried = state is not None and g.holds == state[0]
        if carried:
            self.carried += 1
        else:
            for name, x in inputs.items():
                g.inputs[name][:b].copy_(x)
            if g.filled > b:  # an earlier, larger batch's rows: zeros again
                for name in inputs:
                    g.inputs[name][b:g.filled].zero_()
            g.filled = b
        for name, value in fixed.items():
            if carried and name in self._carries:  # tests/core/test_native.py checks it equals ``value``
                continue
            g.inputs[name].fill_(value)  # one kernel; a tensor made on the host and copied took two
        g.holds = None  # from here the buffers hold the step's own inputs, or (carry) what it leaves
        outputs = self._replay(g, key[1])
        if self.carry is None:
            return tuple(o[:b].clone() for o in outputs)
        if state is not None:
            g.holds = state[1]
        # A stepped batch's own outputs (the engine steps one batch over its preallocated caches): views, read
        # before the next replay of this graph overwrites them (they are its next inputs, carried or copied).
        return tuple(o[:b] for o in outputs)

    def _replay(self, g: _Graph, window: int) -> tuple:
        """The graph's one replay, or (not captured) the same function eagerly."""
        if g.graph is not None:
            g.graph.replay()
            return g.outputs
        outputs = self._fn(g.inputs, window)
        if self.carry is not None:  # into fixed buffers, as a replay writes them: the CPU tests see the aliasing
            g.outputs = g.outputs or tuple(torch.empty_like(o) for o in outputs)
            for buf, o in zip(g.outputs, outputs):
                buf.copy_(o)
            outputs = g.outputs
        return outputs

    def _fn(self, inputs: dict[str, torch.Tensor], window: int) -> tuple:
        """``fn``, then ``carry`` into the input buffers: what is captured."""
        outputs = self.fn(inputs, window)
        if self.carry is not None:
            for name, value in self.carry(inputs, outputs).items():
                inputs[name].copy_(value)
                self._carries.add(name)
        return outputs

    def _build(self, key, inputs, fixed) -> _Graph:
        rows, window = key
        dev = self.cache.buf.device
        bufs = {n: torch.zeros((rows,) + x.shape[1:], dtype=x.dtype, device=dev) for n, x in inputs.items()}
        bufs.update({n: torch.zeros(1, dtype=torch.long, device=dev) for n in fixed})
        g = _Graph(bufs, None, None)
        # Warm-up (and capture) write their keys to the window's last slots, past every row's
        # committed ones (a bucket is only chosen when used + top_slots fits the window). Without
        # CUDA the warm-up still runs once: the CPU tests would have caught a warm-up that wrote
        # outside its window (found on the H200 as a device-side assert).
        for n in fixed:
            bufs[n].fill_(window - self.top_slots)
        if self.capture:
            g.graph, g.outputs, self.pool = capture_or_not(self, lambda: self._fn(g.inputs, window), dev)
            log.debug("captured %s graph rows=%d window=%d", self.name, rows, window)
        else:
            self._fn(g.inputs, window)
        self.graphs[key] = g
        return g
