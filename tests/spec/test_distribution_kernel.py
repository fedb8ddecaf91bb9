"""The sampling distribution's Triton kernels (``spec.distribution_kernel``: one program a row, and the split
of each row over many) against their torch reference (``spec.distribution.distribution``, a sort), and the
sampler on them.

Without a GPU the kernel runs in Triton's interpreter (``conftest``). Logits are random (a top-p
boundary within rounding of the mass is then practically impossible: the two sum ``exp`` in different
orders), except a row of tied logits at its top-k boundary, where no mass is compared.
"""

import os
import subprocess
import sys

import pytest
import torch
from distributions import TREE, batch_tree, emitted, pvalue, step_distribution, tree_and_logits

from eyas.engine import sampler
from eyas.sample import logprobs
from eyas.sample.sampling import SamplingParams, SamplingRows, probs
from eyas.spec.ops import TORCH, SpecTorchOps
from eyas.spec.tree import Tree

kernels = pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
from eyas.models.kernel_settings import KernelSettings
from eyas.spec import distribution_kernel, tree_kernels

TRITON = tree_kernels.SpecTritonOps(KernelSettings(measure=False))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF = float("inf")

# (temperature, top_p, min_p, top_k) per row: every filter alone and together, and the edges
ROWS = [(0.0, 1.0, 0.0, 0), (0.0, 0.9, 0.0, 5),  # greedy rows (temperature 1, their filters as the reference's)
        (0.7, 1.0, 0.0, 0), (1.0, 1.0, 0.0, 20), (1.0, 0.9, 0.0, 0), (0.8, 0.8, 0.0, 7), (1.3, 1.0, 0.1, 0),
        (0.9, 0.95, 0.05, 50), (1.0, 1.0, 0.0, 1), (1.0, 0.01, 0.0, 0), (0.6, 0.5, 0.0, 10**6),
        (1.0, 1.0, 0.0, 40),  # -inf entries (a grammar's mask) and top-k past the finite ones
        (1.0, 1.0, 0.0, 6)]  # tied logits at the top-k boundary
MASKED, TIED = len(ROWS) - 2, len(ROWS) - 1


@pytest.fixture(autouse=True)
def no_kernel_fell_back():
    """A kernel that raised falls back to the reference, which would pass the comparison without it."""
    yield
    assert kernels.failures() == {}


Config = distribution_kernel.Config
ONE = Config(1, distribution_kernel.SPLIT, distribution_kernel.BLOCK, 8)  # one program a row
# the split at a vocabulary each: programs a row, candidates a pass (a 5-way search to a 257-way one), chunks of a
# block or more, the last one short (1000: 4 of 256; 100: 4 of 32; 3001: 3 of 1024; 300: 10 of 32)
SPLITS = [(Config(4, 16, 32, 4), 1000), (Config(5, 4, 16, 2), 100), (Config(3, 64, 64, 4), 3001),
          (Config(16, 256, 16, 4), 300)]


@pytest.fixture(autouse=True)
def kernel_at_every_row_count(monkeypatch, request):
    """The kernel at every row count, also where ``ROW_CONFIGS`` measured the sort faster (None)."""
    if "dispatch" not in request.node.name:
        table = tuple((most, config or ONE) for most, config in distribution_kernel.ROW_CONFIGS)
        monkeypatch.setattr(distribution_kernel, "ROW_CONFIGS", table)


def test_dispatch_takes_the_sort_the_split_or_one_program_by_rows(monkeypatch):
    split = Config(3, 16, 128, 4)  # 300 entries: chunks of 128, the last short
    monkeypatch.setattr(distribution_kernel, "ROW_CONFIGS", ((4, None), (6, split), (1 << 62, Config(1, 16, 128, 4))))
    launches = []
    launch = TRITON._launch
    monkeypatch.setattr(TRITON, "_launch", lambda kernel, grid, *a, **kw: launches.append(grid) or launch(
        kernel, grid, *a, **kw))
    logits, floats, ints = case(300)
    for rows in (3, 5, 8):
        got = TRITON.distribution(logits[:rows], floats[:rows], ints[:rows], True)
        check_equal(got, TORCH.distribution(logits[:rows], floats[:rows], ints[:rows], True))
    passes = 2 * distribution_kernel.passes(16) + 1  # top-k's, top-p's, z's; then the sum
    assert launches == [(5, 3)] * passes + [(5,), (8,)]  # 3 rows took the sort, 5 the split, 8 one program a row
    assert distribution_kernel.launch_config(3, False) is not None  # unfiltered rows: always a kernel
    monkeypatch.setattr(distribution_kernel, "UNFILTERED_CONFIGS", ((6, split), (1 << 62, ONE)))
    launches.clear()
    floats[:, 1], ints[:, 0] = 1.0, 0
    check_equal(TRITON.distribution(logits[:5], floats[:5], ints[:5], False),
                TORCH.distribution(logits[:5], floats[:5], ints[:5], False))
    assert launches == [(5, 3), (5, 3), (5,)]  # the max, z, the sum


