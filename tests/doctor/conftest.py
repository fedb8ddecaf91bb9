"""Fixtures for the doctor tests: the tiny target and its trained draft saved as real folders."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def saved(target, draft, tmp_path_factory) -> tuple[Path, Path]:
    """(tiny target folder, trained eyas draft folder), written by eyas itself."""
    root = tmp_path_factory.mktemp("pair")
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    return root / "target", root / "draft"


@pytest.fixture(scope="session")
def live(target, draft):
    """{'trained': url, 'random': url, 'baseline': url}: three real eyas servers on loopback."""
    from live_server import LiveServer, engines

    trained, random_, baseline = engines(target, draft)
    _ENGINES["trained"] = trained
    with LiveServer(trained) as a, LiveServer(random_) as b, LiveServer(baseline) as c:
        yield {"trained": a.url, "random": b.url, "baseline": c.url}


_ENGINES: dict = {}


@pytest.fixture(scope="session")
def engine_for_key(live):
    """The trained engine again (for a server that requires an API key)."""
    return _ENGINES["trained"]
