"""Request limits: each refusal is a 4xx that names the limit and the flag that changes it.

    --max-request-bytes     request body size (413), checked while the body arrives, and once decoded
                            (Content-Encoding gzip or deflate; any other coding: 415)
    --max-prompt-tokens     prompt tokens per prompt (400; the context length caps it anyway)
    --max-stop-strings      stop strings per request (400)
    --max-stop-length       characters per stop string (400)
    --max-n                 choices per request, ``n`` (400)
    --max-running-requests + --max-queued-requests
                            sequences (prompts x n) per request: one larger than the whole capacity
                            could never be admitted, so it is a 400, not a 503 to retry
    --max-concurrent-streams  open streaming responses (429)
    --request-timeout       seconds from arrival to the end of a request; past it the request is
                            cancelled cleanly (408, or an error event and [DONE] on a stream)
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass

from .api_errors import ApiError, bad_request
from .middleware import send_json


@dataclass
class Limits:
    max_request_bytes: int = 4 * 2**20
    max_prompt_tokens: int | None = None  # None: the context length
    max_stop_strings: int = 16
    max_stop_length: int = 256
    max_n: int = 16
    max_concurrent_streams: int = 256
    request_timeout: float | None = 600.0  # None or 0: no timeout

    def check_job(self, job, running: int | None = None, queued: int | None = None) -> None:
        """400 for the first limit ``job`` breaks; ``running`` and ``queued``: the scheduler's capacity."""
        if job.n > self.max_n:
            raise bad_request(f"{job.n_param} must be at most {self.max_n}, the choices per request this server "
                              f"accepts (--max-n), got {job.n}", param=job.n_param, code="too_many_choices")
        sequences = len(job.prompts) * job.n
        if running is not None and queued is not None and sequences > running + queued:
            raise bad_request(
                f"this request asks for {sequences} sequences ({len(job.prompts)} prompts x {job.n_param} {job.n}); "
                f"this server holds at most {running + queued} at once ({running} running, --max-running-requests, "
                f"+ {queued} queued, --max-queued-requests), so it could never be admitted; send fewer prompts or "
                "a smaller n per request, or raise those flags", param=job.n_param if job.n > 1 else None,
                code="too_many_sequences")
        if self.max_prompt_tokens is not None:
            longest = max((len(p) for p in job.prompts), default=0)
            if longest > self.max_prompt_tokens:
                raise bad_request(
                    f"the prompt has {longest} tokens; this server accepts at most {self.max_prompt_tokens} "
                    "(--max-prompt-tokens)", param="prompt", code="prompt_too_long")
        stops = job.stop or []
        if len(stops) > self.max_stop_strings:
            raise bad_request(f"at most {self.max_stop_strings} stop strings are accepted, got {len(stops)} "
                              "(--max-stop-strings)", param="stop", code="too_many_stop_strings")
        longest = max((len(s) for s in stops), default=0)
        if longest > self.max_stop_length:
            raise bad_request(f"stop strings may be at most {self.max_stop_length} characters, one has {longest} "
                              "(--max-stop-length)", param="stop", code="stop_string_too_long")


def timed_out(limits: Limits) -> ApiError:
    return ApiError(408, f"the request took longer than {limits.request_timeout:g} s and was cancelled "
                         "(--request-timeout)", code="request_timeout")


class StreamSlots:
    """Counts open streaming responses; ``acquire`` refuses past the limit with a 429."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()

    def acquire(self) -> StreamTicket:
        with self._lock:
            if self.open >= self.limit:
                raise ApiError(429, f"{self.open} streams are open, the most this server keeps "
                                    "(--max-concurrent-streams); retry later or use stream=false",
                               code="too_many_streams", headers={"Retry-After": "1"})
            self.open += 1
        return StreamTicket(self)

    def _release(self) -> None:
        with self._lock:
            self.open -= 1


class StreamTicket:
    """One open stream's slot; ``release`` is idempotent (the generator's end and the response's
    background task both call it, whichever way the stream ends)."""

    def __init__(self, slots: StreamSlots):
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._release()


# Content-Encoding of a request body -> zlib's wbits: gzip; deflate is zlib's format (gzip read too)
DECODED = {b"gzip": 31, b"x-gzip": 31, b"deflate": 47}


class BodySizeLimit:
    """ASGI middleware: 413 for a body past ``max_bytes``, by its Content-Length or, for a chunked
    body, counted as it arrives (read up to the limit here, then replayed to the app).

    A gzip or deflate body (``Content-Encoding``) is decoded here, at most ``max_bytes`` of output (a body
    that decodes to more is a 413, however small it came: no zip bomb is inflated), and replayed as plain
    bytes; any other coding is a 415 naming it (uvicorn hands the app the bytes as they came)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        coding = headers.get(b"content-encoding", b"identity").strip().lower()
        if coding != b"identity" and coding not in DECODED:
            return await _answer(send, unsupported_coding(coding))
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                return await _answer(send, self._too_large())
            if coding == b"identity":
                return await self.app(scope, receive, send)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_bytes:
                return await _answer(send, self._too_large())
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if coding != b"identity" and body:
            try:
                body = self._decode(body, coding)
            except ApiError as e:
                return await _answer(send, e)
            kept = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
            scope = {**scope, "headers": [*kept, (b"content-length", str(len(body)).encode())]}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _decode(self, body: bytes, coding: bytes) -> bytes:
        name = coding.decode("latin-1")
        d = zlib.decompressobj(DECODED[coding])
        try:
            out = d.decompress(body, self.max_bytes + 1)  # the output is capped, whatever the ratio
        except zlib.error as e:
            raise bad_request(f"the request body is not valid {name} data ({e}); send it compressed as its "
                              "Content-Encoding says, or uncompressed without that header",
                              code="invalid_encoding") from None
        if len(out) > self.max_bytes:
            raise self._too_large(f" once decoded (Content-Encoding: {name})")
        if not d.eof or d.unused_data:
            raise bad_request(f"the request body is not one complete {name} stream ("
                              f"{'it ends early' if not d.eof else 'bytes follow its end'}); send the whole "
                              "compressed body, or send it uncompressed without Content-Encoding",
                              code="invalid_encoding")
        return out

    def _too_large(self, how: str = "") -> ApiError:
        return ApiError(413, f"the request body is larger than {self.max_bytes} bytes{how} (--max-request-bytes)",
                        code="request_too_large")


def unsupported_coding(coding: bytes) -> ApiError:
    return ApiError(415, f"Content-Encoding {coding.decode('latin-1')!r} is not supported for request bodies; "
                         "send the body uncompressed (no Content-Encoding header), or compressed with gzip or deflate",
                    param="Content-Encoding", code="unsupported_content_encoding",
                    headers={"Accept-Encoding": "gzip, deflate"})  # RFC 7694: the codings a 415 accepts


async def _answer(send, e: ApiError) -> None:
    await send_json(send, e.status, e.body(), [(k.lower().encode(), v.encode()) for k, v in e.headers.items()])
