"""Penalties through the engine: the counts follow the output, speculation keeps greedy output exact.

A greedy request with penalties takes the argmax of the penalised logits, so the text depends on every
token before each position: speculation (which verifies drafted tokens against logits penalised along
each tree path) must give exactly what plain decoding gives, on the generic path and on the native
path's whole-step logic, alone and beside rows without penalties. A seeded sampled request with
penalties gives the same text in any batch.
"""

import pytest

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

SPEC = SpecConfig("EAGLE3", 4, 2, 6)
PROMPT = [72, 101, 108, 108, 111]
PENALIZED = SamplingParams(max_new_tokens=24, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3,
                           logit_bias={7: -100.0}, ignore_eos=True)
PLAIN = SamplingParams(max_new_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, frequency_penalty=1.0, seed=77,
                         ignore_eos=True)


@pytest.fixture(scope="module")
def plain_decoding(target):
    engine = Engine(target)
    return {name: engine.generate([PROMPT], p)[0].output_ids for name, p in
            [("penalized", PENALIZED), ("plain", PLAIN), ("sampled", SAMPLED)]}


def test_penalties_change_greedy_output_as_defined(plain_decoding):
    out = plain_decoding["penalized"]
    assert out != plain_decoding["plain"] and 7 not in out
    assert len(set(out)) > len(set(plain_decoding["plain"]))  # repeats discouraged


@pytest.mark.parametrize("path", ["generic", "native-eager", "native-graph"])
def test_speculation_with_penalties_gives_plain_decodings_text(target, draft, plain_decoding, path):
    model = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(model, draft, SPEC, max_batch=8, cuda_graphs=path == "native-graph")
    outs = engine.generate([PROMPT, [7] * 6, PROMPT], [PENALIZED, PLAIN, SAMPLED])
    assert outs[0].output_ids == plain_decoding["penalized"]
    assert outs[1].output_ids == Engine(target).generate([[7] * 6], PLAIN)[0].output_ids  # no penalty: unchanged
    assert outs[2].output_ids == engine.generate([PROMPT], SAMPLED)[0].output_ids  # seeded: batch-independent
    assert outs[0].stats.accepted > 0  # drafted tokens were verified against penalised logits
    if path == "native-graph":
        assert engine.whole_steps[SPEC].graphs["penalized"].graphs  # ran inside the whole step
        assert not any("penalized" in r.name for r in engine.graph_runners())  # not captured at startup


def test_plain_decoding_on_the_native_path_agrees(target, plain_decoding):
    engine = Engine(NativeTarget.from_target(target), max_batch=4, cuda_graphs=True)
    assert engine.generate([PROMPT], PENALIZED)[0].output_ids == plain_decoding["penalized"]
    assert engine.whole_steps[engine.spec].graphs["penalized"].graphs


def test_a_logit_bias_outside_the_vocabulary_is_refused(target):
    with pytest.raises(Exception, match="logit_bias"):
        Engine(target).new_sequence(PROMPT, SamplingParams(logit_bias={10**6: 1.0}))
