"""A sharded MoE target under torchrun: two gloo processes on the CPU, the target FSDP2-sharded layer by
layer (experts included) and the draft sharded beside it, train the same as one process on the same
global batches: equal first-step gradients, held-out loss and final draft weights. The targets are tiny
random Qwen3-MoE and DeepSeek-V3 (MLA + MoE after one dense layer, ``first_k_dense_replace``) saved as
model folders and loaded as eyas loads a target; one torchrun launch trains on both. Real multi-GPU NCCL
runs are not tested here."""

import sys
from pathlib import Path

import pytest
import torch
from ddp_worker import run
from test_ddp import _torchrun
from train_fixtures import make_data

from eyas.common import dist
from eyas.models.loading import load_target
from eyas.models.target import Target

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from test_families import TOK, family_model

FAMILIES = ["qwen3_moe", "deepseek_v3"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(data, model folders, results of the 2-rank sharded run per family and rank)."""
    tmp = tmp_path_factory.mktemp("shard_moe")
    folders = {}
    for name in FAMILIES:  # a tied head (Qwen3-MoE here) stays with the root; an untied one is its own unit
        model = family_model(name, layers=4, tie_word_embeddings=name == "qwen3_moe")
        model.save_pretrained(tmp / name)
        TOK.save_pretrained(tmp / name)
        folders[name] = tmp / name
    # Rows of equal length (same global batches either way), sampled from one of the targets: any rows
    # of this vocabulary train either target's draft.
    data = make_data(Target(model, TOK, name=name), tmp / "data", rows=24, new=28)
    _torchrun(2, data, tmp / "two", 128, f"target={','.join(map(str, folders.values()))}",
              "train.parallel=fsdp", "train.shard_target=true")
    two = {name: [torch.load(tmp / "two" / name / f"rank{r}-of2.pt") for r in (0, 1)] for name in FAMILIES}
    return data, folders, two


@pytest.mark.parametrize("name", FAMILIES)
def test_sharded_moe_target_trains_as_one_process(sharded, name, tmp_path):
    data, folders, results = sharded
    two = results[name]
    target = load_target(str(folders[name]), dtype="float32")
    one = run(dist.init("cpu"), target, data, tmp_path / "one", {"data.tokens_per_batch": 256})  # same batches
    shares = [r["target_share"] for r in two]  # dim-0 shards: rank 0 takes the larger half of odd sizes
    assert abs(sum(shares) - 1) < 1e-6 and max(shares) < 0.6, f"each rank should hold half the target: {shares}"
    assert two[0]["summary"]["steps"] == one["summary"]["steps"] == 6
    assert one["grads"].keys() == two[0]["grads"].keys() and len(one["grads"]) > 5
    for k, g in one["grads"].items():
        scale = float(g.abs().max())  # about 1e-3 here: the tolerance follows it
        assert scale > 0, f"{k} got no gradient"
        assert torch.allclose(two[0]["grads"][k], g, atol=1e-4 * scale, rtol=1e-4), f"first-step gradient of {k}"
    for k, v in one["state"].items():
        assert torch.equal(two[0]["state"][k], two[1]["state"][k]), f"ranks drifted apart in {k}"
        assert torch.allclose(two[0]["state"][k], v, atol=2e-5, rtol=1e-4), f"{k} differs from one process"
    a, b = two[0]["summary"]["heldout"], one["summary"]["heldout"]
    assert abs(a["loss"] - b["loss"]) < 1e-4 and a["positions"] == b["positions"] > 0
