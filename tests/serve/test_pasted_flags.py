"""Flags people paste from SGLang and vLLM into ``eyas serve``, through the real entry point (``eyas.cli.main``):
each is read with its meaning, or refused with the reason and the way out; never ignored, never a traceback."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from eyas.cli import build_parser, main
from eyas.errors import EyasError
from eyas.pipeline import EngineArgs, build_engine, engine_args_from


def serve_args(*argv: str):
    """``eyas serve ARGV`` parsed, and the pasted flags resolved as ``eyas serve`` resolves them."""
    from eyas.serve.cli import pasted_flags

    args = build_parser().parse_args(["serve", *argv])
    pasted_flags(args)
    return args


def refused(capsys, *argv: str) -> str:
    """stderr of ``eyas serve ARGV``, which must exit 2 with an ``eyas: error`` and no traceback."""
    rc = main(["serve", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("eyas: error: ") and "Traceback" not in err, err
    return err


# -- unknown flags ---------------------------------------------------------------------------------------
def test_an_unknown_flag_prints_serves_own_usage_with_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--max-prefil-tokens=512", "--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: eyas serve ") and "usage: eyas [-h] COMMAND" not in err
    assert "eyas serve: error: unrecognized arguments: --max-prefil-tokens=512 --bogus" in err
    assert "--max-prefil-tokens: did you mean --max-prefill-tokens?" in err
    assert "--bogus: did you mean" not in err  # nothing close: no guess


def test_every_serve_and_prepare_flag_has_help():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    blank = [(name, a.option_strings or a.dest) for name in ("serve", "prepare") for a in sub.choices[name]._actions
             if not (a.help or "").strip()]
    assert not blank


# -- --device --------------------------------------------------------------------------------------------
def test_cuda_on_a_cpu_only_torch_is_an_error_with_the_fix(capsys, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    err = refused(capsys, "--device", "cuda", "--port", "0")
    assert "CPU-only build" in err and "fix: install a CUDA build of PyTorch" in err and "--device cpu" in err
    assert "eyas serve: loading" not in capsys.readouterr().out  # refused before anything loads


def test_cuda_with_no_gpu_visible_and_a_bad_device_name(capsys, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "sees no GPU" in refused(capsys, "--device", "cuda:1", "--port", "0")
    assert "'gpu' is not a device" in refused(capsys, "--device", "gpu", "--port", "0")
    for other in ("mps", "meta", "xpu:0"):  # torch devices, not eyas's: refused, not a traceback at .to(device)
        assert "a CUDA GPU or the CPU" in refused(capsys, "--device", other, "--port", "0")


# -- --tp, --chunked-prefill-size, the positional model ----------------------------------------------------
def test_tp_above_one_is_refused_with_the_export_and_launch_commands(capsys):
    err = refused(capsys, "--tp", "4", "--port", "0")
    assert "--tp 4: eyas runs a model on one GPU" in err
    assert ("eyas export smollm2-135m-instruct-eagle3 --format sglang --out ./draft-sglang "
            "--target HuggingFaceTB/SmolLM2-135M-Instruct") in err
    assert "python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct" in err
    assert "--speculative-algorithm EAGLE3" in err and err.count("--tp 4") == 2
    assert "vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --speculative-config" in err
    assert "--tensor-parallel-size 4" in err
    assert "smollm2-135m-instruct --" not in err  # never the eyas-only name in a launch line
    for spelling in ("--tensor-parallel-size", "-tp", "--tp-size"):
        assert "no tensor parallelism" in refused(capsys, spelling, "2", "--speculative-algorithm", "NONE")
    assert serve_args("--tp", "1").tp == 1


def test_chunked_prefill_size_defaults_by_device():
    from eyas.serve.cli import chunk_default

    assert chunk_default(torch.device("cpu")) == 512 and chunk_default(torch.device("cuda", 0)) == 2048


def test_chunked_prefill_size_is_taken_and_nonsense_refused(capsys):
    assert serve_args().chunked_prefill_size is None  # the device picks: 2048 on a GPU, 512 on the CPU
    assert serve_args("--chunked-prefill-size", "4096").chunked_prefill_size == 4096
    assert serve_args("--chunked-prefill-size", "-1").chunked_prefill_size == -1  # SGLang's "off": whole prompts
    assert serve_args().overlap_schedule is None and serve_args("--overlap-schedule").overlap_schedule  # on
    assert serve_args("--no-overlap-schedule").overlap_schedule is False
    assert serve_args("--disable-overlap-schedule").overlap_schedule is False  # SGLang's flag
    for bad in ("0", "-2"):
        err = refused(capsys, "--chunked-prefill-size", bad, "--port", "0")
        assert "--chunked-prefill-size must be at least 1, or -1" in err


def test_positional_model_is_the_model_path(capsys):
    assert serve_args("./target", "--port", "1").model_path == "./target"
    assert serve_args("--port", "1", "./target").model_path == "./target"
    assert serve_args().model_path == "smollm2-135m-instruct"
    assert serve_args("--model", "./t").model_path == "./t"
    assert "given twice" in refused(capsys, "./a", "--model-path", "./b")


# -- --speculative-config ----------------------------------------------------------------------------------
def spec_fields(*argv: str) -> dict:
    a = engine_args_from(serve_args(*argv))
    return {k: getattr(a, k) for k in ("speculative_algorithm", "speculative_draft_model_path",
                                       "speculative_num_steps", "speculative_eagle_topk",
                                       "speculative_num_draft_tokens")}


def test_speculative_config_is_the_speculative_flags():
    chain = spec_fields("--speculative-config", '{"method": "eagle3", "model": "./d", "num_speculative_tokens": 4}')
    assert chain == spec_fields("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "./d",
                                "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
                                "--speculative-num-draft-tokens", "5")
    tree = spec_fields("--speculative-config", json.dumps({
        "method": "eagle3", "model": "./d", "draft_tensor_parallel_size": 1,
        "speculative_token_tree": "[(0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)]"}))
    assert (tree["speculative_num_steps"], tree["speculative_eagle_topk"], tree["speculative_num_draft_tokens"]) \
        == (3, 3, 7)
    assert spec_fields("--speculative-config", '{"method": "EAGLE"}')["speculative_algorithm"] == "EAGLE"
    # what the JSON leaves out comes from the flags, or eyas's defaults
    mixed = spec_fields("--speculative-config", '{"model": "./d"}', "--speculative-num-steps", "3")
    assert mixed == {"speculative_algorithm": None, "speculative_draft_model_path": "./d",
                     "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 6}


@pytest.mark.parametrize("config, words", [
    ('{"method": "ngram", "num_speculative_tokens": 3}', ["'ngram' is not one eyas runs", "eagle3, eagle"]),
    ('{"method": "medusa2"}', ["'medusa2'", "methods eagle3, eagle"]),
    ('{"method": "eagle3", "prompt_lookup_max": 4}', ["'prompt_lookup_max'", "will not ignore it",
                                                      "num_speculative_tokens"]),
    ('{"num_speculative_tokens": 0}', ["positive integer"]),
    ('{"num_speculative_tokens": 2, "speculative_token_tree": "[(0,), (0, 0), (1,)]"}', ["has 3 nodes"]),
    ('{"speculative_token_tree": "[(0,), (1, 0)]"}', ["parent of (1, 0) is missing"]),
    ('{"draft_tensor_parallel_size": 2}', ["one device"]),
    ('{"method": "eagle3"', ["not JSON"]),
    ('{"model": "./d"}', ["--speculative-config and --speculative-draft-model-path set the same setting"]),
])
def test_speculative_config_refusals(config, words):
    with pytest.raises(EyasError) as e:
        spec_fields("--speculative-config", config, *(["--speculative-draft-model-path", "./e"]
                                                       if '"model"' in config else []))
    assert all(w in str(e.value) for w in words), str(e.value)


# -- --config FILE -----------------------------------------------------------------------------------------
def test_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("port: 31001\nmax-running-requests: 3\nspeculative_num_steps: 2\nlog-requests: true\n"
                   "model-path: ./from-file\nspeculative-config: {method: eagle3, num_speculative_tokens: 4}\n")
    a = serve_args("--config", str(cfg), "--max-running-requests", "5")
    assert (a.port, a.max_running_requests, a.log_requests, a.model_path) == (31001, 5, True, "./from-file")
    assert a.config == str(cfg)
    with pytest.raises(EyasError, match="--speculative-config and --speculative-num-steps"):
        engine_args_from(a)  # the file spelled the tree twice: refused as on the command line
    assert serve_args("./positional", "--config", str(cfg)).model_path == "./positional"  # the CLI wins
    js = tmp_path / "serve.json"
    js.write_text(json.dumps({"port": 31002, "speculative-algorithm": "none"}))
    assert (serve_args(f"--config={js}").port, serve_args("--config", str(js)).speculative_algorithm) == (31002, "NONE")


def test_config_file_false_turns_an_on_by_default_switch_off(tmp_path):
    """``overlap-schedule: false`` is ``--no-overlap-schedule`` (it was dropped: the overlap stayed on)."""
    cfg = tmp_path / "serve.yaml"
    for text, want in (("overlap-schedule: false\n", False), ("overlap-schedule: true\n", True),
                       ("no-overlap-schedule: true\n", False), ("log-requests: false\n", None)):
        cfg.write_text(text)
        a = serve_args("--config", str(cfg))
        assert (a.log_requests if "log" in text else a.overlap_schedule) in ((want,) if want is not None else
                                                                             (None, False)), text


@pytest.mark.parametrize("text, words", [
    ("max-prefil-tokens: 5\n", ["unknown key 'max-prefil-tokens'", "did you mean max_prefill_tokens?"]),
    ("log-requests: 1\n", ["log-requests is a switch"]),
    ("port: [1, 2\n", ["cannot be read"]),
    ("- port\n", ["holds a list"]),
    ("config: other.yaml\n", ["unknown key 'config'"]),
])
def test_config_file_refusals(tmp_path, capsys, text, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    err = refused(capsys, "--config", str(cfg))
    assert all(w in err for w in words), err
    assert "no such file" in refused(capsys, "--config", str(tmp_path / "missing.yaml"))


def test_a_bad_value_in_the_config_file_is_checked_as_a_flag(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("speculative-algorithm: eagle4\n")
    with pytest.raises(SystemExit):
        main(["serve", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert "argument --speculative-algorithm: 'eagle4' is not an algorithm eyas runs" in err
    assert f"(--config {cfg} sets --speculative-algorithm)" in err  # the value the file gave


# -- --mem-fraction-static, --tokenizer-path, --random-seed (on an engine) ----------------------------------
def test_mem_fraction_static_sizes_the_native_kv_cache(models, monkeypatch):
    from eyas.models import native

    tiny, draft = models
    gib = 2**30
    monkeypatch.setattr(native, "device_memory", lambda device: (10 * gib, 16 * gib))  # 6 GiB in use

    def engine(fraction):
        return build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                       engine="native", device="cpu", max_batch=4, mem_fraction_static=fraction))

    roomy = engine(0.5)  # 10 - 16 * 0.5 = 2 GiB for the cache: the whole context fits
    assert roomy.max_context == 1024
    tight = engine(0.37503)  # 10 - 16 * 0.62497 GiB: about 0.5 MiB, a few dozen slots per row
    assert 16 <= tight.max_context < 128, tight.layout
    with pytest.raises(EyasError, match=r"--mem-fraction-static 0.3 leaves nothing for the KV cache: 38% .* in use"):
        engine(0.3)
    with pytest.raises(EyasError, match=r"must be in \(0, 1\]"):
        engine(1.5)


def test_tokenizer_path_replaces_the_targets_tokenizer(models, tmp_path):
    from helpers import byte_tokenizer

    tiny, draft = models
    tok = byte_tokenizer()
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    tok.save_pretrained(tmp_path / "tok")
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                     tokenizer_path=str(tmp_path / "tok")))
    assert engine.target.tokenizer.chat_template == tok.chat_template
    tok.add_tokens([f"<extra{i}>" for i in range(100)])  # 359 tokens: more than the 320 embeddings
    tok.save_pretrained(tmp_path / "big")
    with pytest.raises(EyasError, match="more than the target's 320 embeddings"):
        build_engine(EngineArgs(model_path=str(tiny), dtype="float64", tokenizer_path=str(tmp_path / "big")))
    with pytest.raises(EyasError, match="--tokenizer-path"):
        build_engine(EngineArgs(model_path=str(tiny), dtype="float64", tokenizer_path=str(tmp_path)))


def test_a_missing_tokenizer_path_says_it_does_not_exist(tmp_path):
    from helpers import byte_tokenizer

    from eyas.pipeline import load_tokenizer

    for missing in ("/nonexistent", str(tmp_path / "no" / "such")):
        with pytest.raises(EyasError, match="no such file or folder") as e:
            load_tokenizer(missing, 320)
        assert "Repo id" not in str(e.value) and "hubs may be unreachable" in str(e.value), e.value
        assert "tokenizer.json" in e.value.fix
    byte_tokenizer().save_pretrained(tmp_path / "tok")
    with pytest.raises(EyasError, match=r"is a file \(tokenizer_config.json\)") as e:
        load_tokenizer(str(tmp_path / "tok" / "tokenizer_config.json"), 320)
    assert e.value.fix == f"pass its folder: --tokenizer-path {tmp_path / 'tok'}"


def test_random_seed_decides_what_unseeded_requests_sample(engine):
    from eyas.sample.sampling import SamplingParams
    from eyas.serve.cli import seed_everything

    def sampled(seed):
        seed_everything(seed)
        params = [SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True) for _ in range(2)]
        return [o.output_ids for o in engine.generate([[5, 6, 7], [8, 9]], params)]

    first = sampled(7)
    assert sampled(7) == first
    assert sampled(8) != first
