"""Draft vocabulary round trip, recipe overrides, and the early, clear refusals of bad input."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe

from eyas.errors import EyasError
from eyas.formats import load_draft
from eyas.models.vocab import build_vocab, draft_to_target, target_to_draft
from eyas.train.recipe import load_recipe
from eyas.train.trainer import Trainer


def test_vocab_round_trip_draft_target_draft(tmp_path):
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 1000, (320,), generator=gen)
    d2t, t2d = build_vocab(counts, 100)
    draft_ids = torch.arange(100)
    target_ids = draft_to_target(d2t, draft_ids)
    assert torch.equal(target_to_draft(t2d)[target_ids], draft_ids)
    top = set(torch.sort(-counts, stable=True).indices[:100].tolist())
    assert set(target_ids.tolist()) == top  # the most frequent tokens, nothing else
    # and through a saved draft trained by eyas
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=16)
    recipe = tiny_recipe(data, tmp_path / "run", **{"draft.vocab_size": 64, "train.max_steps": 1})
    trainer = Trainer(recipe, target=target)
    trainer.fit()
    loaded = load_draft(tmp_path / "run" / "draft", embed_weight=target.embed_tokens.weight)
    ids = draft_to_target(loaded.d2t, torch.arange(64))
    assert torch.equal(target_to_draft(loaded.t2d)[ids], torch.arange(64))
    counts = np.load(data / "vocab_counts.npy")
    assert counts[ids.numpy()].min() >= np.sort(counts)[-64]


def test_recipe_overrides_and_errors(tmp_path):
    r = load_recipe(None, ["optim.lr=3e-4", "train.ttt_steps=5", "optim.betas=[0.9, 0.99]", "data.path=x"])
    assert r.optim.lr == 3e-4 and r.train.ttt_steps == 5 and r.optim.betas == (0.9, 0.99)
    f = tmp_path / "r.yaml"
    r.dump(f)
    assert load_recipe(f).to_dict() == r.to_dict()
    with pytest.raises(EyasError, match="unknown recipe key optim.lrr"):
        load_recipe(None, ["optim.lrr=1"])
    with pytest.raises(EyasError, match="train.mode"):
        load_recipe(None, ["train.mode=sideways", "data.path=x"]).validate()
    with pytest.raises(EyasError, match="data.path is empty"):
        load_recipe(None).validate()


def test_bad_input_stops_early(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=16)
    with pytest.raises(EyasError, match="exceeds the target's context"):
        Trainer(tiny_recipe(data, tmp_path / "r1", **{"data.max_length": 4096, "data.tokens_per_batch": 8192}),
                target=target)
    # the recipe's default 2048 past a 1024-token target is fine when eyas prepare cut the rows to its context
    (data / "meta.json").write_text(json.dumps({"max_length": 1024}))
    trainer = Trainer(tiny_recipe(data, tmp_path / "r2", **{"data.max_length": 2048, "data.tokens_per_batch": 4096}),
                      target=target)
    assert trainer.draft.config.eyas["training"]["max_length"] == 1024
    empty = tmp_path / "empty"
    empty.mkdir()
    np.save(empty / "train.offsets.npy", np.zeros(1, dtype=np.int64))
    np.save(empty / "train.tokens.npy", np.zeros(0, dtype=np.int32))
    np.save(empty / "train.mask.npy", np.zeros(0, dtype=np.uint8))
    with pytest.raises(EyasError, match="empty"):
        Trainer(tiny_recipe(empty, tmp_path / "r2"), target=target)
    other = tiny_target(dtype=torch.float32, vocab_size=400)  # a target with another vocabulary
    with pytest.raises(EyasError, match="another target"):
        Trainer(tiny_recipe(data, tmp_path / "r3"), target=other)


@pytest.mark.parametrize("ids, why", [("[1, 2]", "lists 2 layer id"), ("[1, 2, 3, 4]", "lists 4 layer id"),
                                      ("[1, 2, 8]", r"names layer\(s\) \[8\] outside 0..7")])
def test_aux_layer_ids_must_be_three_layers_of_the_target(tmp_path, ids, why):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=8, new=12)
    with pytest.raises(EyasError, match=why) as e:
        Trainer(tiny_recipe(data, tmp_path / "r", **{"draft.aux_layer_ids": ids}), target=target)
    assert "the target has 8 decoder layers" in e.value.problem and "three distinct ids in 0..7" in e.value.fix


def test_data_prepared_for_another_model_of_the_same_shapes_is_refused(tmp_path):
    """A fine-tune, a base model or a sibling of another depth shares the vocabulary and width: the data's depth and
    chat template are compared too (a draft trained on it learns another model's prompts and answers)."""
    from eyas.common.training_record import template_sha

    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=16)
    info = target.info
    shapes = {"name": "other", "vocab_size": info.vocab_size, "hidden_size": info.hidden_size}
    here = template_sha(target.tokenizer.chat_template)
    cases = [({"target": {**shapes, "num_layers": info.num_layers + 2}, "chat": {"template_sha256_16": here}},
              f"num_layers {info.num_layers + 2}.*num_layers {info.num_layers}"),
             ({"target": {**shapes, "num_layers": info.num_layers}, "chat": {"template_sha256_16": "0" * 16},
               "regeneration": {"enabled": True}}, "another chat template.*answers written by that model")]
    for i, (meta, match) in enumerate(cases):
        (data / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(EyasError, match=match) as err:
            Trainer(tiny_recipe(data, tmp_path / f"r{i}"), target=target)
        assert "eyas prepare --model" in err.value.fix
    (data / "meta.json").write_text('{"target": {"name"')  # a preparation cut short
    with pytest.raises(EyasError, match="meta.json is not valid JSON"):
        Trainer(tiny_recipe(data, tmp_path / "r9"), target=target)
    (data / "meta.json").write_text(json.dumps({"target": {**shapes, "num_layers": info.num_layers},
                                                "chat": {"template_sha256_16": here}}))
    Trainer(tiny_recipe(data, tmp_path / "ok"), target=target)  # the same model under another name


@pytest.mark.parametrize("override, match", [
    ("optim.lr=abc", "optim.lr = 'abc' is not a number"),
    ("optim.lr=[1", "'\\[1' is not a YAML value"),  # once a yaml traceback
    ("log.run_name=@v9", "'@v9' is not a YAML value"),
    ("train.seed=1.5", "train.seed = 1.5 is not an integer"),
    ("optim.betas=[0.9]", "optim.betas .* is not two numbers"),
    ("draft.aux_layer_ids=[1, x]", "draft.aux_layer_ids .* is not a list of integers"),
    ("train.max_steps=-5", "train.max_steps = -5 is invalid"),
    ("log.every=0", "log.every = 0 is invalid"),
    ("data.eval_rows=-1", "data.eval_rows = -1 is invalid"),
    ("log.checkpoint_every=-1", "log.checkpoint_every = -1 is invalid"),
    ("optim.betas=[0.9, 1.5]", "optim.betas = \\[0.9, 1.5\\] is invalid"),
    ("train.epochs=-1", "train.epochs = -1.0 is invalid"),
    ("train.autocast=fp16", "train.autocast = 'fp16' is invalid"),  # any other word turned bf16 autocast on
    ("draft.save_dtype=int8", "draft.save_dtype = 'int8' is invalid"),  # refused only after training
    ("train.target_dtype=fp64x", "train.target_dtype = 'fp64x' is invalid"),
    ("train.device=tpu", "train.device = 'tpu' is invalid"),
    # eyas refuses to load a draft whose captured ids repeat: found out only after the training
    ("draft.aux_layer_ids=[2, 2, 4]", "draft.aux_layer_ids = \\[2, 2, 4\\] is invalid"),
    ("draft.aux_layer_ids=[]", "draft.aux_layer_ids = \\[\\] is invalid"),
])
def test_recipe_wrong_types_and_ranges_are_refused(override, match):
    """A mistyped or negative value is an error naming the key, not a traceback, a 0-step run or a
    silently reinterpreted value (eval_rows=-1 scored all rows but one)."""
    with pytest.raises(EyasError, match=match):
        load_recipe(None, [override, "data.path=x"]).validate()
    r = load_recipe(None, ["train.max_steps=1e3", "log.run_name=2024", "log.trackers=tensorboard", "data.path=x"])
    assert r.validate().train.max_steps == 1000 and r.log.run_name == "2024"


def test_recipe_files_yaml_reads_oddly_or_not_at_all(tmp_path):
    """`lr: 1e-3` in a file is a string to YAML 1.1 and died in a TypeError traceback; a file that is a
    YAML list died in an AttributeError, one that is not UTF-8 in a UnicodeDecodeError."""
    f = tmp_path / "r.yaml"
    f.write_text("data:\n  path: x\noptim:\n  lr: 1e-3\ntrain:\n  max_steps: 1e2\n")
    r = load_recipe(f).validate()
    assert r.optim.lr == 1e-3 and r.train.max_steps == 100
    f.write_text("- a\n")
    with pytest.raises(EyasError, match="is a YAML list, not a mapping"):
        load_recipe(f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(EyasError, match="is not valid YAML"):
        load_recipe(f)


def test_a_gpu_this_machine_lacks_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    """train.device=cuda on a CPU-only PyTorch died in an AttributeError traceback (torch._C has no
    _cuda_setDevice)."""
    import eyas.models.loading as loading
    from eyas.cli import main

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded first"))
    assert main(["train", "--data", str(tmp_path), "--output", str(tmp_path / "run"),
                 "--set", "train.device=cuda:99"]) == 2
    err = capsys.readouterr().err
    assert "train.device cuda:99" in err and "Traceback" not in err


def test_print_recipe_checks_the_values_as_a_run_does(capsys):
    from eyas.cli import main

    assert main(["train", "--print-recipe", "--set", "train.max_steps=-1"]) == 2
    captured = capsys.readouterr()
    assert "recipe key train.max_steps = -1 is invalid" in captured.err and not captured.out.strip()
    assert main(["train", "--print-recipe", "--data", "d", "--set", "train.max_steps=5"]) == 0
    assert "max_steps: 5" in capsys.readouterr().out
    assert main(["train", "--print-recipe"]) == 0  # the defaults, to start a recipe from: data.path may be empty
    assert "data.path is empty" in capsys.readouterr().err


def test_path_and_name_flags_are_taken_as_given_not_as_yaml(capsys):
    """--output 2024.10 is not the number 2024.1, 'runs/a #2' is not 'runs/a' (a YAML comment), 'on' is not
    true: the path and name flags reach the recipe as the text they are."""
    from eyas.cli import main

    for flag, value, key in (("--output", "2024.10", "output"), ("--output", "runs/a #2", "output"),
                             ("--model-path", "models/m #2", "target"), ("--run-name", "on", "run_name"),
                             ("--run-name", "1e3", "run_name"), ("--data", "0017", "path")):
        assert main(["train", "--print-recipe", "--data", "d", *([flag, value] if flag != "--data" else
                                                                  ["--data", value])]) == 0, (flag, value)
        out = capsys.readouterr().out
        assert f"{key}: {value}" in out or f"{key}: '{value}'" in out, (flag, value, out)


@pytest.mark.parametrize("shortcut,override,key", [
    (["--data", "A"], "data.path=B", "data.path"),
    (["--data", "A"], "data={path: B}", "data.path"),
    (["--output", "A"], "output=B", "output"),
    (["--model", "A"], "target=B", "target"),
    (["--model-path", "A"], "target=B", "target"),
    (["--run-name", "A"], "log.run_name=B", "log.run_name"),
    (["--report-to", "wandb"], "log.tensorboard=true", "log.tensorboard"),
])
def test_a_shortcut_and_a_set_of_the_same_key_are_refused(capsys, shortcut, override, key):
    from eyas.cli import main

    assert main(["train", "--print-recipe", *shortcut, "--set", override]) == 2
    err = capsys.readouterr().err
    assert f"{shortcut[0].replace('-path', '')}" in err and f"--set {override}" in err, err
    assert f"both set the recipe's {key}" in err and "fix: keep one of them" in err, err


def test_a_shortcut_beside_a_set_of_other_keys_is_fine(capsys):
    from eyas.cli import main

    assert main(["train", "--print-recipe", "--data", "A", "--set", "data={max_length: 512}"]) == 0
    out = capsys.readouterr().out
    assert "path: A" in out and "max_length: 512" in out


def test_eval_rows_0_turns_the_held_out_evaluation_off(tmp_path):
    """data.eval_rows: 0 passes the recipe's check ('0 or more held-out rows') but died at the first
    evaluation in a ValueError traceback (the mean length of no rows is NaN)."""
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=16)
    recipe = tiny_recipe(data, tmp_path / "run", **{"data.eval_rows": 0, "log.eval_every": 1, "train.max_steps": 2})
    summary = Trainer(recipe, target=target).fit()
    assert summary["steps"] == 2 and summary["heldout"] is None
    assert '"event": "eval"' not in (tmp_path / "run" / "log.jsonl").read_text()


def test_no_held_out_rows_with_an_evaluation_asked_for_is_said(tmp_path):
    """A small set at --held-out 0.02 rounds to no held-out row: log.eval_every then evaluates nothing, and says so."""
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=7)  # 7 // 8 = 0 held-out rows
    said = []
    Trainer(tiny_recipe(data, tmp_path / "r", **{"log.eval_every": 5}), target=target, log=said.append)
    assert any("holds no held-out rows, so log.eval_every 5 evaluates nothing" in m for m in said)
