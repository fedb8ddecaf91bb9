"""The EAGLE-3 trainer: TTT loss, AdamW with warm-up and cosine decay, clipping, checkpoints, eval.

One ``Trainer.fit()`` runs single-process or under ``torchrun`` (DDP, or FSDP2 for the draft);
the target is frozen and either replicated per rank or FSDP2-sharded (``train.shard_target``).
bf16 autocast on the GPU, fp32 on the CPU; draft master weights are fp32 either way.

Data-parallel exactness: each rank divides its loss by the global count of scored positions over
world size (``ttt_loss(step_norm=...)``), so DDP's gradient average equals a single process
training on the same global batch. The CI test checks that.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

from ..common import dist
from ..data.tokenized import TokenizedSplit, load_array
from ..errors import EyasError
from ..models.draft import Eagle3Draft
from . import checkpoint, trackers
from .batches import collate, epoch_batches, rank_rows, to_device
from .budget import TimeBudget
from .data_meta import check_data_meta
from .evaluate import heldout_metrics
from .finite import FirstBad, check_state, optimizer_tensors
from .logger import RunLog, Window
from .new_draft import blank_draft, build_draft
from .recipe import Recipe, check_aux_ids
from .sharded_target import broadcast_module, load_sharded_target, shard_target
from .states import OfflineStates, OnlineStates, build_cache, cache_complete, fingerprint, split_sha
from .ttt import ttt_loss


class TTTModule(nn.Module):
    """The draft plus its loss, so DDP/FSDP wrap one module whose forward is the whole step."""

    def __init__(self, draft: Eagle3Draft, steps: int, decay: float):
        super().__init__()
        self.draft, self.steps, self.decay = draft, steps, decay

    def forward(self, input_ids, aux, logits, loss_mask, valid, step_norm):
        r = ttt_loss(self.draft, input_ids, aux, logits, loss_mask, valid, self.steps, self.decay, step_norm)
        return r.loss, r


def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


class Trainer:
    def __init__(self, recipe: Recipe, target=None, ctx: dist.DistContext | None = None, log=print,
                 trust_remote_code: bool = False, allow_pickle: bool = False):
        self.r = r = recipe.validate()
        self.ctx = ctx or dist.init(r.train.device)
        self.tracker_names = trackers.requested(r.log)  # a missing package stops every rank before any load
        self.train_split = TokenizedSplit(Path(r.data.path), "train")  # a --select-only folder: said before loading
        self.print = log if self.ctx.main else (lambda *a, **k: None)
        whole = None  # with train.shard_target: the whole target on rank 0's host, until the draft is made
        sharded = r.train.shard_target and self.ctx.active
        if target is None and sharded:
            from ..models.loading import parse_dtype

            dtype = parse_dtype(r.train.target_dtype, self.ctx.device)
            target, whole = load_sharded_target(r.target, self.ctx, dtype, r.draft.aux_layer_ids, trust_remote_code,
                                                allow_pickle)
        elif target is None:
            from ..models.loading import load_target

            target = load_target(r.target, device=self.ctx.device, dtype=r.train.target_dtype,
                                 trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        if r.draft.aux_layer_ids is not None or target.aux_layer_ids is None:  # None: the error says why
            target.set_aux_layers(check_aux_ids(r.draft.aux_layer_ids, target.info.num_layers))
        self.target = target
        data = Path(r.data.path)
        meta = check_data_meta(data, self.target)
        ctx_len, length = target.info.max_context, min(r.data.max_length, meta.get("max_length") or r.data.max_length)
        if ctx_len and length > ctx_len:  # rows are no longer than eyas prepare cut them (for this target: its context)
            raise EyasError(f"data.max_length {r.data.max_length} exceeds the target's context ({ctx_len}), and so do "
                            f"the prepared rows (up to {length} tokens)", f"set data.max_length to at most {ctx_len}")
        chat = meta.get("chat") or {}
        if self.train_split.loss_tokens == 0:
            raise EyasError(f"the training data in {data} has no assistant tokens to learn",
                            "prepare conversations with assistant turns (eyas prepare --regenerate)")
        held = (data / "heldout.tokens.npy").is_file()  # no held-out split is fine; a broken one is an error
        self.heldout = TokenizedSplit(data, "heldout", allow_empty=True) if held else None
        if self.heldout is not None and len(self.heldout.lengths()) == 0:
            self.heldout = None
        if self.heldout is None and r.log.eval_every and r.data.eval_rows:
            self.print(f"warning: {data} holds no held-out rows, so log.eval_every {r.log.eval_every} evaluates "
                       "nothing; prepare with a larger --held-out (0.02 of a small set may round to none)")
        counts_file = data / "vocab_counts.npy"
        counts = load_array(counts_file, "integer") if counts_file.is_file() else np.ones(target.info.vocab_size,
                                                                                             dtype=np.int64)
        if sharded and not isinstance(target.embed_tokens.weight, DTensor):
            self.draft = build_draft(target, r, counts, allow_pickle).to(self.ctx.device)
            shard_target(target)  # a target passed in whole: after the draft copied its embeddings and head
        elif sharded:  # made on rank 0 from the whole weights, then sent to every rank
            made = build_draft(whole, r, counts, allow_pickle) if whole is not None else blank_draft(target, r)
            self.draft = made.to(self.ctx.device)
            broadcast_module(self.draft)
            del whole
        else:
            self.draft = build_draft(target, r, counts, allow_pickle).to(self.ctx.device)
        # what the doctor compares with serving, in every saved config.json (draft/ and each checkpoints/step-N)
        self.draft.config.eyas = {**(self.draft.config.eyas or {}), "training": {
            "max_length": length,
            "chat_template_sha256_16": chat.get("template_sha256_16"), "thinking": chat.get("thinking")}}
        self.module = TTTModule(self.draft, r.train.ttt_steps, r.train.decay)
        self.wrapped = self._wrap(self.module)
        params = [p for p in self.module.parameters() if p.requires_grad]
        o = r.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
        self.batches_per_epoch = len(self._epoch(0))
        if self.batches_per_epoch == 0:
            raise EyasError("the training data gives no batch", "prepare more rows or lower the number of ranks")
        total = r.train.max_steps or max(1, int(self.batches_per_epoch * r.train.epochs))
        self.total_steps, self.step_cap, self.budget_s = total, total, r.train.time_budget_s
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda(total))
        self.step, self.position = 0, (0, 0)
        self.states = self._states(target)
        self.eval_states = self._states(target, split="heldout") if self.heldout is not None else None
        self.out = Path(r.output)
        self.log = RunLog(self.out, enabled=self.ctx.main)

    def _lr_lambda(self, total: int):
        o = self.r.optim
        return lr_lambda(total, int(total * o.warmup_ratio), o.min_lr_ratio)

    def _fit_budget(self, steps_done: int, seconds: float, budget_left: float) -> None:
        """Fit the run to the time budget: same schedule shape, the steps the measured rate allows, never more than
        the recipe's own (every rank agrees)."""
        rate = steps_done / max(seconds, 1e-9)
        want = self.ctx.mean([float(self.step + int(rate * budget_left))])[0]
        total = max(self.step + 1, min(self.step_cap, int(want)))
        if total != self.total_steps:
            self.print(f"time budget: {rate:.2f} steps/s, so {total} steps instead of {self.total_steps}")
            self.total_steps = total
            self.scheduler.lr_lambdas[0] = self._lr_lambda(total)
            self.log.write("budget", step=self.step, total_steps=total, steps_per_s=round(rate, 3))

    # -- setup ----------------------------------------------------------------------------------
    def _wrap(self, module: nn.Module) -> nn.Module:
        if not self.ctx.active:
            return module
        if self.r.train.parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(module)
            return module
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [torch.device(self.ctx.device).index] if self.ctx.device.startswith("cuda") else None
        return DDP(module, device_ids=ids, broadcast_buffers=False)

    def _states(self, target, split: str = "train"):
        r = self.r
        if r.train.mode == "online":
            return OnlineStates(target)
        folder = Path(r.train.offline_dir or (Path(r.output) / "states")) / split
        data = self.train_split if split == "train" else self.heldout
        fp = fingerprint(target, data, r.train.offline_dtype, self._data_sha() if split == "train" else None)
        if not cache_complete(folder, len(data), r.data.max_length, target.aux_layer_ids, fp):
            self.print(f"caching target states for {split} in {folder} (offline mode)")
            build_cache(target, data, folder, r.data.max_length, r.train.offline_dtype, rank=self.ctx.rank,
                        world=self.ctx.world, progress=r.log.progress and self.ctx.main, fp=fp)
            self.ctx.barrier()
        return OfflineStates(folder, self.ctx.device, torch.float32 if self.ctx.device == "cpu" else target.dtype)

    def _epoch(self, epoch: int):
        if getattr(self, "_cached_epoch", None) != epoch:
            d = self.r.data
            self._cached = epoch_batches(self.train_split.lengths(), d.max_length, d.tokens_per_batch,
                                         self.ctx.world, self.r.train.seed, epoch)
            self._cached_epoch = epoch
        return self._cached

    def autocast(self):
        mode = self.r.train.autocast
        on_gpu = self.ctx.device.startswith("cuda")
        if mode == "none" or (mode == "auto" and not on_gpu):
            return contextlib.nullcontext()
        return torch.autocast("cuda" if on_gpu else "cpu", dtype=torch.bfloat16)

    # -- checkpoints ----------------------------------------------------------------------------
    def draft_state(self) -> dict:
        state = self.draft.state_dict()
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in state.items()}

    def servable(self) -> Eagle3Draft:
        """The draft as a plain module on the CPU, ready to save (under FSDP a collective: every rank calls it)."""
        full = self.draft_state()
        with torch.device("meta"):  # no second allocation: the module takes the CPU tensors as they are
            plain = Eagle3Draft(self.draft.config)
        plain.load_state_dict(full, assign=True)
        return plain

    def _check_finite(self) -> None:
        if getattr(self, "bad", None) is not None:
            self.bad.check(self.ctx, self.r, self.out, self.log)

    def save_checkpoint(self) -> None:
        if self.r.train.parallel == "fsdp" and self.ctx.active:
            return  # sharded optimizer state: checkpoints are DDP/single-process only (see docs/train.md)
        self._check_finite()  # never over the last good checkpoint
        if self.ctx.main:
            schedule = None if self.budget_s is None else {
                "total_steps": self.total_steps, "step_cap": self.step_cap,
                "budget_left_s": self.budget_s - (time.perf_counter() - self.t_start)}
            path = checkpoint.save(self.out, self.step, self.servable(), self.optimizer, self.scheduler,
                                   self.position, self.r.to_dict(), self.r.log.keep_checkpoints, schedule,
                                   self._data_sha())
            self.log.write("checkpoint", step=self.step, path=str(path))
        self.ctx.barrier()

    def _data_sha(self) -> str:
        """The training rows' digest (once a run: it reads every token), which checkpoints record."""
        if getattr(self, "_sha", None) is None:
            self._sha = split_sha(self.train_split)
        return self._sha

    def resume(self, path, allow_pickle: bool = False, allow_recipe_change: bool = False) -> None:
        ckpt = checkpoint.find(path, allow_pickle, warn=self.print)
        recipe = self.r.to_dict()
        changes = checkpoint.check_compatible(ckpt, self.draft.state_dict(), recipe, allow_recipe_change,
                                              self._data_sha())
        check_state({**ckpt.state["draft"], **optimizer_tensors(ckpt.state["optimizer"])}, f"checkpoint {ckpt.path}",
                    f"resume from an earlier checkpoint (--resume {ckpt.path.parent}/step-N) or start again with a "
                    "lower optim.lr")
        checkpoint.load_draft(self.draft, ckpt)
        self.optimizer.load_state_dict(ckpt.state["optimizer"])
        self.scheduler.load_state_dict(ckpt.state["scheduler"])
        if changes:
            checkpoint.apply_optim(self.optimizer, self.scheduler, recipe["optim"])
            self.print("warning: resuming with a changed recipe (checkpoint -> now): " + ", ".join(changes))
        checkpoint.set_rng_state(ckpt.state["rng"])
        self.step, self.position = ckpt.step, ckpt.position
        if ckpt.schedule and (ckpt.recipe or {}).get("train", {}).get("time_budget_s") == self.r.train.time_budget_s:
            s = ckpt.schedule  # the same budget: its fitted schedule goes on, with the seconds it had left
            self.total_steps, self.step_cap, self.budget_s = s["total_steps"], s["step_cap"], s["budget_left_s"]
            self.scheduler.lr_lambdas[0] = self._lr_lambda(self.total_steps)
        self.print(f"resumed at step {self.step} (epoch {self.position[0]}, batch {self.position[1]})")

    # -- the loop -------------------------------------------------------------------------------
    def _step_norm(self, b):
        """Per-step loss denominators: the global count of scored positions over world size. Floats
        in one process; under torchrun a device tensor, all-reduced without waiting on the host."""
        m = b.loss_mask * b.valid
        counts = [float(m[:, 1 + i:].sum()) for i in range(self.r.train.ttt_steps)]
        if not self.ctx.active:
            return counts
        t = self.ctx.all_sum(to_device(torch.tensor(counts, dtype=torch.float64), self.ctx.comm_device))
        return (t / self.ctx.world).float().to(self.ctx.device)

    def train_step(self, b) -> dict:
        """One optimizer step. Returns device tensors, read on the host only when a log line is due."""
        dev = self.ctx.device
        aux, logits = self.states(b)
        aux = aux.float()  # fp32 into the fp32 master weights; autocast lowers the matmuls on the GPU
        norm = self._step_norm(b)
        ids, loss_mask, valid = (to_device(t, dev) for t in (b.input_ids, b.loss_mask, b.valid))
        with self.autocast():
            loss, res = self.wrapped(ids, aux, logits, loss_mask, valid, norm)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.r.optim.grad_clip or float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # res.stats[0] is this rank's loss over (global count / world): its ranks' mean is the global mean.
        return {"stats": res.stats, "grad_norm": gnorm, "tokens": b.tokens, "loss": loss}

    def _synced_time(self) -> float:
        self._sync()
        return time.perf_counter()

    def _sync(self) -> None:
        if self.ctx.device.startswith("cuda"):
            torch.cuda.synchronize()

    def evaluate(self) -> dict | None:
        if self.heldout is None or not self.r.data.eval_rows:  # data.eval_rows 0: no held-out evaluation
            return None
        d, t = self.r.data, self.r.train
        return heldout_metrics(self.wrapped, self.heldout, self.eval_states, self.ctx, d.max_length,
                               d.tokens_per_batch, t.ttt_steps, t.decay, d.eval_rows, self.autocast)

    def fit(self, stop_after: int | None = None) -> dict:
        """Train to ``total_steps``; ``stop_after`` ends early without the final save (tests a crash)."""
        r, ctx = self.r, self.ctx
        if ctx.main:  # written first, so `eyas train --resume RUN` alone finds it after a crash
            self.out.mkdir(parents=True, exist_ok=True)
            r.dump(self.out / "recipe.yaml")
        self.log.track(trackers.start(ctx, self.tracker_names, r.log, self.out, r.to_dict()))
        self.module.train()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not (r.log.progress and ctx.main), dynamic_ncols=True)
        window = Window(r.train.ttt_steps, ctx.device)
        t_window = time.perf_counter()
        self.bad = FirstBad(ctx.device)
        t_start, tokens_total = time.perf_counter(), 0
        self.t_start, last_eval = t_start, None
        budget = TimeBudget(max(self.budget_s, 1e-3), self.step, t_start) if self.budget_s is not None else None
        while self.step < self.total_steps:
            epoch, index = self.position
            batches = self._epoch(epoch)
            if index >= len(batches):
                self.position = (epoch + 1, 0)
                continue
            b = collate(self.train_split, rank_rows(batches[index], ctx.rank, ctx.world), r.data.max_length)
            m = self.train_step(b)
            self.step += 1
            self.bad.add(self.step, m["loss"], m["grad_norm"])  # on the device; read with the log line
            self.position = (epoch, index + 1)
            window.add(m["stats"], m["tokens"])
            bar.update(1)
            fit = budget and budget.due(self.step, self.step % r.log.every == 0, self._synced_time,
                                        lambda: ctx.mean([time.perf_counter() - t_start])[0])
            if fit:
                self._fit_budget(*fit)
                bar.total = self.total_steps
            if self.step % r.log.every == 0 or self.step == self.total_steps:
                losses, correct, scored = window.stats.tolist()  # the host reads the device once per log line
                self._check_finite()
                k = len(scored)
                sums = ctx.sum([window.tokens] + correct + scored)
                self._sync()
                dt = time.perf_counter() - t_window
                tokens, accs, counts = sums[0], sums[1:1 + k], sums[1 + k:]
                tokens_total += tokens
                step_loss = [x / window.n for x in ctx.mean(losses)]
                acc = [a / c if c else 0.0 for a, c in zip(accs, counts)]
                rec = {"step": self.step, "epoch": round(epoch + index / max(1, len(batches)), 3),
                       "loss": round(sum(r.train.decay ** i * x for i, x in enumerate(step_loss)), 4),
                       "step_loss": [round(x, 4) for x in step_loss], "acc": [round(a, 4) for a in acc],
                       "lr": self.scheduler.get_last_lr()[0], "grad_norm": round(float(m["grad_norm"]), 4),
                       "tokens_per_s": round(tokens / dt, 1), "ranks": ctx.world}
                self.log.write("train", **rec)
                bar.set_postfix(loss=f"{rec['loss']:.3f}", acc0=f"{acc[0]:.3f}", tok_s=f"{tokens / dt:.0f}")
                window = Window(r.train.ttt_steps, ctx.device)
                t_window = time.perf_counter()
            if r.log.eval_every and (self.step % r.log.eval_every == 0 or self.step == self.total_steps):
                self._check_finite()
                last_eval = self.evaluate()
                if last_eval:
                    self.log.write("eval", step=self.step, **last_eval)
                    if ctx.main:  # every rank holds the same summed figures; one reports them
                        bar.write(f"step {self.step}: held-out acc per TTT step {last_eval['acc']}")
                t_window = time.perf_counter()
            if r.log.checkpoint_every and self.step % r.log.checkpoint_every == 0 and self.step < self.total_steps:
                self.save_checkpoint()
                t_window = time.perf_counter()
            if stop_after is not None and self.step >= stop_after:
                bar.close()
                return {"steps": self.step, "stopped": True}
        bar.close()
        elapsed = time.perf_counter() - t_start
        summary = {"steps": self.step, "total_steps": self.total_steps, "seconds": round(elapsed, 1),
                   "tokens_per_s": round(tokens_total / elapsed, 1) if elapsed else 0.0, "ranks": ctx.world,
                   "heldout": last_eval}
        self._check_finite()  # a NaN draft is never saved
        plain = self.servable()  # a collective under FSDP: every rank takes part
        if ctx.main:
            with checkpoint.writing("final draft", self.out):
                plain.save_pretrained(self.out / "draft", dtype=_dtype(r.draft.save_dtype))
            resolved = copy.deepcopy(r)  # what reproduces this run: the budget resolved to steps
            if budget:
                resolved.train.max_steps, resolved.train.time_budget_s = self.total_steps, None
            resolved.dump(self.out / "recipe.yaml")
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            self.log.write("done", **summary)
        self.save_checkpoint()
        self.log.close()
        return summary


def _dtype(name: str):
    from ..models.loading import parse_dtype

    return parse_dtype(name, "cpu") if name not in ("auto", None) else None
