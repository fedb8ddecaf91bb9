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
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainingRecord:
    max_length: int | None = None
    template_sha: str | None = None  # first 16 hex digits of sha256(chat_template)
    thinking: bool | None = None
    source: str = ""  # where it was read


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
    meta = (getattr(config, "eyas", None) or {})
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
            if (base / named).is_file():
                return _from_recipe(base / named, base)
    return TrainingRecord()


def _from_recipe(recipe: Path, base: Path) -> TrainingRecord:
    try:
        import yaml

        data = (yaml.safe_load(recipe.read_text()) or {}).get("data") or {}
    except Exception:  # noqa: BLE001 - a broken recipe only costs the record
        return TrainingRecord()
    rec = TrainingRecord(data.get("max_length"), source=str(recipe))
    data_dir = data.get("path")
    if data_dir:
        meta_file = (Path(data_dir) if Path(data_dir).is_absolute() else base / data_dir) / "meta.json"
        if meta_file.is_file():
            try:
                chat = json.loads(meta_file.read_text()).get("chat") or {}
            except ValueError:
                chat = {}
            rec.template_sha, rec.thinking = chat.get("template_sha256_16"), chat.get("thinking")
            rec.source += f" + {meta_file}"
    return rec
