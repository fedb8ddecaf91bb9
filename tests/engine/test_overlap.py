"""A step launched before the last one is read back (``Engine.launch(ahead=True)``, the server's overlap
schedule) gives every row exactly the tokens of steps taken one at a time: greedy and seeded sampled rows,
plain, chain and tree, rows ending at different steps, on the whole-step graph path (run eagerly here).
"""

from __future__ import annotations

import pytest

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPTS = ([72, 101, 108, 108], [7] * 9, [200, 13], [5, 6, 7, 8, 9, 10, 11])
SPECS = [SpecConfig("NONE"), SpecConfig("EAGLE3", 3, 1, 4), SpecConfig("EAGLE3", 3, 2, 6)]


def params(sampled: bool) -> list[SamplingParams]:
    """Rows that end at different steps (their budgets), sampled ones seeded (their draws follow the seed)."""
    extra = dict(temperature=0.8, top_p=0.9, seed=11) if sampled else {}
    return [SamplingParams(max_new_tokens=n, ignore_eos=True, **extra) for n in (9, 23, 4, 16)]


def engine_for(target, draft, spec) -> Engine:
    return Engine(NativeTarget.from_target(target), draft if spec.speculative else None, spec, max_batch=4,
                  cuda_graphs=True)


def overlapped(engine: Engine, rows: list[SamplingParams], prompts=PROMPTS, settings=None,
               ahead: bool = True) -> tuple[list[list[int]], int]:
    """The scheduler's loop with overlap: the next step launched before this one is collected, drained
    before the batch changes (``ahead=False``: one step at a time). ``settings``: the steps' settings in turn,
    as ``auto`` may change them. Returns every row's tokens and how many steps were launched ahead."""
    seqs = [engine.new_sequence(p, sp) for p, sp in zip(prompts, rows)]
    batch, pending, launched, n = engine.prefill_all(seqs), None, 0, 0

    def launch(**kwargs):
        nonlocal n
        step = engine.launch(batch, settings[n % len(settings)] if settings else None, **kwargs)
        n += step is not None
        return step

    while True:
        if pending is not None and any(s.finished for s in batch.seqs):  # the batch changes: drain
            engine.collect(pending)
            pending = None
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if not alive:
            return [s.output_ids for s in seqs], launched
        if len(alive) < len(batch):
            batch = engine.filter(batch, alive)
        step = pending or launch()
        pending = launch(ahead=True) if ahead else None
        launched += pending is not None
        engine.collect(step)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("spec", SPECS, ids=["none", "chain", "tree"])
def test_steps_launched_ahead_give_the_tokens_of_steps_one_at_a_time(target, draft, spec, sampled):
    rows = params(sampled)
    want = [o.output_ids for o in engine_for(target, draft, spec).generate(list(PROMPTS), rows)]
    got, launched = overlapped(engine_for(target, draft, spec), rows)
    assert got == want
    assert [len(g) for g in got] == [9, 23, 4, 16]
    assert launched >= 3  # most steps ran ahead


def test_no_graph_no_launch_ahead(target, draft):
    """By parts (no whole-step graph, or a row asking for logprobs) a step needs the last one read back."""
    spec = SPECS[2]
    engine = Engine(NativeTarget.from_target(target), draft, spec, max_batch=4, cuda_graphs=True,
                    whole_step_graphs=False)
    batch = engine.prefill_all([engine.new_sequence(p, SamplingParams(max_new_tokens=8)) for p in PROMPTS])
    step = engine.launch(batch)
    assert engine.launch(batch, ahead=True) is None
    engine.collect(step)
    graphed = engine_for(target, draft, spec)
    asking = [SamplingParams(max_new_tokens=8, logprobs=2 if i == 1 else None) for i in range(len(PROMPTS))]
    batch = graphed.prefill_all([graphed.new_sequence(p, sp) for p, sp in zip(PROMPTS, asking)])
    graphed.collect(graphed.launch(batch))
    assert graphed.launch(batch, ahead=True) is None


def test_a_launch_ahead_past_the_cache_is_refused_not_written(target, draft):
    """One step ahead, the host knows the caches' slot counts a step late: a step that might not fit is
    not launched ahead (the one after the read-back fits, or the row ends at its context)."""
    spec = SPECS[2]
    engine = engine_for(target, draft, spec)
    batch = engine.prefill_all([engine.new_sequence(p, SamplingParams(max_new_tokens=8)) for p in PROMPTS])
    engine.collect(engine.launch(batch))
    whole = engine.whole_steps[spec]
    room = engine.target_pool.capacity_slots - engine.target_pool.used
    assert room > whole.span + spec.path_width  # a fresh batch: room for a step ahead
    engine.target_pool.used = engine.target_pool.capacity_slots - whole.span - spec.path_width + 1
    assert engine.launch(batch, ahead=True) is None


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_settings_that_change_each_step_launched_ahead(target, draft, sampled):
    """The adaptive spec may pick another setting for the step launched ahead: that step's graph copies its
    inputs from the outputs of the step still in flight (another graph's buffers), on the device, in order."""
    auto = SpecConfig.auto("EAGLE3")
    cycle = [auto.options[i] for i in (4, 0, 2, 3, 1)]  # 6/8/32, none, chain 5, 4/4/16, chain 3
    rows = params(sampled)
    engines = [Engine(NativeTarget.from_target(target), draft, auto, max_batch=4, cuda_graphs=True) for _ in "ab"]
    got, launched = overlapped(engines[0], rows, settings=cycle)
    assert got == overlapped(engines[1], rows, settings=cycle, ahead=False)[0] and launched >= 3


def test_a_batch_with_a_step_in_flight_refuses_to_change_rows(target, draft):
    """Filtering or merging a batch whose step launched ahead is not collected would hand that step's tokens to
    the wrong rows: refused, naming the fix; once collected, it goes."""
    from eyas.errors import EyasError

    engine = engine_for(target, draft, SPECS[2])
    batch = engine.prefill_all([engine.new_sequence(p, SamplingParams(max_new_tokens=8)) for p in PROMPTS])
    step = engine.launch(batch)
    ahead = engine.launch(batch, ahead=True)
    engine.collect(step)
    other = engine.prefill_all([engine.new_sequence([9, 9], SamplingParams(max_new_tokens=8))])
    for change in (lambda: engine.filter(batch, [0, 2]), lambda: engine.merge(batch, other)):
        with pytest.raises(EyasError, match="collect it first"):
            change()
    engine.collect(ahead)
    assert len(engine.filter(batch, [0, 2])) == 2
