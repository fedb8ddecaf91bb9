"""The training recipe: one YAML file, sections as dataclasses, command-line overrides on top.

    eyas train --recipe recipes/smollm2.yaml --set optim.lr=3e-4 --set train.epochs=2

Every key is validated here, once, with errors that name the key and a valid value. The resolved
recipe is written next to the checkpoints, so a run can always be reproduced and resumed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import EyasError
from ..models.loading import DTYPES


@dataclass
class DataSection:
    path: str = ""  # folder written by `eyas prepare`
    max_length: int = 2048  # rows are cut to this many tokens
    tokens_per_batch: int = 16384  # per rank: rows * padded length <= this
    eval_rows: int = 256  # held-out rows scored at each eval (0: no held-out evaluation)


@dataclass
class DraftSection:
    vocab_size: int = 16384  # draft vocabulary: the most frequent learned target tokens
    aux_layer_ids: list[int] | None = None  # eyas convention; None: [2, N//2, N-3]
    init_head_from_target: bool = False  # copy lm_head rows + final norm from the target: measured
    # harmful on SmolLM2 (loss 19 at step 0, grad norm 650, slower learning than a random head)
    save_dtype: str = "bfloat16"
    init_from: str | None = None  # warm start: a saved draft of this target (folder or shipped name), same
    # width and aux layers; its trainable weights and vocabulary maps replace the random init (a vocab_size of
    # its own grows or shrinks the vocabulary around the saved draft's tokens: train.warm_start)


@dataclass
class OptimSection:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.02
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * this
    grad_clip: float = 0.5


@dataclass
class TrainSection:
    mode: str = "online"  # online: target in the loop; offline: cached aux states
    ttt_steps: int = 7
    decay: float = 0.8
    epochs: float = 1.0
    max_steps: int | None = None
    time_budget_s: float | None = None  # fit the schedule to this many seconds (measured after warm-up)
    seed: int = 0
    device: str = "auto"
    target_dtype: str = "auto"  # bf16 on the GPU, fp32 on the CPU
    autocast: str = "auto"  # auto: bf16 autocast on the GPU, none on the CPU
    parallel: str = "ddp"  # ddp | fsdp (draft sharded with FSDP2)
    shard_target: bool = False  # FSDP2-shard the target's layers across ranks (when it does not fit)
    offline_dir: str | None = None  # where offline aux states are cached (default <output>/states)
    offline_dtype: str = "float16"  # storage of cached states: float16 or float32


@dataclass
class LogSection:
    every: int = 10
    eval_every: int = 200
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    trackers: list[str] = field(default_factory=list)  # accelerate's: tensorboard, wandb, mlflow, ... (trackers.py)
    project: str = "eyas"  # the trackers' project: wandb project, MLflow experiment
    run_name: str | None = None  # the run in the trackers; default: the output folder's name
    dir: str | None = None  # the trackers' local files (TensorBoard events, wandb); default: the output folder
    tensorboard: bool = False  # alias: true adds tensorboard to trackers
    progress: bool = True


@dataclass
class Recipe:
    target: str = "smollm2-135m-instruct"
    output: str = "runs/draft"
    data: DataSection = field(default_factory=DataSection)
    draft: DraftSection = field(default_factory=DraftSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    log: LogSection = field(default_factory=LogSection)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["optim"]["betas"] = list(self.optim.betas)
        return d

    def dump(self, path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    def validate(self) -> Recipe:
        t, o, ids = self.train, self.optim, self.draft.aux_layer_ids
        checks = [
            (t.mode in ("online", "offline"), "train.mode", t.mode, "online or offline"),
            (t.parallel in ("ddp", "fsdp"), "train.parallel", t.parallel, "ddp or fsdp"),
            (t.ttt_steps >= 1, "train.ttt_steps", t.ttt_steps, "a positive integer (7 in EAGLE-3)"),
            (0 < t.decay <= 1, "train.decay", t.decay, "in (0, 1] (0.8 in EAGLE-3)"),
            (t.epochs > 0 or (t.max_steps or 0) > 0, "train.epochs", t.epochs, "> 0, or set train.max_steps"),
            (o.lr > 0, "optim.lr", o.lr, "e.g. 1e-4"),
            (0 <= o.warmup_ratio < 1, "optim.warmup_ratio", o.warmup_ratio, "in [0, 1)"),
            (o.grad_clip >= 0, "optim.grad_clip", o.grad_clip, "0 (off) or positive, e.g. 0.5"),
            (self.data.max_length >= 2, "data.max_length", self.data.max_length, "at least 2"),
            (self.data.tokens_per_batch >= self.data.max_length, "data.tokens_per_batch", self.data.tokens_per_batch,
             f">= data.max_length ({self.data.max_length})"),
            (self.draft.vocab_size >= 1, "draft.vocab_size", self.draft.vocab_size, "e.g. 16384"),
            (t.epochs >= 0, "train.epochs", t.epochs, "a positive number of passes over the data"),
            (t.max_steps is None or t.max_steps >= 1, "train.max_steps", t.max_steps, "a positive integer or null"),
            (t.time_budget_s is None or t.time_budget_s > 0, "train.time_budget_s", t.time_budget_s,
             "a positive number of seconds or null"),
            (t.seed >= 0, "train.seed", t.seed, "a non-negative integer"),
            (all(0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas), "two numbers in [0, 1), e.g. [0.9, 0.95]"),
            (o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "0 or positive"),
            (0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", o.min_lr_ratio, "in [0, 1]"),
            (self.data.eval_rows >= 0, "data.eval_rows", self.data.eval_rows, "0 (off) or more held-out rows"),
            (self.log.every >= 1, "log.every", self.log.every, "a positive number of steps"),
            (self.log.eval_every >= 0, "log.eval_every", self.log.eval_every, "0 (off) or a positive number of steps"),
            (self.log.checkpoint_every >= 0, "log.checkpoint_every", self.log.checkpoint_every,
             "0 (only at the end) or a positive number of steps"),
            (self.log.keep_checkpoints >= 0, "log.keep_checkpoints", self.log.keep_checkpoints,
             "0 (keep all) or a positive count"),
            (t.offline_dtype in ("float16", "float32"), "train.offline_dtype", t.offline_dtype, "float16 or float32"),
            (str(self.draft.save_dtype).lower() in ("auto", *DTYPES), "draft.save_dtype", self.draft.save_dtype,
             "auto (keep float32), bfloat16, float16 or float32"),  # else refused only at the end, after training
            (str(t.target_dtype).lower() in ("auto", *DTYPES), "train.target_dtype", t.target_dtype,
             "auto (bf16 on the GPU, fp32 on the CPU), bfloat16, float16 or float32"),
            (t.autocast in ("auto", "none", "bf16"), "train.autocast", t.autocast,
             "auto (bf16 on the GPU), none or bf16"),  # any other word turned bf16 autocast on
            (_is_device(t.device), "train.device", t.device, "auto, cpu, cuda or cuda:N"),
            (ids is None or (ids and len(set(ids)) == len(ids)), "draft.aux_layer_ids", ids,
             "null (the default [2, N//2, N-3]) or three distinct layer ids, e.g. [2, 16, 29]: a draft whose ids "
             "repeat is refused when it is loaded, after the training"),
        ]
        checks.append((not (self.draft.init_from and self.draft.init_head_from_target), "draft.init_head_from_target",
                       self.draft.init_head_from_target,
                       "false when draft.init_from is set (the warm start sets the head)"))
        for ok, key, value, want in checks:
            if not ok:
                raise EyasError(f"recipe key {key} = {value!r} is invalid", f"set {key} to {want}")
        if not self.data.path:
            raise EyasError("the recipe names no data (data.path is empty)",
                            "run `eyas prepare --out DATA ...` and pass --set data.path=DATA")
        return self


def check_aux_ids(ids: list[int] | None, num_layers: int) -> list[int] | None:
    """``draft.aux_layer_ids`` against the loaded target: three distinct layers within its depth (None: the default,
    which the target picks). Returns the ids as given."""
    if ids is None:
        return None
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    outside = [i for i in ids if not 0 <= i < num_layers]
    why = (f"lists {len(ids)} layer id(s) where EAGLE-3 captures three" if len(ids) != 3
           else f"repeats layer(s) {repeated}" if repeated
           else f"names layer(s) {outside} outside 0..{num_layers - 1}" if outside else None)
    if why is None:
        return ids
    from ..layers import default_aux_layers

    example = default_aux_layers(num_layers) if num_layers >= 3 else [0, 1, 2]
    raise EyasError(f"draft.aux_layer_ids = {ids} {why}; the target has {num_layers} decoder layers (eyas ids are "
                    f"inputs of decoder layers: 0..{num_layers - 1})",
                    f"set draft.aux_layer_ids to three distinct ids in 0..{num_layers - 1}, e.g. "
                    f"--set 'draft.aux_layer_ids={example}' (the default), or leave it null for the default")


def _is_device(name: str) -> bool:
    import torch

    try:
        return name == "auto" or torch.device(name).type in ("cpu", "cuda")
    except (RuntimeError, ValueError):
        return False


def _merge(obj, values: dict, where: str):
    for key, value in values.items():
        if not hasattr(obj, key) or key.startswith("_"):
            names = ", ".join(f.name for f in dataclasses.fields(obj))
            raise EyasError(f"unknown recipe key {where}{key}", f"known keys here: {names}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise EyasError(f"recipe key {where}{key} is a section, got {value!r}", f"write {key}: {{...}}")
            _merge(current, value, f"{where}{key}.")
        else:
            kind = {f.name: f.type for f in dataclasses.fields(obj)}[key]
            setattr(obj, key, _coerce(f"{where}{key}", value, str(kind)))


def _coerce(key: str, value, kind: str):
    """``value`` as the field's annotated type (``int``, ``float | None``, ``list[int] | None``, ...),
    or an error naming the key: a wrong type must not reach the trainer as a traceback."""
    if "None" in kind and value is None:
        return None
    base = kind.replace(" | None", "")
    if base in ("int", "float") and isinstance(value, str):  # YAML 1.1 reads `lr: 1e-3` (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "float" and number:
        return float(value)
    if base == "int" and number and float(value).is_integer():
        return int(value)
    if base == "bool" and isinstance(value, bool):
        return value
    if base == "str" and (isinstance(value, str) or number):
        return str(value)
    if base == "list[str]" and (isinstance(value, str) or (isinstance(value, list)
                                                           and all(isinstance(v, str) for v in value))):
        return value  # a string is split into names where it is read (log.trackers=tensorboard,wandb)
    if base == "list[int]" and isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                                               for v in value):
        return value
    if base == "tuple[float, float]" and isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    want = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "list[str]": "a list of names", "list[int]": "a list of integers",
            "tuple[float, float]": "two numbers, e.g. [0.9, 0.95]"}.get(base, base)
    raise EyasError(f"recipe key {key} = {value!r} is not {want}" + (" (or null)" if "None" in kind else ""),
                    f"set {key} to {want}")


def parse_override(text: str) -> dict:
    """``a.b=value`` -> {"a": {"b": value}}, value parsed as YAML (numbers, lists, null)."""
    if "=" not in text:
        raise EyasError(f"override {text!r} has no '='", "write --set section.key=value, e.g. --set optim.lr=3e-4")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        where = f" ({e.problem})" if getattr(e, "problem", None) else ""
        raise EyasError(f"--set {text!r}: the value {raw!r} is not a YAML value{where}",
                        "quote it as text or write a number or a list, e.g. --set optim.lr=3e-4, --set "
                        "'draft.aux_layer_ids=[2, 12, 21]', --set \"log.run_name='@v9'\"") from None
    if isinstance(value, str):  # YAML reads 3e-4 as a string; numbers written that way are meant
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return nested(key.strip(), value)


def nested(key: str, value) -> dict:
    """``a.b`` and a value -> {"a": {"b": value}}: an override as a mapping (the path and name flags pass theirs
    so, taken as they are, not parsed)."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def load_recipe(path=None, overrides: list[str | dict] = ()) -> Recipe:
    """The recipe file (or the defaults) with ``overrides`` on top: ``--set`` text (``a.b=value``, the value
    parsed as YAML) or a mapping taken as it is (the path and name flags)."""
    recipe = Recipe()
    if path:
        p = Path(path)
        if not p.is_file():
            raise EyasError(f"no recipe file {p}", "pass --recipe PATH.yaml (see recipes/ in the repository)")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise EyasError(f"recipe {p} is not valid YAML: {e}", "fix the file's syntax") from None
        if not isinstance(data, dict):
            raise EyasError(f"recipe {p} is a YAML {type(data).__name__}, not a mapping of sections",
                            "write it as `target: ...`, `data: {path: ...}`, ... (see recipes/)")
        _merge(recipe, data, "")
    for o in overrides:
        _merge(recipe, o if isinstance(o, dict) else parse_override(o), "")
    return recipe
