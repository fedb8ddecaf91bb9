"""Exports and checks of drafts as released: pickle weights (the flag the refusal names) and other widths."""

from __future__ import annotations

import json

from interop_helpers import write_official_fixture

from eyas.cli import main


def test_export_of_an_official_pickle_release_takes_the_flag_its_refusal_names(tmp_path, capsys):
    src = write_official_fixture(tmp_path / "official", weights="pytorch_model.bin")
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "a")]) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "b"), "--allow-pickle"]) == 0
    assert (tmp_path / "b" / "model.safetensors").is_file()


def test_doctor_on_an_official_pickle_release_takes_the_flag_its_refusal_names(tmp_path, capsys):
    from helpers import save_tiny_model

    target = save_tiny_model(tmp_path / "target")
    src = write_official_fixture(tmp_path / "official", weights="pytorch_model.bin")
    base = ["doctor", "--draft", str(src), "--target", str(target), "--json"]
    assert main(base) == 1
    fmt = json.loads(capsys.readouterr().out)["checks"][0]
    assert fmt["name"] == "format" and "--allow-pickle" in fmt["fix"]
    main(base + ["--allow-pickle"])
    report = json.loads(capsys.readouterr().out)
    assert report["checks"][0]["status"] == "ok" and report["figures"]["format"] == "eagle3"


def test_a_draft_narrower_than_its_target_exports_with_its_embeddings(tmp_path, capsys):
    """SGLang does not share the target's embeddings with a draft of another width: the export must keep them."""
    import torch
    from helpers import tiny_target
    from safetensors import safe_open
    from transformers import LlamaConfig

    from eyas import formats
    from eyas.models.draft import Eagle3Draft

    t = tiny_target(dtype=torch.float32)
    cfg = Eagle3Draft.config_for_target(t).to_dict()
    cfg.update(hidden_size=32, head_dim=8, intermediate_size=64)
    Eagle3Draft(LlamaConfig.from_dict(cfg)).save_pretrained(tmp_path / "narrow", include_embeddings=True)
    for fmt in ("sglang", "speculators"):
        out = tmp_path / fmt
        assert main(["export", str(tmp_path / "narrow"), "--format", fmt, "--out", str(out)]) == 0
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            assert tuple(f.get_slice("embed_tokens.weight").get_shape()) == (320, 32)
        formats.load_draft(out, embed_weight=t.embed_tokens.weight)  # and it loads back


def test_a_cast_that_overflows_is_refused_not_written(tmp_path, capsys):
    import torch
    from interop_helpers import sglang_tensors, write_sglang_fixture

    tensors = sglang_tensors()
    tensors["fc.weight"][0, 0] = 1e6  # fine in bfloat16 (float32's range), infinite in float16
    src = write_sglang_fixture(tmp_path / "draft", tensors)
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "a"), "--dtype", "float16"]) == 2
    assert "fc.weight holds values beyond float16's range" in capsys.readouterr().err
    assert not (tmp_path / "a" / "model.safetensors").exists()
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "b"), "--dtype", "bfloat16"]) == 0
    assert torch.isfinite(torch.tensor(1e6, dtype=torch.bfloat16))


def test_export_checks_a_target_folder_against_the_draft(tmp_path, capsys):
    """--target names what SGLang and vLLM will load beside the draft: a folder of another width, or a path that
    is not there, is refused (the lines once went out with the wrong verifier)."""
    from helpers import save_tiny_model
    from interop_helpers import write_sglang_fixture

    src = write_sglang_fixture(tmp_path / "sgl")
    right = save_tiny_model(tmp_path / "right")
    wide = save_tiny_model(tmp_path / "wide", hidden_size=96, num_attention_heads=6, num_key_value_heads=2)
    base = ["export", str(src), "--format", "sglang"]
    assert main([*base, "--out", str(tmp_path / "a"), "--target", str(wide)]) == 2
    assert "is not this draft's target: its hidden_size 96 (the draft's target: 64)" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--target", "./no-such-target"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "c"), "--target", str(right)]) == 0
    assert main([*base, "--out", str(tmp_path / "d"), "--target", "org/some-hub-model"]) == 0


def test_export_warns_of_a_capture_sglang_and_vllm_cannot_load(tmp_path, capsys):
    from interop_helpers import HIDDEN, sglang_tensors, write_sglang_fixture

    src = write_sglang_fixture(tmp_path / "two", tensors=sglang_tensors(fc_in=2 * HIDDEN),
                               eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4], "use_aux_hidden_state": True})
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "o")]) == 0
    assert "fuses 2 captured layers; SGLang and vLLM build the fc for 3" in capsys.readouterr().out


def test_an_out_folder_under_a_file_is_refused_before_anything_is_read(tmp_path, capsys):
    from interop_helpers import sglang_tensors, write_sglang_fixture

    src = write_sglang_fixture(tmp_path / "draft", sglang_tensors())
    (tmp_path / "notes.txt").write_text("a file")
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "notes.txt" / "out")]) == 2
    err = capsys.readouterr().err
    assert "notes.txt is a file, not a folder" in err and "fix:" in err and "Traceback" not in err


def test_speculative_tokens_out_of_range_are_refused_at_parsing(tmp_path, capsys):
    """--speculative-tokens 100000 was written into the launch line (and speculators' config) as given."""
    import pytest

    for value in ("100000", "0", "-3", "x"):
        with pytest.raises(SystemExit):
            main(["export", "smollm2-135m-instruct", "--format", "sglang", "--out", str(tmp_path / "o"),
                  "--speculative-tokens", value])
        assert "argument --speculative-tokens:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_speculative_tokens_with_sglang_shape_both_launch_lines(tmp_path, capsys):
    """With --format sglang the flag changed only the vLLM line, and its help said 'speculators only': now both
    lines run a chain of K, as eyas reads vLLM's num_speculative_tokens; without it SGLang's line keeps its tree."""
    from interop_helpers import sglang_tensors, write_sglang_fixture

    src = write_sglang_fixture(tmp_path / "draft", sglang_tensors())
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "a"),
                 "--speculative-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6" in out
    assert '"num_speculative_tokens": 5' in out
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in out
    assert '"num_speculative_tokens": 3' in out
