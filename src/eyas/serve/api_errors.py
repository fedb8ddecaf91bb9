"""Errors the API returns, in OpenAI's JSON shape: ``{"error": {message, type, param, code}}``.

The official ``openai`` client reads ``error.message`` into its exception text, so every message
says what was wrong and what was expected, as the engine's ``EyasError`` does.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from pydantic import BaseModel

# The openai SDK retries 408 (twice by default) unless told not to: a request cancelled at --request-timeout
# would only run, and time out, again. It reads this header before its own rules.
NO_RETRY = {408: {"x-should-retry": "false"}}


class ApiError(Exception):
    """A request the server refuses; ``status`` is the HTTP status (4xx for the client's fault)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or error_type(status)
        self.headers = {**NO_RETRY.get(status, {}), **(headers or {})}
        self.counted = False  # set where the request's sequences were queued: they count it as they end

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_type(status: int) -> str:
    if status == 404:
        return "not_found_error"
    if status == 503:
        return "overloaded_error"
    if status == 429:
        return "rate_limit_error"  # OpenAI's (and Anthropic's) name for it
    if status == 408:
        return "timeout_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """The error object; its text always encodes as UTF-8 (a lone surrogate is written as ``\\udXXX``)."""
    return {"error": {"message": _text(message), "type": type, "param": None if param is None else _text(param),
                      "code": code}}


def _text(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(HTTPStatus.BAD_REQUEST, message, param, code)


def overloaded(e, retry_after: int = 1) -> ApiError:
    """The 503 for ``work.Overloaded``: the numbers the admission check compared."""
    if e.stopping:
        message = f"the server is shutting down and admits no new requests; retry after {retry_after} s"
    else:
        message = (f"the server is at capacity: {e.inflight} sequences in flight (running, being prefilled or queued) "
                   f"of the {e.running + e.queued} it holds ({e.running} --max-running-requests + {e.queued} "
                   f"--max-queued-requests), and this request needs {e.asked} more; retry after {retry_after} s, "
                   "or start the server with a larger --max-running-requests / --max-queued-requests")
    return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, message, code="server_overloaded",
                    headers={"Retry-After": str(retry_after)})


def short(value) -> str:
    """A client's value as an error message quotes it: JSON, cut to 80 characters."""
    s = json.dumps(value) if not isinstance(value, BaseModel) else repr(value)
    return s if len(s) <= 80 else s[:77] + "..."
