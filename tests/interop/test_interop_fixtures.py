"""Hand-written folders of every format load, pass the checks and generate losslessly."""

from __future__ import annotations

import pytest
import torch
from helpers import reference_greedy, save_tiny_model
from interop_helpers import DRAFT_VOCAB, WRITERS, sglang_tensors

from eyas import formats
from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.formats import names as format_names
from eyas.models.draft import Eagle3Draft
from eyas.sample.sampling import SamplingParams

PROMPTS = [[72, 101, 108, 108, 111], [256, 87, 104, 97, 116, 32]]
NEW = 10

# format -> (what detect_format says, captured layers in eyas's convention)
EXPECTED = {
    "sglang": (format_names.SGLANG, [2, 4, 5]),  # SpecForge's [1, 3, 4] + 1
    "speculators": (format_names.SPECULATORS, [1, 4, 6]),  # used as is
    "eagle3": (format_names.OFFICIAL, None),  # none written: the target's default [2, 4, 5]
}


@pytest.fixture(scope="module")
def fixture_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    dirs = {name: write(root / name) for name, write in WRITERS.items()}
    eyas_draft = Eagle3Draft(formats.read_config(dirs["sglang"]))  # eyas's own format: save_pretrained
    eyas_draft.load_state_dict({**sglang_tensors(seed=3), "embed_tokens.weight": torch.zeros(320, 64)})
    eyas_draft.config.eyas = {"target": {"name": "tiny-llama"}}
    dirs["eyas"] = eyas_draft.save_pretrained(root / "eyas")
    return dirs


@pytest.fixture(scope="module")
def references(target):
    return [reference_greedy(target.model, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("name", ["sglang", "speculators", "eagle3"])
def test_fixture_detected_and_read(fixture_dirs, name):
    fmt, ids = EXPECTED[name]
    assert formats.detect_format(fixture_dirs[name]) == fmt
    folder = formats.read_draft(fixture_dirs[name])
    assert folder.aux_layer_ids == ids
    assert int(folder.config.draft_vocab_size) == DRAFT_VOCAB
    assert not any(k.startswith(("model.", "layers.")) for k in folder.state)
    if name == "eagle3":  # legacy rope_theta is honoured, not replaced by the default
        assert folder.config.rope_parameters["rope_theta"] == 500000.0


def test_specforge_full_vocabulary_folder(target, tmp_path):
    """SpecForge saves its frozen embeddings and no d2t/t2d when the draft keeps the full vocabulary."""
    tensors = sglang_tensors(draft_vocab=320)
    del tensors["d2t"], tensors["t2d"]
    tensors["embed_tokens.weight"] = target.embed_tokens.weight.detach().float()
    path = WRITERS["sglang"](tmp_path / "specforge", tensors, draft_vocab_size=320)
    draft = formats.load_draft(path, dtype=target.dtype)  # no target embedding needed: it ships its own
    assert torch.equal(draft.d2t, torch.zeros(320, dtype=torch.long)) and bool(draft.t2d.all())
    try:
        Engine(target, draft, SpecConfig("EAGLE3", 3, 1, 4))  # passes every pair check
    finally:
        target.set_aux_layers(None)


@pytest.mark.parametrize("name", ["eyas", "sglang", "speculators", "eagle3"])
def test_fixture_generates_losslessly(target, fixture_dirs, references, name):
    draft = formats.load_draft(fixture_dirs[name], embed_weight=target.embed_tokens.weight, dtype=target.dtype)
    assert draft.source_format == (format_names.EYAS if name == "eyas" else EXPECTED[name][0])
    try:
        engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 5))  # runs every misconfiguration check
        outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, temperature=0.0, ignore_eos=True))
    finally:
        target.set_aux_layers(None)  # the session target is shared: restore its default capture
    assert [out.output_ids for out in outs] == references


def test_build_engine_accepts_every_format(tmp_path, fixture_dirs):
    """serve/generate load drafts through the pipeline, which now reads any format."""
    from eyas.pipeline import EngineArgs, build_engine

    model_dir = save_tiny_model(tmp_path / "target")
    reference = None
    for name in ("speculators", "eagle3"):  # eyas/SGLang folders went through this path before
        engine = build_engine(EngineArgs(model_path=str(model_dir),
                                         speculative_draft_model_path=str(fixture_dirs[name]),
                                         speculative_num_steps=3, speculative_eagle_topk=1,
                                         speculative_num_draft_tokens=4))
        assert engine.target.aux_layer_ids == (EXPECTED[name][1] or [2, 4, 5])
        out = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True))[0]
        reference = reference or reference_greedy(engine.target.model, PROMPTS[0], 6)
        assert out.output_ids == reference


@pytest.mark.parametrize("name", ["eyas", "sglang", "speculators", "eagle3"])
def test_eagle_flag_refused_for_every_format_before_loading(fixture_dirs, monkeypatch, name):
    """The silent failure (EAGLE with an EAGLE-3 draft) is refused whatever the draft's format."""
    import eyas.pipeline as pipeline
    from eyas.errors import EyasError

    def boom(*a, **k):
        raise AssertionError("the target was loaded before the flag was checked")

    monkeypatch.setattr(pipeline, "load_target", boom)
    with pytest.raises(EyasError, match="use --speculative-algorithm EAGLE3"):
        pipeline.build_engine(pipeline.EngineArgs(model_path="unused", speculative_algorithm="EAGLE",
                                                  speculative_draft_model_path=str(fixture_dirs[name])))


def test_vllms_architecture_name_reads_as_sglangs(tmp_path):
    """vLLM registers ``Eagle3LlamaForCausalLM`` beside SGLang's ``LlamaForCausalLMEagle3`` for one loader: a folder
    written for vLLM under that name is the same draft (once refused as "no EAGLE-3 draft layout eyas knows")."""
    from interop_helpers import write_sglang_fixture

    sgl = write_sglang_fixture(tmp_path / "sgl")
    vllm = write_sglang_fixture(tmp_path / "vllm", architectures=["Eagle3LlamaForCausalLM"])
    assert formats.detect_format(vllm) == format_names.SGLANG
    a, b = formats.read_draft(sgl), formats.read_draft(vllm)
    assert a.state.keys() == b.state.keys() and all(torch.equal(a.state[k], b.state[k]) for k in a.state)
