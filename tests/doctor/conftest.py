"""Fixtures for the doctor tests: the tiny target and its trained draft saved as real folders."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def saved(target, draft, tmp_path_factory) -> tuple[Path, Path]:
    """(tiny target folder, trained eyas draft folder), written by eyas itself."""
    root = tmp_path_factory.mktemp("pair")
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    return root / "target", root / "draft"
