"""What a draft's training recorded: its context (max length) and the chat template it saw.

Looked up, first found wins:

1. ``config.json`` -> ``eyas.training`` (``max_length``, ``chat_template_sha256_16``, ``thinking``);
2. the run folder ``eyas train`` writes around the draft: ``<run>/draft`` next to
   ``<run>/recipe.yaml`` (``data.max_length``, ``data.path``), and that data folder's ``meta.json``
   from ``eyas prepare`` (``chat.template_sha256_16``, ``chat.thinking``);
3. the recipe named in ``config.json`` -> ``eyas.recipe`` (a path such as
   ``recipes/smollm2-135m-instruct-eagle3.yaml``, as drafts saved before 1. was written record it;
   the shipped draft carries 1.), found from the working directory or a folder above the draft, read
   the same way.

SGLang/SpecForge, speculators and the official release record neither; the doctor then says so.

The record is informational: ``record_of`` keeps each field eyas reads only when it has the type eyas wrote, and
turns any other (a string for a number, a list for an object, null, a negative length) into a warning naming the
field, so a crafted or corrupted record never stops ``eyas doctor`` or ``eyas serve``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainingRecord:
    max_length: int | None = None
    template_sha: str | None = None  # first 16 hex digits of sha256(chat_template)
    thinking: bool | None = None
    source: str = ""  # where it was read
    warnings: list[str] = field(default_factory=list)  # fields of the record that could not be read


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _text(v) -> bool:
    return isinstance(v, str)


def _flag(v) -> bool:
    return isinstance(v, bool)


def _ids(v) -> bool:
    return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)


def _names(v) -> bool:
    return isinstance(v, list) and all(isinstance(a, str) for a in v)


# field -> (check, what was expected); an object's fields are nested dicts of the same shape
_SCHEMA: dict = {
    "training": {"max_length": (_count, "a positive whole number"), "chat_template_sha256_16": (_text, "a string"),
                 "thinking": (_flag, "true or false")},
    "recipe": (_text, "a path (string)"),
    "aux_layer_ids": (_ids, "a list of layer numbers"),
    "target": {"name": (_text, "a string"), "architecture": (_text, "a string"),
               "num_hidden_layers": (_count, "a positive whole number"),
               "hidden_size": (_count, "a positive whole number"), "vocab_size": (_count, "a positive whole number")},
    "verifier": {"name_or_path": (_text, "a string"), "architectures": (_names, "a list of strings")},
}


def _shown(v) -> str:
    text = repr(v) if isinstance(v, (str, int, float, bool)) or v is None else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _clean(data: dict, schema: dict, where: str, warnings: list[str]) -> dict:
    out = dict(data)  # fields eyas does not read are kept as they are
    for key, rule in schema.items():
        if key not in data:
            continue
        value, name = data[key], f"{where}.{key}"
        if isinstance(rule, dict):
            if isinstance(value, dict):
                out[key] = _clean(value, rule, name, warnings)
                continue
            ok, expected = False, "an object"
        else:
            ok, expected = rule[0](value), rule[1]
        if not ok:
            out.pop(key)
            warnings.append(f"{name} is {_shown(value)}, expected {expected}: ignored (the training "
                            "record is informational; correct or remove the field)")
    return out


def record_of(config) -> tuple[dict, list[str]]:
    """The draft's ``config.eyas`` with every field eyas reads of the expected type (others dropped), and a
    warning for each dropped field."""
    meta = getattr(config, "eyas", None)
    if meta is None:
        return {}, []
    if not isinstance(meta, dict):
        return {}, [f"config.json eyas is {_shown(meta)}, expected an object: the training record is ignored"]
    warnings: list[str] = []
    return _clean(meta, _SCHEMA, "config.json eyas", warnings), warnings


def template_sha(template: str | None) -> str:
    """The same digest ``eyas prepare`` records (``eyas.data.prepare.template_hash``)."""
    return hashlib.sha256((template or "").encode()).hexdigest()[:16]


def past_draft_positions(serving: int | None, draft_config) -> tuple[str, str] | None:
    """(problem, fix) when the serving context runs past the draft's ``max_position_embeddings``, else None:
    what ``eyas doctor`` calls a PROBLEM and ``eyas serve`` / ``eyas generate`` warn about."""
    draft_max = int(getattr(draft_config, "max_position_embeddings", 0) or 0)
    if not (serving and draft_max and serving > draft_max):
        return None
    return (f"serving context {serving} exceeds the draft's max_position_embeddings {draft_max}: beyond it "
            "acceptance collapses or kernels fail (SGLang #6783, vLLM #23072)",
            f"serve with --context-length {draft_max}, or retrain the draft for longer contexts")


def context_warning(engine) -> str | None:
    """The doctor's context PROBLEM as a warning for ``eyas serve`` and ``eyas generate``: a serving context past
    the draft's max_position_embeddings (not refused: the draft may still work past it)."""
    if engine.draft is None or not engine.spec.speculative or not engine.target.info.max_context:
        return None  # an unknown target context is no known overrun
    past = past_draft_positions(engine.max_context, engine.draft.config)
    return None if past is None else f"WARNING: {past[0]}; {past[1]}"


def read_record(draft_path, config) -> TrainingRecord:
    meta, warnings = record_of(config)
    rec = _find(draft_path, meta)
    rec.warnings = warnings + rec.warnings
    return rec


def _find(draft_path, meta: dict) -> TrainingRecord:
    training = meta.get("training") or {}
    if training:
        return TrainingRecord(training.get("max_length"), training.get("chat_template_sha256_16"),
                              training.get("thinking"), "config.json eyas.training")
    draft_path = Path(draft_path)
    beside = draft_path.parent / "recipe.yaml"
    if beside.is_file():
        return _from_recipe(beside, beside.parent)
    named = meta.get("recipe")  # a path recorded at training, relative to the repository it ran in
    if named:
        for base in (Path.cwd(), *draft_path.resolve().parents[:6]):
            try:
                found = (base / named).is_file()
            except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte
                found = False
            if found:
                return _from_recipe(base / named, base)
    return TrainingRecord()


def _from_recipe(recipe: Path, base: Path) -> TrainingRecord:
    try:
        import yaml

        loaded = yaml.safe_load(recipe.read_text())
        data = loaded.get("data") if isinstance(loaded, dict) else None
    except Exception:  # noqa: BLE001 - a broken recipe only costs the record
        return TrainingRecord()
    warnings: list[str] = []
    data = _clean(data, {"max_length": _SCHEMA["training"]["max_length"], "path": (_text, "a path (string)")},
                  f"{recipe} data", warnings) if isinstance(data, dict) else {}
    rec = TrainingRecord(data.get("max_length"), source=str(recipe), warnings=warnings)
    data_dir = data.get("path")
    if data_dir:
        meta_file = (Path(data_dir) if Path(data_dir).is_absolute() else base / data_dir) / "meta.json"
        try:
            meta = json.loads(meta_file.read_text()) if meta_file.is_file() else None
        except (OSError, ValueError, RecursionError):
            meta = None
        if meta is not None:
            chat = meta.get("chat") if isinstance(meta, dict) else None
            chat = _clean(chat, {"template_sha256_16": (_text, "a string"), "thinking": (_flag, "true or false")},
                          f"{meta_file} chat", warnings) if isinstance(chat, dict) else {}
            rec.template_sha, rec.thinking = chat.get("template_sha256_16"), chat.get("thinking")
            rec.source += f" + {meta_file}"
    return rec
