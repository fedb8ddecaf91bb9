"""A real eyas server on loopback for the live tests: ``create_app`` under uvicorn in a thread."""

from __future__ import annotations

from helpers import InProcessServer


def LiveServer(engine, name: str = "tiny", api_key: str | None = None) -> InProcessServer:  # noqa: N802
    """A context manager serving ``engine`` on a free loopback port (``.url``)."""
    from eyas.serve.app import ServeOptions, create_app

    return InProcessServer(create_app(engine, ServeOptions(served_model_name=name, log_interval=0, api_key=api_key)))


def engines(target, draft):
    """(trained EAGLE3 engine, random-draft EAGLE3 engine, baseline engine) on one shared target."""
    from eyas.config import Algorithm, SpecConfig
    from eyas.engine.engine import Engine
    from eyas.models.draft import Eagle3Draft

    spec = SpecConfig(Algorithm.EAGLE3, 3, 1, 4)
    random_draft = Eagle3Draft.for_target(target, seed=7).to(target.dtype).eval()
    return (Engine(target, draft, spec, "trained-draft"), Engine(target, random_draft, spec, "random-draft"),
            Engine(target, None, SpecConfig(Algorithm.NONE)))
