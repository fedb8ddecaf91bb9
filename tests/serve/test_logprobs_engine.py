"""The engine's logprobs (``sample/logprobs.py``) against the target's own forward: speculative (tree and
chain) equal plain decoding's for the same greedy output, and the HF model's ``log_softmax`` at those
positions; sampled ones equal the processed distribution's; a row that asks beside one that does not
leaves both outputs as they are alone."""

from __future__ import annotations

import dataclasses
import traceback

import pytest
import torch

from eyas.config import Algorithm, SpecConfig
from eyas.engine.engine import Engine
from eyas.models.target import Target
from eyas.sample.penalties import Penalties, penalize
from eyas.sample.sampling import SamplingParams, probs

PROMPTS = ["The quick brown fox", "abab abab ab", "hello there, how"]
TOL = 1e-4  # float32 log-softmax of float64 logits


@pytest.fixture(scope="module")
def engines(engine):
    """{"tree": the served EAGLE-3 tree engine, "chain": top-k 1, "generic": the tree on the Hugging Face
    forward (a growing cache, no native path), "none": plain decoding}, one target."""
    generic = Target(engine.target.model, engine.target.tokenizer, "generic", engine.target.aux_layer_ids)
    return {"tree": engine, "chain": Engine(engine.target, engine.draft, SpecConfig(Algorithm.EAGLE3, 3, 1, 4)),
            "generic": Engine(generic, engine.draft, SpecConfig(Algorithm.EAGLE3, 3, 2, 6)),
            "none": Engine(engine.target, None, SpecConfig(Algorithm.NONE))}


def _ids(engine, text: str) -> list[int]:
    return engine.target.tokenizer(text).input_ids


def _hf_logits(engine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V] the HF model's logits at the positions that predicted each output token."""
    ids = torch.tensor([prompt + output[:-1]], device=engine.device)
    with torch.no_grad():
        return engine.target.model(ids).logits[0, len(prompt) - 1:].double()


@pytest.mark.parametrize("kind", ["tree", "chain", "generic"])
def test_speculative_logprobs_are_plain_decodings_and_the_targets(engines, kind):
    spec, none = engines[kind], engines["none"]
    prompts = [_ids(spec, p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=5)
    got, want = spec.generate(prompts, params), none.generate(prompts, params)
    assert sum(o.stats.accepted for o in got) > 0  # the draft's tokens were accepted somewhere
    for g, w, prompt in zip(got, want, prompts):
        assert g.output_ids == w.output_ids and len(g.logprobs) == len(g.output_ids) == 24
        ref = torch.log_softmax(_hf_logits(spec, prompt, g.output_ids), dim=-1)
        for j, (token, gl, wl) in enumerate(zip(g.output_ids, g.logprobs, w.logprobs)):
            assert gl.logprob == pytest.approx(wl.logprob, abs=TOL)
            assert gl.logprob == pytest.approx(ref[j, token].item(), abs=TOL)
            top_ref = ref[j].topk(5)
            assert [t for t, _ in gl.top] == top_ref.indices.tolist() == [t for t, _ in wl.top]
            assert [v for _, v in gl.top] == pytest.approx(top_ref.values.tolist(), abs=TOL)
            assert gl.top[0][0] == token  # greedy: the chosen token is the most likely one
            assert [v for _, v in gl.top] == sorted((v for _, v in gl.top), reverse=True)


@pytest.mark.parametrize("kind", ["tree", "none"])
def test_sampled_logprobs_are_the_processed_distributions(engines, kind):
    eng = engines[kind]
    prompt = _ids(eng, PROMPTS[0])
    params = SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.9, seed=7, ignore_eos=True, logprobs=3)
    out = eng.generate([prompt], params)[0]
    logits = _hf_logits(eng, prompt, out.output_ids)
    ref = probs(logits, params).double().log()  # -inf where top-p cut the token
    for j, (token, lp) in enumerate(zip(out.output_ids, out.logprobs)):
        assert lp.logprob == pytest.approx(ref[j, token].item(), abs=TOL)
        assert [t for t, _ in lp.top] == ref[j].topk(3).indices.tolist()
        for t, v in lp.top:
            assert v == pytest.approx(ref[j, t].item(), abs=TOL) or v == ref[j, t].item() == -float("inf")


