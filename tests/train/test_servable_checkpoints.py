"""Every checkpoint folder is a servable draft: eyas export, the engine (what eyas serve runs) and eyas eval
take RUN/checkpoints/step-N as they take RUN/draft; older checkpoints still resume and are explained."""

import json
import shutil

import pytest
import torch
from helpers import reference_greedy, save_tiny_model
from safetensors.torch import load_file
from train_fixtures import make_data, tiny_recipe

from eyas import formats
from eyas.cli import main
from eyas.formats import names as format_names
from eyas.models.loading import load_target
from eyas.pipeline import EngineArgs, build_engine
from eyas.sample.sampling import SamplingParams
from eyas.train.trainer import Trainer

SETS = {"train.max_steps": 60, "log.checkpoint_every": 30, "log.keep_checkpoints": 3}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 60-step run: checkpoints/step-30 (intermediate), step-60 and draft/."""
    root = tmp_path_factory.mktemp("servable")
    model = save_tiny_model(root / "target")
    target = load_target(str(model), "cpu", "float32")
    data = make_data(target, root / "data", rows=48)
    Trainer(tiny_recipe(data, root / "run", target=str(model), **SETS), target=target).fit()
    return root / "run", model, data, target


def test_a_checkpoint_holds_the_draft_as_the_final_folder_does(run):
    folder, _, _, _ = run
    step = folder / "checkpoints" / "step-60"
    assert {p.name for p in step.iterdir()} == {"config.json", "model.safetensors", "state.pt", "checkpoint.json"}
    assert formats.detect_format(step) == format_names.EYAS
    saved, final = formats.read_draft(step), formats.read_draft(folder / "draft")  # the recipe saves float32
    assert saved.config.to_dict() == final.config.to_dict()
    assert saved.state.keys() == final.state.keys() and "embed_tokens.weight" not in saved.state
    for k, v in final.state.items():
        assert torch.equal(saved.state[k], v), k


def test_export_takes_an_intermediate_checkpoint(run, tmp_path, capsys):
    step = run[0] / "checkpoints" / "step-30"
    for fmt in ("speculators", "sglang"):
        assert main(["export", str(step), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
        assert f"exported an eyas EAGLE-3 draft from {step}" in capsys.readouterr().out
        back, source = formats.read_draft(tmp_path / fmt), formats.read_draft(step)
        assert back.format == fmt
        for k, v in source.state.items():
            assert torch.equal(back.state[k], v), (fmt, k)


def test_the_engine_generates_losslessly_with_an_intermediate_checkpoint(run):
    folder, model, _, _ = run
    engine = build_engine(EngineArgs(model_path=str(model),
                                     speculative_draft_model_path=str(folder / "checkpoints/step-30"),
                                     speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                                     device="cpu", dtype="float32"))
    prompts = [[256, 72, 101, 108, 108, 111], [256, 40, 41, 42]]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.output_ids == reference_greedy(engine.target.model, prompt, 12)
    assert sum(o.stats.accepted for o in outs) > 0  # the checkpoint's draft is really used


def test_eval_measures_an_intermediate_checkpoint(run, tmp_path):
    folder, model, _, _ = run
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"hello {i}"}) for i in range(2)) + "\n")
    out = tmp_path / "eval.json"
    assert main(["eval", "--model-path", str(model), "--speculative-draft-model-path",
                 str(folder / "checkpoints" / "step-30"), "--prompts", str(prompts), "--max-new-tokens", "12",
                 "--baseline", "--json-out", str(out), "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "6"]) == 0
    res = json.loads(out.read_text())
    assert res["greedy_identical"] is True and res["accept_length"] > 1.0


def test_a_checkpoint_of_the_previous_format_still_resumes_and_is_explained(run, tmp_path, capsys):
    """Format 2 kept the draft inside state.pt and wrote no draft folder: it resumes; loaders say what it is."""
    folder, model, data, target = run
    step = tmp_path / "run" / "checkpoints" / "step-30"
    shutil.copytree(folder / "checkpoints" / "step-30", step)
    state = torch.load(step / "state.pt", weights_only=True)
    state["draft"] = {**load_file(step / "model.safetensors"),
                      "embed_tokens.weight": target.embed_tokens.weight.detach().float().clone()}
    torch.save(state, step / "state.pt")
    meta = json.loads((step / "checkpoint.json").read_text())
    (step / "checkpoint.json").write_text(json.dumps({**meta, "format": 2}))
    (step / "model.safetensors").unlink()
    (step / "config.json").unlink()
    t = Trainer(tiny_recipe(data, tmp_path / "run", target=str(model), **SETS), target=target)
    t.resume(step)
    assert t.step == 30
    for k, v in load_file(folder / "checkpoints" / "step-30" / "model.safetensors").items():
        assert torch.equal(t.draft.state_dict()[k], v), k
    assert main(["export", str(step), "--format", "sglang", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "training checkpoint of an older eyas" in err and "eyas train --resume RUN" in err
    assert main(["export", str(folder), "--format", "sglang", "--out", str(tmp_path / "y")]) == 2
    assert f"pass {folder / 'draft'}" in capsys.readouterr().err


def test_a_truncated_draft_in_a_checkpoint_falls_back_to_the_previous_one(run, tmp_path):
    folder, model, data, target = run
    shutil.copytree(folder, tmp_path / "run")
    weights = tmp_path / "run" / "checkpoints" / "step-60" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    messages = []
    t = Trainer(tiny_recipe(data, tmp_path / "run", target=str(model), **SETS), target=target, log=messages.append)
    t.resume(tmp_path / "run")
    assert t.step == 30
    assert any("step-60" in m and "model.safetensors is truncated" in m for m in messages), messages


def test_a_checkpoint_records_its_training_for_the_doctor(tmp_path):
    """The doctor found draft/'s training length and template through RUN/recipe.yaml, but a
    checkpoints/step-N (two folders down) recorded neither: its context and template checks said
    'not recorded' and missed what they exist to catch. The saved config carries them now."""
    from eyas.common.training_record import read_record, template_sha

    model = save_tiny_model(tmp_path / "target")
    target = load_target(str(model), "cpu", "float32")
    data = make_data(target, tmp_path / "data", rows=16)
    sha = template_sha(target.tokenizer.chat_template)  # the data's template must be the target's (data_meta)
    (data / "meta.json").write_text(json.dumps({"max_length": 48, "chat": {"template_sha256_16": sha,
                                                                           "thinking": None}}))
    sets = {"train.max_steps": 2, "log.checkpoint_every": 1}
    Trainer(tiny_recipe(data, tmp_path / "run", target=str(model), **sets), target=target).fit()
    for folder in (tmp_path / "run" / "checkpoints" / "step-1", tmp_path / "run" / "draft"):
        rec = read_record(folder, formats.read_draft(folder).config)
        assert (rec.max_length, rec.template_sha) == (48, sha), folder
