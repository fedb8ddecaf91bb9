"""Experiment trackers through ``accelerate.tracking``: TensorBoard, Weights & Biases, MLflow, ...

    log:
      trackers: [tensorboard, wandb, mlflow]   # or: eyas train --report-to tensorboard,wandb
      project: eyas      # wandb project, MLflow experiment
      run_name: null     # default: the output folder's name
      dir: null          # trackers' local files (TensorBoard events, wandb's run folder); default: output

A name is one of accelerate's trackers (tensorboard, wandb, mlflow, comet_ml, aim, clearml, dvclive,
swanlab, trackio) or the ``name`` of a ``GeneralTracker`` subclass registered with
``accelerate.tracking.register_tracker_class``. ``log.tensorboard: true`` is an alias of naming
tensorboard. A tracker whose package is not installed is refused, naming the pip command, before
the target loads and on every rank (so no rank waits on one that stopped). Only rank 0 opens
trackers; each gets the resolved recipe as its configuration and, per log line, what ``log.jsonl``
holds: ``train/loss``, ``train/acc_0`` ... (one per TTT step), ``train/lr``, ``train/tokens_per_s``,
``eval/acc_0`` ..., at the line's step. eyas does not construct an ``Accelerator``: the trainer
keeps its own process group and devices, and only the tracker classes are used.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import EyasError
from .checkpoint import flat_recipe

# name -> (module its tracker imports, pip package). TensorBoardTracker writes through
# torch.utils.tensorboard, which needs the `tensorboard` package.
PACKAGES = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"), "comet_ml": ("comet_ml", "comet-ml"), "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"), "dvclive": ("dvclive", "dvclive"), "swanlab": ("swanlab", "swanlab"),
    "trackio": ("trackio", "trackio"),
}
START_FIX = ("check the tracker's own settings (wandb: `wandb login`, or WANDB_MODE=offline to keep the run "
             "local; MLflow: MLFLOW_TRACKING_URI), or leave it out of log.trackers / --report-to")


def _classes() -> dict:
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return LOGGER_TYPE_TO_CLASS


def requested(log) -> list[str]:
    """The tracker names a recipe's ``log`` section asks for, checked: known to accelerate and installed."""
    names = log.trackers
    if isinstance(names, str):  # --set log.trackers=tensorboard,wandb
        names = names.split(",")
    if not isinstance(names, (list, tuple)):
        raise EyasError(f"recipe key log.trackers = {names!r} is not a list of names",
                        "write e.g. log.trackers: [tensorboard, wandb], or --report-to tensorboard,wandb")
    wanted = [str(n).strip().lower() for n in names] + (["tensorboard"] if log.tensorboard else [])
    out = []
    for name in wanted:
        if name and name != "none" and name not in out:
            out.append(name)
    known = _classes()
    for name in out:
        if name not in known:
            raise EyasError(f"log.trackers names {name!r}, which is not a tracker accelerate knows",
                            f"use some of: {', '.join(sorted(known))} (or register a GeneralTracker subclass "
                            "with accelerate.tracking.register_tracker_class)")
        if name in PACKAGES:
            module, package = PACKAGES[name]
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - missing (ImportError) or broken on import
                raise EyasError(f"the {name} tracker was asked for (log.trackers / --report-to) but the {package} "
                                f"package cannot be imported ({type(e).__name__}: {e})",
                                f"pip install {package}, or leave {name} out of log.trackers / --report-to") from None
    return out


def _config(recipe: dict) -> dict:
    """The recipe as flat ``section.key`` values of the types every tracker takes."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flat_recipe(recipe).items()}


def metrics(event: str, fields: dict) -> dict:
    """A log line's numbers as tracker values: ``event/key``, lists as ``event/key_i``."""
    out = {}
    for k, v in fields.items():
        if k == "step" or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[f"{event}/{k}"] = v
        elif isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
            out.update({f"{event}/{k}_{i}": x for i, x in enumerate(v)})
    return out


def start(ctx, names: list[str], log, output, recipe: dict) -> Trackers:
    """Rank 0 opens the trackers; if it cannot, every rank raises (none waits on it in a collective)."""
    if not names:
        return Trackers()
    opened, error = Trackers(), None
    if ctx.main:
        try:
            opened = Trackers.open(names, log, output, recipe)
        except EyasError as e:
            error = e
    if ctx.sum([float(error is not None)])[0]:
        raise error or EyasError("rank 0 could not start the run's trackers", "see rank 0's error above")
    return opened


def _process_state() -> None:
    """accelerate's trackers log through its logger, which needs its ``PartialState``. With eyas's process
    group already up it only reads it; the current CUDA device, which it may set, is put back."""
    import torch
    from accelerate import PartialState

    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    PartialState()
    if device is not None:
        torch.cuda.set_device(device)


class Trackers:
    """The open trackers of one run (rank 0's); empty elsewhere."""

    def __init__(self, trackers: list | None = None):
        self.trackers = trackers or []

    @classmethod
    def open(cls, names: list[str], log, output, recipe: dict) -> Trackers:
        folder = Path(str(log.dir or output))
        run_name = str(log.run_name or Path(output).resolve().name)
        _process_state()
        opened = []
        try:
            for name in names:
                tracker = cls._make(name, str(log.project), run_name, folder)
                tracker.main_process_only = False  # only rank 0 gets here
                try:
                    if hasattr(tracker, "start"):  # accelerate >= 1.5 starts trackers lazily
                        tracker.start()
                    tracker.store_init_configuration(_config(recipe))
                except Exception as e:  # noqa: BLE001 - each tracker library raises its own types
                    raise EyasError(f"the {name} tracker could not start: {type(e).__name__}: {e}", START_FIX) from None
                opened.append(tracker)
        except BaseException:
            cls(opened).close()
            raise
        return cls(opened)

    @staticmethod
    def _make(name: str, project: str, run_name: str, folder: Path):
        c = _classes()[name]
        folder.mkdir(parents=True, exist_ok=True)
        if name == "tensorboard":  # events under DIR/tensorboard/RUN_NAME
            return c(run_name, str(folder / "tensorboard"))
        if name == "wandb":
            return c(project, name=run_name, dir=str(folder))
        if name == "mlflow":
            return c(experiment_name=project, run_name=run_name)
        # the others, and registered classes: accelerate's convention (project, then the folder if needed)
        return c(project, str(folder)) if c.requires_logging_directory else c(project)

    def log(self, event: str, step: int, fields: dict) -> None:
        values = metrics(event, fields)
        if values:
            for t in self.trackers:
                t.log(values, step=step)

    def close(self) -> None:
        for t in self.trackers:
            t.finish()
        self.trackers = []
