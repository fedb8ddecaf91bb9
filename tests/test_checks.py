"""Every configuration that would fail silently is refused, with a message that names the fix."""

import subprocess
import sys

import pytest
import torch
from helpers import save_tiny_model, tiny_target

from eyas.checks import check_spec, check_vocab_maps
from eyas.config import Algorithm, SpecConfig
from eyas.engine.engine import Engine
from eyas.errors import EyasError
from eyas.models.draft import Eagle3Draft
from eyas.pipeline import EngineArgs, build_engine
from eyas.sample.sampling import SamplingParams


def refuse(target, draft, spec, path="draft/", match=""):
    with pytest.raises(EyasError, match=match) as e:
        check_spec(spec, target.info, draft, path, target.aux_layer_ids)
    assert e.value.fix, "every refusal names a fix"
    return str(e.value)


def test_eagle_with_an_eagle3_draft_is_refused_naming_eagle3(target):
    d = Eagle3Draft.for_target(target)
    msg = refuse(target, d, SpecConfig("EAGLE"), match="EAGLE-3 draft")
    assert "--speculative-algorithm EAGLE3" in msg
    assert "1.00" in msg  # says what would have happened


def test_eagle3_with_a_draft_without_fc_is_refused(target):
    d = Eagle3Draft.for_target(target)
    del d.fc
    d.config.architectures = ["LlamaForCausalLMEagle"]
    refuse(target, d, SpecConfig("EAGLE3"), match="has no fc")


def test_eagle3_with_an_eagle1_draft_is_refused(target):
    d = Eagle3Draft.for_target(target)
    d.fc = torch.nn.Linear(2 * target.info.hidden_size, target.info.hidden_size, bias=False)
    d.config.architectures = ["LlamaForCausalLMEagle"]
    refuse(target, d, SpecConfig("EAGLE3"), match="EAGLE-1/2 draft")


def test_draft_for_another_target_is_refused(target):
    other = tiny_target(hidden_size=32, intermediate_size=64)
    d = Eagle3Draft.for_target(other)
    msg = refuse(target, d, SpecConfig("EAGLE3"), match="built for another target")
    assert "96" in msg and "192" in msg  # 3 x 32 given, 3 x 64 expected


def test_aux_layers_out_of_range_are_refused(target):
    deep = tiny_target(num_hidden_layers=40)
    d = Eagle3Draft.for_target(deep)  # captures [2, 20, 37]
    assert d.aux_layer_ids == [2, 20, 37]
    with pytest.raises(EyasError, match="outside the target's 0..7") as e:
        Engine(target, d, SpecConfig("EAGLE3"))
    assert "deeper target" in str(e.value)


def test_a_draft_trained_on_a_target_of_another_depth_is_refused():
    """Its layer ids, a 10-layer target's default [2, 5, 7], are within this 8-layer target too, but name other
    states: only the training record tells (the serving paths refuse it as ``eyas doctor`` does)."""
    target, other = tiny_target(), tiny_target(num_hidden_layers=10)  # the engine sets the target's ids: not shared
    d = Eagle3Draft.for_target(other)
    assert max(d.aux_layer_ids) < target.info.num_layers and d.config.eyas["target"]["num_hidden_layers"] == 10
    with pytest.raises(EyasError, match="trained on a 10-layer target; this one has 8 layers") as e:
        Engine(target, d, SpecConfig("EAGLE3"))
    assert e.value.fix


def test_draft_vocabulary_of_another_tokenizer_is_refused(target):
    d = Eagle3Draft.for_target(tiny_target(vocab_size=400))
    refuse(target, d, SpecConfig("EAGLE3"), match="draft's vocabulary has 400 tokens, the target's 320")


def test_embedding_width_mismatch_is_refused(target):
    d = Eagle3Draft.for_target(target)
    d.embed_tokens = torch.nn.Embedding(320, 48)
    refuse(target, d, SpecConfig("EAGLE3"), match="embedding width")


@pytest.mark.parametrize("corrupt,match", [
    (lambda d2t, t2d: (d2t[:-1], t2d), r"d2t has shape \(99,\)"),
    (lambda d2t, t2d: (d2t, t2d[:-1]), r"t2d has shape \(319,\)"),
    (lambda d2t, t2d: (d2t + 300, t2d), "outside the target vocabulary"),
    (lambda d2t, t2d: (torch.cat([d2t[:1] + 1, d2t[1:]]), t2d), "same target id"),
    (lambda d2t, t2d: (d2t, ~t2d), "disagree"),
])
def test_inconsistent_vocab_maps_are_refused(target, corrupt, match):
    d = Eagle3Draft.for_target(target, draft_vocab_size=100)
    d2t, t2d = corrupt(d.d2t.clone(), d.t2d.clone())
    with pytest.raises(EyasError, match=match):
        check_vocab_maps(d2t, t2d, 100, 320)
    d.d2t, d.t2d = d2t, t2d
    with pytest.raises(EyasError, match=match):
        Engine(target, d, SpecConfig("EAGLE3"))


