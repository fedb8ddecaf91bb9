"""The drafts shipped inside the package, and how a draft argument (a folder or a shipped name) is
resolved to a folder.

Shared by the engine builder (``eyas.pipeline``), ``eyas train --warm-start``, ``eyas export``,
``eyas doctor`` and ``eyas serve``, so it sits below all of them.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from ..errors import EyasError
from ..models.loading import SMOLLM2

# Drafts shipped inside the package, by the target name they belong to.
BUILTIN_DRAFTS = {SMOLLM2: "smollm2-135m-instruct-eagle3"}


def builtin_draft(name: str) -> Path | None:
    """Path of a draft shipped with eyas, by draft name or by its target's name; None for paths.

    Only plain names are looked up, inside the package's ``drafts/`` folder: a local target folder
    must never be mistaken for its own draft.
    """
    name = BUILTIN_DRAFTS.get(name.lower(), name)
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    path = Path(str(importlib.resources.files("eyas"))) / "drafts" / name
    return path if (path / "config.json").is_file() else None


def resolve_draft_path(path_or_name: str) -> Path:
    p = Path(path_or_name).expanduser()
    if p.is_dir():
        return p
    found = builtin_draft(path_or_name)
    if found is None:
        raise EyasError(
            f"draft {path_or_name!r} is neither a folder nor a draft shipped with eyas",
            "pass the folder of a saved EAGLE-3 draft (config.json + model.safetensors)",
        )
    return found


def default_draft_for(model_path: str) -> str | None:
    return str(builtin_draft(model_path)) if builtin_draft(model_path) else None
