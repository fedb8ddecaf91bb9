"""``bench.online.stream_chat``: the one SSE client loop eyas bench and benchmarks/serve_load.py share."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from eyas.bench.online import stream_chat


def sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def read(body: bytes, status: int = 200):
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_chat(client, "http://server", {"stream": True})

    return asyncio.run(go())


def test_text_chunks_and_the_last_usage_are_read_up_to_done():
    usage = {"completion_tokens": 7, "spec_accept_length": 2.5}
    s = read(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, chunk("a"), chunk("b"), chunk("c"),
                 {"choices": [], "usage": usage}, b"[DONE]", chunk("after done")))
    assert len(s.arrivals) == 3 and s.usage == usage  # the role-only chunk and anything after [DONE] are not text
    assert s.start <= s.arrivals[0] <= s.arrivals[-1] <= s.end


def test_an_error_event_fails_the_request_with_the_servers_message():
    with pytest.raises(RuntimeError, match="stream error: the prompt is too long"):
        read(sse(chunk("a"), {"error": {"message": "the prompt is too long", "code": 400}}, b"[DONE]"))


def test_a_status_other_than_200_fails_with_the_body():
    with pytest.raises(RuntimeError, match=r"HTTP 503 from .*/v1/chat/completions: busy$"):
        read(b'{"error": "busy"}', status=503)


def test_an_event_with_a_raw_unicode_line_separator_is_one_event():
    """vLLM and SGLang send U+2028 and U+0085 raw inside their JSON (a sampled token can be one); SSE ends a line at
    LF or CR LF alone, where httpx's aiter_lines also splits at those and cut the event in two (a JSONDecodeError)."""
    raw = json.dumps(chunk("a\u2028b\x85c"), ensure_ascii=False).encode()
    body = b"data: " + raw + b"\r\n\r\n" + sse({"choices": [], "usage": {"completion_tokens": 3}}, b"[DONE]")
    s = read(body)
    assert len(s.arrivals) == 1 and s.usage == {"completion_tokens": 3}
