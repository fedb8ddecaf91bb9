"""``TritonOps``: ``torch_ops.TorchOps`` in fewer launches, for the static-cache path, under one
``KernelSettings``; and ``FAILURES``, the kernel families that failed in this process.

The kernels are in ``norm``, ``attention`` and ``linear`` (the token tree's in ``spec.tree_kernels`` and
``spec.verify_kernels``, which ``spec.ops`` adds to these for the engine). Every Triton kernel of eyas, the
tree's included, launches through ``TritonOps._launch`` and falls back through ``TritonOps._or_torch``,
which read the instance's settings (``pdl``, ``mode``) and the process's ``FAILURES``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
import triton

from ...errors import EyasError
from ..kernel_choice import CHOICES, shape_key
from ..kernel_settings import KernelSettings
from ..torch_ops import TorchOps
from .attention import _attend_combine_kernel, _attend_kernel, _rope_store_kernel
from .linear import ROWS_MAX, _linear_kernel, _linear_rows_kernel, linear_candidates, linear_rows_config
from .norm import _rms_norm_kernel, _silu_mul_kernel
from .pdl import _INTERPRETED, gdc_wait

log = logging.getLogger("eyas.kernels")

FAILURES: dict[str, str | None] = {}
"""Each kernel family that failed in this process, and why; it falls back from then on, under any settings:
``failed`` the forward's kernels (then ``ops.ops_for`` takes the torch ops everywhere), ``top_children_failed``
the drafting kernels (``spec.tree_kernels``), ``linear_failed`` the projections' (cuBLAS instead),
``pdl_failed`` the dependent launch (the plain launch instead)."""


def failures() -> dict[str, str]:
    """Each kernel family that fell back in this process, and why (benchmarks record it)."""
    return {family: why for family, why in FAILURES.items() if why}


_PDL_DEVICES: dict[int, bool] = {}


def _pdl(device: torch.device) -> bool:
    """Whether ``device`` can launch a kernel dependent on the one before (sm_90 on), and it has not failed."""
    if FAILURES.get("pdl_failed") or device.type != "cuda" or gdc_wait is None:
        return False
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _PDL_DEVICES:
        _PDL_DEVICES[i] = torch.cuda.get_device_capability(i) >= (9, 0)
    return _PDL_DEVICES[i]


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, last]`` with a unit last stride (a copy only for expanded or strided input)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


class TritonOps(TorchOps):
    """The ops as Triton kernels, under ``settings``. If a kernel fails (Triton cannot compile it for
    this GPU, say), the call runs the torch op instead, a warning says why once, and ``FAILURES`` keeps
    the process on the torch ops (``ops_for``); with ``settings.mode`` triton the error stands instead."""

    name = "triton"

    def __init__(self, settings: KernelSettings | None = None):
        self.settings = settings or KernelSettings()

    def _launch(self, kernel, grid, x: torch.Tensor, *args, **kwargs) -> None:
        """``kernel[grid](x, *args)``; off the GPU only in Triton's interpreter. On Hopper and later
        with programmatic dependent launch (``pdl._after_previous_kernel``) unless ``settings.pdl`` is
        off; if such a launch fails where the plain one runs, the plain launch from then on
        (``FAILURES["pdl_failed"]`` says why); a kernel that fails both ways raises, and leaves the
        other kernels' launches as they were."""
        if not x.is_cuda and not _INTERPRETED:
            raise EyasError("the Triton kernels run on a GPU, or on the CPU under TRITON_INTERPRET=1",
                            "unset EYAS_KERNELS (the torch ops then run on the CPU), or set TRITON_INTERPRET=1")
        if self.settings.pdl and _pdl(x.device):
            try:
                return kernel[grid](x, *args, **kwargs, PDL=True, launch_pdl=True)
            except Exception as e:  # noqa: BLE001 - an older Triton or driver: the plain launch still works
                if self.settings.forced:
                    raise
                kernel[grid](x, *args, **kwargs, PDL=False)  # a kernel that cannot run at all raises: not PDL's fault
                FAILURES["pdl_failed"] = f"{type(e).__name__}: {e}"
                log.warning("programmatic dependent launch failed (%s); kernels launch the plain way from now on",
                            FAILURES["pdl_failed"])
                return
        kernel[grid](x, *args, **kwargs, PDL=False)

    def _or_torch(self, kernel_path, torch_path, flag: str = "failed", instead: str = "running the torch ops"):
        """``kernel_path()``, or ``torch_path()`` once it has failed. ``flag`` names the ``FAILURES`` entry
        that keeps the failure: ``failed`` for the forward's kernels (then ``ops_for`` takes the torch
        ops everywhere); the drafter's ``top_children`` and the one-row ``linear`` keep their own, so
        that only they fall back."""
        if not FAILURES.get(flag) or self.settings.forced:
            try:
                return kernel_path()
            except EyasError:
                raise
            except Exception as e:  # noqa: BLE001 - a kernel that cannot run must not take a server down
                if self.settings.forced:
                    raise
                FAILURES[flag] = f"{type(e).__name__}: {e}"
                log.warning("the Triton %s failed (%s); %s from now on (EYAS_KERNELS=torch skips the kernels "
                            "from the start)", "kernels" if flag == "failed" else flag[: -len("_failed")] + " kernel",
                            FAILURES[flag], instead)
        return torch_path()

    def rotation(self, rope, x: torch.Tensor, positions: torch.Tensor):
        return rope.table, positions

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._or_torch(lambda: self._rms_norm(x, weight, eps), lambda: TorchOps.rms_norm(self, x, weight, eps))

    def rms_norm_cat(self, parts: list[tuple[torch.Tensor, torch.Tensor, float]]) -> torch.Tensor:
        return self._or_torch(lambda: self._rms_norm_cat(parts), lambda: TorchOps.rms_norm_cat(self, parts))

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        return self._or_torch(lambda: self._silu_mul(x), lambda: TorchOps.silu_mul(self, x))

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        x, norm = self._norm_apart(x, norm)
        return self._fused_or_cublas(x, weight, weight.shape[1], None,
                                     lambda cfg: self._linear(x, weight, bias, norm, cfg),
                                     lambda: TorchOps.linear(self, x, weight, bias, norm), prologue=norm is not None,
                                     variant=_variant("linear", bias, norm))

    def linear_silu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        x, norm = self._norm_apart(x, norm)
        return self._fused_or_cublas(x, weight, weight.shape[1], None,
                                     lambda cfg: self._linear(x, weight, bias, norm, cfg, silu=True),
                                     lambda: self.silu_mul(TorchOps.linear(self, x, weight, bias, norm)),
                                     prologue=norm is not None or not self.settings.row_norm_apart,
                                     variant=_variant("silu", bias, norm))

    def _norm_apart(self, x: torch.Tensor, norm):
        """``(x, norm)`` as the projection takes them: for 2 to ``ROWS_MAX`` rows with ``row_norm_apart``
        (and not ``row_prologues``), ``x`` normed by the norm kernel and no norm left, so that the
        projection runs as ``_linear_rows_kernel`` instead of cuBLAS."""
        rows, s = x.numel() // max(1, x.shape[-1]), self.settings
        if (norm is None or not 1 < rows <= ROWS_MAX or s.row_prologues or not s.row_norm_apart
                or not (s.row_linears and s.fused_linears)):
            return x, norm
        return self.rms_norm(x, *norm), None

    def linear_add(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        # cuBLAS with the residual as the accumulator (addmm) took 45-57 us for Llama-3.1-8B's o_proj at 2-64 rows
        # on the H200, where a plain GEMM of a larger weight took 17-24 us: the product and the add apart are
        # timed as one more candidate (spec-step-8b-llama-b1-h200.json's kernel timings)
        return self._fused_or_cublas(x, weight, weight.shape[1], residual,
                                     lambda cfg: self._linear(x, weight, bias, None, cfg, residual=residual),
                                     lambda: TorchOps.linear_add(self, residual, x, weight, bias),
                                     variant=_variant("add", bias, None),
                                     extra={"cublas+add": lambda: residual + F.linear(x, weight, bias)})

    def _fused_or_cublas(self, x: torch.Tensor, weight: torch.Tensor, width: int, residual, kernel_path, cublas_path,
                         prologue: bool = False, variant: str = "linear", extra: dict | None = None):
        """``kernel_path(config)`` or ``cublas_path()``, whichever ``CHOICES`` measured faster for this
        shape on this GPU (``kernel_choice``). The kernels take one row of ``width`` for ``weight`` (a
        decode step at batch 1: ``_linear_kernel``, its norm, activation and residual inside) or a few
        rows (up to ``ROWS_MAX``: a tree's verify, a draft level; ``_linear_rows_kernel`` in the tile
        shapes of ``ROWS_TILES``, without a norm or activation inside unless ``row_prologues``). More
        rows (prefill, large batches) stay cuBLAS's, and a mismatched input meets torch's shape error.
        Without timing (the CPU, a capture, ``settings.measure`` off) the first candidate runs: the kernel
        with its built-in configuration, or cuBLAS where ``linear_config`` says so. ``extra``: more named
        paths timed beside them where several rows are (never the default)."""
        rows, s = x.numel() // max(1, x.shape[-1]), self.settings
        several = 1 < rows <= ROWS_MAX and s.row_linears and (s.row_prologues or not prologue)
        fits = (s.fused_linears and x.shape[-1] == width and (rows == 1 or several)
                and weight.dtype == x.dtype and weight.stride(-1) == 1
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
                and (residual is None or residual.numel() == rows * weight.shape[0]))
        if not fits:
            return cublas_path()
        n, k = weight.shape
        configs = linear_candidates(rows, n, k, x.dtype.itemsize)
        if not configs:
            return cublas_path()
        runs = {name: (lambda cfg=cfg: kernel_path(cfg)) if cfg else cublas_path for name, cfg in configs.items()}
        if rows > 1 and extra:
            runs.update(extra)
        key = shape_key(rows, n, k, x.dtype, variant)
        choice = CHOICES.pick(key, runs, x.device) if s.measure else next(iter(configs))
        if choice not in configs:
            return runs[choice]()
        if configs[choice] is None:
            return cublas_path()
        return self._or_torch(lambda: kernel_path(configs[choice]), cublas_path, "linear_failed",
                              "projections use cuBLAS")

    def qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        def torch_path():
            table, positions = rot
            cos, sin = table[positions].chunk(2, dim=-1)
            return TorchOps.qkv_to_cache(self, qkv, heads, (cos[:, None], sin[:, None]), cache, layer, norms)

        return self._or_torch(lambda: self._qkv_to_cache(qkv, heads, rot, cache, layer, norms), torch_path)

    def fold_mask(self, mask: torch.Tensor, rep: int) -> torch.Tensor:
        return mask  # ``attend`` reads each folded row's mask row in place

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
               heads: tuple[int, int, int]) -> torch.Tensor:
        return self._or_torch(lambda: self._attend(q, keys, values, mask, scale, heads),
                              lambda: TorchOps.attend(self, q, keys, values,
                                                      TorchOps.fold_mask(self, mask, heads[0] // heads[1]), scale,
                                                      heads))

    def _linear(self, x, weight, bias, norm, cfg, residual=None, silu: bool = False) -> torch.Tensor:
        n, k = weight.shape
        n = n // 2 if silu else n  # gate/up: the kernel writes silu(gate) * up
        if x.numel() != k:
            return self._linear_rows(x, weight, bias, norm, n, residual, silu, cfg)
        out = torch.empty(n, dtype=x.dtype, device=x.device)
        res = out if residual is None else _rows(residual)
        block_n, block_k, warps, stages = cfg
        if not x.is_cuda:  # Triton's interpreter runs programs one by one: fewer, wider ones (same code path)
            block_n = max(block_n, min(128, triton.next_power_of_2(n)))
        self._launch(_linear_kernel, (triton.cdiv(n, block_n // 2 if silu else block_n),), _rows(x), weight,
                     weight.stride(0), out if bias is None else bias, res, out if norm is None else norm[0], out, n, k,
                     float(norm[1]) if norm else 0.0, NORM=norm is not None, SILU=silu, HAS_BIAS=bias is not None,
                     HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k,
                     ROW_P2=triton.next_power_of_2(k) if norm is not None and k <= 16384 else 0, num_warps=warps,
                     num_stages=stages)
        return out.view(*x.shape[:-1], n)

    def _linear_rows(self, x, weight, bias, norm, n, residual, silu, cfg=None) -> torch.Tensor:
        """``cfg``: (BLOCK_N, BLOCK_K, num_warps, num_stages), else ``linear_rows_config``'s."""
        k = weight.shape[1]
        xr = _rows(x)
        m = xr.shape[0]
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        res = out if residual is None else _rows(residual)
        block_m, block_n, block_k, warps, stages = linear_rows_config(m, n, k, x.dtype.itemsize)
        if cfg is not None:
            block_n, block_k, warps, stages = cfg
        self._launch(_linear_rows_kernel, (triton.cdiv(n, block_n), triton.cdiv(m, block_m)), xr, xr.stride(0), weight,
                     weight.stride(0), out if bias is None else bias, res, res.stride(0),
                     out if norm is None else norm[0], out, out.stride(0), m, n, k, float(norm[1]) if norm else 0.0,
                     NORM=norm is not None, SILU=silu, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EXACT=x.dtype.itemsize > 2 or not x.is_cuda,
                     UPCAST=x.dtype.itemsize == 2 and not x.is_cuda, num_warps=warps, num_stages=stages)
        return out.view(*x.shape[:-1], n)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """The norm of ``x``'s rows, written to ``out`` when given (``[rows, n]``, unit last stride: a
        slice of a wider tensor, as ``_rms_norm_cat`` passes it)."""
        n = x.shape[-1]
        rows = _rows(x)
        dest = torch.empty(rows.shape, dtype=x.dtype, device=x.device) if out is None else out
        block = triton.next_power_of_2(n)
        self._launch(_rms_norm_kernel, (rows.shape[0],), rows, rows.stride(0), weight, dest, dest.stride(0), n,
                     float(eps), BLOCK=block, num_warps=min(16, max(1, block // 256)))
        return dest.view(x.shape) if out is None else out

    def _rms_norm_cat(self, parts) -> torch.Tensor:
        """Each part's norm written into its columns of one output: no ``cat`` kernel."""
        first = parts[0][0]
        total = sum(x.shape[-1] for x, _, _ in parts)
        out = torch.empty((*first.shape[:-1], total), dtype=first.dtype, device=first.device)
        flat, start = out.view(-1, total), 0
        for x, weight, eps in parts:
            if x.shape[:-1] != first.shape[:-1] or x.dtype != first.dtype:
                raise ValueError(f"rms_norm_cat: parts of shapes {[tuple(p[0].shape) for p in parts]}, dtypes "
                                 f"{[p[0].dtype for p in parts]} (the leading shape and dtype must match)")
            self._rms_norm(x, weight, eps, out=flat[:, start : start + x.shape[-1]])
            start += x.shape[-1]
        return out

    def _silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1] // 2
        rows = _rows(x)
        out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
        block = 1024
        self._launch(_silu_mul_kernel, (rows.shape[0], triton.cdiv(n, block)), rows, rows.stride(0), out, out.stride(0),
                     n, BLOCK=block, num_warps=4)
        return out.view(*x.shape[:-1], n)

    def _qkv_to_cache(self, qkv: torch.Tensor, heads: tuple[int, int, int], rot, cache, layer: int, norms=None):
        table, positions = rot
        bsz, t = qkv.shape[:2]
        hq, hkv, d = heads
        if qkv.stride(-1) != 1:
            qkv = qkv.contiguous()
        q = torch.empty((bsz, hq, t, d), dtype=qkv.dtype, device=qkv.device)
        kb, vb = cache.layer_buffers(layer, bsz)  # [B, Hkv, slots, D] each, the same strides
        qw, kw, eps = (norms[0].weight, norms[1].weight, float(norms[0].variance_epsilon)) if norms else (qkv, qkv, 0.0)
        self._launch(_rope_store_kernel, (bsz * t, hq + 2 * hkv), qkv, qkv.stride(0), qkv.stride(1), positions,
                     positions.stride(0), positions.stride(1), table, q, q.stride(0), q.stride(1), q.stride(2), kb, vb,
                     kb.stride(0), kb.stride(1), kb.stride(2), cache.write_slots, qw, kw, eps, t, HQ=hq, HKV=hkv, D=d,
                     HALF=d // 2, HALF_P2=triton.next_power_of_2(d // 2), HAS_NORM=norms is not None, num_warps=1)
        keys, values = cache.window_of(layer, bsz)
        return q.view(bsz, hkv, hq // hkv * t, d), keys, values

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
                heads: tuple[int, int, int]) -> torch.Tensor:
        """Grouped-query attention straight from the cache window (no K/V copies), the mask unfolded,
        written as ``[B, T, Hq * D]`` for the o projection. The window is split over enough programs
        to fill the GPU (flash-decoding); with more than one split a second kernel combines them."""
        hq, hkv, d = heads
        bsz, _, w, _ = keys.shape
        t = mask.shape[2]
        rep = hq // hkv
        q = q.view(bsz, hq, t, d)  # qkv_to_cache's contiguous [B, Hq, T, D]
        out = torch.empty((bsz, t, hq, d), dtype=q.dtype, device=q.device)
        rows = rep * t
        block_m = max(16, min(64, triton.next_power_of_2(rows)))
        m_blocks = triton.cdiv(rows, block_m)
        block_n = 64 if d <= 128 else 32
        chunks = triton.cdiv(w, block_n)
        splits = max(1, min(chunks, triton.cdiv(256, bsz * hkv * m_blocks)))
        per_split = triton.cdiv(chunks, splits) * block_n
        splits = triton.cdiv(w, per_split)
        d_p2 = max(16, triton.next_power_of_2(d))
        m_pad = m_blocks * block_m
        direct = splits == 1
        if direct:
            part_o = part_ml = out
        else:
            part_o = torch.empty((bsz, hkv, splits, m_pad, d_p2), dtype=torch.float32, device=q.device)
            part_ml = torch.empty((bsz, hkv, splits, m_pad, 2), dtype=torch.float32, device=q.device)
        self._launch(_attend_kernel, (bsz, hkv, splits * m_blocks), q, q.stride(0), q.stride(1), q.stride(2), keys,
                     values, keys.stride(0), keys.stride(1), keys.stride(2), mask, mask.stride(0), mask.stride(2),
                     mask.stride(3), out, out.stride(0), out.stride(1), out.stride(2), part_o, part_ml, w, t, per_split,
                     float(scale), torch.finfo(mask.dtype).min / 2, hkv, splits, m_pad, REP=rep, D=d, D_P2=d_p2,
                     BLOCK_M=block_m, BLOCK_N=block_n, M_BLOCKS=m_blocks, DIRECT=direct,
                     EXACT=q.dtype.itemsize > 2 or not q.is_cuda, UPCAST=q.dtype.itemsize == 2 and not q.is_cuda,
                     num_warps=4)
        if not direct:
            self._launch(_attend_combine_kernel, (bsz, hkv, rows), part_o, part_ml, out, out.stride(0), out.stride(1),
                         out.stride(2), t, splits, hkv, m_pad, REP=rep, D=d, D_P2=d_p2,
                         SPLITS_P2=triton.next_power_of_2(splits), num_warps=1)
        return out.view(bsz, t, hq * d)


def _variant(op: str, bias, norm) -> str:
    """What a projection does besides the product, for ``shape_key``: ``linear+norm+bias``, ``silu``, ``add``."""
    return op + ("+norm" if norm is not None else "") + ("+bias" if bias is not None else "")

