"""The per-shape kernel choice (``eyas.models.kernel_choice``): timed once, remembered per GPU.

The timer and the machine name are injected, so the choosing, the file and the routing through
``TritonOps`` are checked on the CPU; on a GPU the timer is CUDA events (the benchmarks' business).
"""

import json
import logging

import pytest
import torch

from eyas.models.kernel_choice import KernelChoices, row_bucket, shape_key
from eyas.models.kernel_settings import KernelSettings
from eyas.models.ops import TORCH

kernels = pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
GPU = torch.device("cuda")  # a name only: nothing runs on it here


class FakeTimer:
    """Microseconds by candidate: each candidate is a callable returning its own name."""

    def __init__(self, us: dict[str, float]):
        self.us, self.calls = us, []

    def __call__(self, fn):
        name = fn()
        self.calls.append(name)
        return self.us[name]


class Spy:
    """``TritonOps._linear_rows`` that records the tile each call launches with."""

    def __init__(self, real):
        self.real, self.tiles = real, []

    def __get__(self, ops, owner):
        return lambda *a: (self.tiles.append(a[-1]), self.real(ops, *a))[1]


def candidates(*names):
    def run(name):
        if name == "broken":
            raise RuntimeError("out of shared memory")
        return name
    return {n: (lambda n=n: run(n)) for n in names}


def choices(tmp_path, timer, machine="FakeGPU | triton 0 | torch 0"):
    return KernelChoices(tmp_path, timer=timer, machine=lambda device: machine if device.type == "cuda" else None)


def test_the_fastest_candidate_is_chosen_once_and_remembered(tmp_path):
    timer = FakeTimer({"rows:16": 9.0, "rows:64": 4.0, "cublas": 5.0})
    c = choices(tmp_path, timer)
    key = shape_key(16, 6144, 4096, torch.bfloat16, "linear")
    assert key == "rows<=16 6144x4096 bf16 linear"
    assert c.pick(key, candidates("rows:16", "rows:64", "cublas"), GPU) == "rows:64"
    assert c.pick(key, candidates("rows:16", "rows:64", "cublas"), GPU) == "rows:64"
    assert timer.calls == ["rows:16", "rows:64", "cublas"]  # timed once
    assert c.timings[key] == {"rows:16": 9.0, "rows:64": 4.0, "cublas": 5.0}
    saved = json.loads((tmp_path / "kernel-choices.json").read_text())
    assert saved == {"FakeGPU | triton 0 | torch 0": {key: "rows:64"}}
    line = c.summary()
    assert "1 shapes (rows 1)" in line and "1 timed now" in line and "FakeGPU" in line


def test_a_later_process_on_the_same_gpu_reads_the_file_and_another_gpu_times_again(tmp_path):
    key = shape_key(1, 4096, 4096, torch.bfloat16, "add")
    choices(tmp_path, FakeTimer({"kernel": 3.0, "cublas": 7.0})).pick(key, candidates("kernel", "cublas"), GPU)
    again = FakeTimer({"kernel": 9.0, "cublas": 1.0})
    later = choices(tmp_path, again)
    assert later.pick(key, candidates("kernel", "cublas"), GPU) == "kernel" and again.calls == []
    assert "0 timed now, 1 from the cache" in later.summary()
    other = FakeTimer({"kernel": 9.0, "cublas": 1.0})
    elsewhere = choices(tmp_path, other, machine="OtherGPU | triton 0 | torch 0")
    assert elsewhere.pick(key, candidates("kernel", "cublas"), GPU) == "cublas" and len(other.calls) == 2
    saved = json.loads((tmp_path / "kernel-choices.json").read_text())
    assert saved["FakeGPU | triton 0 | torch 0"] == {key: "kernel"} and saved["OtherGPU | triton 0 | torch 0"] == {
        key: "cublas"}


def test_a_failing_candidate_is_skipped_and_a_corrupt_file_is_timed_again(tmp_path, caplog):
    (tmp_path / "kernel-choices.json").write_text("{not json")
    timer = FakeTimer({"rows:16": 2.0, "cublas": 5.0})
    c = choices(tmp_path, timer)
    with caplog.at_level(logging.WARNING, logger="eyas.kernels"):
        assert c.pick("k", candidates("broken", "cublas"), GPU) == "cublas"
    assert "ignoring" in caplog.text and "timed again" in caplog.text
    assert json.loads((tmp_path / "kernel-choices.json").read_text())  # rewritten whole
    assert c.pick("k2", candidates("broken"), GPU) == "broken"  # one candidate: nothing to time


