"""The walk of tree rejection sampling as a Triton kernel (``spec.rejection_kernel``) against its torch
reference (``spec.rejection.walk``), which ``test_device_sampling`` holds to the exact distribution.

Without a GPU the kernel runs in Triton's interpreter (``conftest``). Random trees and logits, the drafted
tokens made likely so that paths run deep; rows mix greedy and sampled settings, and the edges where the
kept tokens are exactly a node's children (top-k 1, a tiny top-p, a grammar's mask), where the last kept
child must take what is left.
"""

import math
import os
import subprocess
import sys

import pytest
import torch

from eyas.engine import sampler
from eyas.sample.sampling import SamplingParams, SamplingRows
from eyas.spec.ops import TORCH
from eyas.spec.tree import Tree

pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
from eyas.models.kernel_settings import KernelSettings
from eyas.models.kernels import triton_ops
from eyas.spec import rejection_kernel, tree_kernels

TRITON = tree_kernels.SpecTritonOps(KernelSettings(measure=False))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(), SamplingParams(temperature=0.7, top_k=1),
            SamplingParams(temperature=1.0, top_p=0.01), SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
            SamplingParams(temperature=1.3, min_p=0.2), SamplingParams(temperature=1.0, top_k=2)]


@pytest.fixture(autouse=True)
def no_kernel_fell_back():
    """A kernel that raised falls back to the reference, which would pass the comparison without it."""
    yield
    assert triton_ops.failures() == {}


def random_trees(gen: torch.Generator, rows: int, size: int, vocab: int) -> Tree:
    """Each row its own tree: node ``j``'s parent drawn among the nodes before it, its token distinct."""
    parents = torch.stack([torch.tensor([-1] + [int(torch.randint(0, j, (), generator=gen)) for j in range(1, size)])
                           for _ in range(rows)])
    tokens = torch.stack([torch.randperm(vocab, generator=gen)[:size] for _ in range(rows)])
    return Tree.from_parents(tokens, parents)


def case(size: int, rows: int, seed: int, mask_all_but_children: bool = False):
    gen = torch.Generator().manual_seed(seed)
    vocab = 40
    tree = random_trees(gen, rows, size, vocab)
    logits = torch.randn(rows, size, vocab, generator=gen)
    for r in range(rows):
        for j in range(1, size):
            if torch.rand((), generator=gen) < 0.7:
                logits[r, tree.parents[r, j], tree.tokens[r, j]] += 6
    if mask_all_but_children:  # a grammar that allows a node's children alone
        allowed = torch.zeros_like(logits, dtype=torch.bool)
        for r in range(rows):
            for j in range(1, size):
                allowed[r, tree.parents[r, j], tree.tokens[r, j]] = True
        allowed[..., 0] |= ~allowed.any(-1)  # a leaf keeps one token
        logits = logits.masked_fill(~allowed, float("-inf"))
    params = [SETTINGS[r % len(SETTINGS)] for r in range(rows)]
    sr = SamplingRows.build(params, list(range(rows)), DEVICE)
    width = int(tree.depth.max()) + 1
    k = max(1, int((tree.parents[:, None, :] == torch.arange(size)[None, :, None]).sum(-1).max()))
    tree = Tree(*(t.to(DEVICE) for t in (tree.tokens, tree.parents, tree.depth, tree.mask)))
    u = sampler.draws(sr.seed, torch.arange(rows, device=DEVICE) + 3, width, k)
    return tree, logits.to(DEVICE), sr, u, width


@pytest.mark.parametrize("size,seed,masked", [(2, 0, False), (5, 1, False), (9, 2, False), (16, 3, False),
                                              (9, 4, True)])