def case(v: int, seed: int = 0):
    """(logits [N, v], floats [N, 3], ints [N, 2]) of ``ROWS``."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(ROWS), v, generator=gen) * 3
    logits[MASKED, torch.randperm(v, generator=gen)[: v - 30]] = -INF  # 30 finite entries, top-k 40
    logits[[4, 5], :20] = -INF  # and in a top-p row, a top-k and top-p one
    logits[TIED] = torch.randint(0, 4, (v,), generator=gen).float()  # 4 values: many tied at the 6th
    floats = torch.tensor([[t, p, mp] for t, p, mp, _ in ROWS])
    ints = torch.tensor([[k, 7] for *_, k in ROWS])
    return logits.to(DEVICE), floats.to(DEVICE), ints.to(DEVICE)


def check_equal(got, want):
    """Bit for bit but ``z``, whose sum runs in another order."""
    (x, m, thr, z), (rx, rm, rthr, rz) = got, want
    assert torch.equal(x, rx) and torch.equal(m, rm)
    assert torch.equal(thr, rthr), (thr - rthr).nonzero()
    torch.testing.assert_close(z, rz, rtol=2e-6, atol=0)


@pytest.mark.parametrize("v", [100, 512, 1000, 3000])  # below, at and past the 512-entry block
@pytest.mark.parametrize("filtered", [True, False])
def test_kernel_gives_the_references_thresholds(v, filtered):
    logits, floats, ints = case(v, seed=v)
    if not filtered:  # only for rows that use neither top-k nor top-p
        floats[:, 1], ints[:, 0] = 1.0, 0
    want = TORCH.distribution(logits, floats, ints, filtered)
    check_equal(TRITON.distribution(logits, floats, ints, filtered), want)
    thr = want[2]
    assert (thr[[TIED, 8]] == logits[[TIED, 8]].amax(-1)).all() or not filtered  # ties kept; top-k 1: the max
    if filtered:
        assert thr[MASKED] == torch.finfo(torch.float32).min  # past the finite entries: all of them, no -inf
        assert (logits[TIED] >= thr[TIED]).sum() >= 6


@pytest.mark.parametrize("split", [1, 4])  # binary search; a 5-way one (the default: 17)
def test_every_split_of_the_search_lands_on_the_same_value(split):
    logits, floats, ints = case(700, seed=split)
    got = distribution_kernel.distribution(TRITON._launch, logits, floats, ints, True, Config(1, split, 128, 4))
    check_equal(got, TORCH.distribution(logits, floats, ints, True))


@pytest.mark.parametrize("config,v", SPLITS, ids=str)
@pytest.mark.parametrize("filtered", [True, False])
def test_the_split_gives_the_references_thresholds(config, v, filtered):
    logits, floats, ints = case(v, seed=v + config.programs)
    if not filtered:
        floats[:, 1], ints[:, 0] = 1.0, 0
    got = distribution_kernel.distribution(TRITON._launch, logits, floats, ints, filtered, config)
    check_equal(got, TORCH.distribution(logits, floats, ints, filtered))


TABLES = [(c, True) for _, c in distribution_kernel.ROW_CONFIGS if c]
TABLES += [(c, False) for _, c in distribution_kernel.UNFILTERED_CONFIGS if c]


@pytest.mark.parametrize("config,filtered", sorted(set(TABLES)), ids=str)
def test_every_launch_configuration_the_table_names(config, filtered):
    """The tables' configurations are chosen by time alone: each gives the reference's thresholds."""
    logits, floats, ints = case(3000, seed=config.block)
    if not filtered:
        floats[:, 1], ints[:, 0] = 1.0, 0
    got = distribution_kernel.distribution(TRITON._launch, logits, floats, ints, filtered, config)
    check_equal(got, TORCH.distribution(logits, floats, ints, filtered))


@pytest.mark.parametrize("rows", [1, 3, 5, 41])
@pytest.mark.parametrize("filtered", [True, False])
def test_the_splits_pointers_are_aligned_at_any_row_count(rows, filtered):
    """Triton compiles a kernel once per pattern of 16-byte-aligned pointers: a scratch buffer at an offset that
    is aligned for some row counts only made a served prefill of an odd count of prompts compile (seconds)."""
    pointers = []

    def launch(kernel, grid, *args, **kw):
        pointers.extend(a.data_ptr() for a in args if isinstance(a, torch.Tensor))

    logits, floats, ints = (t.repeat(rows, 1)[:rows] for t in case(3000))
    distribution_kernel.distribution(launch, logits, floats, ints, filtered, Config(64, 16, 256, 4))
    assert pointers and all(p % 16 == 0 for p in pointers)


def test_the_warm_up_rows_meet_every_launch_configuration():
    """``config_rows``: a row count for each configuration of both tables, which warm-up draws first tokens at."""
    rows = distribution_kernel.config_rows()
    for filtered, table in ((True, distribution_kernel.ROW_CONFIGS), (False, distribution_kernel.UNFILTERED_CONFIGS)):
        assert {distribution_kernel.launch_config(n, filtered) for n in rows} >= {c for _, c in table}


@pytest.mark.parametrize("config", [ONE, Config(4, 256, 2, 1), Config(2, 256, 4, 1)], ids=str)
def test_extreme_logits(config):
    """Signs, zeros (both), the largest floats: the search's key order is float32's. The split: chunks of
    two entries or four."""
    big = torch.finfo(torch.float32).max
    rows = torch.tensor([[0.0, -0.0, 1e-30, -1e-30, 5.0, -5.0, 0.0, 3.0],
                         [big / 2, -big / 2, 0.0, 1.0, big / 4, -INF, -INF, 2.0],
                         [-1e4, -1e4 - 1, -1e4 - 2, -1e4 - 2, -2e4, -3e4, -INF, -1e4 - 0.5]])
    settings = [(top_k, top_p) for top_k in (1, 2, 3, 4, 7) for top_p in (1.0, 0.2, 0.6, 0.999)]
    logits = rows.repeat(len(settings), 1).to(DEVICE)  # each row under each setting
    floats = torch.tensor([[1.0, top_p, 0.0] for _, top_p in settings for _ in rows], device=DEVICE)
    ints = torch.tensor([[top_k, 0] for top_k, _ in settings for _ in rows], device=DEVICE)
    got = distribution_kernel.distribution(TRITON._launch, logits, floats, ints, True, config)
    check_equal(got, TORCH.distribution(logits, floats, ints, True))


@pytest.fixture(params=["as measured", "split", "one program"])
def table(request, monkeypatch):
    """The dispatch's table as it is, the split at every row count, or one program a row at every row count."""
    if request.param == "split":
        monkeypatch.setattr(distribution_kernel, "ROW_CONFIGS", ((1 << 62, Config(2, 64, 256, 4)),))
    if request.param == "one program":
        monkeypatch.setattr(distribution_kernel, "ROW_CONFIGS", ((1 << 62, Config(1, 16, 128, 4)),))
    return request.param


