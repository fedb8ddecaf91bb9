"""A real eyas server on loopback for the live tests: ``create_app`` under uvicorn in a thread."""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, engine, name: str = "tiny", api_key: str | None = None):
        import uvicorn

        from eyas.serve.app import ServeOptions, create_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(engine, ServeOptions(served_model_name=name, log_interval=0, api_key=api_key))
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        end = time.time() + 60
        while not self.server.started:
            if time.time() > end or not self.thread.is_alive():
                raise RuntimeError("the in-process eyas server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def engines(target, draft):
    """(trained EAGLE3 engine, random-draft EAGLE3 engine, baseline engine) on one shared target."""
    from eyas.config import Algorithm, SpecConfig
    from eyas.engine.engine import Engine
    from eyas.models.draft import Eagle3Draft

    spec = SpecConfig(Algorithm.EAGLE3, 3, 1, 4)
    random_draft = Eagle3Draft.for_target(target, seed=7).to(target.dtype).eval()
    return (Engine(target, draft, spec, "trained-draft"), Engine(target, random_draft, spec, "random-draft"),
            Engine(target, None, SpecConfig(Algorithm.NONE)))
