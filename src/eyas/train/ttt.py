"""Training-time test (TTT): the draft unrolled ``k`` steps on its own states, as at inference.

Step 0 at index ``t`` reads ``(token t+1, fc(aux_t))`` at position ``t`` and predicts the target's
next-token distribution at ``t + 1``. Step ``i`` at index ``t`` reads ``(token t+1+i, h_t^(i-1))``
(the previous step's pre-norm output) at position ``t + i`` and predicts the target at ``t+1+i``.
Its attention sees step-0 keys at indices ``<= t`` and, for each earlier step ``j >= 1``, only the
key of index ``t``: exactly what a depth-``i+1`` tree node sees at inference (the committed prefix
plus its own ancestors). The keys live in the same ``DynamicCache`` the engine uses, so the two
paths share one attention implementation.

Loss per step: cross-entropy of the draft logits against the target's distribution restricted to
the draft vocabulary, over assistant tokens; step ``i`` is weighted ``decay ** i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models import kv_cache


@dataclass
class TTTResult:
    loss: torch.Tensor  # scalar, weighted sum over steps
    step_loss: list[float]
    step_acc: list[float]  # top-1 agreement with the target's argmax, per step
    step_count: list[int]  # positions scored per step


def _ttt_mask(length: int, step: int, valid: torch.Tensor, dtype) -> torch.Tensor:
    """Additive mask [B, 1, L, (step+1) L]: causal on step-0 keys, diagonal on later steps."""
    idx = torch.arange(length, device=valid.device)
    causal = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]  # [B, L, L]
    diag = torch.eye(length, dtype=torch.bool, device=valid.device).expand(valid.shape[0], length, length)
    allowed = torch.cat([causal] + [diag] * step, dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def ttt_loss(
    draft,
    input_ids: torch.Tensor,  # [B, L] target token ids
    aux: torch.Tensor,  # [B, L, n_aux * target_hidden] captured target states
    target_logits: torch.Tensor,  # [B, L, vocab] the target's logits at each position
    loss_mask: torch.Tensor,  # [B, L] 1 where the target's prediction at t (of token t+1) is learned
    attention_valid: torch.Tensor | None = None,  # [B, L] 0 on padding
    steps: int = 7,
    decay: float = 0.8,
    step_norm: list[float] | None = None,  # [steps] per-step loss denominators; None: this batch's counts
) -> TTTResult:
    """``step_norm`` lets data-parallel ranks divide by the *global* count of scored positions (over
    world size), so that DDP's gradient average equals the single-process gradient exactly."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_valid is None else attention_valid.bool()
    # Target distribution over the draft vocabulary, predicting token t+1 from position t.
    t2d = draft.t2d.to(dev)
    with torch.no_grad():
        target_p = torch.softmax(target_logits[..., t2d].float(), dim=-1)  # [B, L, draft_vocab]
        target_top = target_p.argmax(-1)
    cache = kv_cache.new_cache()
    hidden = draft.project(aux)
    total = torch.zeros((), device=dev)
    result = TTTResult(total, [], [], [])
    pos = torch.arange(length, device=dev)[None, :].expand(bsz, length)
    for i in range(steps):
        # Inputs: token at t+1+i (shifted ids, zero-padded past the end).
        ids = torch.zeros_like(input_ids)
        if 1 + i < length:
            ids[:, : length - 1 - i] = input_ids[:, 1 + i:]
        mask = _ttt_mask(length, i, valid, hidden.dtype)
        out = draft.backbone(draft.embed(ids), hidden, pos + i, cache, mask)
        logits = draft.logits(out).float()  # [B, L, draft_vocab]
        # Step i at index t predicts the target at t+1+i, so scores index t where that exists.
        shift = 1 + i
        if shift >= length:
            break
        lp = torch.log_softmax(logits[:, : length - shift], dim=-1)
        tgt = target_p[:, shift:]
        m = (loss_mask[:, shift:] * valid[:, shift:]).float()
        per_pos = -(tgt * lp).sum(-1)
        count = m.sum().clamp(min=1.0)
        norm = count if step_norm is None else max(float(step_norm[i]), 1e-9)
        step_loss = (per_pos * m).sum() / norm
        total = total + (decay ** i) * step_loss
        acc = ((lp.detach().argmax(-1) == target_top[:, shift:]).float() * m).sum() / count
        result.step_loss.append(float(step_loss.detach()))
        result.step_acc.append(float(acc))
        result.step_count.append(int(m.sum()))
        hidden = out
    result.loss = total
    return result


@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, lengths: torch.Tensor | None = None):
    """(aux [B, L, n*H], logits [B, L, V]) from one plain causal target forward over padded rows."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    lengths = torch.full((bsz,), length, device=dev) if lengths is None else lengths.to(dev)
    idx = torch.arange(length, device=dev)
    visible = (idx[None, :, None] >= idx[None, None, :]) & ((idx[None, None, :] < lengths[:, None, None]) | (idx[None, :, None] == idx[None, None, :]))
    mask = kv_cache.attention_mask(torch.zeros_like(lengths), 0, visible, target.dtype)
    logits, aux = target.forward(input_ids, idx[None].expand(bsz, length), mask, kv_cache.new_cache())
    return aux, logits