def test_accept_rows_on_the_kernel_gives_the_same_tokens(table):
    """The same draws, the same acceptance and bonus tokens through either op, on random trees (the split,
    slower in the interpreter, on half as many)."""
    gen = torch.Generator().manual_seed(3)
    params = [SamplingParams(temperature=t, top_p=p, top_k=k, min_p=mp) for t, p, mp, k in ROWS[:-2]]
    params *= 1 if table == "split" else 2
    rows, v = len(params), 300
    tokens, logits = tree_and_logits(TREE, seed=5, vocab=v)
    tree, width, _ = batch_tree(TREE, tokens, rows)
    tree = Tree(*(t.to(DEVICE) for t in (tree.tokens, tree.parents, tree.depth, tree.mask)))
    logits = (logits + torch.randn(rows, len(TREE), v, generator=gen)).to(DEVICE)
    logits[:, :, tokens] += 2.0  # the drafted tokens likely, so paths run deep
    sr = SamplingRows.build(params, list(range(rows)), DEVICE)
    at = torch.full((rows,), 11, device=DEVICE)
    got = sampler.accept_rows(tree, logits, width, sr.floats, sr.ints, at, True, TRITON)
    want = sampler.accept_rows(tree, logits, width, sr.floats, sr.ints, at, True, TORCH)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert got[1].max() > 1
    lp = logprobs.log_probs(logits[:, :3], sr.floats, sr.ints, True, TRITON)
    ref = logprobs.log_probs(logits[:, :3], sr.floats, sr.ints, True, TORCH)
    assert torch.equal(lp.isinf(), ref.isinf())
    torch.testing.assert_close(lp, ref, rtol=0, atol=1e-5)


