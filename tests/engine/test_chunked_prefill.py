"""A long prompt prefilled a chunk at a time (``Engine.prefill_chunk``, what ``eyas serve`` does past
``--chunked-prefill-size``) is the prompt prefilled whole: the same first token, the same draft output for
the first tree, and every token after equal to Hugging Face's greedy continuation, on both paths."""

import pytest
import torch
from helpers import reference_greedy

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine.prefill import Prefilling
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPT = list(range(30, 67))  # 37 tokens: chunks of 8, 8, 8, 8, 5
NEW = 20
CLOSE = dict(atol=1e-9, rtol=1e-9)  # float64


def chunked(engine, params, chunk=8):
    part = Prefilling(engine.new_sequence(PROMPT, params))
    calls = 1
    while (batch := engine.prefill_chunk(part, chunk)) is None:
        calls += 1
    return batch, calls


def run(engine, batch):
    while not batch.seqs[0].finished:
        engine.step(batch)
    return batch.seqs[0]


@pytest.mark.parametrize("path", ["generic", "native"])
@pytest.mark.parametrize("spec", [SpecConfig("NONE"), SpecConfig("EAGLE3", 4, 3, 8)], ids=["plain", "tree"])
def test_a_prompt_prefilled_in_chunks_is_the_prompt_prefilled_whole(target, draft, spec, path):
    model = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(model, draft if spec.speculative else None, spec, max_batch=4)
    greedy = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    batch, calls = chunked(engine, greedy)
    whole = engine.prefill([engine.new_sequence(PROMPT, greedy)])
    assert calls == 5 and batch.seqs[0].output_ids == whole.seqs[0].output_ids
    assert batch.lengths.tolist() == whole.lengths.tolist() == [len(PROMPT)]
    if spec.speculative:
        torch.testing.assert_close(batch.draft_logits, whole.draft_logits, **CLOSE)
        torch.testing.assert_close(batch.draft_hidden, whole.draft_hidden, **CLOSE)
    seq = run(engine, batch)
    assert seq.output_ids == reference_greedy(target.model, PROMPT, NEW)
    assert seq.stats.as_dict() == run(engine, whole).stats.as_dict()  # the draft saw the same prompt


def test_a_seeded_sampled_prompt_draws_the_same_tokens_chunked(target, draft):
    engine = Engine(target, draft, SpecConfig("EAGLE3", 4, 3, 8), max_batch=4)
    sampled = SamplingParams(max_new_tokens=NEW, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7)
    a = run(engine, chunked(engine, sampled, chunk=16)[0])
    b = run(engine, engine.prefill([engine.new_sequence(PROMPT, sampled)]))
    assert a.output_ids == b.output_ids and len(a.output_ids) == NEW
