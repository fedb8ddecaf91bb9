"""The FastAPI application: lifespan (engine thread), error handlers and the small endpoints.

``create_app(engine, options)`` wires an already built and checked engine to HTTP; it binds nothing
itself, so tests can run it in-process under uvicorn or with any ASGI client.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import __version__
from ..sample.sampling import SamplingParams
from .api_errors import ApiError, error_body, error_type
from .banner import describe, info_labels, training_warnings
from .dashboard import router as dashboard_router
from .generate_route import router as generate_router
from .inputs import check_model
from .limits import BodySizeLimit, Limits, StreamSlots
from .metrics import ServeMetrics
from .middleware import ApiKey, HeadAsGet, RequestLog, TrailingSlash, open_paths
from .openai_routes import router as openai_router
from .openapi import install_openapi
from .prepare import Preparer
from .responses_route import router as responses_router
from .sampling_defaults import SamplingDefaults
from .scheduler import Failed, Scheduler
from .tokenize_route import router as tokenize_router

# what the banner and a 404 point to (every route: GET /openapi.json)
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate", "/tokenize", "/detokenize",
          "/v1/models", "/health", "/metrics", "/dashboard")

log = logging.getLogger("eyas.serve")


@dataclass
class ServeOptions:
    served_model_name: str | None = None  # default: the --model-path as given
    model_path: str = ""
    max_running_requests: int = 32
    max_queued_requests: int = 256
    metrics_window: int = 1000  # engine steps behind eyas:spec_accept_length / _rate
    log_interval: float = 10.0  # seconds between "decode: ..." log lines while busy
    max_prefill_tokens: int = 16384  # prompt tokens prefilled together in one engine turn
    chunked_prefill_size: int = 2048  # a longer prompt is prefilled this many tokens a turn; -1: whole
    overlap_schedule: bool = True  # launch the next step before this one's tokens are read back (scheduler.py)
    membership_wait_steps: int = 8  # the most steps a batch change waits for others (membership.py); 0: none
    log_requests: bool = False  # one log line per finished request, with its acceptance
    extra_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None  # when set, every route but /health (and /metrics) needs "Authorization: Bearer KEY"
    metrics_require_key: bool = False  # with api_key: /metrics needs the key too
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])  # CORS (vLLM's default); [] turns it off
    limits: Limits = field(default_factory=Limits)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # an OpenAI request's left-out fields
    switch_interval_ms: float | None = None  # the interpreter's thread switch interval while serving (eyas serve:
    # 0.1 ms); None: Python's


@dataclass
class ServeState:
    engine: object
    scheduler: Scheduler
    metrics: ServeMetrics
    options: ServeOptions
    served_names: list[str]
    streams: StreamSlots
    prepare: Preparer  # request body -> job, on a worker thread
    started: float = field(default_factory=time.time)


def create_app(engine, options: ServeOptions | None = None) -> FastAPI:
    options = options or ServeOptions()
    rows = engine.config.max_batch if getattr(engine, "static", False) else None
    if rows and options.max_running_requests > rows:  # the native path's KV cache holds that many rows, no more
        log.warning("max_running_requests %d is more than the engine's KV cache holds (%d rows, "
                    "EngineArgs.max_batch): running at most %d", options.max_running_requests, rows, rows)
        options = replace(options, max_running_requests=rows)
    spec = engine.spec
    name = options.served_model_name or options.model_path or engine.target.name
    metrics = ServeMetrics(spec.num_steps, spec.num_draft_tokens, options.metrics_window, spec.speculative,
                           model_name=name)
    metrics.set_info(info_labels(engine))
    metrics.follow_chooser(getattr(engine, "chooser", None))  # --speculative-batch-schedule auto
    scheduler = Scheduler(engine, metrics, options.max_running_requests, options.max_queued_requests,
                          options.log_interval, options.max_prefill_tokens, options.log_requests,
                          options.chunked_prefill_size,
                          options.overlap_schedule and getattr(engine, "launches_ahead", False),
                          options.membership_wait_steps)
    names = [name] + [n for n in [options.model_path, engine.target.name, *options.extra_model_names]
                      if n and n != name]
    preparer = Preparer(engine, names, options.limits.max_prompt_tokens, options.log_requests, options.sampling,
                        options.limits)
    state = ServeState(engine, scheduler, metrics, options, names, StreamSlots(options.limits.max_concurrent_streams),
                       preparer)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # torch releases the interpreter lock around each op, so the engine thread asks for it back several times
        # a step; while the event loop runs, each ask waits up to the switch interval (Python's 5 ms: several
        # GPU steps of a small model).
        switch = sys.getswitchinterval()
        if options.switch_interval_ms is not None:
            sys.setswitchinterval(options.switch_interval_ms / 1000)
        scheduler.start()
        try:
            yield
        finally:
            sys.setswitchinterval(switch)
            running, queued = scheduler.counts()
            if running or queued:
                log.info("shutting down: cancelling %d running and %d queued requests", running, queued)
            scheduler.stop()
            preparer.close()

    app = FastAPI(title="eyas serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.eyas = state
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(generate_router)
    app.include_router(dashboard_router)
    app.include_router(tokenize_router)
    _add_error_handlers(app, metrics)
    unguarded = open_paths(options.metrics_require_key)  # the one place a route's auth is decided
    install_openapi(app, unguarded)
    if options.api_key:
        app.add_middleware(ApiKey, key=options.api_key, open_paths=unguarded)
    app.add_middleware(BodySizeLimit, max_bytes=options.limits.max_request_bytes)
    app.add_middleware(RequestLog, with_text=options.log_requests)  # logs refusals too
    if options.allowed_origins:  # outside the key check: a browser's preflight carries no credentials
        app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins, allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["X-Request-Id"])
    app.add_middleware(TrailingSlash)  # every layer sees the path the route does
    app.add_middleware(HeadAsGet)  # outermost: HEAD is GET to every layer

    @app.get("/health")  # and HEAD (middleware.HeadAsGet), as every GET route
    async def health():
        running, queued = scheduler.counts()
        body = {"status": "ok" if scheduler.alive else "engine thread stopped", "running": running, "queued": queued}
        return JSONResponse(body, status_code=200 if scheduler.alive else 503)

    @app.get("/health_generate")  # SGLang's: a one-token generation through the engine thread
    async def health_generate():
        from .inputs import Job
        from .runner import JobRun

        try:
            run = JobRun(scheduler, engine, Job([[0]], SamplingParams(max_new_tokens=1)))
            async for _, event in run.events():
                if isinstance(event, Failed):
                    return JSONResponse({"status": event.message}, status_code=503)
        except ApiError as e:
            return JSONResponse({"status": e.message}, status_code=503)
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    def model_card() -> dict:
        return {"id": names[0], "object": "model", "created": int(state.started), "owned_by": "eyas",
                "root": options.model_path or engine.target.name, "max_model_len": engine.max_context}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}", responses={404: {  # the openai SDK's models.retrieve; ids may hold '/'
        "description": "no such model: this server serves the one GET /v1/models lists",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}})
    async def model(model_id: str):
        check_model(model_id, names)  # 404 naming the served model
        return model_card()

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's name
    async def server_info():
        running, queued = scheduler.counts()
        return {
            **describe(engine),
            "warnings": training_warnings(engine),
            "served_model_name": names[0],
            "default_sampling_params": options.sampling.as_json(),  # --generation-config's (sampling_defaults.py)
            "max_running_requests": options.max_running_requests,
            "max_queued_requests": options.max_queued_requests,
            "overlap_schedule": scheduler.overlap,  # on where the engine launches steps ahead
            "running": running,
            "queued": queued,
            "engine_steps": scheduler.steps,
            **({"spec_accept_length": metrics.window_accept_length, "spec_accept_rate": metrics.window_accept_rate}
               if spec.speculative else {}),
        }

    return app


def _add_error_handlers(app: FastAPI, metrics: ServeMetrics) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        if e.status == 503:
            metrics.requests.labels(outcome="rejected").inc()
        elif e.status < 500 and not e.counted:  # counted: by its sequences as they end (Work.outcome)
            metrics.requests.labels(outcome="invalid").inc()  # 5xx: the scheduler counted the failure
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        path = request.url.path
        msg = {404: "responses are not stored by this server (store is always false): a response's output comes "
                    "back from POST /v1/responses alone" if path.startswith("/v1/responses/")
               else f"no route {request.method} {path}; see {', '.join(ROUTES)}",
               405: f"method {request.scope.get('eyas.method', request.method)} is not allowed on "
                    f"{request.url.path}"}.get(e.status_code, str(e.detail))
        return JSONResponse(error_body(msg, error_type(e.status_code), code=str(e.status_code)),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, e: ClientDisconnect):
        # the client left while its body was being read (a timeout, a proxy, a killed process): an abort, as when it
        # leaves later, never a server error; nobody is left to read the answer
        metrics.requests.labels(outcome="abort").inc()
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return JSONResponse(error_body(f"invalid request: {e.errors()[:1]}"), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        metrics.requests.labels(outcome="error").inc()
        return JSONResponse(error_body(f"internal server error: {type(e).__name__}: {e}", "server_error"),
                            status_code=500)
