"""The draws' Triton kernels (``spec.draw_kernel``) against their torch reference (``spec.draw.draw``): the same
token on every row, whatever the chunking, and they compile for Hopper.

Without a GPU the kernels run in Triton's interpreter (``conftest``). Logits are random, so a target within
rounding of a boundary between two tokens (where the kernels' sums, added in another order, may pick the
neighbour) is practically impossible.
"""

import os
import subprocess
import sys

import pytest
import torch

from eyas.spec.draw import draw

pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
from eyas.models.kernel_settings import KernelSettings
from eyas.spec import draw_kernel, tree_kernels

TRITON = tree_kernels.SpecTritonOps(KernelSettings(measure=False))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF = float("inf")


def rows(n: int = 12, v: int = 700):
    """Random rows with every case: greedy, thresholds from none to all but a few, a row of -inf alone, a row
    masked past 100 (a grammar), tied maxima, seeds of every sign and size, positions up to 2^32 - 1."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(n, v, generator=gen) * 3
    x[2] = -INF
    x[3, 100:] = -INF
    x[4] = x[4].round()  # ties, the largest among them
    x[10] = x[10].round()
    m = x.amax(dim=-1)
    thr = torch.tensor([-3.4e38, 1.0, -3.4e38, 0.0, 2.0, 5.0, -3.4e38, 6.0, -1.0, 3.0, -3.4e38, 0.5][:n])
    thr = torch.minimum(thr, m.clamp(min=-3.4e38))  # the max is always kept, as the distribution's thresholds
    greedy = torch.tensor([0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0][:n], dtype=torch.bool)
    seed = torch.tensor([1, -5, 2**62, 7, 7, 9, 123456789012, -(2**63), 2**63 - 1, 0, 3, 3][:n])
    position = torch.tensor([0, 10, 3, 4, 4, 2**31, 99, 2**32 - 1, 7, 7, 8, 8][:n])
    return tuple(t.to(DEVICE) for t in (x, m, thr, greedy, seed, position))


@pytest.mark.parametrize("chunks,block", [(None, 512), (1, 128), (3, 64), (64, 16)])
def test_the_kernels_draw_what_the_reference_draws(chunks, block):
    args = rows()
    want = draw(*args)
    got = draw_kernel.draw(TRITON._launch, *args, chunks=chunks, block=block, scan_block=block)
    assert torch.equal(got, want), (got, want)
    x, _, thr, greedy = args[:4]
    assert got[2] == 0 and got[3] < 100  # a row of -inf alone: 0; a mask is kept
    assert torch.equal(got[greedy], x[greedy].argmax(dim=-1))  # greedy rows: the first of the maxima
    kept = ~greedy & (thr > -1e38)
    assert (x.gather(1, got[:, None])[:, 0][kept] >= thr[kept]).all()


def test_the_ops_take_the_kernels_and_no_rows_is_nothing():
    args = rows()
    assert torch.equal(TRITON.draw(*args), draw(*args))
    empty = draw_kernel.draw(TRITON._launch, *(a[:0] for a in args))
    assert empty.shape == (0,) and empty.dtype == torch.long


HOPPER_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from eyas.spec.draw_kernel import _draw_pick_kernel, _draw_sums_kernel

p, i = "*fp32", "*i64"
kernels = [(_draw_sums_kernel, dict(x=p, m=p, thr=p, sums=p, maxv=p, maxi=i, V="i32", CHUNK="i32", S="i32"), {}),
           (_draw_pick_kernel, dict(x=p, m=p, thr=p, greedy="*u8", seed=i, position=i, sums=p, maxv=p, maxi=i, out=i,
                                    V="i32", CHUNK="i32", S="i32"), dict(S_P2=64))]
for fn, sig, extra in kernels:
    for pdl in (True, False):
        const = dict(BLOCK=512, PDL=pdl, **extra)
        src = triton.compiler.ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        assert not pdl or ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
print("compiled")
"""


def test_kernels_compile_for_hopper():
    """The compiler checks what the interpreter does not (uint32 products, loop-carried types): sm_90, no GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
