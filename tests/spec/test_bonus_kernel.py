"""The bonus draw's Triton kernels (``spec.bonus_kernel``) against their torch reference (``TreeOps.bonus``),
and the sampler on them.

Without a GPU the kernels run in Triton's interpreter (``conftest``). The reference's cumsum and the
kernels' chunk sums add in different orders, so a target within rounding of the boundary between two
tokens may go either way: each row's uniform is chosen (``case``) so that its target lies well inside
one token's share of the mass (or at an end, where both take the first or the last positive token),
and that token is the answer the float64 weights give; the reference is checked to give it too.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
from scipy.stats import chisquare

from eyas.engine import sampler
from eyas.sample.sampling import SamplingParams, SamplingRows
from eyas.spec.ops import TORCH
from eyas.spec.tree import Tree

kernels = pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
from eyas.models.kernel_settings import KernelSettings
from eyas.spec import bonus_kernel, tree_kernels

TRITON = tree_kernels.SpecTritonOps(KernelSettings(measure=False))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF = float("inf")
FLOAT_MIN = torch.finfo(torch.float32).min
U_MAX = 1.0 - 2.0**-24  # the largest draw rng.uniform gives
# each row's kind, in turn: where its target lies and what the row holds
KINDS = ["mid", "min-p, the argmax rejected", "tiny temperature", "masked", "u 0, the first kept rejected", "low",
         "high", "u max, rejected after the last", "top-1", "nothing left", "flat", "u 1, rejected after the last"]


@pytest.fixture(autouse=True)
def no_kernel_fell_back():
    """A kernel that raised falls back to the reference, which would pass the comparison without it."""
    yield
    assert kernels.failures() == {}


@pytest.fixture(autouse=True)
def kernel_at_every_row_count(monkeypatch, request):
    """The kernel at every row count, also where ``ROW_TABLE`` keeps the reference (until a GPU times it)."""
    if "dispatch" not in request.node.name:
        monkeypatch.setattr(bonus_kernel, "ROW_TABLE", ((1 << 62, True),))


def test_dispatch_follows_the_row_table(monkeypatch):
    """``ROW_TABLE`` decides: shipped, every row count takes the kernel (measured faster on the H200)."""
    launched = []
    monkeypatch.setattr(bonus_kernel, "bonus", lambda *a, **k: launched.append(1))
    x = torch.randn(3, 1, 40)
    args = (x, torch.zeros(3, dtype=torch.long), x[:, 0].amax(-1), torch.full((3,), FLOAT_MIN), None, None,
            torch.rand(3))
    TRITON.bonus(*args)
    assert launched == [1] and all(on for _, on in bonus_kernel.ROW_TABLE)
    monkeypatch.setattr(bonus_kernel, "ROW_TABLE", ((3, False), (1 << 62, True)))
    TRITON.bonus(*args)
    assert launched == [1]  # 3 rows: the reference


def weights(x, f, m, thr, rejected, valid) -> torch.Tensor:
    """[B, V] float64: the reference's weights at node ``f``, the rejected tokens' zeroed."""
    xf = x[torch.arange(x.shape[0]), f].double()
    w = torch.exp(xf - m.double()[:, None]) * (xf >= thr[:, None])
    if rejected is not None:
        for r in range(x.shape[0]):
            w[r, rejected[r][valid[r]]] = 0.0
    return w


def case(v: int, b: int, seed: int = 0):
    """(x [b, 3, v], f, m, thr, rejected [b, 4], valid, u, want) for ``b`` rows cycling through ``KINDS``;
    ``want`` [b] the token float64 arithmetic picks, the target at least 2e-5 of itself from either end
    of that token's share (or at an end of the row)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 3, v, generator=gen) * 3
    f = torch.randint(0, 3, (b,), generator=gen)
    rejected = torch.randint(0, v, (b, 4), generator=gen)
    valid = torch.rand(b, 4, generator=gen) < 0.7
    thr = torch.full((b,), FLOAT_MIN)
    kind = [KINDS[r % len(KINDS)] for r in range(b)]
    for r, name in enumerate(kind):
        row = x[r, f[r]]
        if name == "tiny temperature":
            row /= 0.01
            valid[r] = False
        elif name == "masked":
            keep = torch.randperm(v, generator=gen)[: max(1, min(20, v // 3))]
            row[torch.ones(v, dtype=torch.bool).index_fill_(0, keep, False)] = -INF
        elif name == "flat":
            row *= 0.15
        elif name == "top-1":
            valid[r] = False
    m = x[torch.arange(b), f].amax(-1)
    for r, name in enumerate(kind):
        row = x[r, f[r]]
        if name.startswith("min-p"):
            thr[r] = m[r] + math.log(0.05)
            rejected[r, 0], valid[r, 0] = row.argmax(), True
        elif name in ("top-1", "nothing left"):
            thr[r] = m[r]
            rejected[r], valid[r] = row.argmax(), name == "nothing left"
        elif name.startswith("u 0"):
            rejected[r, 0], valid[r, 0] = 0, True
            row[0] = m[r] - 1  # kept, and rejected: the kernel must pass it
        elif name in ("high", "u max, rejected after the last", "u 1, rejected after the last"):
            valid[r] = False
            last = v - 1 - (3 if name.startswith("u ") else 0) if v > 4 else v - 1
            row[last:] = -INF
            row[last] = m[r]  # the last kept token holds much of the mass: a target near 1 is its
            if name.startswith("u ") and v > 4:
                row[last + 1:] = m[r] - 0.5  # kept but rejected: the fallback must pass them
                rejected[r, :3], valid[r, :3] = torch.arange(last + 1, v), True
    w = weights(x, f, m, thr, rejected, valid)
    total = w.sum(-1)
    cum = w.cumsum(-1)
    u = torch.zeros(b, dtype=torch.float64)
    want = torch.zeros(b, dtype=torch.long)
    for r, name in enumerate(kind):
        positive = (w[r] > 0).nonzero()[:, 0]
        if name == "nothing left":
            assert len(positive) == 0
            u[r] = float(torch.rand((), generator=gen))  # no weight: token 0, as the reference
            continue
        if name.startswith("u 0"):
            u[r], want[r] = 0.0, positive[0]
            continue
        if name.startswith(("u max", "u 1")):  # u 1: past every draw, the target at the total (the fallback)
            u[r], want[r] = U_MAX if name.startswith("u max") else 1.0, positive[-1]
            continue
        if name == "low":
            j, a = positive[0], 0.01
        elif name == "high":
            j, a = positive[-1], 0.99
        else:
            heavy = (w[r] >= 0.05 * w[r].max()).nonzero()[:, 0]  # flat: the first, so the target stays small
            j = heavy[0 if name == "flat" else torch.randint(0, len(heavy), (), generator=gen)]
            a = 0.25 + 0.5 * float(torch.rand((), generator=gen))
        u[r] = (cum[r, j] - (1 - a) * w[r, j]) / total[r]
        want[r] = j
        assert min(a, 1 - a) * w[r, j] >= 2e-5 * cum[r, j], (name, r)  # rounding in float32 sums scales with them
    u = u.float()
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    return (*map(dev, (x, f, m, thr, rejected, valid, u, want)),)


CONFIGS = [{}, dict(chunks=7, block=64, scan_block=32), dict(chunks=1, block=128, scan_block=128, warps=2,
                                                          scan_warps=1)]


@pytest.mark.parametrize("config", range(len(CONFIGS)), ids=["default", "7 chunks", "one chunk"])
@pytest.mark.parametrize("v,b", [(5, 12), (100, 22), (1000, 12), (3001, 24), (49152, 12)])
def test_the_kernel_picks_the_references_token(v, b, config):
    if v == 49152 and config:
        pytest.skip("the vocabulary's size at the default configuration only (the interpreter is slow)")
    x, f, m, thr, rejected, valid, u, want = case(v, b, seed=v + b)
    ref = TORCH.bonus(x, f, m, thr, rejected, valid, u)
    assert torch.equal(ref, want), (ref != want).nonzero()
    got = bonus_kernel.bonus(TRITON._launch, x, f, m, thr, rejected, valid, u, **CONFIGS[config])
    assert got.dtype == torch.long and torch.equal(got, want), (got != want).nonzero()


def test_ignoring_the_rejected_tokens_would_fail():
    """The cases' rejected tokens carry mass: without them most tokens move, and none is ever picked."""
    x, f, m, thr, rejected, valid, u, want = case(300, 33, seed=1)
    assert (TORCH.bonus(x, f, m, thr, None, None, u) != want).float().mean() > 0.3
    got = TRITON.bonus(x, f, m, thr, rejected, valid, u)
    assert torch.equal(got, want)
    picked_rejected = ((rejected == got[:, None]) & valid).any(-1)
    assert not picked_rejected[[r for r in range(33) if KINDS[r % len(KINDS)] != "nothing left"]].any()


def test_no_rejected_tokens_and_none_valid_are_the_same():
    x, f, m, thr, rejected, valid, u, _ = case(200, 12, seed=2)
    none = TRITON.bonus(x, f, m, thr, None, None, u)
    assert torch.equal(none, TRITON.bonus(x, f, m, thr, rejected, torch.zeros_like(valid), u))
    assert torch.equal(none, TRITON.bonus(x, f, m, thr, rejected[:, :0], valid[:, :0], u))
    assert torch.equal(none, TORCH.bonus(x, f, m, thr, None, None, u))


def test_x_is_read_in_place_through_its_strides():
    """One node's row shared by every row of the batch (stride 0), a strided ``u``: no copies needed."""
    x, f, m, thr, rejected, valid, u, _ = case(400, 9, seed=3)
    shared = x[:1].expand(9, 3, 400)
    m = shared[torch.arange(9), f].amax(-1)
    lanes = torch.stack([u, u * 0.5], dim=1)  # u a column of a [B, 2]
    got = TRITON.bonus(shared, f, m, thr, rejected, valid, lanes[:, 0])
    assert torch.equal(got, TRITON.bonus(shared.contiguous(), f, m, thr, rejected, valid, u.clone()))
    assert torch.equal(got, TORCH.bonus(shared, f, m, thr, rejected, valid, u))


@pytest.mark.parametrize("rows,vocab", [(1, 49152), (4, 49152), (16, 152064), (64, 49152), (5000, 49152), (3, 100)])
def test_launch_config_covers_the_row_in_whole_blocks(rows, vocab):
    chunks, chunk = bonus_kernel.launch_config(rows, vocab)
    assert chunk % bonus_kernel.BLOCK == 0 and (chunks - 1) * chunk < vocab <= chunks * chunk
    assert 1 <= chunks <= min(bonus_kernel.CHUNKS, max(1, bonus_kernel.PROGRAMS // rows))
    if rows <= 16 and vocab > 10000:  # few rows: many chunks each
        assert chunks >= bonus_kernel.CHUNKS // 2


def test_the_bonus_alone_draws_the_residual_exactly():
    """Chi-square: the kernel's draws at one node (two chunks of eight) against ``p`` with the rejected
    tokens' mass removed, renormalised; the same draws with the rejected tokens ignored land on them."""
    n, v = 600, 12
    gen = torch.Generator().manual_seed(4)
    row = torch.randn(v, generator=gen) * 1.2
    rejected = row.argsort(descending=True)[:3]  # the likeliest: the residual is far from p
    x = row.expand(n, 1, v).to(DEVICE)
    f = torch.zeros(n, dtype=torch.long, device=DEVICE)
    m = x[:, 0].amax(-1)
    thr = torch.full((n,), FLOAT_MIN, device=DEVICE)
    rej = rejected.expand(n, 3).to(DEVICE)
    valid = torch.ones(n, 3, dtype=torch.bool, device=DEVICE)
    u = TORCH.uniform(torch.arange(n, device=DEVICE), torch.full((n,), 5, device=DEVICE), 1)[:, 0]
    exact = torch.softmax(row.double(), -1).index_fill(0, rejected, 0.0)
    exact = exact / exact.sum()
    kept = exact > 0
    config = dict(chunks=2, block=8, scan_block=4)
    got = bonus_kernel.bonus(TRITON._launch, x, f, m, thr, rej, valid, u, **config)
    counts = torch.bincount(got.cpu(), minlength=v)
    assert counts[rejected].sum() == 0
    assert chisquare(counts[kept].double(), exact[kept] * n).pvalue > 1e-3
    ignoring = bonus_kernel.bonus(TRITON._launch, x[:200], f[:200], m[:200], thr[:200], None, None, u[:200], **config)
    assert torch.isin(ignoring.cpu(), rejected).float().mean() > 0.3


class Launches:
    """``TRITON._launch``, recording the kernels it launches."""

    def __init__(self, monkeypatch):
        self.kernels = []
        launch = TRITON._launch
        monkeypatch.setattr(TRITON, "_launch", lambda kernel, grid, *a, **kw: self.kernels.append(kernel) or launch(
            kernel, grid, *a, **kw))


def test_the_plain_step_and_the_first_token_take_the_kernel(monkeypatch):
    """A root-only tree (the plain sampled step, the prefill's first token): the same op, the same tokens."""
    params = [SamplingParams(temperature=0.8), SamplingParams(), SamplingParams(temperature=1.2, top_p=0.9, top_k=9),
              SamplingParams(temperature=0.05, min_p=0.1)] * 3
    sr = SamplingRows.build(params, list(range(len(params))), DEVICE)
    logits = (torch.randn(len(params), 500, generator=torch.Generator().manual_seed(6)) * 2).to(DEVICE)
    lengths = torch.arange(len(params), device=DEVICE) + 7
    launches = Launches(monkeypatch)
    got = sampler.first_tokens(logits, sr.kind, sr.floats, sr.ints, lengths, None, TRITON)
    assert launches.kernels.count(bonus_kernel._bonus_pick_kernel) == 1
    assert torch.equal(got, sampler.first_tokens(logits, sr.kind, sr.floats, sr.ints, lengths, None, TORCH))
    root = Tree.root_only(got)
    step = sampler.accept(root, logits[:, None], 1, sr.kind, sr.floats, sr.ints, lengths + 1, 0, TRITON)
    assert launches.kernels.count(bonus_kernel._bonus_pick_kernel) == 2
    want = sampler.accept(root, logits[:, None], 1, sr.kind, sr.floats, sr.ints, lengths + 1, 0, TORCH)
    for g, w in zip(step, want):
        assert torch.equal(g, w)
    assert torch.equal(step[2][1::4], logits[1::4].argmax(-1))  # greedy rows: the argmax, not the draw


HOPPER_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from eyas.spec.bonus_kernel import _bonus_pick_kernel, _bonus_sums_kernel
common = {"x": "*fp32", "f": "*i64", "m": "*fp32", "thr": "*fp32", "rejected": "*i64", "valid": "*u8"}
ints = {"s_b": "i64", "s_t": "i64", "V": "i32", "K": "i32", "CHUNK": "i32", "S": "i32"}
sums = {**common, "sums": "*fp32", **ints}
pick = {**common, "u": "*fp32", "s_u": "i64", "sums": "*fp32", "out": "*i64", **ints}
for rejected, pdl in [(True, True), (False, False)]:
    for fn, sig, const in [(_bonus_sums_kernel, sums, dict(REJECTED=rejected, K_P2=8, BLOCK=512, PDL=pdl)),
                           (_bonus_pick_kernel, pick, dict(REJECTED=rejected, K_P2=8, S_P2=64, BLOCK=512, PDL=pdl))]:
        src = triton.compiler.ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
        options = {"num_warps": 4, "num_stages": 1}
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
        assert not pdl or ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
print("compiled")
"""


def test_kernels_compile_for_hopper():
    """The compiler checks what the interpreter does not (globals, loop-carried types): sm_90, no GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