@pytest.mark.parametrize("steps,topk,tokens,match", [
    (3, 2, 15, "larger than the tree can hold"),  # 2 + 2*4 = 10 draft tokens at most
    (5, 1, 7, "larger than the tree can hold"),  # a chain of 5 holds 5 (+ root)
    (5, 1, 1, "leaves no draft token"),
    (0, 1, 2, "num-steps must be a positive integer"),
    (3, 0, 4, "eagle-topk must be a positive integer"),
])
def test_impossible_trees_are_refused(steps, topk, tokens, match):
    with pytest.raises(EyasError, match=match):
        SpecConfig("EAGLE3", steps, topk, tokens)


def test_tree_capacity_is_exact():
    assert SpecConfig("EAGLE3", 3, 2, 11).max_tree_tokens == 10
    assert SpecConfig("EAGLE3", 5, 4, 8).max_tree_tokens == 4 + 4 * 16


def test_speculation_without_a_draft_is_an_error_never_self_drafting(target):
    refuse(target, None, SpecConfig("EAGLE3"), path=None, match="needs a draft model")


def test_a_draft_under_none_is_an_error(target):
    refuse(target, Eagle3Draft.for_target(target), SpecConfig("NONE"), match="never be used")


@pytest.mark.parametrize("name,what", [("nextn", "multi-token-prediction"), ("MEDUSA", "Medusa heads"), ("x", "")])
def test_another_kind_of_speculation_is_named_when_refused(name, what, capsys):
    from eyas.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--speculative-algorithm", name])
    err = capsys.readouterr().err
    assert f"'{name}'" in err and what in err and "is not an algorithm eyas runs" in err and "use EAGLE3" in err


def test_unknown_algorithm_is_refused():
    with pytest.raises(EyasError, match="NONE, EAGLE, EAGLE3"):
        SpecConfig("MEDUSA")
    assert Algorithm.parse("eagle3") is Algorithm.EAGLE3


@pytest.fixture(scope="module")
def folders(tmp_path_factory, draft):
    root = tmp_path_factory.mktemp("pair")
    save_tiny_model(root / "target")
    draft.save_pretrained(root / "draft")
    return root


def test_build_engine_refuses_eagle_before_loading_weights(folders, monkeypatch):
    import eyas.pipeline as pipeline

    def boom(*a, **k):
        raise AssertionError("the target was loaded before the flag was checked")

    monkeypatch.setattr(pipeline, "load_target", boom)
    with pytest.raises(EyasError, match="EAGLE3"):
        build_engine(EngineArgs(model_path=str(folders / "target"), speculative_algorithm="EAGLE",
                                speculative_draft_model_path=str(folders / "draft")))


def test_build_engine_accepts_the_right_pair(folders):
    e = build_engine(EngineArgs(model_path=str(folders / "target"), speculative_algorithm="EAGLE3",
                                speculative_draft_model_path=str(folders / "draft")))
    assert e.spec.algorithm is Algorithm.EAGLE3 and e.target.aux_layer_ids == [2, 4, 5]


def test_a_chain_shorter_than_its_steps_drafts_only_what_it_verifies(folders, caplog):
    """5 steps, topk 1, 3 draft tokens: the step verifies the chain's first 2 drafted tokens, so the engine
    drafts 2 steps (the same tokens, SGLang's flags kept) and says so."""
    from eyas.sample.sampling import SamplingParams

    flags = dict(model_path=str(folders / "target"), speculative_draft_model_path=str(folders / "draft"),
                 speculative_eagle_topk=1, speculative_num_draft_tokens=3)
    with caplog.at_level("WARNING", logger="eyas"):
        e = build_engine(EngineArgs(**flags, speculative_num_steps=5))
    assert (e.spec.num_steps, e.spec.eagle_topk, e.spec.num_draft_tokens) == (2, 1, 3)
    assert "drafts 2 steps, not 5" in caplog.text and "SGLang" in caplog.text
    wasteful = Engine(e.target, e.draft, SpecConfig("EAGLE3", 5, 1, 3))
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    a, b = e.generate([[5, 6, 7]], params)[0], wasteful.generate([[5, 6, 7]], params)[0]
    assert a.output_ids == b.output_ids and a.stats.as_dict() == b.stats.as_dict()


