"""Training checkpoints that resume exactly, that are servable drafts, and that never run code when read.

    <output>/recipe.yaml                              the recipe, written when the run starts
    <output>/checkpoints/step-<n>/config.json         the draft's config  } a draft folder, as <output>/draft/
    <output>/checkpoints/step-<n>/model.safetensors   its weights, fp32   } (eyas eval / export / serve take it)
    <output>/checkpoints/step-<n>/state.pt            {optimizer, scheduler, rng}
    <output>/checkpoints/step-<n>/checkpoint.json     {format, step, position, recipe, data_sha256_16}

The draft is written by its own ``save_pretrained``, in the trainer's fp32 master weights, so the
same file resumes training exactly and serves as is; embeddings are left out (the target's, frozen,
as in every saved draft). ``state.pt`` holds tensors and plain Python values only, so it is read with
``torch.load(weights_only=True)`` (``models.safety.load_torch_file``, the one loader): a crafted file
raises instead of running code. RNG covers Python (its state is ints), NumPy (the MT19937 key as a
tensor), torch's CPU and (if present) CUDA generators. The data position is the ``(epoch, batch)``
of the next batch (see ``batches``); the order inside an epoch is a function of the seed, so nothing
else about the data has to be saved.

``--resume`` takes a step folder or the run's output folder. From a run folder the newest intact
checkpoint is used: a step folder without ``state.pt``, or whose files cannot be read (truncated,
crafted), is skipped with a warning naming it. Checkpoints of older eyas versions kept the draft
inside ``state.pt`` (format 2: not servable, still resumed); before that (``state.pt`` without
``checkpoint.json``) they stored NumPy objects: those load only with ``--allow-pickle`` (still
``weights_only``, plain NumPy arrays admitted). A checkpoint resumes only into the run it came
from: the draft's shapes must match (vocabulary sizes are named), and recipe fields that differ are
refused unless ``--allow-recipe-change``, which resumes with the new values; so are training rows whose digest
differs from the one the checkpoint recorded (the data folder prepared again under the same path).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import EyasError
from ..models.draft import WEIGHTS
from ..models.safety import checked_file, load_torch_file

FORMAT = 3  # 3: the draft is a servable folder beside state.pt; 2: the draft inside state.pt
META, STATE = "checkpoint.json", "state.pt"
SHARED = ("embed_tokens.weight",)  # the target's embeddings (frozen): not in a saved draft
STEP = re.compile(r"step-(\d+)")
# Where and how a run reports, and how long it goes (a finished time-budgeted run records the steps it
# made; a resume may extend it): not what a step computes.
NOT_COMPARED = ("output", "log.", "train.device", "train.max_steps", "train.time_budget_s", "train.epochs")


def rng_state() -> dict:
    np_state = np.random.get_state(legacy=False)
    key = torch.from_numpy(np_state["state"]["key"].astype(np.int64))
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {**np_state, "state": {"key": key, "pos": int(np_state["state"]["pos"])}}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    if isinstance(np_state, dict):  # this format; older checkpoints hold NumPy's legacy tuple
        key = np_state["state"]["key"].numpy().astype(np.uint32)
        np_state = {**np_state, "state": {"key": key, "pos": np_state["state"]["pos"]}}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _steps(run: Path) -> list[Path]:
    """The run's step folders, newest first (``.step-N.tmp`` folders of an interrupted save are not)."""
    found = [(int(m.group(1)), q) for q in (run / "checkpoints").glob("step-*")
             if (m := STEP.fullmatch(q.name)) and q.is_dir()]
    return [q for _, q in sorted(found, reverse=True)]


def save(folder, step: int, draft, optimizer, scheduler, position: tuple[int, int], recipe: dict,
         keep: int = 2, schedule: dict | None = None, data_sha: str | None = None) -> Path:
    """``draft``: a plain ``Eagle3Draft`` on the CPU (``Trainer.servable``), saved as it is (fp32);
    ``schedule``: a time-budgeted run's fitted steps and the seconds left of its budget; ``data_sha``: the
    training rows' digest (``states.split_sha``), which a resume compares."""
    root = Path(folder) / "checkpoints"
    path = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # what an interrupted save left
    with writing(f"checkpoint step-{step}", folder, tmp):
        draft.save_pretrained(tmp)
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
                   tmp / STATE)
        meta = {"format": FORMAT, "step": step, "position": list(position), "recipe": recipe}
        if schedule:
            meta["schedule"] = schedule
        if data_sha:
            meta["data_sha256_16"] = data_sha
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)  # a checkpoint folder exists only once complete
    for old in _steps(Path(folder))[keep:] if keep else []:
        shutil.rmtree(old)
    return path