def test_nothing_is_timed_off_a_gpu_or_when_measuring_is_off(tmp_path, monkeypatch):
    timer = FakeTimer({"a": 9.0, "b": 1.0})
    off_gpu = choices(tmp_path, timer)
    assert off_gpu.pick("k", candidates("a", "b"), torch.device("cpu")) == "a"
    assert timer.calls == [] and not (tmp_path / "kernel-choices.json").exists()
    assert off_gpu.summary() is None
    chosen = KernelChoices(tmp_path, timer=timer, machine=lambda d: "FakeGPU")
    chosen.picks[shape_key(3, 72, 200, torch.float32, "add")] = "cublas"  # what measuring would run
    monkeypatch.setattr(kernels, "CHOICES", chosen)
    spy = Spy(kernels.TritonOps._linear_rows)
    monkeypatch.setattr(kernels.TritonOps, "_linear_rows", spy)
    x, w, res = torch.randn(3, 200), torch.randn(72, 200) / 200 ** 0.5, torch.randn(3, 72)
    got = kernels.TritonOps(KernelSettings(measure=False)).linear_add(res, x, w)  # the built-in tile, not the pick
    torch.testing.assert_close(got, TORCH.linear_add(res, x, w), rtol=1e-5, atol=1e-5)
    assert spy.tiles == [next(iter(kernels.linear_candidates(3, 72, 200, 4).values()))] and timer.calls == []


def test_row_buckets_follow_the_rows_kernel_tiles():
    assert [row_bucket(r) for r in (1, 2, 16, 17, 32, 33, 64)] == [
        "rows=1", "rows<=16", "rows<=16", "rows<=32", "rows<=32", "rows<=64", "rows<=64"]


