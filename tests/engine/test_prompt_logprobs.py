"""A prompt's logprobs (``SamplingParams.prompt_logprobs``) are the raw model's: Hugging Face's own
``log_softmax`` over the prompt at every position, the top N and each token's rank included, on both paths,
with and without a draft, for a prompt prefilled whole, in pieces, or a chunk at a time as the server does;
``max_new_tokens`` 0 ends the row after its prompt with no token; and a row that asks changes nothing for
the rows beside it."""

import dataclasses

import pytest
import torch

from eyas.config import SpecConfig
from eyas.engine import engine as engine_module
from eyas.engine import prefill
from eyas.engine.engine import Engine
from eyas.engine.prefill import Prefilling
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPT = [(7 * i) % 250 + 3 for i in range(45)]
TOP = 4
TOL = 1e-4  # float32 log-softmax of float64 logits


def engine_for(target, draft, path: str, spec: str) -> Engine:
    model = target if path == "generic" else NativeTarget.from_target(target)
    setting = SpecConfig("NONE") if spec == "plain" else SpecConfig("EAGLE3", 4, 3, 8)
    return Engine(model, draft if setting.speculative else None, setting, max_batch=4)


def hf_log_softmax(target, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), V] float64: position i's log-distribution over the token after it."""
    with torch.no_grad():
        return torch.log_softmax(target.model(torch.tensor([prompt])).logits[0].double(), dim=-1)


def assert_raw(target, prompt: list[int], got: list, top: int = TOP) -> None:
    ref = hf_log_softmax(target, prompt)
    assert len(got) == len(prompt) and got[0] is None
    for i in range(1, len(prompt)):
        want, token = ref[i - 1], prompt[i]
        assert got[i].logprob == pytest.approx(want[token].item(), abs=TOL)
        assert got[i].rank == int((want >= want[token]).sum())
        best = want.topk(top)
        assert [t for t, _ in got[i].top] == best.indices.tolist()
        assert [v for _, v in got[i].top] == pytest.approx(best.values.tolist(), abs=TOL)


def greedy(n: int = 6, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)


@pytest.mark.parametrize("path", ["generic", "native"])
@pytest.mark.parametrize("spec", ["plain", "tree"])
def test_prompt_logprobs_are_the_models_log_softmax_at_every_position(target, draft, path, spec):
    engine = engine_for(target, draft, path, spec)
    short = PROMPT[:9]
    asking, plain = greedy(prompt_logprobs=TOP), greedy()
    out = engine.generate([short], asking)[0]
    assert_raw(target, short, engine.prefill([engine.new_sequence(short, asking)]).seqs[0].prompt_logprobs)
    assert out.output_ids == engine.generate([short], plain)[0].output_ids  # the output is the prompt's, as alone
    assert engine.prefill([engine.new_sequence(short, plain)]).seqs[0].prompt_logprobs is None


@pytest.mark.parametrize("path", ["generic", "native"])
def test_a_long_prompt_in_pieces_and_in_server_chunks_gets_the_same_logprobs(target, draft, path, monkeypatch):
    engine = engine_for(target, draft, path, "tree")
    asking = greedy(n=12, prompt_logprobs=TOP)
    whole = engine.prefill([engine.new_sequence(PROMPT, asking)])
    monkeypatch.setattr(prefill, "PROMPT_LOGPROBS_TOKENS", 8)  # 45 tokens: pieces of 8, 8, 8, 8, 8, 5
    pieces = engine.prefill([engine.new_sequence(PROMPT, asking)])
    part, calls = Prefilling(engine.new_sequence(PROMPT, asking)), 1
    while (chunked := engine.prefill_chunk(part, 20)) is None:  # the server's chunks of 20, each in pieces of 8
        calls += 1
    assert calls == 3
    for batch in (whole, pieces, chunked):
        assert_raw(target, PROMPT, batch.seqs[0].prompt_logprobs)
        assert batch.seqs[0].output_ids == whole.seqs[0].output_ids
    outs = []
    for batch in (whole, pieces, chunked):
        while not batch.seqs[0].finished:
            engine.step(batch)
        outs.append(batch.seqs[0].output_ids)
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 12


def test_no_alternatives_a_one_token_prompt_and_sampled_rows_keep_the_raw_distribution(target, draft):
    engine = engine_for(target, draft, "native", "tree")
    zero = engine.prefill([engine.new_sequence(PROMPT[:6], greedy(prompt_logprobs=0))]).seqs[0].prompt_logprobs
    assert_raw(target, PROMPT[:6], zero, top=0)
    one = engine.prefill([engine.new_sequence(PROMPT[:1], greedy(prompt_logprobs=3))]).seqs[0]
    assert one.prompt_logprobs == [None] and len(one.output_ids) == 1
    hot = greedy(prompt_logprobs=TOP, temperature=0.3, top_k=2, presence_penalty=1.0, seed=1)  # none of it applies
    assert_raw(target, PROMPT[:7], engine.prefill([engine.new_sequence(PROMPT[:7], hot)]).seqs[0].prompt_logprobs)


