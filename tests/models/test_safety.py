"""Pickle checkpoints are refused without being opened; --allow-pickle reads them safely."""

import pickle

import pytest
import torch
from helpers import save_tiny_model

from eyas import formats
from eyas.errors import EyasError
from eyas.models.draft import Eagle3Draft
from eyas.models.loading import load_target


class Payload:
    """Unpickling this writes a marker file: proof that a loader executed pickle code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_evil_pickle(path, marker):
    with open(path, "wb") as f:
        pickle.dump({"fc.weight": Payload(str(marker))}, f)


def test_a_pickle_draft_is_refused_without_being_unpickled(tmp_path, draft):
    folder = tmp_path / "draft"
    draft.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    write_evil_pickle(folder / "pytorch_model.bin", marker)
    with pytest.raises(EyasError, match="pickle checkpoint") as e:
        formats.load_draft(folder, embed_weight=torch.zeros(320, 64))
    assert "--allow-pickle" in e.value.fix and "safetensors" in e.value.fix
    assert not marker.exists()
    # Even when allowed, torch.load(weights_only=True) refuses to run the payload.
    with pytest.raises(EyasError, match="holds objects other than tensors .*, so it was not loaded") as e:
        formats.load_draft(folder, embed_weight=torch.zeros(320, 64), allow_pickle=True)
    assert not marker.exists()
    assert "weights_only=False" not in str(e.value).split("fix:")[0]  # never torch's advice to run it anyway


def test_a_pickle_target_is_refused_without_being_unpickled(tmp_path):
    folder = save_tiny_model(tmp_path / "target")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    write_evil_pickle(folder / "pytorch_model.bin", marker)
    with pytest.raises(EyasError, match="pytorch_model.bin is a pickle checkpoint"):
        load_target(str(folder))
    assert not marker.exists()
    # allowed, transformers' own torch.load (weights_only) refuses it: said as for a draft, not a traceback
    with pytest.raises(EyasError, match="pytorch_model.bin holds objects other than tensors .*, so it was not "
                                        "loaded") as e:
        load_target(str(folder), allow_pickle=True)
    assert not marker.exists() and "weights_only=False" not in str(e.value).split("fix:")[0]
    (folder / "pytorch_model.bin").write_bytes(b"damaged\n")
    with pytest.raises(EyasError, match=r"holds objects other than tensors and plain values \(or is damaged\)"):
        load_target(str(folder), allow_pickle=True)


def test_a_trusted_pickle_draft_loads_with_allow_pickle(tmp_path, draft):
    folder = tmp_path / "draft"
    draft.save_pretrained(folder)
    state = {k: v for k, v in draft.state_for_save().items()}
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    loaded = formats.load_draft(folder, embed_weight=draft.embed_tokens.weight, allow_pickle=True)
    assert torch.equal(loaded.fc.weight, draft.fc.weight)


def test_truncated_target_weights_get_a_specific_message(tmp_path):
    folder = save_tiny_model(tmp_path / "target")
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(EyasError, match="truncated or not a safetensors file") as e:
        load_target(str(folder))
    assert "again" in e.value.fix


def test_misshaped_target_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_tiny_model(tmp_path / "target")
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(7, 64)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EyasError, match=r"k_proj.weight in model.safetensors has shape \(7, 64\), but config.json "
                                        r"implies \(32, 64\)"):
        load_target(str(folder))


def test_integer_data_where_floats_belong_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_tiny_model(tmp_path / "target")
    state = load_file(str(folder / "model.safetensors"))
    state["model.norm.weight"] = torch.zeros(64, dtype=torch.int32)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EyasError, match="stored as I32"):
        load_target(str(folder))


def test_a_target_missing_a_weight_is_refused_not_filled_with_random_values(tmp_path):
    """transformers initialises a tensor absent from the checkpoint at random and loads on: the target would
    generate garbage (and no draft would be accepted), silently."""
    from safetensors.torch import load_file, save_file

    folder = save_tiny_model(tmp_path / "target")
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.3.mlp.up_proj.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EyasError, match=r"lacks 1 weight.*model\.layers\.3\.mlp\.up_proj\.weight") as e:
        load_target(str(folder))
    assert "random" in str(e.value) and "again" in e.value.fix


@pytest.mark.parametrize("make,why", [
    (lambda f: f.symlink_to(f.name), "is a symbolic link that loops back on itself"),
    (lambda f: f.symlink_to("elsewhere.safetensors"),
     "is a symbolic link to elsewhere.safetensors, which does not exist"),
    (lambda f: f.mkdir(), "is a directory; a file was expected there"),
])
def test_weight_files_that_are_not_files_are_named(tmp_path, draft, make, why):
    target = save_tiny_model(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    for folder, load in ((target, lambda: load_target(str(target))),
                         (tmp_path / "draft", lambda: formats.load_draft(tmp_path / "draft", embed_weight=None))):
        f = folder / "model.safetensors"
        f.unlink()
        make(f)
        with pytest.raises(EyasError, match=f"weight file {f} {why}") as e:
            load()
        assert "replace" in e.value.fix


def test_a_config_that_links_to_itself_is_named(tmp_path):
    folder = save_tiny_model(tmp_path / "target")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("config.json")
    with pytest.raises(EyasError, match="config.json is a symbolic link that loops back on itself"):
        load_target(str(folder))


def remote_code_folder(tmp_path, marker, where="config"):
    """A target folder whose config.json (or tokenizer_config.json) asks for code shipped beside it."""
    import json

    folder = save_tiny_model(tmp_path / "target")
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    name = "config.json" if where == "config" else "tokenizer_config.json"
    data = json.loads((folder / name).read_text())
    if where == "config":
        data.update(model_type="evilmodel", auto_map={"AutoConfig": "evil.EvilConfig",
                                                      "AutoModelForCausalLM": "evil.EvilModel"})
    else:
        data.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (folder / name).write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_code_shipped_in_a_target_folder_is_refused_naming_the_flag(tmp_path, where):
    from eyas.cli import main
    from eyas.doctor.static import diagnose

    marker = tmp_path / "pwned"
    folder = remote_code_folder(tmp_path, marker, where)
    with pytest.raises(EyasError, match="needs Python code shipped inside the folder") as e:
        load_target(str(folder))
    assert "--trust-remote-code" in e.value.fix
    draft = tmp_path / "draft"
    from helpers import tiny_target

    Eagle3Draft.for_target(tiny_target()).save_pretrained(draft)
    report = diagnose(draft, str(folder))
    target_row = next(c for c in report.checks if c.name == "target")
    assert target_row.status == "problem" and "--trust-remote-code" in target_row.fix
    assert main(["prepare", "--model-path", str(folder), "--out", str(tmp_path / "data"), "--source", "pydoc",
                 "--limit", "2"]) == 2
    assert not marker.exists()


def test_a_pickle_named_by_an_index_is_refused_whatever_its_name(tmp_path):
    """A sharded checkpoint's index may name any file: transformers torch.loads one that is not safetensors, so
    'weights.dat' loaded without --allow-pickle (only *.bin/*.pt/*.pth were looked for)."""
    import json

    from safetensors.torch import load_file

    folder = save_tiny_model(tmp_path / "target")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "weights.dat")
    index = {"metadata": {"total_size": 0}, "weight_map": dict.fromkeys(state, "weights.dat")}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    with pytest.raises(EyasError, match="weights.dat is a pickle checkpoint"):
        load_target(str(folder))
    assert load_target(str(folder), allow_pickle=True).info.num_layers > 0  # trusted: tensors only, as any pickle


def test_the_conversion_a_refusal_names_gives_a_target_that_loads(tmp_path):
    import shlex
    import subprocess
    import sys

    from safetensors.torch import load_file

    folder = save_tiny_model(tmp_path / "target")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(EyasError) as e:
        load_target(str(folder))
    command = e.value.fix.split("(", 1)[1].rsplit(") or", 1)[0]  # python -c "..."
    subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True)
    (folder / "pytorch_model.bin").unlink()
    assert load_target(str(folder)).info.num_layers > 0
