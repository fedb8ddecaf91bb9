"""Grammar-constrained decoding in the engine (``sample/grammar.py``) on the tiny float64 pair.

Under speculation the grammar's mask goes on the target's logits at every node of the verified tree,
so the constrained output must be exactly plain decoding's (NONE) under the same grammar, for a tree
and for a chain; a constrained row beside an unconstrained one gives what each gives alone; a sampled
constrained row only ever emits tokens the grammar allows.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from eyas.config import Algorithm, SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.grammar import GrammarError, GrammarSpec, RowGrammar, grammars_for
from eyas.sample.sampling import SamplingParams

REGEX = "(ab|cd)+x[0-9]{3}"
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "ok": {"type": "boolean"}},
          "required": ["city", "ok"], "additionalProperties": False}
SPECS = [GrammarSpec("regex", REGEX), GrammarSpec.json_schema(SCHEMA)]


@pytest.fixture(scope="module")
def plain(engine):
    return Engine(engine.target, None, SpecConfig(Algorithm.NONE))


@pytest.fixture(scope="module")
def chain(engine):
    return Engine(engine.target, engine.draft, SpecConfig(Algorithm.EAGLE3, num_steps=3, eagle_topk=1,
                                                          num_draft_tokens=4))


def _prompts(engine) -> list[list[int]]:
    tok = engine.target.tokenizer
    return [tok("hello world").input_ids, tok("The answer is").input_ids]


def _text(engine, ids: list[int]) -> str:
    return engine.target.tokenizer.decode(ids, skip_special_tokens=True)


def _check(spec: GrammarSpec, text: str) -> None:
    """The text is a complete sentence of the grammar."""
    if spec.kind == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        value = json.loads(text)
        assert set(value) == {"city", "ok"} and value["city"] in SCHEMA["properties"]["city"]["enum"]
        assert isinstance(value["ok"], bool)


@pytest.mark.parametrize("spec", SPECS, ids=["regex", "json_schema"])
@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_speculative_greedy_equals_none_under_the_grammar(engine, plain, chain, spec, shape):
    spec_engine = engine if shape == "tree" else chain
    params = SamplingParams(max_new_tokens=48, grammar=spec)
    prompts = _prompts(engine)
    want = plain.generate(prompts, params)
    got = spec_engine.generate(prompts, params)
    for w, g in zip(want, got):
        assert g.output_ids == w.output_ids
        assert w.finish_reason == g.finish_reason == "stop"  # the grammar completed and ended the row
        _check(spec, _text(engine, w.output_ids))
    free = plain.generate(prompts, SamplingParams(max_new_tokens=8))
    assert [o.output_ids[:8] for o in free] != [o.output_ids[:8] for o in want]  # the grammar did change the output


def test_constrained_row_beside_an_unconstrained_one(engine, plain):
    prompts = _prompts(engine)
    constrained, free = SamplingParams(max_new_tokens=40, grammar=SPECS[0]), SamplingParams(max_new_tokens=12)
    solo = [plain.generate([prompts[0]], constrained)[0].output_ids, plain.generate([prompts[1]], free)[0].output_ids]
    for e in (plain, engine):
        together = e.generate(prompts, [constrained, free])
        assert [o.output_ids for o in together] == solo


@pytest.mark.parametrize("spec", SPECS, ids=["regex", "json_schema"])
def test_sampled_tokens_are_always_allowed(engine, spec):
    """Temperature 1.5 on a random model: unconstrained it wanders anywhere; constrained, each emitted token
    is checked against a fresh matcher fed the output so far."""
    compiled = grammars_for(engine.target).compile(spec)
    for seed in range(4):
        params = SamplingParams(max_new_tokens=48, temperature=1.5, seed=seed, grammar=spec)
        out = engine.generate(_prompts(engine), params)
        for o in out:
            assert o.finish_reason in ("stop", "length")
            matcher = RowGrammar(compiled, engine.target.info.vocab_size)
            for t in o.output_ids:
                assert matcher.advance(t), (seed, t)
            if o.finish_reason == "stop":
                _check(spec, _text(engine, o.output_ids))


def test_tree_mask_matches_a_matcher_per_prefix(engine):
    """Every node's bitmask is the grammar state after its own prefix; refused nodes, and what hangs
    under them, allow everything (they can never be accepted)."""
    tok = engine.target.tokenizer
    compiled = grammars_for(engine.target).compile(SPECS[0])
    ids = {c: tok.convert_tokens_to_ids(c) for c in "abcdx"}
    # root -> a -> b -> c ; root -> c -> d ; root -> x (refused) -> a
    tokens = [0, ids["a"], ids["b"], ids["c"], ids["c"], ids["d"], ids["x"], ids["a"]]
    parents = [-1, 0, 1, 2, 0, 4, 0, 6]
    mask = RowGrammar(compiled, engine.target.info.vocab_size).tree_mask(tokens, parents)
    vocab = engine.target.info.vocab_size

    def allowed(row: torch.Tensor) -> set[int]:
        return {i for i in range(vocab) if (int(row[i // 32]) >> (i % 32)) & 1}

    for node, prefix in [(0, []), (1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [4]), (5, [4, 5])]:
        m = RowGrammar(compiled, vocab)
        for j in prefix:
            assert m.advance(tokens[j])
        assert allowed(mask[node]) == allowed(m.tree_mask([0], [-1])[0]), node
    assert allowed(mask[2]) == {ids["a"], ids["c"], ids["x"]}  # after "ab"
    for node in (6, 7):
        assert allowed(mask[node]) == set(range(vocab))


def test_a_bad_grammar_is_an_error_naming_the_field(engine):
    grammars = grammars_for(engine.target)
    with pytest.raises(GrammarError, match="regex cannot be compiled") as e:
        grammars.compile(GrammarSpec("regex", "[a-", param="sampling_params.regex"))
    assert e.value.param == "sampling_params.regex"
    with pytest.raises(GrammarError, match="json schema cannot be compiled"):
        grammars.compile(GrammarSpec("json_schema", '{"type": "objec"}'))
    assert grammars.compile(SPECS[1]) is grammars.compile(GrammarSpec.json_schema(SCHEMA))  # the LRU
