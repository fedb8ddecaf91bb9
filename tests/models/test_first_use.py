"""``models/first_use.py``: what is compiled or captured after warm-up is logged and counted, and nothing before."""

import logging

import pytest
import torch

from eyas.models import graphs as graphs_module
from eyas.models.first_use import FirstUse
from eyas.models.graphs import ForwardGraphs
from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget, PoolPlan


def test_nothing_counts_before_arm_and_a_slow_first_use_is_a_warning(caplog):
    watch = FirstUse()
    watch.record("graph", "[step 0 sampled, rows 64, window 1024]", 2.0)  # warm-up: not counted
    assert watch.events == {"kernel": [0, 0.0], "graph": [0, 0.0]}
    watch.armed = True  # as arm() leaves it, without touching Triton's hooks
    with caplog.at_level(logging.INFO, logger="eyas.engine"):
        watch.record("graph", "[step 0 sampled, rows 64, window 1024]", 0.25)
        watch.record("kernel", "_distribution_kernel[num_warps=16]", 0.01)
    assert watch.events == {"kernel": [1, 0.01], "graph": [1, 0.25]}
    [slow, fast] = caplog.records
    assert slow.levelno == logging.WARNING and "rows 64, window 1024" in slow.getMessage()
    assert "0.250 s" in slow.getMessage()
    assert fast.levelno == logging.INFO and "_distribution_kernel" in fast.getMessage()


def test_triton_compiles_after_arm_are_timed_through_its_hooks_and_earlier_hooks_still_run(monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(("before", kw["repr"])))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(("after", kw["repr"])))
    watch = FirstUse()
    watch.arm()
    kwargs = {"key": "k", "repr": "_walk_kernel[num_warps=4]", "fn": None, "compile": {}, "is_manual_warmup": False,
              "already_compiled": False}  # what Triton passes (JITFunction._call_hook)
    assert knobs.runtime.jit_cache_hook(**kwargs) is None  # falsy: Triton goes on to compile
    knobs.runtime.jit_post_compile_hook(**kwargs)
    assert seen == [("before", "_walk_kernel[num_warps=4]"), ("after", "_walk_kernel[num_warps=4]")]
    assert watch.events["kernel"][0] == 1 and 0 <= watch.events["kernel"][1] < 1
    knobs.runtime.jit_post_compile_hook(**kwargs)  # a post hook without its start (an async compile): not counted
    assert watch.events["kernel"][0] == 1


@torch.inference_mode()
def test_a_graph_built_on_first_use_after_arm_is_counted(target, monkeypatch):
    """A bucket captured while serving (here the capture stood in for: the CPU has no CUDA graphs) is one event
    named by its runner, rows and window; the buckets warm-up builds before arm() are not."""
    watch = FirstUse()
    monkeypatch.setattr(graphs_module, "FIRST_USE", watch)
    monkeypatch.setattr(graphs_module, "capture_or_not", lambda owner, fn, device, reset: (None, None, owner.pool))
    native = NativeTarget.from_target(target)
    _, runner = native.new_pool(PoolPlan(2, 300, 0), [1, 2], [1], True, capture_aux=True, kernels=KernelSettings())
    assert isinstance(runner, ForwardGraphs)
    for bg in runner.by_tokens.values():
        bg.capture = True
    runner.warm((1, 1, 256))  # warm-up: before arm
    assert watch.events["graph"][0] == 0
    watch.armed = True
    runner.warm((2, 1, 256))
    assert watch.events["graph"][0] == 1


@torch.inference_mode()
def test_a_warm_up_is_never_a_first_use_even_after_another_engine_armed_the_watch(target, monkeypatch):
    """Engines built one after another in one process (benchmarks, checks): the second one's warm-up stops the
    watch the first one armed, so its captures are not counted as served; on the CPU it stays stopped."""
    from eyas.config import SpecConfig
    from eyas.engine import warmup
    from eyas.engine.engine import Engine

    watch = FirstUse()
    watch.armed = True  # as a first engine's warm-up left it on a GPU
    monkeypatch.setattr(warmup, "FIRST_USE", watch)
    monkeypatch.setattr(graphs_module, "FIRST_USE", watch)
    engine = Engine(NativeTarget.from_target(target), None, SpecConfig("NONE"), max_batch=2, cuda_graphs=True)
    engine.warm_up(progress=False, on_cpu=True)
    assert not watch.armed and watch.events["graph"] == [0, 0.0]
