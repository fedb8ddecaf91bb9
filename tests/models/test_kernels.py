"""The Triton kernels (``eyas.models.kernels``, ``eyas.spec.tree_kernels`` and ``verify_kernels``) against the
torch ops they replace.

Without a GPU they run in Triton's interpreter (``conftest`` sets ``TRITON_INTERPRET=1``): the same
kernel code, its loads, masks, strides and stores, executed program by program on the CPU.
"""

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from helpers import reference_greedy
from test_native import PROMPTS, family_model
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from eyas.config import SpecConfig
from eyas.engine.engine import Engine
from eyas.engine_config import EngineConfig
from eyas.errors import EyasError
from eyas.models import kv_cache
from eyas.models.kernel_settings import KernelSettings
from eyas.models.llama import RopeTable
from eyas.models.native import NativeTarget
from eyas.models.static_cache import StaticKV
from eyas.sample.sampling import SamplingParams
from eyas.spec.ops import TORCH, kernel_ops, ops_for

kernels = pytest.importorskip("eyas.models.kernels.triton_ops", reason="Triton is not installed (pip install triton)")
from eyas.models.kernels import linear
from eyas.spec import tree_kernels

# On a GPU each projection shape runs the kernel ``kernel_choice`` timed fastest, often cuBLAS; these tests
# check eyas's own kernels, so they take the built-in choice there (``measure``), as on the CPU.
SETTINGS = KernelSettings(measure=False)
FORCED = replace(SETTINGS, mode="triton")  # the kernels on the CPU too, and their errors stand
TRITON = tree_kernels.SpecTritonOps(SETTINGS)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the CPU: Triton's interpreter


def ops_with(**changes) -> tree_kernels.SpecTritonOps:
    """The kernels under ``SETTINGS`` with ``changes`` (``row_linears=False``, ``mode="triton"``...)."""
    return tree_kernels.SpecTritonOps(replace(SETTINGS, **changes))


@pytest.fixture(autouse=True)
def no_kernel_fell_back():
    """A kernel that raised falls back to the torch op it replaces (``TritonOps._or_torch``), which
    would make its comparison here pass without it: every test must end with no family fallen back
    (the tests that make one fail on purpose restore ``FAILURES`` through ``monkeypatch`` first)."""
    yield
    assert kernels.failures() == {}

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 576, 100])
def test_rms_norm_matches_torch(dtype, width):
    torch.manual_seed(0)
    x = torch.randn(3, 5, width, dtype=dtype, device=DEVICE) * 3
    w = torch.randn(width, dtype=dtype, device=DEVICE)
    got, want = TRITON.rms_norm(x, w, 1e-5), TORCH.rms_norm(x, w, 1e-5)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tol(dtype))
    expanded = x[:, :1].expand(3, 4, width)  # a draft's hidden state, broadcast over a tree's frontier
    torch.testing.assert_close(TRITON.rms_norm(expanded, w, 1e-5), TORCH.rms_norm(expanded, w, 1e-5), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_cat_matches_torch(dtype):
    """An EAGLE-3 draft's input: the embedding and the hidden state (broadcast over a tree's frontier),
    each normed, side by side in one tensor, with no cat kernel."""
    torch.manual_seed(1)
    emb = torch.randn(3, 4, 64, dtype=dtype, device=DEVICE) * 2
    hidden = torch.randn(3, 1, 64, dtype=dtype, device=DEVICE).expand(3, 4, 64)
    parts = [(emb, torch.rand(64, dtype=dtype, device=DEVICE) + 0.5, 1e-6),
             (hidden, torch.rand(64, dtype=dtype, device=DEVICE) + 0.5, 1e-5)]
    got, want = TRITON.rms_norm_cat(parts), TORCH.rms_norm_cat(parts)
    assert got.shape == (3, 4, 128) and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tol(dtype))
    with pytest.raises(ValueError, match="leading shape"):
        TRITON._rms_norm_cat([parts[0], (hidden[:, :2], *parts[1][1:])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [96, 1536, 2500])  # one block, two, a ragged last block
def test_silu_mul_matches_torch(dtype, width):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 2 * width, dtype=dtype, device=DEVICE) * 4
    got, want = TRITON.silu_mul(x), TORCH.silu_mul(x)
    assert got.shape == (2, 3, width)
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(40, 72), (96, 576), (24, 2500)])  # ragged blocks; SmolLM2's width; K blocks
@pytest.mark.parametrize("norm,bias", [(False, False), (True, False), (True, True)])
def test_linear_matches_torch(dtype, shape, norm, bias):
    """A decode step's projection at batch 1, its RMSNorm (and Qwen2's bias) inside the kernel."""
    torch.manual_seed(5)
    n, k = shape
    x = torch.randn(1, 1, k, dtype=dtype, device=DEVICE) * 2
    w = (torch.randn(n, k, device=DEVICE) / k ** 0.5).to(dtype)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    nrm = (torch.rand(k, device=DEVICE).to(dtype) + 0.5, 1e-5) if norm else None
    got, want = TRITON.linear(x, w, b, nrm), TORCH.linear(x, w, b, nrm)
    assert got.shape == (1, 1, n) and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_add_matches_torch(dtype, bias):
    """The o and down projections: the residual added inside."""
    torch.manual_seed(6)
    n, k = 48, 200
    x = torch.randn(1, 1, k, dtype=dtype, device=DEVICE) * 2
    res = torch.randn(1, 1, n, dtype=dtype, device=DEVICE) * 4
    w = (torch.randn(n, k, device=DEVICE) / k ** 0.5).to(dtype)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    got, want = TRITON.linear_add(res, x, w, b), TORCH.linear_add(res, x, w, b)
    assert got.shape == res.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter,k,norm,bias", [(48, 200, True, False), (20, 72, False, True), (300, 64, True, True)])
