"""Functions over a ``StaticKV``, eager or replayed from CUDA graphs captured per shape bucket.

``BatchGraph`` is the one wrapper that captures: a function of per-row inputs ``[B, ...]`` and a few slot
numbers, one graph per (rows, window) bucket. It copies the real inputs into the bucket's fixed buffers
(zeros elsewhere), replays the graph captured the first time the bucket was seen, and falls back to the
eager function past the last bucket or when a capture fails. The whole step, the tree drafting, the draft
extend and the prefill are each one; ``ForwardGraphs`` is a model's forward of ``T`` new tokens over the
cache as one ``BatchGraph`` per token bucket. Padding is harmless by construction:

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
import time
from bisect import bisect_left
from dataclasses import dataclass

import torch

from . import consts
from .first_use import FIRST_USE
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


def share_pool(graphs) -> None:
    """One CUDA memory pool for ``graphs`` (``BatchGraph``s; nothing on the CPU). Safe where they never run at
    once and each replay's outputs are read before another of them replays (a graph captured later may have
    put its outputs where an earlier one keeps its scratch); a carried graph's outputs, which its caller reads
    at the next step, need a pool no other setting's graphs replay in between (``engine/decode.py``)."""
    graphs = list(graphs)
    if graphs and graphs[0].cache.buf.is_cuda:
        handle = torch.cuda.graph_pool_handle()
        for g in graphs:
            g.pool = handle


WARM_UPS = 2  # runs before a capture (eagerly, the same runs stand for them)