def test_cli_exits_nonzero_with_the_fix(folders):
    r = subprocess.run([sys.executable, "-m", "eyas", "generate", "--model-path", str(folders / "target"),
                        "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(folders / "draft"),
                        "--max-new-tokens", "4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "fix: use --speculative-algorithm EAGLE3" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_local_target_is_never_taken_as_its_own_draft(folders):
    """SGLang issue 36528: no draft path must never mean 'use the target as the draft'."""
    from eyas.common.draft_registry import builtin_draft

    assert builtin_draft(str(folders / "target")) is None
    e = build_engine(EngineArgs(model_path=str(folders / "target")))
    assert e.spec.algorithm is Algorithm.NONE and e.draft is None
    with pytest.raises(EyasError, match="needs a draft model"):
        build_engine(EngineArgs(model_path=str(folders / "target"), speculative_algorithm="EAGLE3"))


def test_a_topk_wider_than_the_draft_vocabulary_is_refused_not_a_traceback(target):
    small = Eagle3Draft.for_target(target, draft_vocab_size=6)
    refuse(target, small, SpecConfig("EAGLE3", 2, 7, 8), match="eagle-topk 7 is larger than the draft's vocabulary")
    Engine(target, small, SpecConfig("EAGLE3", 2, 6, 8))  # as wide as the vocabulary: fine


@pytest.mark.parametrize("length", [0, -5])
def test_a_context_length_below_one_is_refused_not_ignored(folders, monkeypatch, length):
    import eyas.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_target", lambda *a, **k: pytest.fail("weights loaded before the check"))
    with pytest.raises(EyasError, match=f"--context-length {length} leaves no room") as e:
        build_engine(EngineArgs(model_path=str(folders / "target"), speculative_draft_model_path=str(folders / "draft"),
                                context_length=length))
    assert "positive" in e.value.fix


def test_the_context_length_caps_the_native_path_and_sizes_its_kv_pool(folders):
    """``--context-length`` on the native path (the GPU's): the engine holds that context and its KV pool is
    sized for it, not for the model's own (the cap was dropped where the target moved to the native forward)."""
    engine = build_engine(EngineArgs(model_path=str(folders / "target"), speculative_draft_model_path=str(
        folders / "draft"), context_length=96, engine="native", cuda_graphs=False, max_batch=2), warm_up=False)
    assert engine.max_context == engine.target.info.max_context == 96
    assert engine.target_pool.capacity_slots < 96 + 64  # the context and a tree's slack, not the model's 1,024+
    with pytest.raises(EyasError, match=r"this context length \(96\) holds at most 95"):
        engine.new_sequence(list(range(1, 100)), SamplingParams())


def test_a_context_that_cannot_hold_the_tree_is_refused_before_loading(folders, monkeypatch):
    """Not a 400 on every request blaming the prompt with a negative count (the engine checks it again, for a KV
    pool that holds less than the model takes)."""
    import eyas.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_target", lambda *a, **k: pytest.fail("weights loaded before the check"))
    with pytest.raises(EyasError, match="context of 40 tokens leaves no room .*48 tokens") as e:
        build_engine(EngineArgs(model_path=str(folders / "target"), speculative_draft_model_path=str(folders / "draft"),
                                context_length=40, speculative_num_steps=6, speculative_eagle_topk=8,
                                speculative_num_draft_tokens=48))
    assert "--context-length to at least 50" in e.value.fix


def test_a_narrow_draft_that_ships_its_embeddings_runs_as_the_doctor_says(tmp_path):
    """Draft hidden 32 on a 64-wide target (SGLang's target_hidden_size case), its own 320 x 32 embeddings: the
    doctor calls it ready, so the engine must run it, losslessly."""
    from transformers import LlamaConfig

    from eyas import formats
    from eyas.sample.sampling import SamplingParams

    t = tiny_target(dtype=torch.float32)
    cfg = Eagle3Draft.config_for_target(t).to_dict()
    cfg.update(hidden_size=32, head_dim=8, intermediate_size=64)
    Eagle3Draft(LlamaConfig.from_dict(cfg)).save_pretrained(tmp_path / "narrow", include_embeddings=True)
    d = formats.load_draft(tmp_path / "narrow", embed_weight=t.embed_tokens.weight, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=12)
    out = Engine(t, d, SpecConfig("EAGLE3", 3, 2, 6), draft_path="narrow").generate([[1, 2, 3, 4]], params)
    base = Engine(t, None, SpecConfig("NONE")).generate([[1, 2, 3, 4]], params)
    assert out[0].output_ids == base[0].output_ids


@pytest.mark.parametrize("schedule, flags, named", [
    ("1:5,1,6;8:3,1,4", ["--speculative-num-steps", "3"], "--speculative-num-steps"),
    ("auto", ["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16"],
     "--speculative-eagle-topk, --speculative-num-draft-tokens"),
    ("1:5,1,6", ["--speculative-config", '{"num_speculative_tokens": 3}'], "--speculative-config"),
])
def test_a_tree_given_beside_a_batch_schedule_is_refused_not_ignored(schedule, flags, named):
    """The schedule sets the tree for every batch size; the tree flags were dropped without a word."""
    from eyas.cli import build_parser
    from eyas.pipeline import engine_args_from

    args = build_parser().parse_args(["generate", "--speculative-batch-schedule", schedule, *flags])
    with pytest.raises(EyasError, match="would be ignored") as e:
        engine_args_from(args)
    assert named in str(e.value) and "--speculative-batch-schedule" in e.value.fix
    assert engine_args_from(build_parser().parse_args(["generate", "--speculative-batch-schedule", schedule]))
