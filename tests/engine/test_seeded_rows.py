"""A seeded request gives the same tokens whatever else is in its batch, wherever it sits, whenever it joins,
and whatever the engine speculates with.

Its draws depend only on its seed and its positions (``spec/rng.py``, ``spec/race.py``), never on its
neighbours nor on the tree, so the same request served alone, among greedy and sampled neighbours with other
settings, at another row, merged into a running batch, without speculation, under any chain or tree, or under
``auto`` changing the setting from step to step, emits the same text: eagerly on the generic and native paths,
and through the whole-step graphs' logic (the native path's buckets, run eagerly on the CPU).
"""

import pytest

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

SPEC = SpecConfig("EAGLE3", 4, 2, 6)
PROMPT = [72, 101, 108, 108, 111]
MINE = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1277, ignore_eos=True)
OTHERS = [([7] * 9, SamplingParams(max_new_tokens=24, ignore_eos=True)),
          ([200, 13], SamplingParams(max_new_tokens=10, temperature=1.3, min_p=0.1, ignore_eos=True)),
          ([5, 6, 7, 8, 9, 10], SamplingParams(max_new_tokens=20, temperature=0.6, top_k=5, seed=9, ignore_eos=True))]


def joined_late(engine: Engine) -> list[int]:
    """MINE prefilled after the others have stepped three times, then merged into their batch."""
    batch = engine.prefill_all([engine.new_sequence(p, sp) for p, sp in OTHERS])
    for _ in range(3):
        engine.step(batch)
    seq = engine.new_sequence(PROMPT, MINE)
    batch = engine.merge(batch, engine.prefill([seq]))
    while not seq.finished:
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if len(alive) < len(batch):
            batch = engine.filter(batch, alive)
        engine.step(batch)
    return seq.output_ids


@pytest.fixture(scope="module")
def alone(target, draft):
    out = Engine(target, draft, SPEC).generate([PROMPT], MINE)[0]
    assert out.stats.accepted > 0  # the draft's tokens were accepted: the tree's draws are exercised
    return out.output_ids


@pytest.mark.parametrize("path", ["generic", "native-eager", "native-graph"])
def test_a_seeded_request_gives_the_same_tokens_in_any_batch(target, draft, alone, path):
    model = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(model, draft, SPEC, max_batch=8, cuda_graphs=path == "native-graph")
    assert engine.generate([PROMPT], MINE)[0].output_ids == alone
    for row in (0, 3):
        batch = OTHERS[:row] + [(PROMPT, MINE)] + OTHERS[row:]
        outs = engine.generate([p for p, _ in batch], [sp for _, sp in batch])
        assert outs[row].output_ids == alone, f"at row {row}"
    assert joined_late(engine) == alone
    other = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1278, ignore_eos=True)
    assert engine.generate([PROMPT], other)[0].output_ids != alone  # the seed decides
    if path == "native-graph":
        assert engine.whole_steps[SPEC].graphs["filtered"].graphs  # the sampled rows ran inside the whole step


AUTO = SpecConfig.auto("EAGLE3")
SETTINGS = [MINE, SamplingParams(max_new_tokens=12, temperature=1.0, seed=77, ignore_eos=True),
            SamplingParams(max_new_tokens=20, temperature=0.7, top_k=5, min_p=0.05, seed=-3, ignore_eos=True),
            SamplingParams(max_new_tokens=6, temperature=1.2, repetition_penalty=1.3, seed=5, ignore_eos=True)]
# step costs (NONE, then AUTO's candidates) per rows bucket: no speculation at 4 rows, trees as rows finish
COSTS = {1: (1.0, 1.2, 1.3, 1.6, 2.2), 2: (1.0, 1.8, 2.0, 2.4, 3.0), 4: (1.0, 4.0, 5.0, 8.0, 12.0)}


@pytest.mark.parametrize("path", ["generic", "native"])
def test_a_seeded_request_gives_the_same_tokens_speculating_or_not(target, draft, path):
    """Plain decoding, a chain, trees, and ``auto`` switching settings: each node draws its position's token
    (``spec/race.py``), so the tree changes how many tokens a step emits, never which."""
    model = target if path == "generic" else NativeTarget.from_target(target)
    plain = Engine(model, None, AUTO.options[0]).generate([PROMPT] * len(SETTINGS), SETTINGS)
    assert len({tuple(o.output_ids) for o in plain}) == len(SETTINGS)  # the settings and seeds decide
    accepted = 0
    for spec in (SpecConfig("EAGLE3", 5, 1, 6), SPEC, SpecConfig("EAGLE3", 3, 4, 12), AUTO):
        engine = Engine(model, draft, spec, max_batch=4)
        if spec.adaptive:  # the setting changes as rows finish (test_adaptive.py)
            engine.chooser.set_costs({s: {b: row[i] for b, row in COSTS.items()} for i, s in enumerate(AUTO.options)})
        outs = engine.generate([PROMPT] * len(SETTINGS), SETTINGS)
        assert [o.output_ids for o in outs] == [o.output_ids for o in plain], spec
        accepted += sum(o.stats.accepted for o in outs)
    assert len([n for n in engine.chooser.steps.values() if n]) >= 2, engine.chooser.steps  # auto changed
    assert accepted > 0  # drafted tokens were accepted: the trees' draws were exercised