def test_linear_silu_matches_torch(dtype, inter, k, norm, bias):
    """Gate/up at batch 1: each program reads matching gate and up rows of ``[gate; up]`` and writes
    ``silu(gate) * up`` (ragged: widths that are not a multiple of the block)."""
    torch.manual_seed(7)
    x = torch.randn(1, 1, k, dtype=dtype, device=DEVICE) * 2
    w = (torch.randn(2 * inter, k, device=DEVICE) / k ** 0.5).to(dtype)
    b = torch.randn(2 * inter, dtype=dtype, device=DEVICE) if bias else None
    nrm = (torch.rand(k, device=DEVICE).to(dtype) + 0.5, 1e-5) if norm else None
    exact = TORCH.linear_silu(x.float(), w.float(), None if b is None else b.float(),
                              nrm and (nrm[0].float(), nrm[1])).to(dtype)  # two bf16 roundings apart can be
    got = TRITON.linear_silu(x, w, b, nrm)  # 4 ulps apart (silu, then the product): both against float32
    assert got.shape == (1, 1, inter) and got.dtype == dtype
    torch.testing.assert_close(got, exact, **_tol(dtype))
    torch.testing.assert_close(TORCH.linear_silu(x, w, b, nrm), exact, **_tol(dtype))
    more = x.expand(1, 3, k).contiguous()  # three rows: cuBLAS, then the silu kernel
    torch.testing.assert_close(TRITON.linear_silu(more, w, b, nrm), exact.expand(1, 3, inter), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [(2,), (1, 7), (3, 16), (1, 64)])  # a pair of rows; an extend; a verify of 48; 64
@pytest.mark.parametrize("kind", ["norm", "norm-bias", "residual", "silu-norm", "silu-bias"])
@pytest.mark.parametrize("norm_inside", [False, True])
def test_linear_rows_match_torch(dtype, rows, kind, norm_inside):
    """A few rows at once (a tree's verify, a draft level, the draft extend) through
    ``_linear_rows_kernel``: the bias, the residual or silu(gate) * up inside, the norm as its own
    kernel before it (the default, ``row_norm_apart``) or inside (``row_prologues``, as the benchmarks
    time it), ragged blocks of rows, columns and K (SmolLM2's 576)."""
    ops = ops_with(row_prologues=norm_inside)
    torch.manual_seed(8)
    silu = kind.startswith("silu")
    n, k = (40, 576) if silu else (72, 200)
    x = torch.randn(*rows, k, dtype=dtype, device=DEVICE) * 2
    w = (torch.randn(2 * n if silu else n, k, device=DEVICE) / k ** 0.5).to(dtype)
    b = torch.randn(w.shape[0], dtype=dtype, device=DEVICE) if "bias" in kind else None
    nrm = (torch.rand(k, device=DEVICE).to(dtype) + 0.5, 1e-5) if "norm" in kind else None
    launched = []
    kernel = kernels._linear_rows_kernel
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "_linear_rows_kernel", type("Spy", (), {"__getitem__": lambda self, grid: (
            launched.append(grid), kernel[grid])[1]})())
        if kind == "residual":
            res = torch.randn(*rows, n, dtype=dtype, device=DEVICE) * 4
            got, want = ops.linear_add(res, x, w), TORCH.linear_add(res, x, w)
        elif silu:
            got = ops.linear_silu(x, w, b, nrm)
            want = TORCH.linear_silu(x.float(), w.float(), None if b is None else b.float(),
                                     nrm and (nrm[0].float(), nrm[1])).to(dtype)  # see test_linear_silu_matches_torch
        else:
            got, want = ops.linear(x, w, b, nrm), TORCH.linear(x, w, b, nrm)
    assert launched and got.shape == want.shape == (*rows, n) and got.dtype == dtype
    loose = silu and dtype == torch.bfloat16  # the normed row, gate and up each rounded: a few ulps of 576 terms
    torch.testing.assert_close(got, want, **(dict(rtol=0.04, atol=0.1) if loose else _tol(dtype)))


def test_linear_kernels_take_up_to_64_rows(monkeypatch):
    """More rows than ``ROWS_MAX`` (prefill, large batches) and a wide head over short rows keep
    cuBLAS; one row is ``_linear_kernel``'s, 2 to 64 ``_linear_rows_kernel``'s."""
    monkeypatch.setattr(kernels, "_linear_kernel", CannotCompile())
    monkeypatch.setattr(kernels, "_linear_rows_kernel", CannotCompile())
    ops = ops_with(mode="triton")  # a launch would raise
    x, w = torch.randn(2, 32, device=DEVICE), torch.randn(24, 32, device=DEVICE)
    with pytest.raises(RuntimeError, match="no kernel for this GPU"):
        ops.linear(x, w)
    many = torch.randn(kernels.ROWS_MAX + 1, 32, device=DEVICE)
    assert torch.equal(ops.linear(many, w), TORCH.linear(many, w))
    norm = (torch.rand(32, device=DEVICE) + 0.5, 1e-5)  # the norm apart (its kernel), then the rows kernel
    with pytest.raises(RuntimeError, match="no kernel for this GPU"):
        ops.linear(x, w, None, norm)
    with pytest.raises(RuntimeError, match="no kernel for this GPU"):
        ops.linear_silu(x, w, None, norm)
    ops = ops_with(mode="triton", row_norm_apart=False)  # the path before: norm kernel + cuBLAS (+ silu)
    torch.testing.assert_close(ops.linear(x, w, None, norm), TORCH.linear(x, w, None, norm))  # the norm's rounding
    torch.testing.assert_close(ops.linear_silu(x, w, None, norm), TORCH.linear_silu(x, w, None, norm))  # silu kernel
    ops = ops_with(mode="triton", row_norm_apart=False, row_linears=False)
    assert torch.equal(ops.linear(x, w), TORCH.linear(x, w))
    head = torch.randn(16384, 32, device=DEVICE)
    assert linear.linear_config(16384, 32, 4) is None
    assert torch.equal(ops.linear(x[:1], head), TORCH.linear(x[:1], head))
    with pytest.raises(RuntimeError, match="no kernel for this GPU"):
        ops.linear(x[:1], w)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # a wrong width is torch's error, not a stray read
        ops.linear(x[:1, :31], w)
    ops = ops_with(mode="triton", row_norm_apart=False, row_linears=False, fused_linears=False)
    assert torch.equal(ops.linear(x[:1], w), TORCH.linear(x[:1], w))