@contextmanager
def writing(what: str, run, partial: Path | None = None):
    """A full disk or a failing write while saving ``what`` is an eyas error saying where the run can go
    on from, not a traceback; ``partial`` (a folder being written) is removed to give the space back."""
    try:
        yield
    except (OSError, SafetensorError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "writ" not in str(e).lower():
            raise  # torch.save reports a failed write as a RuntimeError; anything else is not ours
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        steps = _steps(Path(run))
        last = f"continue from {steps[0].name} with --resume {run}" if steps else f"start again with --output {run}"
        raise EyasError(f"could not write the {what} in {run}: {e}",
                        f"free disk space there (or lower log.keep_checkpoints), then {last}") from None


@dataclass
class Checkpoint:
    path: Path
    step: int
    position: tuple[int, int]
    recipe: dict | None  # the recipe it was trained with (None: not recorded)
    state: dict  # draft (its saved tensors: no embeddings since format 3), optimizer, scheduler, rng
    schedule: dict | None = None  # a time-budgeted run's {total_steps, step_cap, budget_left_s}
    data_sha: str | None = None  # the digest of the rows it trained on (None: not recorded)


class _Unreadable(Exception):
    """A checkpoint folder that cannot be resumed from; the message says why."""


def find(path, allow_pickle: bool = False, warn=print) -> Checkpoint:
    """The checkpoint ``--resume PATH`` means: that step folder, or a run folder's newest intact one."""
    p = Path(path)
    single = STEP.fullmatch(p.name) is not None or (p / STATE).exists() or (p / META).exists()
    candidates = [p] if single else _steps(p)
    if not candidates:
        raise EyasError(f"no checkpoint under {p} (no checkpoints/step-N folder)",
                        "pass a run's output folder or one of its checkpoints/step-N")
    skipped = []
    for c in candidates:
        try:
            ckpt = _read(c, allow_pickle)
        except _Unreadable as e:
            if single:
                raise EyasError(f"checkpoint {c} cannot be resumed from: {e}",
                                "pass the run folder to resume from its newest intact checkpoint, "
                                "or another of its checkpoints/step-N") from None
            skipped.append(f"{c} ({e})")
            continue
        if skipped:
            warn(f"warning: skipped {len(skipped)} checkpoint(s) that cannot be resumed from: {'; '.join(skipped)}; "
                 f"resuming from {c}")
        return ckpt
    raise EyasError(f"no intact checkpoint under {p}: " + "; ".join(skipped),
                    "start the run again without --resume (or with another --output)")


def _read(c: Path, allow_pickle: bool) -> Checkpoint:
    state_file, meta_file = c / STATE, c / META
    if not state_file.exists() and not state_file.is_symlink():
        raise _Unreadable(f"it has no {STATE}")
    legacy = not meta_file.exists()
    if legacy and not allow_pickle:
        raise EyasError(f"checkpoint {c} was written by an older eyas: its {STATE} holds NumPy objects that only "
                        "unpickling reads, and unpickling a file can run code",
                        "if you trust it (you wrote it), resume with --allow-pickle: it is still read with "
                        "torch.load(weights_only=True), plain NumPy arrays admitted; otherwise start a new run")
    try:
        meta = None if legacy else json.loads(meta_file.read_text())
        state = load_torch_file(state_file, numpy_arrays=legacy)
    except EyasError as e:
        raise _Unreadable(e.problem) from None
    except json.JSONDecodeError as e:
        raise _Unreadable(f"{META} is not valid JSON ({e})") from None
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError/EOFError/... for a truncated file
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Unreadable(f"{STATE} is truncated or not a checkpoint ({type(e).__name__}: {first})") from None
    if legacy and isinstance(state, dict):
        meta = {"step": state.get("step"), "position": state.get("position"), "recipe": state.get("recipe")}
    if isinstance(state, dict) and "draft" not in state and isinstance(meta, dict) and meta.get("format") == 3:
        state["draft"] = _read_draft(c)
    missing = [k for k in ("draft", "optimizer", "scheduler", "rng") if not isinstance(state, dict) or k not in state]
    if missing:
        raise _Unreadable(f"{STATE} is incomplete (no {', '.join(missing)})")
    try:
        step, position = int(meta["step"]), tuple(int(x) for x in meta["position"])
    except (TypeError, ValueError, KeyError):
        raise _Unreadable(f"{META if not legacy else STATE} records no valid step and data position") from None
    return Checkpoint(c, step, position[:2], meta.get("recipe"), state, meta.get("schedule"),
                      meta.get("data_sha256_16"))


def _read_draft(c: Path) -> dict:
    if not (c / WEIGHTS).exists() and not (c / WEIGHTS).is_symlink():
        raise _Unreadable(f"it has no {WEIGHTS} (the draft's weights)")
    try:
        return load_file(str(checked_file(c / WEIGHTS, "the checkpoint's draft weights")))
    except EyasError as e:
        raise _Unreadable(e.problem) from None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own errors for a truncated file
        raise _Unreadable(f"{WEIGHTS} is truncated or not a safetensors file ({type(e).__name__}: {e})") from None


def load_draft(draft, ckpt: Checkpoint) -> None:
    """The checkpoint's draft weights into ``draft`` (its shared embeddings stay the target's)."""
    missing, unexpected = draft.load_state_dict(ckpt.state["draft"], strict=False)
    if unexpected or set(missing) - set(SHARED):
        raise EyasError(f"checkpoint {ckpt.path} holds another draft (missing {sorted(set(missing) - set(SHARED))}, "
                        f"unexpected {sorted(unexpected)})", "resume with the recipe and target it was trained with")


def check_compatible(ckpt: Checkpoint, draft_state: dict, recipe: dict, allow_changes: bool,
                     data_sha: str | None = None) -> list[str]:
    """Refuse a checkpoint of another draft shape; return the recipe fields that differ, and the training rows
    where their digest ``data_sha`` differs from the checkpoint's (a folder prepared again under the same path:
    the epoch's position would index other rows), refused unless ``allow_changes``."""
    saved = ckpt.state["draft"]

    def vocab(sd):
        return (sd["lm_head.weight"].shape[0] if "lm_head.weight" in sd else None,
                sd["t2d"].numel() if "t2d" in sd else None)

    (a, b), (c, d) = vocab(saved), vocab(draft_state)
    if (a, b) != (c, d):
        raise EyasError(f"checkpoint {ckpt.path} holds a draft vocabulary of {a} tokens over a target vocabulary of "
                        f"{b}; this run's draft has {c} tokens over {d}",
                        f"resume with the recipe it was trained with (draft.vocab_size {a}, the target it was "
                        "trained for), or start a new run with another --output")
    bad = [f"{k} {tuple(saved[k].shape) if k in saved else 'missing'} vs {tuple(v.shape)}"
           for k, v in draft_state.items()
           if (k not in saved and k not in SHARED) or (k in saved and tuple(saved[k].shape) != tuple(v.shape))]
    if bad:
        raise EyasError(f"checkpoint {ckpt.path} holds another draft (checkpoint vs this run): " + "; ".join(bad),
                        "resume with the recipe and target it was trained with, or start a new run with another "
                        "--output")
    changes = recipe_changes(ckpt.recipe, recipe)
    if ckpt.data_sha and data_sha and ckpt.data_sha != data_sha:
        changes.append(f"the training rows in data.path (sha256 {ckpt.data_sha} -> {data_sha}: prepared again)")
    if changes and not allow_changes:
        raise EyasError(f"checkpoint {ckpt.path} was trained with another recipe (checkpoint -> now): "
                        + ", ".join(changes),
                        "resume with the checkpoint's values (drop those --set overrides), start a new run with "
                        "another --output, or pass --allow-recipe-change to continue with the new values on purpose "
                        "(the run then no longer matches an uninterrupted one)")
    return changes


def flat_recipe(d: dict, prefix: str = "") -> dict:
    """A recipe as flat ``section.key`` values (tuples as lists): what resume compares, what trackers get."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_recipe(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = list(v) if isinstance(v, tuple) else v
    return out


def recipe_changes(saved: dict | None, now: dict) -> list[str]:
    """``key old -> new`` for each recipe field that differs (none when the checkpoint has no recipe)."""
    if saved is None:
        return []
    a, b = flat_recipe(saved), flat_recipe(now)
    keys = list(b) + [k for k in a if k not in b]
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys
            if not k.startswith(NOT_COMPARED) and a.get(k) != b.get(k)]


def apply_optim(optimizer, scheduler, optim: dict) -> None:
    """After a resume with ``--allow-recipe-change``: the recipe's optimiser values replace the ones
    the checkpoint restored (learning rate, betas, weight decay; the schedule is already this run's)."""
    for g in optimizer.param_groups:
        g.update(initial_lr=optim["lr"], betas=tuple(optim["betas"]), weight_decay=optim["weight_decay"])
    scheduler.base_lrs = [optim["lr"]] * len(optimizer.param_groups)
    for g, f in zip(optimizer.param_groups, scheduler.lr_lambdas):
        g["lr"] = optim["lr"] * f(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def run_recipe(path) -> Path | None:
    """The ``recipe.yaml`` of the run ``--resume PATH`` belongs to (PATH or two folders up), if any."""
    p = Path(path)
    for folder in (p, p.parent.parent) if STEP.fullmatch(p.name) else (p,):
        if (folder / "recipe.yaml").is_file():
            return folder / "recipe.yaml"
    return None


def check_new_output(output) -> None:
    """A run started without ``--resume`` needs an output folder that holds no other run's checkpoints:
    writing there would overwrite its draft/, mix two runs in log.jsonl, and prune the new run's own
    checkpoints as the oldest (``keep_checkpoints`` keeps the highest steps)."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise EyasError(f"the output {out} is a file, not a folder", "pass --output NEW_FOLDER")
    steps = _steps(out) if out.is_dir() else []
    if steps:
        raise EyasError(f"the output {out} already holds a run (checkpoints up to {steps[0].name})",
                        f"continue it with --resume {out}, or start this run in another --output "
                        "(or delete that folder to start over)")


def run_of(resume) -> Path:
    """The run folder ``--resume PATH`` names: PATH, or two folders up from a ``checkpoints/step-N``."""
    p = Path(resume)
    return p.parent.parent if STEP.fullmatch(p.name) and p.parent.name == "checkpoints" else p


def check_continues(resume, output, recipe_file) -> None:
    """``--resume RUN --recipe R`` where R writes elsewhere and no --output says so (``output``: the recipe's, None
    where --output was given): the run would go on in R's folder (runs/draft, say), not in RUN."""
    run = run_of(resume)
    if output is not None and Path(output).resolve() != run.resolve():
        raise EyasError(f"--resume {resume} with --recipe {recipe_file} would continue in {output} (the recipe's "
                        f"output), not in {run}", f"add --output {run} to continue the run there, or --output "
                        "NEW_FOLDER to branch into a new one")


def check_branch(resume, output) -> None:
    """Resuming from a step folder older than its run's newest, into that same run, would mix two timelines:
    the new checkpoints land beside the abandoned ones (``keep_checkpoints`` keeps the highest steps, so the
    branch's own are pruned first) and a later ``--resume RUN`` continues the abandoned one."""
    p, run = Path(resume), run_of(resume)
    if run == p:
        return
    newer = [q for q in _steps(run) if int(STEP.fullmatch(q.name).group(1)) > int(STEP.fullmatch(p.name).group(1))]
    if newer and Path(output).resolve() == run.resolve():
        raise EyasError(f"{p} is older than the run's {newer[0].name}: continuing it in {run} would mix two "
                        "timelines (a later --resume would take the newer one)",
                        f"continue the run with --resume {run}, or branch into a new folder: --resume {p} "
                        f"--recipe {run / 'recipe.yaml'} --output NEW_FOLDER")
