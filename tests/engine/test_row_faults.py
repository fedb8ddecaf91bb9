"""A fault of one row ends that row alone: the batch goes on, and the other rows' tokens do not change.

The fault is real state, not a mocked step: a NaN written into one row's keys (what an overflow in the
model leaves behind) makes that row's logits NaN in the next forward, on every path the engine steps
by (the generic forward, the native one by parts, and the native whole-step function a graph replays).
"""

import pytest
import torch

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.models.static_cache import StaticKV
from eyas.sample.sampling import SamplingParams

PROMPTS = [[72, 101, 108], [7] * 9, [200, 13, 5, 5]]
NEW = 12


@torch.inference_mode()
def poison(cache, row: int, slot: int = 0) -> None:
    """A NaN in ``row``'s keys at ``slot`` of every layer."""
    if isinstance(cache, StaticKV):
        cache.buf[:, 0, row, :, slot] = float("nan")
    else:
        for layer in cache.hf.layers:
            layer.keys[row, :, slot] = float("nan")


def engine_for(target, draft, spec, path, monkeypatch):
    model = target if path == "generic" else NativeTarget.from_target(target)
    return Engine(model, draft if spec.speculative else None, spec, max_batch=4, cuda_graphs=path == "native-graph",
                  whole_step_graphs=path != "native-by-parts")


def run(engine, batch):
    """Step ``batch`` until every row has finished, dropping finished rows between steps (as the server)."""
    while True:
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if not alive:
            return
        if len(alive) < len(batch):
            batch = engine.filter(batch, alive)
        engine.step(batch)


@pytest.mark.parametrize("path", ["generic", "native-by-parts", "native-graph"])
@pytest.mark.parametrize("spec", [SpecConfig("EAGLE3", 3, 2, 6), SpecConfig("NONE")], ids=["tree", "no-spec"])
def test_non_finite_logits_end_their_row_alone(target, draft, spec, path, monkeypatch):
    engine = engine_for(target, draft, spec, path, monkeypatch)
    greedy = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    sampled = [SamplingParams(max_new_tokens=NEW, ignore_eos=True, temperature=0.8, seed=1),
               SamplingParams(max_new_tokens=NEW, ignore_eos=True, temperature=1.0, top_p=0.9, seed=2)]
    params = [greedy, *sampled]  # the failing row samples: a NaN through the device sampler harms no other row
    alone = [engine.generate([p], [sp])[0].output_ids for p, sp in zip(PROMPTS, params)]
    seqs = [engine.new_sequence(p, sp) for p, sp in zip(PROMPTS, params)]
    batch = engine.prefill(seqs)
    engine.step(batch)  # on the native path, the rows now live in the engine's preallocated cache
    poison(batch.target_cache, 2)  # the last row: a row that joins later takes its place in the cache
    engine.step(batch)
    assert seqs[2].finish_reason == "error" and "not finite" in seqs[2].error
    assert not seqs[0].finished and not seqs[1].finished
    failed_at = list(seqs[2].output_ids)
    late = engine.new_sequence([9, 8, 7], SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    batch = engine.merge(engine.filter(batch, [0, 1]), engine.prefill([late]))
    run(engine, batch)
    assert [s.output_ids for s in seqs[:2]] == alone[:2]  # the others finish as they would have alone
    assert seqs[2].output_ids == failed_at  # nothing emitted past the fault
    assert late.output_ids == engine.generate([[9, 8, 7]], SamplingParams(max_new_tokens=NEW, ignore_eos=True))[
        0].output_ids  # the failed row's slots were cleared before another row used them


def test_non_finite_prefill_logits_fail_that_prompt_only(target, monkeypatch):
    engine = Engine(NativeTarget.from_target(target), None, SpecConfig("NONE"), max_batch=4, cuda_graphs=True)
    forward = engine.target.native.forward

    def nan_for_marked(ids, *args, **kwargs):  # a prompt holding token 3 overflows
        logits, aux = forward(ids, *args, **kwargs)
        return logits.masked_fill((ids == 3).any(dim=1)[:, None, None], float("nan")), aux

    monkeypatch.setattr(engine.target.native, "forward", nan_for_marked)
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    outs = engine.generate([[5, 6, 7], [5, 3, 7], [8, 9]], params)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert outs[1].output_ids == []
    assert [o.output_ids for o in (outs[0], outs[2])] == [o.output_ids for o in engine.generate([[5, 6, 7], [8, 9]],
                                                                                             params)]
