"""A seeded request gives the same tokens whatever else is in its batch, wherever it sits, whenever it joins.

Its draws depend only on its seed and its positions (``engine/rng.py``), never on its neighbours, so
the same request served alone, among greedy and sampled neighbours with other settings, at another
row, or merged into a running batch, emits the same text: eagerly on the generic and native paths,
and through the whole-step graphs' logic (the native path's buckets, run eagerly on the CPU).
"""

import pytest

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

SPEC = SpecConfig("EAGLE3", 4, 2, 6)
PROMPT = [72, 101, 108, 108, 111]
MINE = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
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
    other = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1235, ignore_eos=True)
    assert engine.generate([PROMPT], other)[0].output_ids != alone  # the seed decides
    if path == "native-graph":
        assert engine.whole_steps[SPEC].graphs["filtered"].graphs  # the sampled rows ran inside the whole step
