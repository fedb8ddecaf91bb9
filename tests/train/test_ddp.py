"""Two gloo processes on the CPU: weights stay in sync and match one process on the same data,
with DDP and with FSDP2 (draft sharded, target sharded too)."""

import os
import subprocess
import sys
from pathlib import Path

import torch
from helpers import tiny_target
from train_fixtures import make_data

WORKER = Path(__file__).with_name("ddp_worker.py")


def _torchrun(n: int, data, out, tokens_per_batch: int, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", str(WORKER),
           str(data), str(out), str(tokens_per_batch), *extra]
    try:  # a run takes about 10 s; a hang (seen about once in ten full-suite runs) shows what it printed
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        text = lambda b: (b or b"").decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        raise AssertionError(f"torchrun {extra} hung for {e.timeout} s\nstdout: {text(e.stdout)[-2000:]}\n"
                             f"stderr: {text(e.stderr)[-4000:]}") from None
    saved = sorted(p.name for p in Path(out).glob("**/rank*-of*.pt"))  # a crash after saving is a teardown's
    assert done.returncode == 0, f"saved: {saved}\nstdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-3000:]}"
    return done


def test_two_process_gloo_matches_single(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=40)  # equal-length rows: same global batches either way
    two = _torchrun(2, data, tmp_path / "two", 256, "log.trackers=[tensorboard]")  # 256 tokens per rank
    assert two.stdout.count("step 6: held-out acc per TTT step") == 1  # rank 0 reports, not every rank
    _torchrun(2, data, tmp_path / "fsdp", 256, "train.parallel=fsdp", "train.shard_target=true")
    _torchrun(1, data, tmp_path / "one", 512)  # the same 512-token global batches in one process
    r0 = torch.load(tmp_path / "two" / "rank0-of2.pt")
    r1 = torch.load(tmp_path / "two" / "rank1-of2.pt")
    single = torch.load(tmp_path / "one" / "rank0-of1.pt")
    for k, v in r0["state"].items():
        assert torch.equal(v, r1["state"][k]), f"ranks drifted apart in {k}"
        assert torch.allclose(v, single["state"][k], atol=2e-5, rtol=1e-4), f"{k} differs from one process"
    assert r0["summary"]["steps"] == single["summary"]["steps"] == 6
    # Only rank 0 reports: one TensorBoard writer, the run's name from its output folder.
    assert len(list((tmp_path / "two" / "tensorboard" / "two").glob("events.out.tfevents.*"))) == 1
    a, b = r0["summary"]["heldout"], single["summary"]["heldout"]
    assert abs(a["loss"] - b["loss"]) < 1e-3 and a["positions"] == b["positions"]
    fsdp = torch.load(tmp_path / "fsdp" / "rank0-of2.pt")
    for k, v in fsdp["state"].items():
        assert torch.allclose(v.double(), single["state"][k].double(), atol=2e-5, rtol=1e-4), f"FSDP2: {k} differs"
    assert abs(fsdp["summary"]["heldout"]["loss"] - b["loss"]) < 1e-3
