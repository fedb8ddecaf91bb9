"""Greedy speculative output equals the target's own greedy output, token for token."""

import pytest
from helpers import reference_greedy

from eyas.config import SpecConfig, parse_schedule
from eyas.engine.engine import Engine
from eyas.engine.stats import SpecStats
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPTS = [
    [72, 101, 108, 108, 111],
    [7] * 23,
    [200, 13],
    list(range(30, 71)),
    [1],
]
NEW = 48

SPECS = {
    "chain-5": SpecConfig("EAGLE3", 5, 1, 6),
    "chain-3-short": SpecConfig("EAGLE3", 3, 1, 3),
    "tree-4x3-8": SpecConfig("EAGLE3", 4, 3, 8),
    "tree-3x4-16": SpecConfig("EAGLE3", 3, 4, 16),
    "tree-2x2-6": SpecConfig("EAGLE3", 2, 2, 6),
}


@pytest.fixture(scope="module")
def references(target):
    return [reference_greedy(target.model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_speculation_is_lossless(target, draft, references, name, batch):
    engine = Engine(target, draft, SPECS[name])
    total = SpecStats()
    for start in range(0, len(PROMPTS), batch):
        chunk = PROMPTS[start:start + batch]
        outs = engine.generate(chunk, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
        for i, o in enumerate(outs):
            assert o.output_ids == references[start + i], f"prompt {start + i} diverged"
            assert o.finish_reason == "length"
            total.add(o.stats)
    # the trained draft gets some tokens accepted and some rejected: both paths are exercised
    assert 0 < total.accepted < total.draft_tokens
    assert total.drafts >= len(PROMPTS) * 5  # several verify steps per prompt


def test_no_speculation_is_the_same_code_path_and_lossless(target, references):
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    outs = Engine(target, None, SpecConfig("NONE")).generate(PROMPTS, params)
    assert [o.output_ids for o in outs] == references
    assert all(o.stats.drafts == 0 for o in outs)


@pytest.mark.parametrize("path", ["generic", "native-eager", "native-graphs"])
def test_sequences_join_and_leave_a_running_batch(target, draft, references, path):
    """Continuous batching: merge new rows mid-flight and filter finished ones; still lossless.
    On the native path the rows live in the engine's preallocated cache."""
    if path == "generic":
        engine = Engine(target, draft, SpecConfig("EAGLE3", 4, 2, 6))
    else:
        engine = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 4, 2, 6), max_batch=8,
                        cuda_graphs=path == "native-graphs")
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    first = [engine.new_sequence(p, params) for p in PROMPTS[:2]]
    batch = engine.merge(None, engine.prefill(first))
    if engine.static:
        assert batch.target_cache is engine.target_pool
    for _ in range(3):
        engine.step(batch)
    late = [engine.new_sequence(p, params) for p in PROMPTS[2:]]
    batch = engine.merge(batch, engine.prefill(late))
    if engine.static:
        assert batch.target_cache.n == 5
    seqs = first + late
    while True:
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if not alive:
            break
        batch = engine.filter(batch, alive)
        engine.step(batch)
    assert [s.output_ids for s in seqs] == references


@pytest.mark.parametrize("native", [False, True], ids=["generic", "native"])
def test_greedy_rows_stay_lossless_beside_sampled_rows(target, draft, references, native):
    """A batch with a sampled row verifies that row on the host; its greedy rows are unchanged."""
    engine = Engine(NativeTarget.from_target(target) if native else target, draft, SpecConfig("EAGLE3", 4, 2, 6),
                    max_batch=8, cuda_graphs=False)
    greedy = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=NEW, ignore_eos=True, temperature=1.0, seed=3)
    outs = engine.generate(PROMPTS[:3], [greedy, sampled, greedy])
    assert [outs[0].output_ids, outs[2].output_ids] == [references[0], references[2]]
    assert len(outs[1].output_ids) == NEW


def test_stop_tokens_end_a_sequence_and_are_included(target, draft, references):
    stop = references[0][10]
    first = references[0].index(stop)
    out = Engine(target, draft, SpecConfig("EAGLE3", 5, 1, 6)).generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=NEW, stop_token_ids=[stop], ignore_eos=True))[0]
    assert out.output_ids == references[0][: first + 1]
    assert out.finish_reason == "stop"


def test_statistics_are_consistent(target, draft):
    out = Engine(target, draft, SpecConfig("EAGLE3", 4, 3, 8)).generate(
        [PROMPTS[1]], SamplingParams(max_new_tokens=NEW, ignore_eos=True))[0]
    s = out.stats
    assert s.draft_tokens == 7 * s.drafts
    assert sum(s.accepted_per_position) == s.accepted
    assert all(a >= b for a, b in zip(s.accepted_per_position, s.accepted_per_position[1:]))
    assert s.accept_length == pytest.approx(1 + s.accepted / s.drafts)
    assert s.accept_rate == pytest.approx(s.accepted / s.draft_tokens)
    # tokens: one from prefill, then (accepted + 1) per verify step, cut at max_new_tokens
    assert len(out.output_ids) <= 1 + s.drafts + s.accepted
    d = s.as_dict()
    assert set(d) == {"drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "accept_length",
                      "accept_rate"}


@pytest.mark.parametrize("path", ["generic", "native"])
def test_batch_schedule_switches_as_rows_finish_and_stays_lossless(target, draft, references, path):
    """5 rows, none speculating from 3 rows up; a chain at 2 rows, a tree at 1. The draft is fed
    through the plain steps too, so it drafts (and gets tokens accepted) once the batch shrinks."""
    spec = SpecConfig("EAGLE3", schedule=parse_schedule("1:4,4,12;2:3,1,4;4:0"))
    t = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(t, draft, spec, max_batch=8)
    lengths = [NEW, 12, 30, 5, 40]
    seqs = [engine.new_sequence(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(PROMPTS, lengths)]
    batch, proposed, sizes = engine.prefill(seqs), {s.rid: 0 for s in seqs}, set()
    while alive := [i for i, s in enumerate(batch.seqs) if not s.finished]:
        batch = engine.filter(batch, alive)
        step_spec = spec.for_batch(len(batch))
        sizes.add((len(batch), step_spec.num_draft_tokens if step_spec.speculative else 0))
        for s in batch.seqs:
            proposed[s.rid] += step_spec.num_draft_tokens - 1 if step_spec.speculative else 0
        engine.step(batch)
    assert [s.output_ids for s in seqs] == [r[:n] for r, n in zip(references, lengths)]
    assert sizes == {(5, 0), (4, 0), (3, 0), (2, 4), (1, 12)}
    assert [s.stats.draft_tokens for s in seqs] == [proposed[s.rid] for s in seqs]  # plain steps record nothing
    assert seqs[3].stats.drafts == 0 and seqs[4].stats.accepted > 0  # the fed draft drafts well again
    if engine.static:
        assert engine.target_runner.tokens == [1, 4, 12] and len(engine.drafters) == 2