def test_penalized_logprobs_follow_the_penalised_logits(engines):
    eng, none = engines["tree"], engines["none"]
    prompt = _ids(eng, PROMPTS[1])
    params = SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=2, presence_penalty=1.5,
                            frequency_penalty=0.5, repetition_penalty=1.3, logit_bias={100: 3.0})
    got, want = eng.generate([prompt], params)[0], none.generate([prompt], params)[0]
    assert got.output_ids == want.output_ids
    logits = _hf_logits(eng, prompt, got.output_ids)
    pen = Penalties.build([params], [prompt], logits.shape[-1], logits.device)
    for j, (token, g, w) in enumerate(zip(got.output_ids, got.logprobs, want.logprobs)):
        x = penalize(logits[None, j:j + 1], torch.tensor([[0]]), torch.ones(1, 1, 1, dtype=torch.bool), *pen.tensors())
        ref = torch.log_softmax(x[0, 0].double(), dim=-1)
        assert g.logprob == pytest.approx(ref[token].item(), abs=TOL)
        assert g.logprob == pytest.approx(w.logprob, abs=TOL)
        pen.counts[0, token] += 1


def test_a_row_with_logprobs_beside_one_without_gives_both_their_solo_outputs(engines):
    eng = engines["tree"]
    prompts = [_ids(eng, p) for p in PROMPTS[:2]]
    plain = SamplingParams(max_new_tokens=20, ignore_eos=True)
    asking = dataclasses.replace(plain, temperature=0.8, seed=3, logprobs=4)
    together = eng.generate(prompts, [asking, plain])
    alone = [eng.generate([prompts[0]], asking)[0], eng.generate([prompts[1]], plain)[0]]
    assert [o.output_ids for o in together] == [o.output_ids for o in alone]
    assert together[1].logprobs is None and alone[1].logprobs is None
    assert [lp.logprob for lp in together[0].logprobs] == pytest.approx([lp.logprob for lp in alone[0].logprobs],
                                                                        abs=TOL)
    assert len(together[0].logprobs) == 20 and all(len(lp.top) == 4 for lp in together[0].logprobs)


def test_no_alternatives_and_the_cap(engines):
    out = engines["none"].generate([_ids(engines["none"], "hi")], SamplingParams(max_new_tokens=3, logprobs=0))[0]
    assert len(out.logprobs) == len(out.output_ids) and all(lp.top == [] for lp in out.logprobs)
    with pytest.raises(Exception, match="logprobs must be an integer in \\[0, 20\\]"):
        SamplingParams(logprobs=21)


def test_a_step_with_logprobs_reads_the_device_once_then_unpacks_on_the_host(engine, monkeypatch):
    """The logprobs travel with the step's one readback (``collect``): unpacking them reads host memory only."""
    eng = Engine(engine.target, engine.draft, SpecConfig(Algorithm.EAGLE3, 3, 2, 6), max_batch=4)
    asking, plain = (SamplingParams(max_new_tokens=40, ignore_eos=True, logprobs=k) for k in (3, None))
    batch = eng.prefill([eng.new_sequence(_ids(eng, p), sp) for p, sp in zip(PROMPTS, (asking, plain))])
    eng.step(batch)
    reads, tolist = [], torch.Tensor.tolist

    def recorded(t, *args, **kwargs):
        reads.append(traceback.extract_stack()[-2].name)
        return tolist(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "tolist", recorded)
    eng.step(batch)
    assert reads == ["collect", "unpack"]
    assert len(batch.seqs[0].logprobs) == len(batch.seqs[0].output_ids) and batch.seqs[1].logprobs is None
