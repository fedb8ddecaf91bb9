"""The engine names its phases for a profiler (``engine/phases.py``): benchmarks read them instead of
patching the engine, and without a profiler a phase costs nothing but a check."""

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from eyas.config import SpecConfig
from eyas.engine import phases
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams


def ranges(prof) -> set[str]:
    return {e.name for e in prof.events() if e.name.startswith(phases.PREFIX)}


@pytest.mark.parametrize("path", ["generic", "native"])
def test_a_step_by_parts_shows_each_phase_and_a_whole_step_one(target, draft, path):
    model = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(model, draft, SpecConfig("EAGLE3", 3, 2, 6), max_batch=2, whole_step_graphs=False)
    seqs = [engine.new_sequence([5, 6, 7], SamplingParams(max_new_tokens=8, ignore_eos=True))]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        batch = engine.prefill(seqs)
        engine.step(batch)
    assert ranges(prof) == {phases.PREFIX + name for name in phases.NAMES}  # every phase there is
    if path == "native":  # the whole step replayed (or run as its graph's function, on the CPU) is one range
        whole = Engine(model, draft, SpecConfig("EAGLE3", 3, 2, 6), max_batch=2)
        batch = whole.prefill([whole.new_sequence([5, 6, 7], SamplingParams(max_new_tokens=8, ignore_eos=True))])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            whole.step(batch)
        assert ranges(prof) == {"eyas.step", "eyas.finish"}


def test_without_a_profiler_a_phase_is_nothing_and_a_timer_sees_every_phase(target):
    assert isinstance(phases.phase("step"), contextlib.nullcontext)
    seen = []

    @contextlib.contextmanager
    def timer(name):
        seen.append(name)
        yield

    engine = Engine(target, None, SpecConfig("NONE"))
    batch = engine.prefill([engine.new_sequence([5, 6, 7], SamplingParams(max_new_tokens=4))])
    with phases.timed_by(timer), torch.inference_mode():
        engine.step(batch)
    assert seen == ["step", "draft", "mask", "verify", "accept", "commit", "finish"]
    assert isinstance(phases.phase("step"), contextlib.nullcontext)  # the timer is gone after the block