HOPPER_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from eyas.models.kernels.linear import _linear_kernel
sig = {"x": "*bf16", "w": "*bf16", "s_w": "i32", "bias": "*bf16", "res": "*bf16", "nw": "*bf16", "out": "*bf16",
       "N": "i32", "K": "i32", "eps": "fp32"}
for norm, silu, has_bias, has_res, row_p2, pdl in [(False, False, False, True, 0, True),
                                                   (True, False, False, False, 4096, False),
                                                   (True, False, True, False, 0, True),
                                                   (True, True, False, False, 4096, True),
                                                   (False, True, True, False, 0, False),
                                                   (False, False, True, True, 0, True)]:
    const = dict(NORM=norm, SILU=silu, HAS_BIAS=has_bias, HAS_RES=has_res, BLOCK_N=8, BLOCK_K=512, ROW_P2=row_p2,
                 PDL=pdl)
    src = triton.compiler.ASTSource(fn=_linear_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                                    constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    if not norm and has_res:  # down's configuration: 16 rows of 1024, three stages (shared memory)
        const.update(BLOCK_N=16, BLOCK_K=1024)
        src = triton.compiler.ASTSource(fn=_linear_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                                        constexprs=const)
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    assert ("griddepcontrol.wait" in ptx) == const["PDL"], const  # the dependent launch's wait, only with PDL
    assert not const["PDL"] or ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
from eyas.models.kernels.linear import _linear_rows_kernel
for dt, norm, silu, has_bias, has_res, block_m, exact in [("bf16", True, False, False, False, 64, False),
                                                          ("bf16", True, True, False, False, 16, False),
                                                          ("bf16", False, False, True, True, 32, False),
                                                          ("fp32", True, True, True, False, 64, True),
                                                          ("fp32", False, False, False, True, 16, True)]:
    sig = {"x": f"*{dt}", "s_x": "i32", "w": f"*{dt}", "s_w": "i32", "bias": f"*{dt}", "res": f"*{dt}", "s_r": "i32",
           "nw": f"*{dt}", "out": f"*{dt}", "s_o": "i32", "M": "i32", "N": "i32", "K": "i32", "eps": "fp32"}
    const = dict(NORM=norm, SILU=silu, HAS_BIAS=has_bias, HAS_RES=has_res, BLOCK_M=block_m, BLOCK_N=32,
                 BLOCK_K=128 if dt == "bf16" else 64, EXACT=exact, UPCAST=False, PDL=True)
    src = triton.compiler.ASTSource(fn=_linear_rows_kernel, signature={**sig, **{k: "constexpr" for k in const}},
                                    constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2}).asm["ptx"]
    assert ptx.find("griddepcontrol.wait") < ptx.find("ld.global"), "a read before the wait"
print("compiled")
"""


def test_linear_kernel_compiles_for_hopper():
    """Triton's compiler checks what its interpreter does not (a loop-carried variable that changes
    type, say): compile every variant for sm_90 without a GPU, in a process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    run = subprocess.run([sys.executable, "-c", HOPPER_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1.6e-2}


def _cache_case(head_dim, hq, hkv, dtype, qk_norm):
    torch.manual_seed(1)
    bsz, t, slots = 3, 4, 40
    cfg = LlamaConfig(hidden_size=hq * head_dim, num_attention_heads=hq, num_key_value_heads=hkv, head_dim=head_dim,
                      max_position_embeddings=64)
    rope = RopeTable(LlamaRotaryEmbedding(cfg).to(DEVICE))
    rope.extend(slots, torch.zeros(1, dtype=dtype, device=DEVICE))
    qkv = torch.randn(bsz, t, (hq + 2 * hkv) * head_dim, dtype=dtype).to(DEVICE)
    positions = torch.tensor([[5, 6, 7, 8], [0, 1, 1, 2], [30, 31, 32, 33]], device=DEVICE)  # trees repeat positions
    norms = None
    if qk_norm:
        norms = (Qwen3RMSNorm(head_dim, 1e-6), Qwen3RMSNorm(head_dim, 1e-6))
        for n in norms:
            n.weight.data = torch.randn(head_dim).to(DEVICE, dtype)
    caches = []
    for _ in range(2):
        c = StaticKV(2, 4, hkv, slots, head_dim, dtype, DEVICE)
        torch.manual_seed(2)
        c.buf.copy_(torch.randn(c.buf.shape, dtype=dtype))
        c.aim(20, torch.tensor([9, 10, 14, 11], device=DEVICE))  # not in order, not contiguous
        caches.append(c)
    return qkv, rope, positions, norms, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,hq,hkv,qk_norm", [(16, 4, 2, False), (80, 2, 1, False), (16, 4, 4, True)],
                         ids=["gqa", "head-dim-80", "qwen3-norms"])
