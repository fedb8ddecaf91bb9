"""``eyas train --plan``: its memory figure against a measured run, and its figures for the story's targets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import byte_tokenizer, tiny_model
from train_fixtures import make_data

from eyas.cli import main
from eyas.models.target import Target
from eyas.train.plan import GB, make_plan
from eyas.train.recipe import load_recipe

FIXTURES = Path(__file__).parents[1] / "fixtures"

# Run in a fresh process: RSS before the run (everything imported) and the peak after it. Freed tensors
# go back to the OS at once (a fixed mmap threshold), so the peak RSS is the peak of live memory.
MEASURE = """
import sys, torch
torch.set_num_threads(1)
import transformers.models.llama.modeling_llama, eyas.train.trainer, eyas.models.loading, eyas.cli
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
before = status("VmRSS")
assert eyas.cli.main(["train"] + sys.argv[1:]) == 0
print(status("VmHWM") - before)
"""


def tiny_run(tmp_path):
    """A tiny Llama saved as a folder, its data, and a recipe of a few steps on the CPU in fp32."""
    model = tiny_model(seed=0, dtype=torch.float32, vocab_size=4096, hidden_size=256, intermediate_size=768,
                       num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2)
    folder = tmp_path / "target"
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    data = make_data(Target(model, byte_tokenizer()), tmp_path / "data", rows=40, new=60)
    sets = {"target": str(folder), "data.path": str(data), "output": str(tmp_path / "run"), "data.max_length": 64,
            "data.tokens_per_batch": 1024, "draft.vocab_size": 2048, "draft.save_dtype": "float32",
            "train.ttt_steps": 4, "train.max_steps": 2, "train.device": "cpu", "log.every": 1, "log.eval_every": 0,
            "log.checkpoint_every": 0, "log.progress": False, "log.tensorboard": False}
    return [f"{k}={v}" for k, v in sets.items()]


def test_plan_memory_agrees_with_the_measured_peak(tmp_path):
    overrides = tiny_run(tmp_path)
    plan = make_plan(load_recipe(None, overrides))
    assert plan.device == "cpu" and set(plan.parts) == {"target weights", "draft weights (fp32)", "draft gradients",
                                                        "optimizer (AdamW)", "activations"}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", OMP_NUM_THREADS="1")
    args = [a for o in overrides for a in ("--set", o)]
    out = subprocess.run([sys.executable, "-c", MEASURE, *args], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = int(out.stdout.strip().splitlines()[-1])
    assert measured > 100e6  # the run's own memory, well above the noise of a Python process
    assert plan.peak == plan.total > plan.load_total  # the training step, not the loading, peaks here
    assert abs(plan.peak - measured) <= 0.2 * measured, (plan.peak, measured, plan.parts)


def test_plan_for_kimi_k25_and_llama_70b(capsys):
    assert main(["train", "--plan", "--model", str(FIXTURES / "kimi-k2.5"), "--gpu-memory", "141"]) == 0
    kimi = capsys.readouterr().out
    assert "captures layers [2, 30, 58] (SGLang ids [1, 29, 57])" in kimi
    assert "fc 3 x 7,168 = 21,504 -> 7,168" in kimi
    assert "3 x 7,168 x 2 B = 43.0 KB a token" in kimi  # the 43 KB a token, plus the final state
    assert "57.3 KB a token" in kimi
    assert "1,026.88 B parameters" in kimi
    assert main(["train", "--plan", "--model", str(FIXTURES / "llama-3.1-70b-instruct"),
                 "--set", "train.shard_target=true", "--set", "data.tokens_per_batch=4096"]) == 0
    llama = capsys.readouterr().out
    assert "70.55 B parameters" in llama and "captures layers [2, 40, 77]" in llama
    # each rank loads only its shard: the count is the sharded training step's, the whole target is rank 0's host
    assert "fewest GPUs 6 of" in llama and "in rank 0's host memory, each GPU gets its shard" in llama


def test_fewest_gpus_follows_the_gpu_memory():
    recipe = load_recipe(None, [f"target={FIXTURES / 'llama-3.1-70b-instruct'}", "train.shard_target=true",
                                "data.tokens_per_batch=4096"])
    small, large = make_plan(recipe, 80 * GB), make_plan(recipe, 141 * GB)
    assert (small.min_gpus, large.min_gpus) == (small.min_gpus_step, large.min_gpus_step)  # loading bars no count
    whole = make_plan(load_recipe(None, [f"target={FIXTURES / 'llama-3.1-70b-instruct'}"]), 80 * GB)
    assert whole.min_gpus is None and whole.load_total > 80 * GB  # unsharded: every GPU loads the whole target
    assert small.min_gpus_step is not None and large.min_gpus_step is not None
    assert large.min_gpus_step < small.min_gpus_step
    assert small.gpus == small.min_gpus_step and small.total <= 80 * GB and large.total <= 141 * GB
    # the per-GPU figure at one GPU fewer does not fit: that is what "fewest" means
    fewer = make_plan(recipe, 80 * GB, gpus=small.min_gpus_step - 1) if small.min_gpus_step > 1 else None
    assert fewer is None or fewer.total > 80 * GB
    # a target whose whole copy fits one GPU: the loading no longer bars it, and sharding lowers the count
    mid = make_plan(recipe, 200 * GB)
    assert mid.min_gpus is not None and mid.load_total <= 200 * GB and mid.min_gpus == mid.min_gpus_step


def test_plan_refuses_a_folder_without_a_config(tmp_path, capsys):
    assert main(["train", "--plan", "--model", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_gpus_without_plan_is_refused_not_a_one_gpu_run(tmp_path, capsys):
    """``eyas train --gpus 4`` read like a four-GPU run and trained on one; the flag only shapes --plan."""
    assert main(["train", "--gpus", "4", "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--gpus 4 only sets how many GPUs --plan figures for" in err and "torchrun --nproc-per-node 4" in err
    assert not (tmp_path / "run").exists()


def test_gpu_memory_without_plan_is_refused_not_a_cap(tmp_path, capsys):
    """``--gpu-memory 24`` read like a memory cap on the run; it only shapes --plan, as --gpus."""
    assert main(["train", "--gpu-memory", "24", "--output", str(tmp_path / "run")]) == 2
    assert "--gpu-memory 24 only sets the GPU size --plan figures for" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("size", ["0", "nan", "inf", "-80"])
def test_plan_refuses_a_gpu_size_that_is_no_size(size, capsys):
    assert main(["train", "--plan", "--model", str(FIXTURES / "kimi-k2.5"), "--gpu-memory", size]) == 2
    assert f"--gpu-memory {float(size)}" in capsys.readouterr().err
