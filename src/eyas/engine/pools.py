"""The native path's preallocated KV caches and the graph runners over them, built once per engine.

``native_pools`` sizes both caches for the largest setting of the schedule (``models.native.plan_pool``,
within ``--mem-fraction-static``), then builds every runner with graph buckets for every setting's shapes:
the target's forward (the pool's own runner); the whole step (``decode.py``: a ``StaticStep`` per
setting); the step's parts (``spec/drafter.py``: a
``StaticDrafter`` per setting, a ``StaticExtender`` per path width); and the prefill's (``prefill.py``).
``Engine.graph_runners`` lists those ``Engine.warm_up`` captures.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..config import SpecConfig
from ..engine_config import EngineConfig
from ..models.graphs import ForwardGraphs, buckets
from ..models.native import kv_budget, plan_pool
from ..models.static_cache import StaticKV
from ..spec.drafter import StaticDrafter, StaticExtender
from ..spec.ops import ops_for
from .decode import StaticStep
from .prefill import StaticPrefill


class NativePools(NamedTuple):
    target_pool: StaticKV
    target_runner: ForwardGraphs  # the target's forward over target_pool (the target finds it while held)
    whole_steps: dict[SpecConfig, StaticStep]  # the whole step per setting (whole-step graphs on)
    drafters: dict[SpecConfig, StaticDrafter]  # the tree per drafting setting
    extenders: dict[int, StaticExtender]  # the draft extend per path width
    prefiller: StaticPrefill | None  # prefill graphs (CUDA graphs and prefill graphs on)
    ops: object  # the target pool's kernels (``spec.ops.ops_for``)
    max_context: int  # the engine's, lowered where the pool holds fewer slots
    layout: str  # one line for the banner


def feed_widths(spec: SpecConfig, config: EngineConfig) -> list[int]:
    """The width of the draft's deferred feed (``feed.py``), where plain whole steps defer it: a spec that
    drafts and also runs plain steps, whole-step graphs, an interval past 1; else none."""
    plain = spec.speculative and any(not s.speculative for s in spec.options)
    return [config.draft_feed_interval] if plain and config.whole_step_graphs and config.draft_feed_interval > 1 else []


def native_pools(target, draft_steps, spec: SpecConfig, config: EngineConfig, tree_size: int,
                 max_context: int) -> NativePools:
    """The caches and runners for ``target`` (a ``NativeTarget``) and, when ``spec`` drafts, the draft's
    ``draft_steps`` (whose pool this attaches), for trees of up to ``tree_size`` tokens."""
    c = config
    max_batch, cuda_graphs, device = c.max_batch, c.cuda_graphs, target.device
    drafting = [s for s in spec.options if s.speculative]
    draft_tokens = buckets(max(max(s.eagle_topk, s.num_steps + 1) for s in drafting)) if drafting else []
    spans = [s.num_steps * s.eagle_topk for s in drafting]  # draft slots a tree's levels take
    # slots past the context: a row that holds the whole context still verifies a tree and drafts its levels,
    # and a step by parts writes a deferred feed's block (``feed.py``) and then its path at the draft cache's end
    slack = max([tree_size] + draft_tokens + spans) + max(feed_widths(spec, config), default=0) + 1
    context = min(max_context, 1 << 20)
    per_slot = target.bytes_per_slot() + (draft_steps.bytes_per_slot() if spec.speculative else 0)
    budget = kv_budget(device, c.mem_fraction_static)  # --mem-fraction-static
    plan = plan_pool(max_batch, context, slack, per_slot, budget)
    if plan.slots - slack < context:
        max_context = plan.slots - slack
    graphs = cuda_graphs and device.type == "cuda"
    rows = buckets(c.graph_rows)
    like = torch.zeros(1, dtype=target.dtype, device=device)
    target_pool, target_runner = target.new_pool(plan, rows, spec.verify_sizes, cuda_graphs,
                                                 capture_aux=spec.speculative, kernels=c.kernels)
    whole_steps, drafters, extenders, prefiller, pool = {}, {}, {}, None, None
    if spec.speculative:
        pool = draft_steps.attach_pool(plan, c.kernels)
        drafters = {s: StaticDrafter(draft_steps.net, pool, s, rows, cuda_graphs) for s in drafting}
        widths = sorted({s.path_width for s in spec.options} | set(feed_widths(spec, c)))
        extenders = {w: StaticExtender(draft_steps.net, pool, w, rows, cuda_graphs) for w in widths}
    if c.whole_step_graphs:
        aux, draft = (tuple(target.aux_layer_ids), draft_steps.net) if spec.speculative else ((), None)
        feed = max(feed_widths(spec, c), default=0)
        whole_steps = {s: StaticStep(target.native, target_pool, aux, draft, pool, s, rows, cuda_graphs, feed)
                       for s in spec.options}
    if cuda_graphs and c.prefill_graphs:  # on the CPU its buckets run eagerly, as every runner's do
        aux = tuple(target.aux_layer_ids) if spec.speculative else ()
        prefiller = StaticPrefill(target, draft_steps if spec.speculative else None, c.graph_rows, max_context, aux,
                                  cuda_graphs, c.kernels)  # --cuda-graph-max-bs caps its rows too
    ops = ops_for(target_pool, like, target.native.rope)
    layout = (f"native Llama forward, static KV cache {plan.describe()}, context {max_context}, "
              f"CUDA graphs {'on' if graphs else 'off' if device.type == 'cuda' else 'n/a (CPU)'}, "
              f"{ops.name} kernels")
    return NativePools(target_pool, target_runner, whole_steps, drafters, extenders, prefiller, ops, max_context,
                       layout)