@torch.no_grad()
def test_rope_store_matches_torch(head_dim, hq, hkv, qk_norm, dtype):
    qkv, rope, positions, norms, (mine, ref) = _cache_case(head_dim, hq, hkv, dtype, qk_norm)
    heads = (hq, hkv, head_dim)
    x = qkv[..., :1]
    q, keys, values = TRITON.qkv_to_cache(qkv, heads, TRITON.rotation(rope, x, positions), mine, 1, norms)
    q0, keys0, values0 = TORCH.qkv_to_cache(qkv, heads, TORCH.rotation(rope, x, positions), ref, 1, norms)
    assert q.shape == q0.shape == (3, hkv, hq // hkv * 4, head_dim) and keys.shape == keys0.shape
    tol = _tol(dtype) if not qk_norm else {"atol": 5e-2, "rtol": 5e-2} if dtype == torch.bfloat16 else _tol(dtype)
    torch.testing.assert_close(q, q0, **tol)
    torch.testing.assert_close(keys, keys0, **tol)
    torch.testing.assert_close(values, values0, atol=0, rtol=0)  # values are copied, not computed
    torch.testing.assert_close(mine.buf, ref.buf, **tol)  # the step's slots of rows 0-2 of layer 1, nothing else
    untouched = torch.ones_like(mine.buf, dtype=torch.bool)
    untouched[1, :, :3, :, mine.write_slots] = False
    assert torch.equal(mine.buf[untouched], ref.buf[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [40, 300], ids=["one-split", "flash-decoding-splits"])
@pytest.mark.parametrize("head_dim,hq,hkv,t", [(16, 4, 2, 1), (80, 2, 1, 5), (64, 3, 3, 20), (16, 3, 1, 48)],
                         ids=["gqa-decode", "head-dim-80", "mha-verify", "three-row-blocks"])
def test_attend_matches_sdpa(head_dim, hq, hkv, t, window, dtype):
    torch.manual_seed(3)
    bsz, slots = 2, 320
    buf = torch.randn(2, bsz, hkv, slots, head_dim, dtype=dtype).to(DEVICE)
    keys, values = buf[0, :, :, :window], buf[1, :, :, :window]  # a window of the cache, as attention sees it
    q = torch.randn(bsz, hq, t, head_dim, dtype=dtype).to(DEVICE)
    allowed = torch.rand(bsz, t, window) < 0.3  # ragged: some rows see a few slots, one row sees one
    allowed[:, :, 0] = True
    allowed[1, 0] = False
    allowed[1, 0, window - 1] = True
    mask = kv_cache.additive(allowed.to(DEVICE), dtype)
    folded = q.reshape(bsz, hkv, hq // hkv * t, head_dim)
    heads, scale = (hq, hkv, head_dim), head_dim ** -0.5
    got = TRITON.attend(folded, keys, values, TRITON.fold_mask(mask, hq // hkv), scale, heads)
    want = TORCH.attend(folded, keys, values, TORCH.fold_mask(mask, hq // hkv), scale, heads)
    assert got.shape == want.shape == (bsz, t, hq * head_dim)
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 4], ids=["decode", "tree"])
def test_attend_skips_what_no_row_sees_and_matches_sdpa(t, dtype):
    """A served step's layout: row b sees its own slots 0..len_b - 1 and the step's tokens at the shared prefix (the
    longest row's length), in a window bucket far past it, so the last blocks and whole flash-decoding splits are
    hidden from every row; the kernel skips them and still equals SDPA. A query row that sees nothing (none in a
    real step) gives finite values, never NaN: zeros where no row of its program sees anything either."""
    torch.manual_seed(5)
    hq, hkv, head_dim, window = 6, 2, 16, 1024
    lengths, prefix = [100, 300, 7], 300
    bsz = len(lengths)
    buf = torch.randn(2, bsz, hkv, window, head_dim, dtype=dtype).to(DEVICE)
    q = torch.randn(bsz, hq, t, head_dim, dtype=dtype).to(DEVICE)
    allowed = torch.zeros(bsz, t, window, dtype=torch.bool)
    for b, n in enumerate(lengths):
        allowed[b, :, :n] = True
        for i in range(t):  # the step's tokens: a chain, each seeing those before it
            allowed[b, i, prefix:prefix + i + 1] = True
    mask = kv_cache.additive(allowed.to(DEVICE), dtype)
    folded = q.reshape(bsz, hkv, hq // hkv * t, head_dim)
    heads, scale = (hq, hkv, head_dim), head_dim ** -0.5
    got = TRITON.attend(folded, buf[0], buf[1], TRITON.fold_mask(mask, hq // hkv), scale, heads)
    want = TORCH.attend(folded, buf[0], buf[1], TORCH.fold_mask(mask, hq // hkv), scale, heads)
    torch.testing.assert_close(got, want, **_tol(dtype))
    allowed[2, 0] = False  # a query row that sees nothing
    got = TRITON.attend(folded, buf[0], buf[1], TRITON.fold_mask(kv_cache.additive(allowed.to(DEVICE), dtype),
                                                                   hq // hkv), scale, heads)
    assert torch.isfinite(got).all() and (t > 1 or not got[2, 0].any())


@pytest.mark.parametrize("shape,k,dtype", [((3, 8, 16384), 8, torch.bfloat16), ((5, 300), 4, torch.float32),
                                           ((2, 3, 1000), 1, torch.float32), ((2, 4, 2048), 8, torch.float32),
                                           ((1, 10), 10, torch.float32)],
                         ids=["bf16-16k", "ragged", "chain", "ties", "all"])
def test_top_children_matches_log_softmax_and_topk(shape, k, dtype):
    """A tree level's expansion: the same k best (ties: the lower draft id first), their
    log-probabilities plus the parent's score, and their target ids."""
    gen = torch.Generator().manual_seed(0)
    v = shape[-1]
    if shape == (2, 4, 2048):  # three distinct values: ties everywhere
        x = torch.randint(0, 3, shape, generator=gen).float()
    else:
        x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    to_target = torch.randperm(3 * v, generator=gen)[:v]
    base = torch.randn(shape[:-1], generator=gen) if len(shape) == 3 else None
    x, to_target = x.to(DEVICE), to_target.to(DEVICE)
    base = None if base is None else base.to(DEVICE)
    scores, tokens = TRITON.top_children(x, k, to_target, base)
    want_scores, want_tokens = TORCH.top_children(x, k, to_target, base)
    assert scores.shape == tokens.shape == shape[:-1] + (k,) and scores.dtype == torch.float32
    torch.testing.assert_close(scores, want_scores, atol=2e-6, rtol=1e-6)
    to_draft = torch.full((3 * v,), -1, dtype=torch.long, device=DEVICE)
    to_draft[to_target] = torch.arange(v, device=DEVICE)  # back to draft ids (to_target is one-to-one)
    ids = to_draft[tokens]
    assert torch.equal(x.gather(-1, ids), x.gather(-1, to_draft[want_tokens]))
    later = x.gather(-1, ids)
    assert bool(((later[..., 1:] < later[..., :-1]) | (ids[..., 1:] > ids[..., :-1])).all())  # ties: lower id first



def test_top_children_writes_into_a_trees_candidate_buffers():
    """Into ``out`` views of ``[B, C]`` buffers (a level's ``[B, k, k]`` block, the first level's
    ``[B, k]``), with the parents' scores read from such a view too: the same numbers as the torch op."""
    gen = torch.Generator().manual_seed(3)
    bsz, k, v, c = 3, 4, 700, 4 + 16 + 5
    to_target = torch.randperm(2 * v, generator=gen)[:v].to(DEVICE)
    logits0, logits = torch.randn(bsz, v, generator=gen).to(DEVICE), torch.randn(bsz, k, v, generator=gen).to(DEVICE)
    got, want = [(torch.full((bsz, c), -7.0, device=DEVICE), torch.full((bsz, c), -7, device=DEVICE)) for _ in range(2)]
    for ops, (scores, tokens) in ((TRITON, got), (TORCH, want)):
        base, _ = ops.top_children(logits0, k, to_target, out=(scores[:, :k], tokens[:, :k]))
        assert base.data_ptr() == scores.data_ptr()
        ops.top_children(logits, k, to_target, base, out=(scores[:, k : k + 16].view(bsz, k, k),
                                                          tokens[:, k : k + 16].view(bsz, k, k)))
    torch.testing.assert_close(got[0], want[0], atol=2e-6, rtol=1e-6)
    assert torch.equal(got[1], want[1]) and bool((got[0][:, k + 16 :] == -7).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bsz,k,window", [(1, 4, 40), (3, 2, 1030), (2, 8, 300), (2, 1, 20)])
def test_next_frontier_kernel_matches_torch(dtype, bsz, k, window):
    """A tree level's k best of k * k candidates (read from a strided slice of the candidate buffers),
    their parents, tokens, parents' hidden rows and mask rows with their own slots opened, and their
    candidate numbers written into a strided slice: all as the torch op makes them."""
    gen = torch.Generator().manual_seed(bsz * k)
    c, h = 7 + k * k * 2, 72
    scores = torch.randn(bsz, c, generator=gen).to(DEVICE)
    tokens = torch.randint(0, 10_000, (bsz, c), generator=gen).to(DEVICE)
    hidden = torch.randn(bsz, k, h, generator=gen).to(dtype).to(DEVICE)
    allowed = torch.rand(bsz, k, window, generator=gen) < 0.5
    mask = kv_cache.additive(allowed, dtype)[:, 0].to(DEVICE)
    slots = (torch.randperm(window, generator=gen)[:k]).to(DEVICE)
    lo = 7
    outs, frontiers = [], []
    for ops in (TRITON, TORCH):
        frontier = torch.full((bsz, 3, k), -1, dtype=torch.long, device=DEVICE)
        for m, s in ((mask, slots), (None, None)):
            outs.append(ops.next_frontier(scores[:, lo : lo + k * k], tokens[:, lo : lo + k * k], hidden, k, lo,
                                          frontier[:, 1], m, s))
        frontiers.append(frontier)
    assert torch.equal(frontiers[0], frontiers[1]) and bool((frontiers[0][:, 1] >= lo).all())
    for got, want in zip(outs[:2], outs[2:]):
        assert got[4] is None if want[4] is None else torch.equal(got[4], want[4])
        for g, w in zip(got[:4], want[:4]):
            assert g.dtype == w.dtype and torch.equal(g, w)
    opened = outs[0][4][torch.arange(bsz)[:, None], torch.arange(k)[None, :], slots.cpu()[None, :].expand(bsz, k)]
    assert bool((opened == 0).all())


@pytest.mark.parametrize("steps,k,total", [(4, 4, 16), (6, 8, 32), (5, 1, 6), (1, 4, 4), (2, 3, 12), (3, 2, 7)])
def test_a_tree_drafted_through_the_kernels_is_the_torch_ops_tree(steps, k, total):
    """``drafter._grow`` (top children, next frontier, the selection at the end) on the kernels and on
    the torch ops, fed the same draft logits: the same tree, token for token, parent for parent, with
    depths and ancestor masks that a walk up the parents confirms."""
    from eyas.spec.drafter import _grow
    from eyas.spec.tree import Tree

    gen = torch.Generator().manual_seed(steps * 31 + k)
    v, bsz = 300, 3
    table = (torch.randn(steps + 1, 4 * v, v, generator=gen) * 2).to(DEVICE)  # logits by (level, token)

    class Draft:
        d2t = torch.randint(0, 3, (v,), generator=gen).to(DEVICE)

    def feed(step, tokens, hidden, parent, mask):
        return hidden, table[step][tokens]

    trees = []
    for ops in (TRITON, TORCH):
        logits0 = table[0][torch.tensor([5, 17, 200], device=DEVICE)]
        trees.append(_grow(Draft, torch.tensor([1, 2, 3], device=DEVICE), logits0, torch.zeros(bsz, 8, device=DEVICE),
                           SpecConfig("EAGLE3", steps, k, total), feed, ops))
    got, want = trees
    for name in ("tokens", "parents", "depth", "mask"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    walked = Tree.from_parents(got.tokens, got.parents)
    assert torch.equal(walked.mask, got.mask) and torch.equal(walked.depth, got.depth)
    assert int(got.depth.max()) <= steps and got.tokens.shape == (bsz, total)


class CannotCompile:
    """Stands in for a Triton kernel this GPU cannot compile: every launch raises."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("no kernel for this GPU")
        return launch


def _random_trees(bsz: int, size: int, seed: int):
    """Random trees (parents before children, several branches) with target choices that follow some
    branches and leave others, as a verify sees them."""
    from eyas.spec.tree import Tree

    g = torch.Generator().manual_seed(seed)
    parents = torch.full((bsz, size), -1, dtype=torch.long)
    for j in range(1, size):
        parents[:, j] = torch.randint(0, j, (bsz,), generator=g)
    tokens = torch.zeros((bsz, size), dtype=torch.long)  # siblings distinct (as a draft's top-k), few: often chosen
    for j in range(1, size):
        tokens[:, j] = (parents[:, 1:j] == parents[:, j : j + 1]).sum(dim=1)
    tree = Tree.from_parents(tokens.to(DEVICE), parents.to(DEVICE))
    choice = torch.randint(0, 3, (bsz, size), generator=g).to(DEVICE)
    return tree, choice


@pytest.mark.parametrize("bsz,size,width", [(1, 2, 2), (3, 16, 5), (4, 32, 7), (2, 33, 33), (5, 64, 9)])
def test_accept_greedy_kernel_matches_torch(bsz, size, width):
    """Greedy acceptance of a tree in one kernel: the same path, count and bonus token as the torch
    reference (and as the host's walk), ragged tree sizes included."""
    from eyas.spec.verify import accept_greedy

    for seed in range(4):
        tree, choice = _random_trees(bsz, size, seed)
        width = max(width, int(tree.depth.max()) + 1)
        args = (tree.tokens, tree.parents, tree.depth, tree.mask, choice, width)
        got, want = TRITON.accept_greedy(*args), TORCH.accept_greedy(*args)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype == torch.long and torch.equal(g, w)
        for b in range(bsz):
            path, bonus = accept_greedy(tree, choice[b], b)
            assert got[0][b, : len(path)].tolist() == path and int(got[1][b]) == len(path) and int(got[2][b]) == bonus


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size,window,prefix", [(1, 256, 7), (16, 256, 40), (48, 1030, 1000), (8, 64, 56)])
def test_tree_mask_kernel_matches_torch(dtype, size, window, prefix):
    """The verify's additive mask in one kernel: committed slots, the node and its ancestors at the
    tree's slots, and nothing else (padding past each row's length hidden), over windows that span
    several blocks."""
    tree, _ = _random_trees(3, size, 1)
    lengths = torch.tensor([0, prefix // 2, prefix], device=DEVICE)
    at = torch.tensor([prefix], device=DEVICE)
    got = TRITON.tree_mask(lengths, tree.mask, at, window, dtype)
    want = TORCH.tree_mask(lengths, tree.mask, at, window, dtype)
    assert got.shape == want.shape == (3, 1, size, window) and got.dtype == dtype
    assert torch.equal(got, want)
    assert bool((got[1, 0, :, : prefix // 2] == 0).all()) and bool((got[1, 0, :, prefix // 2 : prefix] < 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width,window,prefix", [(1, 256, 7), (7, 256, 40), (33, 1030, 990)])
def test_block_mask_kernel_matches_torch(dtype, width, window, prefix):
    """The draft extend's mask in one kernel: committed slots, then the kept new tokens causally; a
    token past a row's kept count (padding) sees only itself; a row keeping nothing too."""
    lengths = torch.tensor([0, prefix // 2, prefix, 3], device=DEVICE)
    counts = torch.tensor([width, 1, max(1, width - 2), 0], device=DEVICE)
    at = torch.tensor([prefix], device=DEVICE)
    got = TRITON.block_mask(lengths, counts, at, width, window, dtype)
    want = TORCH.block_mask(lengths, counts, at, width, window, dtype)
    assert got.shape == want.shape == (4, 1, width, window) and got.dtype == dtype
    assert torch.equal(got, want)
    last = width - 1  # row 1 keeps one token: its last (padding past it) sees the prefix, the kept one and itself
    assert int((got[1, 0, last] == 0).sum()) == prefix // 2 + min(1, last) + 1 and got[1, 0, last, prefix + last] == 0


def test_top_children_that_cannot_run_falls_back_alone(monkeypatch, caplog):
    """The drafter's kernel failing leaves the forward's kernels on."""
    monkeypatch.setitem(kernels.FAILURES, "failed", None)
    monkeypatch.setitem(kernels.FAILURES, "top_children_failed", None)
    monkeypatch.setattr(tree_kernels, "_top_children_kernel", CannotCompile())
    x = torch.randn(2, 3, 500, device=DEVICE)
    to_target = torch.arange(500, device=DEVICE) + 7
    with caplog.at_level("WARNING", logger="eyas.kernels"):
        got = TRITON.top_children(x, 4, to_target)
    want = TORCH.top_children(x, 4, to_target)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert "top_children kernel failed (RuntimeError: no kernel for this GPU)" in caplog.text
    assert kernels.FAILURES["failed"] is None  # rms_norm, rope_store, attend: still the kernels


def test_linear_kernel_that_cannot_run_falls_back_alone(monkeypatch, caplog):
    """A GPU where the one-row projection kernel cannot compile keeps cuBLAS for the projections and
    the other kernels for the rest."""
    monkeypatch.setitem(kernels.FAILURES, "failed", None)
    monkeypatch.setitem(kernels.FAILURES, "linear_failed", None)
    monkeypatch.setattr(kernels, "_linear_kernel", CannotCompile())
    x, w, res = torch.randn(1, 32, device=DEVICE), torch.randn(48, 32, device=DEVICE), torch.randn(1, 24, device=DEVICE)
    with caplog.at_level("WARNING", logger="eyas.kernels"):
        got = TRITON.linear_silu(x, w)
    torch.testing.assert_close(got, TORCH.linear_silu(x, w))  # cuBLAS, then the silu kernel
    torch.testing.assert_close(TRITON.linear_add(res, got, w[:24, :24]), TORCH.linear_add(res, got, w[:24, :24]))
    assert "linear kernel failed (RuntimeError: no kernel for this GPU); projections use cuBLAS" in caplog.text
    assert kernels.FAILURES["failed"] is None and kernels.FAILURES["linear_failed"]


def test_a_kernel_that_cannot_run_falls_back_to_the_torch_ops(monkeypatch, caplog):
    monkeypatch.setitem(kernels.FAILURES, "failed", None)
    monkeypatch.setattr(kernels, "_attend_kernel", CannotCompile())
    torch.manual_seed(4)
    q = torch.randn(1, 2, 6, 16).to(DEVICE)  # 4 query heads, 2 KV heads, 3 tokens, folded
    keys, values = torch.randn(2, 1, 2, 10, 16).to(DEVICE)
    mask = kv_cache.additive(torch.rand(1, 3, 10, device=DEVICE) < 0.7, torch.float32)
    heads = (4, 2, 16)
    want = TORCH.attend(q, keys, values, TORCH.fold_mask(mask, 2), 0.25, heads)
    with pytest.raises(RuntimeError, match="no kernel for this GPU"):
        ops_with(mode="triton").attend(q, keys, values, mask, 0.25, heads)  # forced: the error stands
    assert kernels.FAILURES["failed"] is None
    with caplog.at_level("WARNING", logger="eyas.kernels"):
        got = TRITON.attend(q, keys, values, mask, 0.25, heads)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert "Triton kernels failed (RuntimeError: no kernel for this GPU)" in caplog.text
    _, rope, _, _, (static, _) = _cache_case(16, 4, 2, torch.float32, False)
    assert ops_for(static, torch.zeros(1, device=DEVICE), rope) is TORCH  # from now on, in this process


def test_a_dependent_launch_that_fails_falls_back_to_the_plain_launch(monkeypatch, caplog):
    """Where the GPU has programmatic dependent launch the kernels use it; where it cannot run
    (Triton's interpreter cannot: its ``gdc_wait`` has no semantics) the plain launch takes over,
    once, with the same result, and the failure is recorded for the benchmarks."""
    real = kernels._pdl
    assert not real(torch.device("cpu"))  # the plain launch off the GPU
    monkeypatch.setitem(kernels.FAILURES, "pdl_failed", None)
    monkeypatch.setattr(kernels, "_pdl", lambda device: kernels.FAILURES["pdl_failed"] is None)
    x, w = torch.randn(3, 96, device=DEVICE), torch.randn(96, device=DEVICE)
    with caplog.at_level("WARNING", logger="eyas.kernels"):
        got = TRITON.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, TORCH.rms_norm(x, w, 1e-6), **_tol(torch.float32))
    if DEVICE == "cpu":
        assert "programmatic dependent launch failed" in caplog.text
        assert "pdl_failed" in kernels.failures() and not kernels.FAILURES.get("failed")
    torch.testing.assert_close(TRITON.rms_norm(x, w, 1e-6), got, atol=0, rtol=0)  # plain from now on (CPU)
    if DEVICE == "cpu":  # on a GPU whose PDL works nothing failed, and it stays on
        assert not real(torch.device(DEVICE))


def test_a_kernel_that_cannot_run_leaves_dependent_launch_on(monkeypatch, caplog):
    """A kernel that fails with and without programmatic dependent launch is the kernel's failure:
    it falls back alone, and the other kernels keep launching with PDL (before, its failed PDL launch
    turned PDL off for the whole process)."""
    monkeypatch.setitem(kernels.FAILURES, "pdl_failed", None)
    monkeypatch.setitem(kernels.FAILURES, "top_children_failed", None)
    monkeypatch.setattr(kernels, "_pdl", lambda device: True)
    monkeypatch.setattr(tree_kernels, "_top_children_kernel", CannotCompile())
    x, to_target = torch.randn(2, 300, device=DEVICE), torch.arange(300, device=DEVICE)
    with caplog.at_level("WARNING", logger="eyas.kernels"):
        got = TRITON.top_children(x, 4, to_target)
    assert torch.equal(got[1], TORCH.top_children(x, 4, to_target)[1])
    assert kernels.FAILURES["pdl_failed"] is None and "top_children kernel failed" in caplog.text
    assert "programmatic dependent launch failed" not in caplog.text


def test_ops_for_takes_the_kernels_only_where_asked():
    _, rope, _, _, (static, _) = _cache_case(16, 4, 2, torch.float32, False)
    x = torch.zeros(2, 3, device=DEVICE)

    def cache(settings):
        return StaticKV(1, 1, 1, 8, 4, torch.float32, DEVICE, settings)

    auto = ops_for(static, x, rope)  # a cache built without settings: the default's
    assert auto is (TORCH if DEVICE == "cpu" else kernel_ops(KernelSettings()))  # kernels for the GPU
    forced = ops_for(cache(FORCED), x, rope)
    assert isinstance(forced, tree_kernels.SpecTritonOps) and forced.settings is FORCED
    assert forced is ops_for(cache(replace(SETTINGS, mode="triton")), x, rope)  # one instance for equal settings
    assert ops_for(kv_cache.new_cache(), x, rope) is TORCH  # prefill on a growing cache
    assert ops_for(cache(FORCED), x, RopeTable(rope.rotary)) is TORCH  # no table built yet
    assert ops_for(cache(FORCED), torch.zeros(2, 3, device=DEVICE, requires_grad=True), rope) is TORCH  # autograd
    assert ops_for(cache(KernelSettings(mode="torch")), x, rope) is TORCH


def test_eyas_kernels_is_read_once_when_the_settings_are_built(monkeypatch):
    """``EYAS_KERNELS`` sets the mode of the settings an engine config takes by default; changing it later
    changes nothing already built, and a mode it does not name is refused where it is read."""
    monkeypatch.setenv("EYAS_KERNELS", "Triton")
    config = EngineConfig()
    assert config.kernels == KernelSettings(mode="triton") == KernelSettings.from_env()
    monkeypatch.setenv("EYAS_KERNELS", "torch")
    assert config.kernels.mode == "triton" and EngineConfig().kernels.mode == "torch"
    monkeypatch.delenv("EYAS_KERNELS")
    assert EngineConfig().kernels == KernelSettings()
    monkeypatch.setenv("EYAS_KERNELS", "cuda")
    with pytest.raises(EyasError, match="EYAS_KERNELS='cuda' is not one of auto, torch, triton"):
        EngineConfig()
    with pytest.raises(EyasError, match="kernel mode 'cuda' is not one of auto, torch, triton"):
        KernelSettings(mode="cuda")


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU fixtures' check; on a GPU the benchmarks' fp32 pair checks it")
def test_engine_with_kernels_is_lossless(target, draft):
    """Greedy speculation through the kernels (target verify, draft tree and extend, on the graph
    runners' padded buffers) emits the same tokens as HF's greedy decoding.

    Each step costs seconds in Triton's interpreter, so the prompts are picked to need few: the first
    row's drafts are all rejected (a bonus token alone each step), the second's accepted (two of three
    tokens a step), so it finishes early and leaves the batch while the first keeps decoding."""
    prompts = [[72, 101, 108, 108, 111], [30, 31, 32]]
    refs = [reference_greedy(target.model, p, 6) for p in prompts]
    engine = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 3, 2, 6), max_batch=2,
                    cuda_graphs=True, kernels=FORCED)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert [o.output_ids for o in outs] == refs
    assert outs[0].stats.accepted == 0 < outs[1].stats.accepted  # rejections beside acceptances, in one batch
    assert outs[1].stats.drafts < outs[0].stats.drafts  # the accepting row left the batch first
    assert engine.prefiller.targets[32].graphs and engine.prefiller.drafts[32].graph.graphs  # prefilled from them


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU fixtures' check; on a GPU the benchmarks' fp32 pair checks it")
@pytest.mark.parametrize("name", ["qwen3-qk-norm", "qwen2-bias"])
def test_other_families_decode_like_hugging_face_through_the_kernels(name):
    """Qwen3's per-head q/k norms (applied inside ``rope_store``) and Qwen2's q/k/v biases, over a
    batch of two (the prefill of 32 slots a row is most of the interpreter's time, then 4 steps)."""
    model = family_model(name)
    refs = [reference_greedy(model, p, 5) for p in PROMPTS[:2]]
    engine = Engine(NativeTarget(model), None, SpecConfig("NONE"), max_batch=2, cuda_graphs=True, kernels=FORCED)
    assert engine.layout.endswith("triton kernels")
    outs = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert [o.output_ids for o in outs] == refs


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU fixtures' check; on a GPU the benchmarks' fp32 pair checks it")
@pytest.mark.parametrize("name", ["llama", "qwen2-bias"])
def test_batch_one_decode_through_the_linear_kernel_is_hugging_faces(name, monkeypatch):
    """At batch 1 every projection of a float32 model runs as ``_linear_kernel`` (norm, silu, bias and
    residual inside) and the greedy tokens are still HF's. One prompt: its prefill (32 slots through
    the interpreter) is most of the time, and a second prompt took the same path."""
    model = family_model(name).float()
    ref = reference_greedy(model, PROMPTS[0], 6)
    launched = []
    launch = kernels.TritonOps._launch
    monkeypatch.setattr(kernels.TritonOps, "_launch",
                        lambda self, kernel, *a, **kw: (launched.append(kernel), launch(self, kernel, *a, **kw)))
    engine = Engine(NativeTarget(model), None, SpecConfig("NONE"), max_batch=1, cuda_graphs=True, kernels=FORCED)
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, ignore_eos=True))[0].output_ids == ref
    assert launched.count(kernels._linear_kernel) >= 5 * model.config.num_hidden_layers * 4  # 4 a layer, 5 steps


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU fixtures' check; on a GPU the benchmarks' fp32 pair checks it")
def test_speculation_through_the_rows_kernel_is_hugging_faces(monkeypatch):
    """A float32 speculative engine: the verify's, the draft levels' and the draft extend's projections
    run as ``_linear_rows_kernel`` (no TF32), batch 1's plain steps as ``_linear_kernel``, and the
    greedy tokens are still HF's."""
    from eyas.models.draft import Eagle3Draft

    model = family_model("qwen2-bias").float()
    refs = [reference_greedy(model, p, 4) for p in PROMPTS[:2]]  # three speculative steps
    target = NativeTarget(model)
    torch.manual_seed(3)
    draft = Eagle3Draft.for_target(target, draft_vocab_size=120).float()
    rows = []
    linear_rows = kernels.TritonOps._linear_rows
    monkeypatch.setattr(kernels.TritonOps, "_linear_rows", lambda self, x, *a: (rows.append(x.numel() // x.shape[-1]),
                                                                                linear_rows(self, x, *a))[1])
    engine = Engine(target, draft, SpecConfig("EAGLE3", 3, 2, 6), max_batch=2, cuda_graphs=True, kernels=FORCED)
    outs = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert [o.output_ids for o in outs] == refs
    assert {12, 4, 8} <= set(rows)  # the verify (2 rows x 6 tokens), a draft level (2 x 2), the extend (2 x 4)