@pytest.mark.parametrize("path", ["generic", "native"])
def test_max_new_tokens_zero_ends_after_the_prompt_with_no_token(target, draft, path):
    engine = engine_for(target, draft, path, "tree")
    scored, plain = greedy(n=0, prompt_logprobs=2, logprobs=2), greedy(n=5)
    outs = engine.generate([PROMPT[:8], PROMPT[8:20]], [scored, plain])
    assert outs[0].output_ids == [] and outs[0].finish_reason == "length" and outs[0].logprobs == []
    assert outs[1].output_ids == engine.generate([PROMPT[8:20]], plain)[0].output_ids and len(outs[1].output_ids) == 5
    bare = engine.generate([PROMPT[:8]], greedy(n=0))[0]  # no logprobs at all: the prompt alone, still nothing said
    assert bare.output_ids == [] and bare.finish_reason == "length"


def test_asking_rows_prefilled_beside_others_leave_every_output_as_alone(target, draft):
    engine = engine_for(target, draft, "native", "tree")
    prompts = [PROMPT[:10], PROMPT[10:30], PROMPT[5:12]]
    plain = greedy(n=10)
    sampled = dataclasses.replace(plain, temperature=0.8, seed=5, prompt_logprobs=3)
    params = [plain, sampled, plain]
    seqs = [engine.new_sequence(p, sp) for p, sp in zip(prompts, params)]
    groups = engine.prefill_groups(seqs)
    assert [1] in groups and sorted(i for g in groups for i in g) == [0, 1, 2]  # the asking row alone
    together = engine.generate(prompts, params)
    mixed = engine.prefill(seqs)  # one prefill of all three: each alone, in pieces, stacked
    assert_raw(target, prompts[1], mixed.seqs[1].prompt_logprobs, top=3)
    while not all(s.finished for s in mixed.seqs):
        engine.step(mixed)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        alone = engine.generate([p], sp)[0].output_ids
        assert together[i].output_ids == alone == mixed.seqs[i].output_ids, i


def test_prompts_asking_for_logprobs_are_grouped_shortest_first_within_the_cells(monkeypatch):
    monkeypatch.setattr(prefill, "PROMPT_LOGPROBS_CELLS", 1024)
    monkeypatch.setattr(prefill, "PROMPT_LOGPROBS_TOKENS", 512)
    assert prefill.logprob_groups([5, 600, 10, 300, 3]) == [[4, 0, 2], [3], [1]]  # 4 x 300 > 1024; 600: pieces
    assert prefill.logprob_groups([256] * 5) == [[0, 1, 2, 3], [4]]
    assert prefill.logprob_groups([]) == []


@pytest.mark.parametrize("path", ["generic", "native"])
@pytest.mark.parametrize("spec", ["plain", "tree"])
def test_prompts_asking_for_logprobs_run_together_and_get_each_its_own(target, draft, path, spec, monkeypatch):
    """An evaluation harness's batch: several prompts, each asking for its logprobs (one of a single token, one
    with no alternatives), prefilled as one group in one forward; each gets the raw log-softmax of its own
    prompt and continues as it would alone."""
    engine = engine_for(target, draft, path, spec)
    prompts = [PROMPT[:12], PROMPT[3:40], PROMPT[:1], PROMPT[20:27]]
    params = [greedy(n=5, prompt_logprobs=TOP), greedy(n=5, prompt_logprobs=2), greedy(n=5, prompt_logprobs=3),
              greedy(n=0, prompt_logprobs=0)]
    seqs = [engine.new_sequence(p, sp) for p, sp in zip(prompts, params)]
    assert engine.prefill_groups(seqs) == [[2, 3, 0, 1]] and not prefill.in_pieces(seqs)
    calls, real = [], prefill.prefill_chunk
    monkeypatch.setattr(engine_module, "prefill_chunk", lambda *a, **k: calls.append(1) or real(*a, **k))
    batch = engine.prefill(seqs)
    assert calls == []  # one eager forward, not a prompt at a time
    for p, sp, s in zip(prompts, params, batch.seqs):
        if len(p) == 1:
            assert s.prompt_logprobs == [None]
        else:
            assert_raw(target, p, s.prompt_logprobs, top=sp.prompt_logprobs)
    while not all(s.finished for s in batch.seqs):
        engine.step(batch)
    for p, sp, s in zip(prompts, params, batch.seqs):
        assert s.output_ids == engine.generate([p], dataclasses.replace(sp, prompt_logprobs=None))[0].output_ids
