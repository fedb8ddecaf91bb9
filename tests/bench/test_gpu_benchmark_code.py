"""The GPU benchmarks' measuring code runs against the engine's current API (on the CPU, tiny model):
a benchmark that no longer runs is found here, not on a lent GPU."""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

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
            out = verify_cost.curve(target, [16, 40], [1, 4], reps=1, graphs=graphs)
            assert set(out) == {"16", "40"} and set(out["16"]) == {"1", "4"}
            assert out["40"]["1"]["relative"] == 1.0 and out["40"]["4"]["median"] > 0
            # the pool built the rope table, so on a GPU this forward takes the engine's kernels, not the
            # torch ops (verify_cost measured the torch ops until 2026-12-02: the engine built the table)
            assert target.native.rope.size >= 40 + 2 * 4