def test_candidates_put_the_built_in_default_first():
    """Several rows: the rows kernel's default tile first, the other tiles, then cuBLAS."""
    # One row is not timed: isolated timings put cuBLAS ahead where, inside the step's graph with dependent
    # launch, _linear_kernel decodes faster (H200, 8B shape: 225 against 236 tok/s when cuBLAS was picked).
    one = kernels.linear_candidates(1, 576, 576, 2)
    assert len(one) == 1 and next(iter(one)).startswith("kernel:")
    assert kernels.linear_candidates(1, 49152, 576, 2) == {"cublas": None}  # a wide head over short rows
    rows = kernels.linear_candidates(16, 4096, 4096, 2)
    names = list(rows)
    assert names[0] == "rows:16x256x4x3" and names[-1] == "cublas" and len(set(names)) == len(names) >= 4
    fp32 = [cfg for cfg in kernels.linear_candidates(16, 4096, 4096, 4).values() if cfg]
    assert fp32 == [(bn, bk // 2, w, s) for bn, bk, w, s in (cfg for cfg in rows.values() if cfg)]  # the same bytes


@pytest.mark.parametrize("which", [-1, 0, 2])
def test_triton_ops_run_what_was_chosen(which, tmp_path, monkeypatch):
    """A choice routes the projection: cuBLAS never launches the rows kernel; a tile choice launches it
    with that tile; either way the result is the torch op's."""
    chosen = KernelChoices(tmp_path)
    monkeypatch.setattr(kernels, "CHOICES", chosen)
    torch.manual_seed(3)
    x, w = torch.randn(5, 200), torch.randn(72, 200) / 200 ** 0.5
    res = torch.randn(5, 72)
    configs = kernels.linear_candidates(5, 72, 200, 4)
    pick = list(configs)[which]
    chosen.picks[shape_key(5, 72, 200, torch.float32, "add")] = pick
    spy = Spy(kernels.TritonOps._linear_rows)
    monkeypatch.setattr(kernels.TritonOps, "_linear_rows", spy)
    got = kernels.TritonOps().linear_add(res, x, w)
    torch.testing.assert_close(got, TORCH.linear_add(res, x, w), rtol=1e-5, atol=1e-5)
    assert spy.tiles == ([] if pick == "cublas" else [configs[pick]])


def test_timing_a_fused_projection_never_meets_another_choice(tmp_path, monkeypatch):
    """Timing gate/up's candidates runs its cuBLAS path, which must be cuBLAS alone: it once called the ops'
    own ``linear`` again, whose choice then waited on the lock its caller held (a hang at the GPU's warm-up)."""
    import threading

    timed = []

    def timer(fn):
        fn()
        timed.append(1)
        return float(len(timed))  # the first candidate (the default tile) is fastest

    chosen = KernelChoices(tmp_path, timer=timer, machine=lambda device: "FakeGPU")
    monkeypatch.setattr(kernels, "CHOICES", chosen)
    torch.manual_seed(4)
    x, w = torch.randn(3, 64), torch.randn(2 * 40, 64) / 8
    out = []
    worker = threading.Thread(target=lambda: out.append(kernels.TritonOps().linear_silu(x, w)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "choosing gate/up's kernel hung"
    torch.testing.assert_close(out[0], TORCH.linear_silu(x, w), rtol=1e-4, atol=1e-4)
    assert list(chosen.picks) == [shape_key(3, 80, 64, torch.float32, "silu")]  # one choice, no nested one
    assert len(timed) == len(kernels.linear_candidates(3, 80, 64, 4))


def test_the_product_and_the_add_apart_are_timed_beside_addmm(tmp_path, monkeypatch):
    """cuBLAS with the residual as its accumulator (addmm) ran Llama-3.1-8B's o_proj 2-3x slower than a plain GEMM
    of a larger weight on the H200: ``residual + F.linear`` is one more candidate of a residual projection over
    several rows (not one row, whose choice is not timed), chosen where it is fastest, and gives the same sums."""
    order = []

    def timer(fn):
        fn()
        order.append(len(order))
        return 10.0 - len(order)  # the later, the faster: the extra candidate is timed last

    chosen = KernelChoices(tmp_path, timer=timer, machine=lambda device: "FakeGPU")
    monkeypatch.setattr(kernels, "CHOICES", chosen)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: GPU))  # a name for the choice: runs on the CPU
    torch.manual_seed(5)
    x, w, res = torch.randn(5, 200), torch.randn(72, 200) / 200 ** 0.5, torch.randn(5, 72)
    got = kernels.TritonOps().linear_add(res, x, w)
    key = shape_key(5, 72, 200, torch.float32, "add")
    assert chosen.picks[key] == "cublas+add" and "cublas" in chosen.timings[key]  # timed beside addmm, and won
    monkeypatch.undo()
    torch.testing.assert_close(got, TORCH.linear_add(res, x, w), rtol=1e-5, atol=1e-5)
    one = KernelChoices(tmp_path / "one", timer=timer, machine=lambda device: "FakeGPU")
    monkeypatch.setattr(kernels, "CHOICES", one)
    kernels.TritonOps().linear_add(res[:1], x[:1], w)
    assert one.picks == {}  # one row: the built-in choice, nothing timed


def test_a_choice_timed_after_warm_up_is_a_first_use(tmp_path, monkeypatch):
    """A shape first met while serving is timed then, the requests waiting: ``models/first_use.py`` counts it;
    one read from the file (or timed during warm-up, before ``arm``) is not."""
    from eyas.models import kernel_choice
    from eyas.models.first_use import FirstUse

    watch = FirstUse()
    monkeypatch.setattr(kernel_choice, "FIRST_USE", watch)
    c = choices(tmp_path, FakeTimer({"rows:16": 9.0, "cublas": 5.0}))
    c.pick(shape_key(16, 960, 576, torch.bfloat16, "linear"), candidates("rows:16", "cublas"), GPU)  # warm-up
    watch.armed = True
    c.pick(shape_key(16, 960, 576, torch.bfloat16, "linear"), candidates("rows:16", "cublas"), GPU)  # remembered
    assert watch.events["kernel"][0] == 0
    c.pick(shape_key(64, 960, 576, torch.bfloat16, "linear"), candidates("rows:16", "cublas"), GPU)  # timed now
    assert watch.events["kernel"][0] == 1
