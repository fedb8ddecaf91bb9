"""The OpenAPI document (``/openapi.json``): request bodies and every status the server can answer.

Handlers read and validate raw bytes themselves (so invalid UTF-8 and malformed JSON get their own
clear 4xx), which means FastAPI cannot see the body models. This module adds them: each model's
JSON schema goes into ``components.schemas`` and each POST operation gets its ``requestBody`` and
the documented error statuses, all with the one OpenAI-style error shape.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    ResponsesRequest,
    TokenizeRequest,
)

BODIES = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/generate": GenerateRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
ANSWERS = {  # the 200 of each POST operation
    "/tokenize": "{count, max_model_len, tokens} (and token_strs with return_token_strs)",
    "/detokenize": "{prompt}: the text of the tokens",
}
REF = "#/components/schemas/{model}"

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    }},
}
ERRORS = {
    "400": "invalid request: bytes, JSON, types, values, or a prompt that does not fit the context",
    "401": "missing or wrong API key (only when the server runs with --api-key)",
    "404": "unknown model",
    "408": "the request ran past --request-timeout and was cancelled",
    "413": "the body is larger than --max-request-bytes (as sent, or once decoded)",
    "415": "a Content-Encoding other than gzip or deflate",
    "429": "a streaming request past --max-concurrent-streams open streams",
    "500": "the engine failed while running this request",
    "503": "at capacity (--max-running-requests + --max-queued-requests); see Retry-After",
}


def _error_response(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": REF.format(
        model="ErrorResponse")}}}}


def install_openapi(app: FastAPI, open_paths: frozenset[str]) -> None:
    """``open_paths``: what answers without the API key (``middleware.open_paths``); 401 is documented
    on every other path."""

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title="eyas serve", version="1", routes=app.routes,
                          description="OpenAI-compatible speculative server (EAGLE-3) with Prometheus metrics")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorResponse"] = ERROR_SCHEMA
        for path, model in BODIES.items():
            schema = model.model_json_schema(ref_template=REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            op = doc["paths"][path]["post"]
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
                "$ref": REF.format(model=model.__name__)}}}}
            ok = ({"description": ANSWERS[path], "content": {"application/json": {"schema": {"type": "object"}}}}
                  if path in ANSWERS else
                  {"description": "the completion (JSON), or server-sent events when stream is true",
                   "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}}})
            errors = {c: t for c, t in ERRORS.items() if path not in ANSWERS or c not in ("500", "503")}
            op["responses"] = {"200": ok, **{code: _error_response(text) for code, text in errors.items()}}
        for path, item in doc["paths"].items():
            if path in BODIES:
                continue
            for op in item.values():
                if path not in open_paths:
                    op.setdefault("responses", {})["401"] = _error_response(ERRORS["401"])
                if path == "/health":
                    op["responses"]["503"] = {"description": "the engine thread has stopped",
                                              "content": {"application/json": {"schema": {}}}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
