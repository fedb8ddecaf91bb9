"""A run stops at its first non-finite loss or gradient, and never saves or resumes NaN weights.

``FirstBad`` keeps, on the device, the first step whose loss or gradient norm was NaN/inf: a few tiny
kernels a step and no host sync. The trainer reads it where it reads the device anyway (a log line, a
held-out evaluation, a checkpoint, the final save), so a run that went wrong stops there with an error
naming the step, before anything is written over the last good checkpoint. ``check_state`` refuses
weights (a checkpoint to resume, a draft to start from) that hold NaN/inf, naming the tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import EyasError


class FirstBad:
    def __init__(self, device):
        self.first = torch.zeros((), dtype=torch.long, device=device)  # 0: every step so far was finite

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Record ``step`` if its loss or gradient norm is not finite (and no earlier step was)."""
        if hasattr(grad_norm, "to_local"):  # FSDP2: this rank's part of the norm (ranks agree in ``check``)
            grad_norm = grad_norm.to_local()
        ok = torch.isfinite(loss.detach()).all() & torch.isfinite(grad_norm.detach()).all()
        self.first = torch.where(~ok & (self.first == 0), step, self.first)

    def check(self, ctx, r, out: Path, log=None) -> None:
        """Raise (on every rank alike) if a step so far was not finite. One host read; one collective under torchrun."""
        first = int(self.first.item())
        if ctx.active:
            firsts = [int(x) for x in ctx.gather_objects(first)]
            first = min((x for x in firsts if x), default=0)
        if not first:
            return
        if log is not None:
            log.write("nonfinite", step=first)
        steps = sorted((int(q.name.split("-")[1]) for q in (out / "checkpoints").glob("step-*")
                        if q.name.split("-")[1].isdigit()), reverse=True)
        last = (f"the last good checkpoint, {out / 'checkpoints' / f'step-{steps[0]}'}, is kept as it was; go on "
                f"from it with --resume {out} and a changed recipe (--allow-recipe-change)"
                if steps else "no checkpoint was saved; start again")
        clip = "" if r.optim.grad_clip else " or set optim.grad_clip (e.g. 0.5)"
        raise EyasError(f"training stopped: the loss or gradient norm became NaN/inf at step {first} "
                        f"(optim.lr {r.optim.lr:g}, optim.grad_clip {r.optim.grad_clip:g}, train.autocast "
                        f"{r.train.autocast}, train.target_dtype {r.train.target_dtype}); nothing after it was saved",
                        f"lower optim.lr (try {r.optim.lr / 10:g}){clip}; check the "
                        "data for rows of garbage tokens; train in float32 (train.autocast none, train.target_dtype "
                        f"float32) if bf16 overflows; {last}")


def check_state(state: dict, what: str, fix: str) -> None:
    """Refuse ``state`` (name -> tensor) if a floating-point tensor holds NaN or inf, naming it."""
    bad = [k for k, v in state.items()
           if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" (and {len(bad) - 1} more: {', '.join(bad[1:4])}{', ...' if len(bad) > 4 else ''})" if len(bad) > 1 \
            else ""
        raise EyasError(f"{what} holds NaN/inf values in {bad[0]}{more}: weights a diverged run left", fix)


def optimizer_tensors(optimizer_state: dict) -> dict:
    """The optimizer state's tensors by name (``state.<param>.<key>``), for ``check_state``."""
    return {f"optimizer state.{p}.{k}": v for p, s in (optimizer_state.get("state") or {}).items()
            if isinstance(s, dict) for k, v in s.items()}
