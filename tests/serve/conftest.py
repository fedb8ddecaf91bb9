"""Fixtures for the server tests: tiny model folders, one real server process, in-process apps.

Training the tiny draft takes a minute or more on a busy 2-core machine, so the saved pair is
kept in pytest's cache directory and reused while it still loads and passes the engine's checks
(``pytest --cache-clear`` retrains). The server, the in-process engine and the greedy reference all
load these same folders, so the pair only has to be consistent with itself, not with today's
helpers; draft quality only moves acceptance figures, which every test reads rather than assumes.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from serve_helpers import InProcessServer, ServerProcess

CACHE_VERSION = "v2"  # bump to retrain everywhere


def _usable(tiny: Path, draft: Path) -> bool:
    if not (draft / "config.json").is_file() or not (tiny / "config.json").is_file():
        return False
    from eyas.pipeline import EngineArgs, build_engine

    try:
        build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64"))
    except Exception:  # noqa: BLE001 - any failure: the format moved on, retrain
        return False
    return True


@pytest.fixture(scope="session")
def models(request, tmp_path_factory) -> tuple[Path, Path]:
    """(tiny target folder, trained EAGLE-3 draft folder), both float64."""
    from helpers import save_tiny_model, tiny_target, train_draft

    try:
        root = Path(request.config.cache.mkdir("eyas_serve_models")) / f"{CACHE_VERSION}-torch{torch.__version__}"
    except Exception:  # noqa: BLE001 - cache disabled (-p no:cacheprovider)
        root = tmp_path_factory.mktemp("eyas_serve_models")
    tiny, draft = root / "tiny", root / "draft"
    if not _usable(tiny, draft):
        work = Path(str(root) + f".tmp{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        save_tiny_model(work / "tiny", dtype=torch.float64)
        train_draft(tiny_target()).save_pretrained(work / "draft")
        shutil.rmtree(root, ignore_errors=True)
        work.rename(root)
        for stale in root.parent.iterdir():  # folders of older cache versions
            if stale != root and ".tmp" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    return tiny, draft


SPEC_FLAGS = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]


@pytest.fixture(scope="session")
def server(models, tmp_path_factory):
    """One real ``python -m eyas.serve`` on loopback, EAGLE3 with a topk-2 tree, float64."""
    tiny, draft = models
    s = ServerProcess(["--model-path", str(tiny), "--speculative-algorithm", "EAGLE3",
                       "--speculative-draft-model-path", str(draft), "--dtype", "float64",
                       "--served-model-name", "tiny", "--log-interval", "1", "--metrics-window", "1000000",
                       "--log-requests", *SPEC_FLAGS],
                      tmp_path_factory.mktemp("server"))
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def engine(models):
    """The same pair, loaded in the test process, for in-process apps."""
    from eyas.pipeline import EngineArgs, build_engine

    tiny, draft = models
    return build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                   speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6))


@pytest.fixture(scope="session")
def reference(engine):
    """greedy(prompt_ids, n) -> the target's own non-speculative greedy ids (the core engine, NONE)."""
    from eyas.config import Algorithm, SpecConfig
    from eyas.engine.engine import Engine
    from eyas.sample.sampling import SamplingParams

    plain = Engine(engine.target, None, SpecConfig(Algorithm.NONE))

    def greedy(prompts: list[list[int]], n: int | list[int], ignore_eos: bool = False) -> list[list[int]]:
        ns = n if isinstance(n, list) else [n] * len(prompts)
        outs = plain.generate(prompts, [SamplingParams(max_new_tokens=k, ignore_eos=ignore_eos) for k in ns])
        return [o.output_ids for o in outs]

    return greedy


class SlowEngine:
    """The real engine with a pause in every step, so a test can catch requests mid-flight."""

    def __init__(self, engine, delay: float):
        self._engine, self._delay = engine, delay

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, batch):
        time.sleep(self._delay)
        return self._engine.step(batch)


@pytest.fixture
def inprocess(engine):
    """inprocess(**ServeOptions fields) -> a context manager running the app on a free port."""
    from eyas.serve.app import ServeOptions, create_app

    def make(step_delay: float = 0.0, wrap=None, **options):
        served = SlowEngine(engine, step_delay) if step_delay else engine
        served = wrap(served) if wrap else served
        return InProcessServer(create_app(served, ServeOptions(served_model_name="tiny", log_interval=0, **options)))

    return make
