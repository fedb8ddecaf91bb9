"""The mask-free TTT attention equals the old dense-mask implementation: loss, every gradient,
per-step losses, accuracies and counts, with padding (right, and holes inside rows), GQA, a given step_norm,
and under bf16 autocast (loosely). ``reference_ttt_loss`` is the old code, kept as the reference."""

import pytest
import torch
from helpers import tiny_target

from eyas.models import kv_cache
from eyas.models.draft import Eagle3Draft
from eyas.models.vocab import build_vocab
from eyas.train.ttt import target_states, ttt_loss


def _ttt_mask(length: int, step: int, valid: torch.Tensor, dtype) -> torch.Tensor:
    """Additive mask [B, 1, L, (step+1) L]: causal on step-0 keys, diagonal on later steps."""
    idx = torch.arange(length, device=valid.device)
    causal = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]  # [B, L, L]
    diag = torch.eye(length, dtype=torch.bool, device=valid.device).expand(valid.shape[0], length, length)
    allowed = torch.cat([causal] + [diag] * step, dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def reference_ttt_loss(draft, input_ids, aux, target_logits, loss_mask, attention_valid=None, steps=7, decay=0.8,
                       step_norm=None):
    """The TTT loss as eyas computed it before (dense additive mask, keys in a DynamicCache)."""
    bsz, length = input_ids.shape
    dev = input_ids.device
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_valid is None else attention_valid.bool()
    t2d = draft.t2d.to(dev)
    with torch.no_grad():
        target_p = torch.softmax(target_logits[..., t2d].float(), dim=-1)
        target_top = target_p.argmax(-1)
    cache = kv_cache.new_cache()
    hidden = draft.project(aux)
    total = torch.zeros((), device=dev)
    losses, accs, counts = [], [], []
    pos = torch.arange(length, device=dev)[None, :].expand(bsz, length)
    for i in range(steps):
        ids = torch.zeros_like(input_ids)
        if 1 + i < length:
            ids[:, : length - 1 - i] = input_ids[:, 1 + i:]
        mask = _ttt_mask(length, i, valid, hidden.dtype)
        out = draft.backbone(draft.embed(ids), hidden, pos + i, cache, mask)
        logits = draft.logits(out).float()
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
        losses.append(float(step_loss.detach()))
        accs.append(float(acc))
        counts.append(int(m.sum()))
        hidden = out
    return total, losses, accs, counts


def _setup(dtype=torch.float32, rows=5, length=37, draft_vocab=200, seed=0):
    target = tiny_target(dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    draft = Eagle3Draft.for_target(target, draft_vocab, seed=seed)
    with torch.no_grad():  # a draft with some structure, not only its init
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    d2t, t2d = build_vocab(torch.randint(0, 100, (target.info.vocab_size,), generator=gen), draft_vocab)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    ids = torch.randint(0, 256, (rows, length), generator=gen)
    aux, logits = target_states(target, ids)
    loss_mask = (torch.rand(rows, length, generator=gen) > 0.2).float()
    return draft, ids, aux, logits, loss_mask


def _right_padded(rows, length):
    lengths = torch.tensor([length, length - 9, 3, length - 1, 20][:rows])
    return torch.arange(length)[None, :] < lengths[:, None]


def _grads(draft, loss):
    params = [p for p in draft.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("padding", ["none", "right", "holes"])
def test_fast_ttt_equals_dense_mask(padding):
    draft, ids, aux, logits, loss_mask = _setup()
    rows, length = ids.shape
    valid = None
    if padding == "right":
        valid = _right_padded(rows, length)
    elif padding == "holes":  # any pattern in which every query sees a valid key (index 0 here)
        valid = _right_padded(rows, length)
        valid[0, 5:9] = valid[3, 1:4] = False
    ref_loss, ref_steps, ref_acc, ref_count = reference_ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=7)
    ref_grads = _grads(draft, ref_loss)
    r = ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=7)
    grads = _grads(draft, r.loss)
    assert torch.allclose(r.loss, ref_loss, rtol=1e-5, atol=1e-5), (r.loss.item(), ref_loss.item())
    assert r.step_count == ref_count
    assert r.step_acc == pytest.approx(ref_acc, abs=1e-6)
    assert r.step_loss == pytest.approx(ref_steps, rel=1e-5, abs=1e-5)
    for (name, _), g, ref in zip([(n, p) for n, p in draft.named_parameters() if p.requires_grad], grads, ref_grads):
        assert torch.allclose(g, ref, rtol=1e-4, atol=1e-5), (name, (g - ref).abs().max().item())


def test_fast_ttt_exact_in_float64_with_step_norm():
    draft, ids, aux, logits, loss_mask = _setup(dtype=torch.float64, rows=3, length=19)
    valid = _right_padded(3, 19)
    norm = [17.0, 15.0, 3.0, 1.0]
    ref_loss, *_ = reference_ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=4, step_norm=norm)
    for given in (norm, torch.tensor(norm)):  # floats, or a tensor (what DDP ranks pass)
        r = ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=4, step_norm=given)
        assert abs(r.loss.item() - ref_loss.item()) < 1e-10
        for g, ref in zip(_grads(draft, r.loss), _grads(draft, reference_ttt_loss(
                draft, ids, aux, logits, loss_mask, valid, steps=4, step_norm=norm)[0])):
            assert torch.allclose(g, ref, rtol=1e-9, atol=1e-11)


def test_more_steps_than_tokens_and_bf16_autocast():
    draft, ids, aux, logits, loss_mask = _setup(rows=2, length=5)
    r = ttt_loss(draft, ids, aux, logits, loss_mask, steps=7)  # only 4 steps can score anything
    ref_loss, ref_steps, _, ref_count = reference_ttt_loss(draft, ids, aux, logits, loss_mask, steps=7)
    assert len(r.step_loss) == len(ref_steps) == 4 and r.step_count == ref_count
    assert torch.allclose(r.loss, ref_loss, rtol=1e-5)
    # bf16 (what the GPU runs): the same maths within bf16 rounding
    draft, ids, aux, logits, loss_mask = _setup(rows=3, length=40)
    valid = _right_padded(3, 40)
    exact = ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=7).loss
    exact_grads = _grads(draft, exact)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=7).loss
        ref = reference_ttt_loss(draft, ids, aux, logits, loss_mask, valid, steps=7)[0]
    for loss in (fast, ref):  # the new code is as close to fp32 as the old one was
        assert abs(loss.item() - exact.item()) < 0.01 * abs(exact.item()), (fast.item(), ref.item(), exact.item())
        for g, e in zip(_grads(draft, loss), exact_grads):
            assert torch.nn.functional.cosine_similarity(g.flatten(), e.flatten(), dim=0) > 0.999
