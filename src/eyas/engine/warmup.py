"""Capturing the engine's CUDA graphs at startup (``Engine.warm_up``), so that no request pays for one.

Every runner's ``plan()`` lists the buckets it can hit (rows x token buckets x windows); each is built once,
the caches emptied afterwards. On the CPU nothing is captured; tests warm the buckets up eagerly.
"""

from __future__ import annotations

import gc
import time

import torch

from ..models.first_use import FIRST_USE
from ..sample.sampling import SamplingParams, SamplingRows
from ..spec.ops import TORCH
from .adaptive import measure_step_costs
from .decode import STARTUP_KINDS
from .sampler import first_tokens

SAMPLED_COSTS = SamplingParams(temperature=0.7, top_p=0.95)  # the sampled rows whose step costs warm-up times
DRAWS = (SamplingParams(temperature=0.7), SAMPLED_COSTS)  # first tokens' kinds of draw: sampled, filtered


def graph_runners(engine) -> list:
    """The native path's graph runners: target forward, the whole step (one per setting,
    each in its greedy, sampled and filtered variants), and, when steps run by parts,
    one tree drafter per setting and one draft extend per path width (with whole steps, the one that
    takes a deferred feed)."""
    if not engine.static:
        return []
    # The drafters and extenders beside whole-step graphs are captured when first used (steps by parts),
    # not at startup: a step that no whole-step bucket fits fits none of theirs either (the same rows and
    # window buckets).
    extra = ([d.graph for d in engine.drafters.values()] + [e.graph for e in engine.extenders.values()]
             if not engine.config.whole_step_graphs else [])
    # where plain whole steps defer the draft's feed (``feed.py``), the extend that takes it runs among them
    extra += [engine.extenders[w.feed_width].graph for w in engine.whole_steps.values() if w.defers]
    # the penalized variants are captured on first use
    whole = [g for w in engine.whole_steps.values() for kind, g in w.graphs.items() if kind in STARTUP_KINDS]
    prefill = engine.prefiller.graphs() if engine.prefiller else []
    return [engine.target_runner] + whole + extra + prefill


def warm_first_tokens(engine) -> None:
    """Draw first tokens as a prefill does (sampled, and filtered by top-p) for groups of prompts of each size
    that meets another launch configuration of the distribution's kernels (``config_rows``): their kernels
    compile now. A prefill's group is any count of prompts, not a graph's bucket."""
    if engine.ops is TORCH:  # no kernels to compile
        return
    from ..spec.distribution_kernel import config_rows  # Triton's: imported where its kernels run

    vocab, device = engine.target.info.vocab_size, engine.device
    for n in [n for n in config_rows() if n <= engine.config.max_batch]:
        logits = torch.zeros((n, vocab), dtype=engine.target.dtype, device=device)
        lengths = torch.full((n,), 8, dtype=torch.long, device=device)
        for params in DRAWS:
            rows = SamplingRows.build([params] * n, list(range(n)), device)
            first_tokens(logits, rows.kind, rows.floats, rows.ints, lengths, None, engine.ops)


def time_settings(engine, measure: bool) -> None:
    """``auto``'s chooser takes each setting's step cost as measured here (greedy and sampled), not modelled;
    until then it holds rough model costs that live steps never correct."""
    if measure and engine.chooser:
        sampled = measure_step_costs(engine, params=SAMPLED_COSTS)
        engine.chooser.set_costs(measure_step_costs(engine), measured=True, sampled=sampled)


@torch.inference_mode()
def warm_up(engine, progress: bool = True, on_cpu: bool = False) -> str:
    """Capture every CUDA graph the engine can replay (each runner's ``plan()``: rows buckets up to
    the graph max batch x token buckets x every window bucket) now, not on first use; return a
    one-line summary. The caches are emptied afterwards, so generation is unchanged. On the CPU
    there is nothing to capture: skipped, unless ``on_cpu`` (tests) runs each bucket once eagerly."""
    runners = [r for r in graph_runners(engine) if r.enabled]
    cuda = engine.device.type == "cuda"
    if not runners:  # adaptive speculation still times its settings where it runs, graphs or not
        time_settings(engine, cuda or on_cpu)
        return "CUDA graphs: none to capture (" + ("disabled)" if engine.static else "generic path)")
    if not (cuda and any(r.capture for r in runners)) and not on_cpu:
        return "CUDA graphs: n/a on the CPU, nothing captured"
    from tqdm.auto import tqdm

    FIRST_USE.armed = False  # another engine of this process served before: its watch waits for this warm-up
    work = [(r, key) for r in runners for key in r.plan()]
    if cuda:  # capture empties the allocator's cache; do it first, so the delta below is the graphs' own
        gc.collect()
        torch.cuda.empty_cache()
    start, reserved = time.perf_counter(), torch.cuda.memory_reserved(engine.device) if cuda else 0
    bar = tqdm(work, desc="capturing CUDA graphs" if cuda else "warming up graph buckets", disable=not progress,
               unit="", bar_format="{desc}: {n_fmt}/{total_fmt} {unit}")  # {postfix} starts with ", "
    for runner, key in bar:
        bar.unit = f"[{runner.name}, rows {key[0]}, window {key[-1]}]"
        runner.warm(key)
    bar.close()
    warm_first_tokens(engine)
    engine._reset_pools()
    time_settings(engine, cuda)
    seconds = time.perf_counter() - start
    if cuda:  # from here on, a kernel compiled or a graph captured kept a request waiting: logged and counted
        FIRST_USE.arm()
    if not cuda:
        return f"graph buckets: {len(work)} warmed up eagerly in {seconds:.1f} s (no CUDA graphs on the CPU)"
    torch.cuda.synchronize(engine.device)
    pool = (torch.cuda.memory_reserved(engine.device) - reserved) / 2**20
    captured = sum(1 for r in runners for g in r.graphs.values() if g.graph is not None)
    return f"CUDA graphs: {captured} of {len(work)} captured in {seconds:.1f} s, graph memory {pool:.0f} MiB"
