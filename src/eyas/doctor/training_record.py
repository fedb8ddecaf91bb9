"""What a draft's training recorded: its context (max length) and the chat template it saw.

Looked up, first found wins:

1. ``config.json`` -> ``eyas.training`` (``max_length``, ``chat_template_sha256_16``, ``thinking``);
2. the run folder ``eyas train`` writes around the draft: ``<run>/draft`` next to
   ``<run>/recipe.yaml`` (``data.max_length``, ``data.path``), and that data folder's ``meta.json``
   from ``eyas prepare`` (``chat.template_sha256_16``, ``chat.thinking``).

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


def read_record(draft_path, config) -> TrainingRecord:
    meta = (getattr(config, "eyas", None) or {}).get("training") or {}
    if meta:
        return TrainingRecord(meta.get("max_length"), meta.get("chat_template_sha256_16"), meta.get("thinking"),
                              "config.json eyas.training")
    recipe = Path(draft_path).parent / "recipe.yaml"
    if not recipe.is_file():
        return TrainingRecord()
    try:
        import yaml

        data = (yaml.safe_load(recipe.read_text()) or {}).get("data") or {}
    except Exception:  # noqa: BLE001 - a broken recipe only costs the record
        return TrainingRecord()
    rec = TrainingRecord(data.get("max_length"), source=str(recipe))
    data_dir = data.get("path")
    if data_dir:
        meta_file = Path(data_dir) if Path(data_dir).is_absolute() else recipe.parent / data_dir
        for candidate in (Path(data_dir) / "meta.json", meta_file / "meta.json"):
            if candidate.is_file():
                try:
                    chat = json.loads(candidate.read_text()).get("chat") or {}
                except ValueError:
                    break
                rec.template_sha, rec.thinking = chat.get("template_sha256_16"), chat.get("thinking")
                rec.source += f" + {candidate}"
                break
    return rec
