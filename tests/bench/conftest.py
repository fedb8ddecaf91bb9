"""Fixtures for the bench tests: the tiny pair in-process, and as real servers on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "doctor"))  # live_server.py


@pytest.fixture(scope="session")
def engine_pair(target, draft):
    """(EAGLE3 engine with the trained draft, the same target without speculation)."""
    from live_server import engines

    trained, _, baseline = engines(target, draft)
    return trained, baseline


@pytest.fixture(scope="session")
def http_pair(engine_pair):
    """(speculative url, baseline url)."""
    from live_server import LiveServer

    with LiveServer(engine_pair[0]) as a, LiveServer(engine_pair[1]) as b:
        yield a.url, b.url


@pytest.fixture(scope="session")
def folders(target, draft, tmp_path_factory):
    """(target folder, draft folder): the tiny pair saved as a user would pass it on the command line."""
    root = tmp_path_factory.mktemp("bench-pair")
    target.model.save_pretrained(root / "t")
    target.tokenizer.save_pretrained(root / "t")
    draft.save_pretrained(root / "d")
    return str(root / "t"), str(root / "d")
