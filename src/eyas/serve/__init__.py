"""``eyas serve``: an OpenAI-compatible speculative server with Prometheus metrics.

Layout (data flows top to bottom; only ``app`` and the route modules import FastAPI):

    cli.py          flags (SGLang's names), strict startup: validate, print, then bind the port
    banner.py       the startup summary a person debugging acceptance needs to read
    scheduler.py    the one engine thread: continuous batching, admission (503), cancellation
    membership.py   when the batch's rows change: several at once, within --membership-wait-steps
    detokenize.py   incremental detokenizing and stop strings, run on the event loop
    metrics.py      prometheus_client metrics under the ``eyas:`` prefix
    protocol.py     request models (OpenAI and SGLang shapes), strict types
    inputs.py       request -> prompt ids + SamplingParams, every check that gives a 4xx
    api_errors.py   OpenAI-style JSON errors
    app.py          the FastAPI app: lifespan, health, models, metrics, error handlers
    openai_routes.py  /v1/chat/completions, /v1/completions (with server-sent events)
    generate_route.py /generate (SGLang's native shape, with meta_info)

The engine is never imported by FastAPI code paths it does not need, and the engine never imports
anything from here.
"""
