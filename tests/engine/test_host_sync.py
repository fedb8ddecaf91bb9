"""A step, greedy or sampled, makes the host wait for the device once: to read back what was accepted, at the end.

Every host read of device data is caught where it is asked for (``item``, ``bool``/``if`` on a
tensor, ``.cpu()``/``.to("cpu")``, ``tolist``), and so is ``torch.tensor`` of host data (a blocking
copy to the GPU waits for the stream too), so the test sees on the CPU what would stall a GPU.
"""

import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import eyas
from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

aten = torch.ops.aten
READS = (aten.item, aten._local_scalar_dense, aten.is_nonzero, aten.equal,
         aten.lift_fresh)  # torch.tensor(host data): a blocking copy to the GPU waits for its stream
SOURCE = str(Path(eyas.__file__).parent)
# The drafter checks an invariant on CPU tensors only (``not keep.is_cuda``, ``TorchOps.select_tree``): no GPU wait.
CPU_ONLY = {"select_tree"}


class HostReads(TorchDispatchMode):
    """Records (what, the eyas function that asked) for every host read, and counts the kernels
    (ops that are not views) run after the last one."""

    def __init__(self):
        super().__init__()
        self.reads, self.kernels_after_last_read = [], 0

    def record(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(SOURCE)]
        where = frames[-1].name if frames else "?"
        if where not in CPU_ONLY:
            self.reads.append((what, where))
            self.kernels_after_last_read = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # .to("cpu") of a GPU tensor (on a CPU run Tensor.cpu is caught by the fixture instead)
        to_host = (func.overloadpacket in (aten.to, aten._to_copy) and args[0].device.type != "cpu"
                   and torch.device(kwargs.get("device", "meta")).type == "cpu")
        if func.overloadpacket in READS or to_host:
            self.record(str(func.overloadpacket))
        elif not func.is_view:
            self.kernels_after_last_read += 1
        return func(*args, **kwargs)


@pytest.fixture
def host_reads(monkeypatch):
    mode = HostReads()
    for name in ("tolist", "cpu", "numpy"):
        def recorded(t, *args, _method=getattr(torch.Tensor, name), _name=name, **kwargs):  # noqa: B008 - bound per name
            out = _method(t, *args, **kwargs)
            mode.record(_name)
            return out

        monkeypatch.setattr(torch.Tensor, name, recorded)
    return mode


GREEDY = SamplingParams(max_new_tokens=64, ignore_eos=True)
ROWS = {"greedy": [GREEDY] * 3,  # sampled rows beside a greedy one; with top-p (the sort), or temperature alone
        "sampled": [SamplingParams(max_new_tokens=64, ignore_eos=True, temperature=0.8, seed=1), GREEDY,
                    SamplingParams(max_new_tokens=64, ignore_eos=True, temperature=1.0, min_p=0.05)],
        "filtered": [SamplingParams(max_new_tokens=64, ignore_eos=True, temperature=0.7, top_p=0.9, top_k=20), GREEDY,
                     SamplingParams(max_new_tokens=64, ignore_eos=True, temperature=1.0, seed=4)]}


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("path", ["generic", "native-eager", "native-graph-buckets", "native-graph-buckets-by-parts"])
@pytest.mark.parametrize("spec", [SpecConfig("EAGLE3", 4, 2, 6), SpecConfig("NONE")], ids=["tree", "no-spec"])
def test_a_step_reads_the_device_once_at_the_end(target, draft, host_reads, spec, path, rows, monkeypatch):
    """Greedy or sampled (drawn on the device, inside the whole-step graph where one is replayed)."""
    model = target if path == "generic" else NativeTarget.from_target(target)
    engine = Engine(model, draft if spec.speculative else None, spec, max_batch=4,
                    cuda_graphs=path.startswith("native-graph"), whole_step_graphs=not path.endswith("by-parts"))
    prompts = ([72, 101, 108], [7] * 9, [200, 13])
    batch = engine.prefill([engine.new_sequence(p, params) for p, params in zip(prompts, ROWS[rows])])
    engine.step(batch)  # the first step on the native path moves the rows into the engine's cache
    for _ in range(3):
        host_reads.reads.clear()
        with host_reads:
            emitted = engine.step(batch)
        assert host_reads.reads == [("tolist", "collect")]  # by parts, or replayed whole (graph buckets)
        assert host_reads.kernels_after_last_read == 0  # the device has nothing left once the host reads
        assert all(emitted)
    if path == "native-graph-buckets":  # the step ran whole, in the variant its rows need
        whole = engine.whole_steps[spec]
        assert [k for k, g in whole.graphs.items() if g.graphs] == [rows]


class Launches(TorchDispatchMode):
    """Counts the kernels (ops that are not views) run outside a step graph's replay (``BatchGraph._replay``: on
    a GPU one call, here the same function eagerly)."""

    def __init__(self):
        super().__init__()
        self.outside, self.inside = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and not func.is_view:
            self.outside.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", ["greedy", "sampled"])
@pytest.mark.parametrize("spec", [SpecConfig("EAGLE3", 4, 2, 6), SpecConfig("NONE")], ids=["tree", "no-spec"])
def test_a_step_after_a_step_launches_nothing_but_its_graph(target, draft, spec, rows, monkeypatch):
    """Served, every torch call on the engine thread gives up the interpreter lock and must win it back from the
    event loop. A whole step carries the next step's inputs in its graph's buffers (``BatchGraph``'s carry),
    so the steps of an unchanged batch launch nothing outside the graph; the first step, after prefill,
    copies them in."""
    from eyas.models.graphs import BatchGraph

    engine = Engine(NativeTarget.from_target(target), draft if spec.speculative else None, spec, max_batch=4,
                    cuda_graphs=True)
    prompts = ([72, 101, 108], [7] * 9, [200, 13])
    batch = engine.prefill([engine.new_sequence(p, params) for p, params in zip(prompts, ROWS[rows])])
    mode = Launches()
    run = BatchGraph._replay

    def inside(self, *args):
        mode.inside += 1
        try:
            return run(self, *args)
        finally:
            mode.inside -= 1

    monkeypatch.setattr(BatchGraph, "_replay", inside)
    counts = []
    for _ in range(4):
        mode.outside.clear()
        with mode:
            engine.step(batch)
        counts.append(list(mode.outside))
    assert len(counts[0]) >= 3 and "copy_" in " ".join(counts[0])  # the first: the inputs copied in
    assert counts[1:] == [[], [], []], counts[1:]
