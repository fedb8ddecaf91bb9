"""eyas serve's speculative setting per device when the flags name none (serve/defaults.py), and the banner line
that says which setting runs and why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eyas.cli import build_parser
from eyas.config import AUTO
from eyas.pipeline import build_engine, engine_args_from
from eyas.serve.cli import pasted_flags
from eyas.serve.defaults import DEVICE_DEFAULTS, apply_choice, choose_setting

SHIPPED = "smollm2-135m-instruct"  # a target eyas ships a draft for


def chosen(device: str, *argv: str, target: str = "m"):
    """(choice, engine args) for ``eyas serve --model-path TARGET ARGV`` on a device of ``device`` ("cuda" faked:
    no GPU needed)."""
    args = build_parser().parse_args(["serve", "--model-path", target, *argv])
    pasted_flags(args)
    engine_args = replace(engine_args_from(args), device=device)
    choice = choose_setting(args, engine_args)
    return choice, apply_choice(engine_args, choice)


def test_no_flags_take_the_device_default():
    choice, e = chosen("cpu")
    assert (choice.setting, choice.source) == ("0", "default for cpu")
    assert e.speculative_algorithm == "NONE" and e.speculative_draft_model_path is None  # the draft is not loaded
    assert "cpu-default-smollm2.json" in choice.why and "--speculative-algorithm EAGLE3" in choice.why
    choice, e = chosen("cuda", target=SHIPPED)
    assert (choice.setting, choice.source) == (AUTO, "default for cuda")
    assert e.speculative_batch_schedule == AUTO and e.speculative_algorithm is None  # EAGLE3 with the shipped draft
    assert "6/8/32" in choice.why
    assert chosen("cuda:1", target=SHIPPED)[0].source == "default for cuda"
    assert chosen("mps", target=SHIPPED)[0].setting == AUTO  # no measured setting: adaptive
    choice, e = chosen("cuda")  # a target no draft ships for: plain decoding, and the banner says why
    assert (choice.setting, choice.source) == ("0", "default for cuda") and e.speculative_algorithm == "NONE"
    assert "no draft ships" in choice.why and "--speculative-draft-model-path" in choice.why
    assert set(DEVICE_DEFAULTS) == {"cuda", "cpu"}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_flags_always_win(device):
    choice, e = chosen(device, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4")
    assert (choice.setting, choice.source) == ("3,1,4", "flags") and e.speculative_batch_schedule is None
    assert (e.speculative_num_steps, e.speculative_eagle_topk, e.speculative_num_draft_tokens) == (3, 1, 4)
    choice, e = chosen(device, "--speculative-num-steps", "2")  # the rest from the chain defaults
    assert choice.setting == "2,1,6" and e.speculative_batch_schedule is None
    choice, e = chosen(device, "--speculative-batch-schedule", "1:3,1,4;8:0")
    assert choice.setting == "1:3,1,4;8:0" and e.speculative_batch_schedule == "1:3,1,4;8:0"
    assert chosen(device, "--speculative-batch-schedule", "Auto")[0].setting == AUTO
    config = '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}'
    choice, e = chosen(device, "--speculative-config", config)
    assert choice.setting == "3,1,4" and e.speculative_draft_model_path == "d"
    # speculation asked for without a tree: adaptive, on every device (it may still run no speculation)
    for argv in (["--speculative-algorithm", "EAGLE3"], ["--speculative-draft-model-path", "d"],
                 ["--speculative-config", '{"method": "eagle3", "model": "d"}']):  # vLLM's JSON, no token count
        choice, e = chosen(device, *argv)
        assert (choice.setting, choice.source) == (AUTO, "flags") and e.speculative_batch_schedule == AUTO
    choice, e = chosen(device, "--speculative-algorithm", "NONE", "--speculative-draft-model-path", "d")
    assert (choice.setting, choice.source) == ("0", "flags") and e.speculative_draft_model_path == "d"  # refused later
    choice, e = chosen(device, "--speculative-algorithm", "EAGLE")  # the story's mistake still reaches the checks
    assert e.speculative_algorithm == "EAGLE" and e.speculative_batch_schedule == AUTO


def test_banner_and_server_info_say_what_runs_and_why(models):
    from eyas.serve.banner import banner_lines, describe

    tiny, draft = models
    choice, e = chosen("cpu")
    engine = build_engine(replace(e, model_path=str(tiny), dtype="float64"))
    engine.setting_choice = choice
    lines = banner_lines(engine, 4, 4)
    assert "speculative algorithm: NONE (plain decoding, one token per target forward)" in lines
    line = next(ln for ln in lines if ln.startswith("speculative setting: "))
    assert line.startswith("speculative setting: no speculation (plain decoding), the default on the CPU: "
                           "speculation measured slower than plain decoding there")
    info = describe(engine)
    assert (info["setting"], info["setting_source"], info["setting_reason"]) == ("0", "default for cpu", choice.why)
    choice, e = chosen("cpu", "--speculative-draft-model-path", str(draft))
    engine = build_engine(replace(e, model_path=str(tiny), dtype="float64"))
    engine.setting_choice = choice
    assert "speculative setting: auto (adaptive), adaptive: the flags ask for speculation but name no tree" \
        in banner_lines(engine, 4, 4)
    assert engine.spec.adaptive and describe(engine)["setting_source"] == "flags"