def capture(fn, pool, device, reset):
    """(graph, its outputs, memory pool) for ``fn()``, after ``WARM_UPS`` runs on a side stream, each (and the
    capture) after ``reset()``: a run that carries state into its own inputs must not start the next from it."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(WARM_UPS):
            reset()
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs, graph.pool()


def capture_or_not(owner, fn, device, reset):
    """``capture`` for a runner; if capture fails, the runner stays eager from then on (and says so)."""
    try:
        return capture(fn, owner.pool, device, reset)
    except Exception as e:  # noqa: BLE001 - an op that cannot be captured must not take a server down
        owner.capture = False
        log.warning("%s: CUDA graph capture failed (%s: %s); running this part eagerly", owner.name,
                    type(e).__name__, e)
        torch.cuda.synchronize(device)
        return None, None, owner.pool


@dataclass
class _Graph:
    inputs: dict[str, torch.Tensor]  # the bucket's input buffers, fixed slot numbers among them
    outputs: tuple | None = None
    graph: object = None
    filled: int = 0  # rows of the input buffers from here on are zeros
    holds: object = None  # the state token its last replay left in the input buffers (``carry``)


class ForwardGraphs:
    """``fn(inputs, mask)``, a forward over ``cache`` of ``T`` new tokens a row, from graphs: ``inputs`` maps
    names to ``[B, T, ...]`` tensors, ``mask`` is the engine's additive mask ``[B, 1, T, used + T]`` and ``fn``
    returns tensors shaped ``[B, T, ...]``. One ``BatchGraph`` per token bucket (``by_tokens``) pads the rows;
    here the tokens are padded to their bucket (zeros: their keys land past the real ones, in slots no real
    token sees) and the mask to the window, whose slots from ``used + T`` on are hidden inside the graph.
    Past the last bucket, or with ``enabled=False`` (the reference), ``fn`` runs eagerly and unpadded."""

    def __init__(self, fn, cache: StaticKV, rows: list[int], tokens: list[int], windows: list[int],
                 enabled: bool = True, capture: bool | None = None, name: str = "forward", example=None):
        self.fn, self.cache, self.name, self.enabled = fn, cache, name, enabled
        self.rows, self.tokens, self.windows = rows, tokens, windows
        self.eager_calls = 0
        self.by_tokens = {t: BatchGraph(self._graphed(t), cache, rows, [w for w in windows if t < w], enabled, capture,
                                        name=f"{name} {t}", example=self._example(example, t), top_slots=t)
                          for t in tokens}
        share_pool(self.by_tokens.values())  # one replay at a time, its outputs copied out (as one runner's were)

    @property
    def capture(self) -> bool:
        return any(g.capture for g in self.by_tokens.values())

    @property
    def graphs(self) -> dict[tuple[int, int, int], _Graph]:
        """Every bucket built so far, by (rows, tokens, window)."""
        return {(r, t, w): g for t, bg in self.by_tokens.items() for (r, w), g in bg.graphs.items()}

    def plan(self) -> list[tuple[int, int, int]]:
        return [(r, t, w) for t, bg in self.by_tokens.items() for r, w in bg.plan()]

    def warm(self, key: tuple[int, int, int]) -> None:
        self.by_tokens[key[1]].warm((key[0], key[2]))

    def _graphed(self, t: int):
        def run(inputs: dict[str, torch.Tensor], window: int) -> tuple:
            inputs = dict(inputs)
            start, need, mask = inputs.pop("start"), inputs.pop("need"), inputs.pop("mask")
            self.cache.aim(window, start + consts.arange(t, start.device))
            hidden = consts.arange(window, start.device) >= need  # slots past the real tokens' own
            return self.fn(inputs, mask.masked_fill(hidden, torch.finfo(mask.dtype).min))
        return run

    @staticmethod
    def _example(example, t: int):
        """``example(rows, tokens) -> (inputs, mask)`` as a bucket's ``BatchGraph`` example."""
        def make(rows: int, window: int):
            inputs, mask = example(rows, t)
            mask = torch.zeros((rows, 1, t, window), dtype=mask.dtype, device=mask.device)
            return {**inputs, "mask": mask}, {"start": 0, "need": 0}
        return make

    def __call__(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> tuple:
        t, used = mask.shape[2], self.cache.used
        bucket = _pick(self.tokens, t) if self.enabled else None
        if bucket is not None:
            out = self.by_tokens[bucket]({**inputs, "mask": mask}, {"start": used, "need": used + t}, used + bucket)
            if out is not None:
                self.cache.advance(t)
                return out if bucket == t else tuple(o[:, :t].contiguous() for o in out)
        self.eager_calls += 1
        self.cache.begin(t)
        out = self.fn(inputs, mask)
        self.cache.advance(t)
        return out


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
        # example(rows, window) -> (inputs, fixed): a bucket's input buffers' shapes (zeros: what it is warmed up with)
        self.example, self.top_slots = example, top_slots
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
            self._build(key)

    def __call__(self, inputs: dict[str, torch.Tensor], fixed: dict[str, int | torch.Tensor], need: int,
                 state: tuple | None = None) -> tuple | None:
        """The outputs' first ``B`` rows for ``inputs`` (``[B, ...]`` each). ``state``: (the token of what
        ``inputs`` hold, the token of what this step leaves), e.g. a batch and its step count: where this
        bucket's last replay carried the first token into its buffers, ``inputs`` are not copied again."""
        b = next(iter(inputs.values())).shape[0]
        key = (_pick(self.rows, b), _pick(self.windows, need))
        if not self.enabled or None in key or need > self.cache.capacity_slots:
            return None
        g = self.graphs.get(key) or self._build(key)
        carried = state is not None and g.holds == state[0]
        if carried:
            self.carried += 1
        else:
            for name, x in inputs.items():
                buf = g.inputs[name]
                if x.shape[1:] != buf.shape[1:]:  # smaller than the bucket past the rows too: zeros around it
                    buf.zero_()
                    buf[tuple(slice(0, n) for n in x.shape)].copy_(x)
                else:
                    buf[:b].copy_(x)
                    if g.filled > b:  # an earlier, larger batch's rows: zeros again
                        buf[b:g.filled].zero_()
            g.filled = b
        for name, value in fixed.items():
            if carried and name in self._carries:  # tests/models/test_native.py checks it equals ``value``
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

    def _build(self, key) -> _Graph:
        rows, window = key
        dev = self.cache.buf.device
        inputs, fixed = self.example(rows, window)
        bufs = {n: torch.zeros_like(x, device=dev) for n, x in inputs.items()}
        bufs.update({n: torch.zeros(1, dtype=torch.long, device=dev) for n in fixed})
        g = _Graph(bufs)

        def reset():
            """The warm-up's inputs: zeros, and slot numbers whose keys land in the window's last slots, past
            every row's committed ones (a bucket is only chosen when used + top_slots fits the window)."""
            for n, buf in bufs.items():
                if n in fixed:
                    buf.fill_(window - self.top_slots)
                else:
                    buf.zero_()

        # Each warm-up run starts from reset(): a carry writes the next step's slot numbers into these
        # buffers, and a second run from them wrote its keys over committed slots of every row (found on the
        # H200: a bucket built mid-sequence changed every row's tokens). Without CUDA the same runs stand for
        # the warm-ups, so the CPU tests see what they write.
        if self.capture:
            start = time.perf_counter()
            g.graph, g.outputs, self.pool = capture_or_not(self, lambda: self._fn(g.inputs, window), dev, reset)
            log.debug("captured %s graph rows=%d window=%d", self.name, rows, window)
            FIRST_USE.record("graph", f"[{self.name}, rows {rows}, window {window}]", time.perf_counter() - start)
        else:
            for _ in range(WARM_UPS):
                reset()
                self._fn(g.inputs, window)
        reset()  # rows from ``filled`` (0) on are zeros
        self.graphs[key] = g
        return g