class Spy(SpecTorchOps):
    """The torch ops, recording which of ``distribution``'s callers reach it."""

    def __init__(self):
        self.calls = 0

    def distribution(self, *args, **kw):
        self.calls += 1
        return super().distribution(*args, **kw)


def test_the_sampler_and_logprobs_take_the_op_from_ops():
    params = [SamplingParams(temperature=0.8, top_p=0.9, logprobs=2), SamplingParams(temperature=1.0, top_k=3)]
    sr = SamplingRows.build(params, [1, 2], DEVICE)
    logits = torch.randn(2, 50, device=DEVICE)
    spy = Spy()
    firsts = sampler.first_tokens(logits, sr.kind, sr.floats, sr.ints, torch.tensor([4, 5], device=DEVICE), None,
                                  spy)
    assert spy.calls == 1
    logprobs.first_logprobs(logits, firsts, sr, spy)
    assert spy.calls == 2


class Unique(SpecTorchOps):
    """``TRITON.distribution`` once per distinct row (many rows share one node's logits and settings; the
    seed, which the distribution does not read, set apart)."""

    def distribution(self, logits, floats, ints, filtered):
        rows = torch.cat([logits, floats, ints[:, :1].float()], dim=1)
        keys, inverse = torch.unique(rows, dim=0, return_inverse=True)
        keys, v = keys.to(DEVICE), logits.shape[1]  # on a GPU the kernel runs there, not interpreted
        top_k = keys[:, v + 3:].long()
        out = TRITON.distribution(keys[:, :v], keys[:, v:v + 3], torch.cat([top_k, top_k * 0], 1), filtered)
        return tuple(o.to(logits.device)[inverse] for o in out)


SETTINGS = [SamplingParams(temperature=0.7, top_k=3), SamplingParams(temperature=1.0, top_p=0.8),
            SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05)]


def assert_exact_per_row(ops, per: int, position: int) -> None:
    """Chi-square, as ``test_device_sampling``: the tokens ``accept_rows`` emits through ``ops`` (``per`` rows of
    each setting, drawn at ``position``) against the reference ``probs`` enumerated along the tree."""
    v = 8
    tokens, logits = tree_and_logits(TREE, seed=len(TREE), vocab=v)
    rows = per * len(SETTINGS)
    sr = SamplingRows.build([SETTINGS[r % len(SETTINGS)] for r in range(rows)], list(range(rows)), "cpu")
    tree, width, _ = batch_tree(TREE, tokens, rows)
    cols, counts, bonus = sampler.accept_rows(tree, logits.expand(rows, len(TREE), v), width, sr.floats, sr.ints,
                                              torch.full((rows,), position), True, ops)
    out = emitted(tree, cols, counts, bonus)
    for i, params in enumerate(SETTINGS):
        exact = step_distribution(TREE, tokens, lambda node, prefix, p=params: probs(logits[node], p))
        assert pvalue(out[i::len(SETTINGS)], exact) > 1e-3, params


def test_the_kernel_keeps_each_rows_exact_distribution(table):
    """The tokens ``accept_rows`` emits on the kernel's thresholds keep every row's distribution exactly."""
    assert_exact_per_row(Unique(), 8000, 17)