def test_the_kernel_walks_the_references_path(size, seed, masked):
    tree, logits, sr, u, width = case(size, 28, seed, masked)
    b, t, v = logits.shape
    x, m, thr, z = TORCH.distribution(logits.reshape(b * t, v), sr.floats.repeat_interleave(t, 0),
                                      sr.ints.repeat_interleave(t, 0), True)
    x, m, thr, z = x.view(b, t, v), m.view(b, t), thr.view(b, t), z.view(b, t)
    greedy = sr.floats[:, 0] <= 0
    args = (tree.tokens, tree.parents, tree.depth, tree.mask, x, m, thr, z, greedy, u, width)
    got, want = TRITON.walk(*args), TORCH.walk(*args)
    for name in ("cols", "counts", "last", "m", "thr", "valid", "u"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert torch.equal(got.rejected[want.valid], want.rejected[want.valid])
    assert torch.equal(got.argmax[greedy], want.argmax[greedy])
    assert want.counts.max() > min(2, size - 1)  # paths run deep
    assert masked or (want.counts == 1).any()  # and stop at the root (masked: every kept token a child)


def test_the_argmax_and_kept_count_pass_equals_torch():
    """``_argmax_kept_kernel``: the first of equal maxima (as ``torch.argmax``), a row of -inf alone (index
    0), the count of entries at or above the threshold (-inf included where it is -inf), a width that is
    not a multiple of the block."""
    gen = torch.Generator().manual_seed(11)
    rows, v = 9, 2500
    x = torch.randint(-4, 4, (rows, v), generator=gen).float()  # many equal maxima
    x[1] = float("-inf")
    x[2, 2400:] = 9.0  # the maximum only past the first blocks, twice
    x[3, ::7] = float("-inf")
    thr = torch.tensor([2.0, float("-inf"), 9.0, float("-inf"), -3.0, 3.0, 4.0, 0.0, -5.0])
    x, thr = x.to(DEVICE), thr.to(DEVICE)
    argmax, kept = (torch.empty(rows, dtype=torch.long, device=DEVICE) for _ in range(2))
    TRITON._launch(rejection_kernel._argmax_kept_kernel, (rows,), x, thr, argmax, kept, v, BLOCK=1024, num_warps=4)
    assert torch.equal(argmax, x.argmax(-1)) and argmax[1] == 0 and argmax[2] == 2400
    assert torch.equal(kept, (x >= thr[:, None]).sum(-1))


def test_the_last_kept_child_takes_what_is_left():
    """Two kept tokens at each node, both its children, and ``z`` a little above their sum (rounding): at the
    largest draw the renormalised rule alone rejects both; the second must be taken, down to the leaf."""
    rows, size = 3, 7
    parents = torch.tensor([[-1, 0, 0, 2, 2, 4, 4]] * rows)
    tree = Tree.from_parents(torch.tensor([[9, 1, 2, 3, 4, 5, 6]] * rows), parents)
    x = torch.full((rows, size, 12), -30.0)
    for node, (a, b) in {0: (1, 2), 2: (3, 4), 4: (5, 6)}.items():
        x[:, node, a], x[:, node, b] = 0.0, -0.5
    m, thr = torch.zeros(rows, size), torch.full((rows, size), -1.0)
    z = torch.full((rows, size), (1 + math.exp(-0.5)) * (1 + 1e-5))
    u = torch.full((rows, 4, 3), 1.0 - 2.0**-24)
    args = (*(t.to(DEVICE) for t in (tree.tokens, parents, tree.depth, tree.mask, x, m, thr, z)),
            torch.tensor([False, False, True], device=DEVICE), u.to(DEVICE), 4)
    got, want = TRITON.walk(*args), TORCH.walk(*args)
    assert got.counts.tolist() == want.counts.tolist() == [4, 4, 2]  # the greedy row takes the argmax, 1
    assert got.cols[0].tolist() == want.cols[0].tolist() == [0, 2, 4, 6]


HOPPER_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from eyas.spec.rejection_kernel import _argmax_kept_kernel, _walk_kernel
ptrs = ["x", "m", "thr", "z"]
sig = {**{p: "*fp32" for p in ptrs}, "kept": "*i64", "argmax": "*i64", "greedy": "*u8", "tokens": "*i64",
       "parents": "*i64", "u": "*fp32", "cols": "*i64", "counts": "*i64", "last": "*i64", "m_f": "*fp32",
       "thr_f": "*fp32", "u_f": "*fp32", "rejected": "*i64", "valid": "*u8", "argmax_f": "*i64",
       "T": "i32", "V": "i32", "WIDTH": "i32", "K": "i32"}
for pdl in (True, False):
    const = dict(T_P2=64, W_P2=8, K_P2=8, PDL=pdl)
    src = triton.compiler.ASTSource(fn=_walk_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                                    constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
    assert not pdl or ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
sig = {"x": "*fp32", "thr": "*fp32", "argmax": "*i64", "kept": "*i64", "V": "i32"}
const = dict(BLOCK=4096, PDL=True)
src = triton.compiler.ASTSource(fn=_argmax_kept_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                                constexprs=const)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
assert ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
print("compiled")
"""


def test_the_kernel_compiles_for_hopper():
    """The compiler checks what the interpreter does not (loop-carried types in the walk's branches): sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


def test_the_step_takes_the_kernel(monkeypatch):
    launched = []
    launch = TRITON._launch
    monkeypatch.setattr(TRITON, "_launch", lambda kernel, grid, *a, **kw: launched.append(kernel) or launch(
        kernel, grid, *a, **kw))
    tree, logits, sr, u, width = case(5, 4, 6)
    sampler.accept_rows(tree, logits, width, sr.floats, sr.ints, u, True, TRITON)
    assert launched.count(rejection_kernel._walk_kernel) == 1
