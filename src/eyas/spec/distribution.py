"""The target's sampling distribution in threshold form: the torch reference (``distribution``).

``sample.sampling`` defines the settings (temperature, top-k, top-p, min-p) and documents the
definition; it lives here, one layer down, so that the tree's ops (``tree_ops.TreeOps.distribution``
and its kernel, ``distribution_kernel``) can call it: ``spec`` never imports ``engine``.
"""

from __future__ import annotations

import math

import torch


def scaled(logits: torch.Tensor, floats: torch.Tensor) -> torch.Tensor:
    """``x`` [N, V] float32: each row of ``logits`` [N, V] over its temperature ``floats[:, 0]`` (a
    greedy row's, 0: 1)."""
    temperature = floats[:, 0]
    return logits.float() / torch.where(temperature > 0, temperature, 1.0)[:, None]


def distribution(logits: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor, filtered: bool):
    """The distribution of each row of ``logits`` [N, V] under the settings ``floats`` [N, 3], ``ints``
    [N, 2] (``SamplingRows``' columns) in threshold form: ``(x [N, V] float32, m [N], thr [N], z [N])``
    with ``p(t) = exp(x_t - m) / z`` where ``x_t >= thr``. Greedy rows get temperature 1 (their callers
    take the argmax instead). ``filtered`` False skips top-k and top-p (and the sort they need): only
    for rows that use neither."""
    _, top_p, min_p = floats.unbind(-1)
    x = scaled(logits, floats)
    m = x.amax(dim=-1)
    thr = torch.where(min_p > 0, m + torch.log(min_p), -math.inf)
    if filtered:
        top_k, vocab = ints[:, 0], x.shape[-1]
        s = torch.sort(x, dim=-1, descending=True).values  # [N, V]
        kth = s.gather(1, (top_k.clamp(1, vocab) - 1)[:, None])[:, 0]
        thr_k = torch.where(top_k > 0, kth, -math.inf)
        e = torch.exp(s - m[:, None]) * (s >= thr_k[:, None])  # the top-k-renormalised weights, sorted
        cum = e.cumsum(dim=-1)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)  # mass strictly before each
        kept = (before < (top_p * cum[:, -1])[:, None]).sum(dim=-1)  # a prefix: before never decreases
        thr_p = s.gather(1, (kept - 1).clamp(min=0)[:, None])[:, 0]
        thr = torch.maximum(thr, torch.where(top_p < 1.0, thr_p, -math.inf))
        thr = torch.maximum(thr, thr_k)
    thr = thr.clamp(min=torch.finfo(x.dtype).min)  # a -inf logit (a grammar's masked token) is never kept
    z = (torch.exp(x - m[:, None]) * (x >= thr[:, None])).sum(dim=-1)
    return x, m, thr, z
