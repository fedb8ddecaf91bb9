"""Training-time test (TTT): the draft unrolled ``k`` steps on its own states, as at inference.

Step 0 at index ``t`` reads ``(token t+1, fc(aux_t))`` at position ``t`` and predicts the target's
next-token distribution at ``t + 1``. Step ``i`` at index ``t`` reads ``(token t+1+i, h_t^(i-1))``
(the previous step's pre-norm output) at position ``t + i`` and predicts the target at ``t+1+i``.
Its attention sees step-0 keys at indices ``<= t`` (not on padding) and, for each step
``1 <= j <= i``, only the key of index ``t``: exactly what a depth-``i+1`` tree node sees at
inference (the committed prefix plus its own ancestors).

No ``[B, L, (i+1) L]`` mask is built (``ttt_attention``). The step-0 keys go through one causal
``scaled_dot_product_attention`` (``is_causal``: flash / memory-efficient kernels), and the ``i``
"diagonal" scores ``q_t . k_j[t]`` are computed elementwise. They join the same softmax as ``i``
extra key slots: each query carries its diagonal scores in a few extra head dimensions and slot
``j``'s key is the unit vector of its dimension, so slot ``j`` scores exactly ``q_t . k_j[t]``;
slot ``j``'s value is a unit vector too, so the output's extra dimensions are the joint softmax
weights ``p_j`` of the diagonal keys, and ``sum_j p_j v_j[t]`` is added elementwise. The kernel's
own running max and log-sum-exp over causal keys and slots make it one exact softmax (merging two
softmaxes by their log-sum-exp outside the kernel would need the kernel's LSE with a gradient,
which PyTorch's SDPA does not give). Padded step-0 keys get ``PAD_SCORE`` through one more extra
dimension, so any padding pattern is exact without a mask. Under bf16 a diagonal score travels as
a bf16 pair (hi + lo, about 16 mantissa bits). The old dense-mask implementation is kept as the
reference in ``tests/train/test_ttt_fast.py``: losses, gradients and accuracies agree (fp32, 1e-5).

Loss per step: cross-entropy of the draft logits against the target's distribution restricted to
the draft vocabulary, over assistant tokens; step ``i`` is weighted ``decay ** i``. Nothing in the
loop waits for the device: the per-step numbers stay one tensor until they are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ..models import kv_cache

PAD_SCORE = -1e4  # unscaled score of a padded key: its softmax weight underflows to exactly 0


@dataclass
class TTTResult:
    loss: torch.Tensor  # scalar, weighted sum over steps
    stats: torch.Tensor  # [3, steps run] detached: loss, top-1 accuracy, scored positions, per step
    _host: list | None = field(default=None, repr=False)

    def _read(self) -> list:
        if self._host is None:  # one device-to-host copy, on first read
            self._host = self.stats.double().tolist() if self.stats.numel() else [[], [], []]
        return self._host

    @property
    def step_loss(self) -> list[float]:
        return self._read()[0]

    @property
    def step_acc(self) -> list[float]:  # top-1 agreement with the target's argmax, per step
        return self._read()[1]

    @property
    def step_count(self) -> list[int]:  # positions scored per step
        return [int(round(c)) for c in self._read()[2]]


@dataclass
class Layout:
    """Extra head dimensions after the ``dim`` real ones: [padding flag][diagonal scores][zeros]."""

    dim: int
    parts: int  # dimensions per diagonal score: 1 in fp32/fp64, 2 (hi, lo) in half precision
    pad: bool  # whether padded keys are hidden through the first extra dimension
    width: int  # dim + extra, the extra rounded up to a multiple of 8

    @classmethod
    def make(cls, dim: int, max_diag: int, dtype: torch.dtype, pad: bool) -> Layout:
        parts = 1 if dtype in (torch.float32, torch.float64) else 2
        need = max_diag * parts + int(pad)
        return cls(dim, parts, pad, dim + -(-need // 8) * 8)  # need 0: no extra dimensions

    def score_col(self, j: int) -> int:
        return self.dim + int(self.pad) + self.parts * j


def step0_keys(k: torch.Tensor, v: torch.Tensor, heads: int, lay: Layout, slots: int, key_pad: torch.Tensor | None):
    """Step-0 keys/values ``[B, Hkv, L, D]`` -> ``[B, H, slots + L, width]``, GQA-repeated, behind
    ``slots`` diagonal slots: the slot at row ``slots - 1 - j`` stands for diagonal key ``j`` (its key
    is 1 in that score's dimensions, its value 1 in dimension ``D + j``), so a step with ``n``
    diagonal keys uses the last ``n`` slots. Extra dimensions are zero, but for ``PAD_SCORE`` in
    the padding one where ``key_pad`` ([B, L]) is True."""
    bsz, kv_heads, length, dim = k.shape
    if heads > kv_heads:
        k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
    ek = k.new_zeros(bsz, heads, length, lay.width - dim)
    if lay.pad:
        ek[..., 0] = (key_pad.to(k.dtype) * PAD_SCORE)[:, None]
    slot_k = k.new_zeros(slots, lay.width)
    slot_v = v.new_zeros(slots, lay.width)
    for j in range(slots):
        c = lay.score_col(j)
        slot_k[slots - 1 - j, c: c + lay.parts] = 1  # scores hi_j + lo_j = q_t . k_j[t]
        slot_v[slots - 1 - j, dim + j] = 1  # writes its softmax weight to output dimension D + j
    ka = torch.cat([slot_k.expand(bsz, heads, slots, lay.width), torch.cat([k, ek], dim=-1)], dim=2)
    va = torch.cat([slot_v.expand(bsz, heads, slots, lay.width), torch.cat([v, torch.zeros_like(ek)], dim=-1)], dim=2)
    return ka, va


def ttt_attention(
    q: torch.Tensor,  # [B, H, L, D] this step's queries, rotary applied
    k0: torch.Tensor,  # [B, H, slots + L, width] step-0 keys behind the diagonal slots (step0_keys)
    v0: torch.Tensor,  # [B, H, slots + L, width] likewise for values
    diag_k: list[torch.Tensor],  # n x [B, Hkv, L, D]: keys of steps 1..n at the query's own index
    diag_v: list[torch.Tensor],  # n x [B, Hkv, L, D]
    lay: Layout,
    scale: float,
) -> torch.Tensor:
    """``[B, H, L, D]``: causal attention over step-0 keys and the diagonal keys in one softmax."""
    bsz, heads, length, dim = q.shape
    n, w = len(diag_k), lay.width
    slots = k0.shape[2] - length
    ka, va = k0[:, :, slots - n:], v0[:, :, slots - n:]
    # n dummy queries in front: under is_causal, query n + t sees the n slots and step-0 keys 0..t.
    qa = q.new_zeros(bsz, heads, n + length, w)
    qa[:, :, n:, :dim] = q
    if lay.pad:
        qa[:, :, n:, dim] = 1
    if n:
        kv_heads = diag_k[0].shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # diagonal scores at least in fp32
        qg = q.to(acc).view(bsz, kv_heads, heads // kv_heads, length, dim)
        for j, kj in enumerate(diag_k):
            d = (qg * kj.to(acc)[:, :, None]).sum(-1).view(bsz, heads, length)  # unscaled q_t . k_j[t]
            c = lay.score_col(j)
            hi = d.to(q.dtype)
            qa[:, :, n:, c] = hi
            if lay.parts == 2:
                qa[:, :, n:, c + 1] = (d - hi.to(acc)).to(q.dtype)  # the rounding error of hi
    out = F.scaled_dot_product_attention(qa, ka, va, is_causal=True, scale=scale)[:, :, n:]
    if not n:
        return out[..., :dim]
    kv_heads = diag_v[0].shape[1]
    p = out[..., dim: dim + n].reshape(bsz, kv_heads, heads // kv_heads, length, n)  # joint weights
    vd = torch.stack(diag_v, dim=-2).to(p.dtype)  # [B, Hkv, L, n, D]
    mixed = torch.einsum("bgrln,bglnd->bgrld", p, vd).reshape(bsz, heads, length, dim)
    return out[..., :dim] + mixed


def ttt_loss(
    draft,
    input_ids: torch.Tensor,  # [B, L] target token ids
    aux: torch.Tensor,  # [B, L, n_aux * target_hidden] captured target states
    target_logits: torch.Tensor,  # [B, L, vocab] the target's logits at each position
    loss_mask: torch.Tensor,  # [B, L] 1 where the target's prediction at t (of token t+1) is learned
    attention_valid: torch.Tensor | None = None,  # [B, L] 0 on padding
    steps: int = 7,
    decay: float = 0.8,
    step_norm=None,  # [steps] floats or a device tensor: per-step loss denominators; None: this batch's counts
) -> TTTResult:
    """``step_norm`` lets data-parallel ranks divide by the *global* count of scored positions (over
    world size), so that DDP's gradient average equals the single-process gradient exactly.

    Uses the draft's own modules (``midlayer``'s norms, q/k/v/o projections and MLP, ``rotary_emb``,
    ``lm_head``) with the attention above; the inference path (``draft.backbone``) is not used."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_valid is None else attention_valid.bool()
    # Target distribution over the draft vocabulary, predicting token t+1 from position t. Draft id r
    # is target id r + d2t[r] (what the engine proposes), the ids t2d marks, in the same order.
    vocab_ids = torch.arange(draft.d2t.numel(), device=dev) + draft.d2t.to(dev)
    with torch.no_grad():
        target_p = torch.softmax(target_logits[..., vocab_ids].float(), dim=-1)  # [B, L, draft_vocab]
        target_top = target_p.argmax(-1)
    layer = draft.midlayer
    attn = layer.self_attn
    heads, dim = attn.num_heads, attn.head_dim
    scale = dim ** -0.5
    hidden = draft.project(aux)
    pos = torch.arange(length, device=dev)[None, :].expand(bsz, length)
    total = torch.zeros((), device=dev)
    rows = []
    k0 = v0 = lay = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    for i in range(steps):
        shift = 1 + i  # step i at index t predicts the target at t+1+i: scored where that exists
        if shift >= length:
            break
        ids = torch.zeros_like(input_ids)  # inputs: the token at t+1+i, zero past the end
        ids[:, : length - shift] = input_ids[:, shift:]
        cos, sin = draft.rotary_emb(hidden, pos + i)
        x = torch.cat([layer.input_layernorm(draft.embed(ids)), layer.hidden_norm(hidden)], dim=-1)
        q, k, v = (proj(x).view(bsz, length, -1, dim).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if i == 0:
            slots = min(steps, length - 1) - 1  # diagonal keys of the last step
            lay = Layout.make(dim, slots, q.dtype, attention_valid is not None)
            k0, v0 = step0_keys(k, v, heads, lay, slots, None if attention_valid is None else ~valid)
        else:
            diag_k.append(k)
            diag_v.append(v)
        a = ttt_attention(q, k0, v0, diag_k, diag_v, lay, scale)
        h = hidden + attn.o_proj(a.transpose(1, 2).reshape(bsz, length, heads * dim))
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = draft.logits(out[:, : length - shift]).float()  # [B, L - shift, draft_vocab]
        lp = torch.log_softmax(logits, dim=-1)
        m = (loss_mask[:, shift:] * valid[:, shift:]).float()
        per_pos = -(target_p[:, shift:] * lp).sum(-1)
        scored = m.sum()
        if step_norm is None:
            norm = scored.clamp(min=1.0)
        elif torch.is_tensor(step_norm):
            norm = step_norm[i].clamp(min=1e-9)
        else:
            norm = max(float(step_norm[i]), 1e-9)
        step_loss = (per_pos * m).sum() / norm
        total = total + (decay ** i) * step_loss
        acc = ((lp.detach().argmax(-1) == target_top[:, shift:]).float() * m).sum() / scored.clamp(min=1.0)
        rows.append(torch.stack([step_loss.detach().float(), acc, scored]))
        hidden = out
    stats = torch.stack(rows, dim=1) if rows else torch.zeros(3, 0, device=dev)
    return TTTResult(total, stats)


@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, lengths: torch.Tensor | None = None):
    """(aux [B, L, n*H], logits [B, L, V]) from one plain causal target forward over padded rows."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    lengths = torch.full((bsz,), length, device=dev) if lengths is None else lengths.to(dev)
    idx = torch.arange(length, device=dev)
    row, col = idx[None, :, None], idx[None, None, :]
    visible = (row >= col) & ((col < lengths[:, None, None]) | (row == col))
    mask = kv_cache.attention_mask(torch.zeros_like(lengths), 0, visible, target.dtype)
    # No KV cache: nothing reads it, and it would hold every layer's keys and values until the logits
    # exist (an MLA target's decompressed keys are 61 x 64 x 320 numbers a token for Kimi-K2.5).
    logits, aux = target.forward(input_ids, idx[None].expand(bsz, length), mask, None)
    return aux, logits
