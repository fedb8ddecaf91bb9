"""The fast path: the native Llama forward and the draft on preallocated caches, with CUDA graphs.

``NativeTarget`` is a ``Target`` whose forward is ``NativeLlama``'s; given a ``DynamicKV``
(prefill) it runs eagerly, given a ``StaticKV`` pool it built it goes through that pool's
``ForwardGraphs``, which the pool's owner (the engine) holds and the target finds by the pool.
``DraftSteps`` runs the draft's one-layer steps and holds its pool (the draft's graphs are whole
operations: ``spec/drafter.py``).
The engine decides which path a model takes (``choose``) and sizes the pools (``plan_pool``).
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

import torch

from ..errors import EyasError
from .graphs import ForwardGraphs, window_buckets
from .kernel_settings import KernelSettings
from .llama import NativeEagle3, NativeLlama, native_support
from .static_cache import StaticKV
from .target import Target


@dataclass(frozen=True)
class PoolPlan:
    rows: int
    slots: int
    bytes: int

    def describe(self) -> str:
        return f"{self.rows} x {self.slots} slots ({self.bytes / 2**30:.2f} GiB)"


def plan_pool(rows: int, max_context: int, slack: int, bytes_per_slot: int, budget: int) -> PoolPlan:
    """Rows x slots for a cache: the whole context if it fits the budget, else as many slots as do."""
    slots = max_context + slack
    fit = budget // max(1, rows * bytes_per_slot)
    slots = max(min(slots, fit), 2 * slack)
    return PoolPlan(rows, slots, rows * slots * bytes_per_slot)


def kv_budget(device: torch.device, mem_fraction_static: float | None = None) -> int:
    """Bytes the KV pools may take, measured after the weights are loaded: by default 40% of the free GPU
    memory, or 2 GiB on the CPU; with ``mem_fraction_static`` (SGLang's ``--mem-fraction-static``) what keeps
    weights and pools together within that share of the device's memory (the machine's on the CPU)."""
    if mem_fraction_static is None:
        return int(device_memory(device)[0] * 0.4) if device.type == "cuda" else 2 << 30
    free, total = device_memory(device)
    return static_budget(free, total, mem_fraction_static)


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the GPU, or of the machine's memory on the CPU. On the GPU, memory that dead
    objects (an engine built before, its graphs and caches) or PyTorch's cache still hold is released
    first, so it counts as free: measured without that, a second engine in one process got a KV cache of a
    few dozen tokens a row."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)
    import psutil

    memory = psutil.virtual_memory()
    return memory.available, memory.total


def static_budget(free: int, total: int, fraction: float) -> int:
    """SGLang's rule: what is free now, less the share of the whole (``1 - fraction``) kept for activations
    and graphs; refused when the weights already take more than ``fraction`` of it."""
    budget = int(free - total * (1 - fraction))
    if budget <= 0:
        used = (total - free) / total
        raise EyasError(f"--mem-fraction-static {fraction:g} leaves nothing for the KV cache: {used:.0%} of the "
                        f"device's {total / 2**30:.1f} GiB is in use already (weights and everything else), more "
                        f"than the {fraction:.0%} static memory may take",
                        f"raise --mem-fraction-static above {used:.2f} (e.g. {min(1.0, used + 0.1):.2f}), or free "
                        "memory on the device")
    return budget


class NativeTarget(Target):
    """A Llama-family target on the native forward."""

    def __init__(self, model, tokenizer=None, name: str = "target", aux_layer_ids=None):
        super().__init__(model, tokenizer, name, aux_layer_ids)
        self.native = NativeLlama(model)
        # id of each pool ``new_pool`` built -> its runner, while the runner's owner holds it (the runner holds
        # its pool: a map keyed by the pool itself would keep every engine's pool and graphs alive)
        self.runners = weakref.WeakValueDictionary()

    @classmethod
    def from_target(cls, target: Target) -> NativeTarget:
        """``target`` on the native forward, its info as the caller left it (``--context-length``'s cap)."""
        native = cls(target.model, target.tokenizer, target.name, target.aux_layer_ids)
        native.info = target.info
        return native

    def bytes_per_slot(self) -> int:
        n = self.native
        return n.num_layers * 2 * n.num_kv_heads * n.head_dim * self.dtype.itemsize

    def static_cache(self, rows: int, slots: int, kernels: KernelSettings) -> StaticKV:
        """A preallocated cache of ``rows`` x ``slots`` whose forwards run under ``kernels``, the rope table
        covering every slot (built before any graph captures against it)."""
        n = self.native
        cache = StaticKV(n.num_layers, rows, n.num_kv_heads, slots, n.head_dim, self.dtype, self.device, kernels)
        n.rope.extend(slots, cache.buf)
        return cache

    def new_pool(self, plan: PoolPlan, rows: list[int], tokens: list[int], graphs: bool, capture_aux: bool,
                 kernels: KernelSettings) -> tuple[StaticKV, ForwardGraphs]:
        """A preallocated cache for one engine (its ``kernels``) and its graph runner (buckets ``rows`` x
        ``tokens`` x windows), which ``forward`` over the pool goes through while the caller holds it."""
        n = self.native
        pool = self.static_cache(plan.rows, plan.slots, kernels)
        aux_ids = tuple(self.aux_layer_ids) if capture_aux else ()

        def fn(inputs, mask):
            logits, aux = n(inputs["ids"], inputs["pos"], mask, pool, aux_ids)
            return (logits,) if aux is None else (logits, aux)

        def example(b, t):
            ids = torch.zeros((b, t), dtype=torch.long, device=self.device)
            return {"ids": ids, "pos": ids}, torch.zeros((b, 1, t, 1), dtype=self.dtype, device=self.device)

        runner = ForwardGraphs(fn, pool, rows, tokens, window_buckets(plan.slots), graphs, name="target",
                               example=example)
        self.runners[id(pool)] = runner
        return pool, runner

    @torch.no_grad()
    def forward(self, input_ids, position_ids, mask, cache, capture=True, logits_at=None):
        runner = None if cache is None else self.runners.get(id(cache))
        if runner is not None:
            out = runner({"ids": input_ids, "pos": position_ids}, mask)
            logits, aux = out[0], (out[1] if len(out) > 1 and capture else None)
            return (logits if logits_at is None else logits[:, logits_at]), aux
        aux_ids = tuple(self.aux_layer_ids) if capture else ()
        return self.native(input_ids, position_ids, mask, cache, aux_ids, logits_at)


class DraftSteps:
    """``(hidden, logits)`` of one draft step over ``[B, T]`` tokens on the draft's fused inference forward
    (``self.net``, a ``NativeEagle3``), which the engine's drafting and draft extend use too: eagerly, the
    level-by-level drafting of the generic path and of batches past the graphs' buckets (on the native path a
    tree is drafted by one graph replay, ``spec/drafter.py``)."""

    def __init__(self, draft):
        self.draft = draft
        self.net = NativeEagle3(draft)
        self.pool: StaticKV | None = None

    def attach_pool(self, plan: PoolPlan, kernels: KernelSettings) -> StaticKV:
        """The draft's preallocated cache on the native path (``plan`` as the target's)."""
        self.pool = self.static_cache(plan.rows, plan.slots, kernels)
        return self.pool

    def static_cache(self, rows: int, slots: int, kernels: KernelSettings) -> StaticKV:
        """The draft's ``NativeTarget.static_cache``: one layer."""
        d = self.net
        attn = d.midlayer.self_attn
        cache = StaticKV(1, rows, attn.num_kv_heads, slots, attn.head_dim, d.fc.weight.dtype, d.fc.weight.device,
                         kernels)
        d.rope.extend(slots, cache.buf)
        return cache

    def bytes_per_slot(self) -> int:
        attn = self.draft.midlayer.self_attn
        return 2 * attn.num_kv_heads * attn.head_dim * self.draft.fc.weight.dtype.itemsize

    def __call__(self, tokens, hidden, positions, cache, mask):
        d, width = self.net, tokens.shape[1]
        cache.begin(width)  # a static cache's window and slots; a growing one appends
        h = d.backbone(d.embed(tokens), hidden, positions, cache, mask)
        cache.advance(width)
        return h, d.logits(h, cache)


def choose(target: Target, engine: str = "auto", flag: str = "--engine") -> tuple[Target, str | None]:
    """(the target on the path to use, why the generic path was kept or None) for ``--engine``
    (``flag``: that option's name where the caller calls it something else)."""
    why = native_support(target.model)
    if engine == "generic":
        return target, "--engine generic"
    if engine == "auto" and (why or target.device.type != "cuda"):
        return target, why or "the native path is for CUDA devices; --engine native forces it"
    if why:
        raise EyasError(f"{flag} native cannot run this model: {why}", f"use {flag} auto or generic")
    return (target if isinstance(target, NativeTarget) else NativeTarget.from_target(target)), None
