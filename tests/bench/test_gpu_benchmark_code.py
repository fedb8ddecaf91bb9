"""The GPU benchmarks' measuring code runs against the engine's current API (on the CPU, tiny model):
a benchmark that no longer runs is found here, not on a lent GPU."""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eyas.models.kernel_settings import KernelSettings
from eyas.models.native import NativeTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_verify_cost_curve_runs_eager_and_on_graph_buffers():
    import verify_cost

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256)
    target = NativeTarget(LlamaForCausalLM(cfg).eval())
    with torch.inference_mode():
        for graphs in (True, False):
            out = verify_cost.curve(target, [16, 40], [1, 4], reps=1, graphs=graphs, kernels=KernelSettings())
            assert set(out) == {"16", "40"} and set(out["16"]) == {"1", "4"}
            assert out["40"]["1"]["relative"] == 1.0 and out["40"]["4"]["median"] > 0
            # the pool built the rope table, so on a GPU this forward takes the engine's kernels, not the
            # torch ops (verify_cost measured the torch ops until 2026-12-02: the engine built the table)
            assert target.native.rope.size >= 40 + 2 * 4


def test_spec_step_8b_measures_every_setting_against_the_plain_step():
    import argparse

    import spec_step_8b

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256)
    args = argparse.Namespace(specs=["2,2,4", "3,1,4"], batches=[1, 2], context=12, context_limit=128, steps=3,
                              draft_vocab=48, taus=[3.0], profile_steps=2)
    rows = spec_step_8b.measure("tiny", LlamaForCausalLM(cfg).eval(), args, KernelSettings())
    assert {"none batch 1", "none batch 2", "2,2,4 batch 1", "3,1,4 batch 2", "3,1,4 build"} <= set(rows)
    row = rows["2,2,4 batch 2"]
    assert row["step_ms"] > 0 and row["tokens_per_row_per_step"] >= 1
    assert row["plain_steps"] == round(row["step_ms"] / rows["none batch 2"]["step_ms"], 2) or abs(
        row["plain_steps"] - row["step_ms"] / rows["none batch 2"]["step_ms"]) < 0.01  # rounded step times
    assert abs(row["speedup_at_tau"]["3.0"] * row["plain_steps"] - 3.0) < 0.02  # speedup = tau x plain / spec
    profile = rows["2,2,4 batch 1"]["profile"]  # the first batch size's steps, read from the profiler's timeline
    assert profile["step"]["span_ms_per_step"] > 0 and "profile" not in row


def test_the_profiling_benchmarks_time_the_engines_own_phases(target, draft, tmp_path):
    """step_profile and kernel_profile read the phases the engine names (``engine/phases.py``), patching
    nothing: a step by parts shows each of its parts."""
    import kernel_profile
    import step_profile

    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine

    engine = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 2, 2, 4), max_batch=1,
                    whole_step_graphs=False)
    parts = {"step", "draft", "mask", "verify", "accept", "commit", "extend", "finish"}
    timed = step_profile.phases(engine, [[5, 6, 7]], 6)
    assert parts <= set(timed) and all(timed[p] > 0 for p in parts) and timed["step_synced"] > 0
    engine.rows = 1
    profiled = kernel_profile.profile_engine(engine, [5, 6, 7], 2, tmp_path / "trace.json")
    assert parts <= set(profiled) and profiled["step"]["span_ms_per_step"] > 0
    assert 1 <= profiled["tokens_per_row_step"] <= 3  # what a step of this tree gained: the steps did work
    assert (tmp_path / "trace.json.gz").exists()