class UniqueAndDraw(Unique):
    """``Unique``'s distribution, and ``TRITON.draw`` (``draw_kernel``) on every row: each has its own draw."""

    def draw(self, *args):
        return TRITON.draw(*(a.to(DEVICE) for a in args)).cpu()


def test_the_draw_kernels_keep_each_rows_exact_distribution():
    """The same chi-square with the draws by their kernels: fewer rows in the interpreter (a program or two a
    row), still enough that a biased draw fails (``test_device_sampling``)."""
    assert_exact_per_row(UniqueAndDraw(), 8000 if DEVICE == "cuda" else 600, 19)


HOPPER_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from eyas.spec.distribution_kernel import _distribution_kernel, _split_kernel, _split_sum_kernel, NONE, MAX, TOP_K, \\
    TOP_P, Z

def barriers_in_loops(ptx):  # bar.sync between an inner loop's header and its branch back: a sync every read
    lines = ptx.splitlines()
    found = 0
    for i, line in enumerate(lines):
        head = lines[i:i + 4]
        if line.startswith("$L__BB") and any("Inner Loop Header" in x for x in head):
            label = line.split(":")[0]
            back = [j for j, x in enumerate(lines) if j > i and "bra" in x and x.rstrip().endswith(label + ";")]
            found += bool(back) and sum("bar.sync" in x for x in lines[i:max(back)])
    return found

def compile(fn, sig, const):
    src = triton.compiler.ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 1}).asm["ptx"]
    assert not const["PDL"] or ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
    assert not barriers_in_loops(ptx), f"{fn.__name__} {const}: a block-wide sync inside a pass's loop"

p, i = "*fp32", "*i64"
sig = dict(x=p, floats=p, log_min_p=p, ints=i, m_out=p, thr_out=p, z_out=p, V="i32")
for filtered, pdl in [(True, True), (False, False)]:
    compile(_distribution_kernel, sig, dict(FILTERED=filtered, BLOCK=512, R=16, PDL=pdl))
sig = dict(x=p, floats=p, log_min_p=p, ints=i, maxes=p, part_in=p, part_out=p, state_in=i, state_out=i, m_out=p,
           thr_out=p, V="i32", C="i32", S="i32")
for prev, kind, r in [(NONE, TOP_K, 64), (TOP_K, TOP_K, 64), (TOP_K, TOP_P, 64), (TOP_P, TOP_P, 64), (TOP_P, Z, 64),
                      (NONE, MAX, 1), (MAX, Z, 1)]:  # unfiltered rows: one candidate, none tested
    compile(_split_kernel, sig, dict(PREV=prev.value, KIND=kind.value, R=r, S_P2=128, BLOCK=256, PDL=kind is not MAX))
compile(_split_sum_kernel, dict(part=p, z_out=p, S="i32", W="i32"), dict(S_P2=128, PDL=True))
print("compiled")
"""


def test_kernel_compiles_for_hopper():
    """The compiler checks what the interpreter does not (globals, loop-carried types): sm_90, no GPU; each
    pass of the split."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


def test_warm_up_draws_first_tokens_at_every_launch_configuration(target, monkeypatch):
    """A prefill's group of prompts is any count, not a graph's bucket: warm-up draws first tokens, sampled and
    filtered, at a count of each launch configuration up to the batch, so none of their kernels compiles while a
    request waits (on a fresh GPU: seconds, in the served 64-client runs before this)."""
    from eyas.config import SpecConfig
    from eyas.engine.engine import Engine
    from eyas.engine.warmup import warm_first_tokens
    from eyas.models.native import NativeTarget

    seen = set()

    class Recording(SpecTorchOps):
        def distribution(self, logits, floats, ints, filtered):
            seen.add((logits.shape[0], filtered))
            return super().distribution(logits, floats, ints, filtered)

    engine = Engine(NativeTarget.from_target(target), None, SpecConfig("NONE"), max_batch=64)
    warm_first_tokens(engine)
    assert not seen  # the torch ops compile nothing
    engine.ops = Recording()
    warm_first_tokens(engine)
    wanted = [n for n in distribution_kernel.config_rows() if n <= 64]
    assert seen == {(n, f) for n in wanted for f in (True, False)} and 41 in wanted
