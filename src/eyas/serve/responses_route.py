"""``/v1/responses``: OpenAI's Responses API for text, run as a chat completion.

A request becomes a chat request: ``instructions`` a system message first, ``input`` a string (one user message)
or a list of messages (``{"role", "content"}``, ``"type": "message"`` optional, the content a string or
``input_text`` / ``output_text`` parts), ``max_output_tokens`` its max_tokens, ``text.format`` its
``response_format``. It then runs as ``/v1/chat/completions`` does (the sampling defaults, the limits, structured
output, acceptance in ``usage``). The answer is a ``response`` with one ``message`` output item of ``output_text``,
``status`` "completed", or "incomplete" with ``incomplete_details.reason`` "max_output_tokens" (or "abort": cancelled
at shutdown, the chat route's finish_reason); streamed, the
Responses events in order, each named in its ``event:`` line and numbered (``sequence_number``):
``response.created``, ``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` per piece of text, ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` (or ``response.incomplete``, or ``response.failed``).

Refused by name (400), since answering without them would not be what was asked: tools, ``previous_response_id``
and ``conversation`` (nothing is stored: ``store`` is accepted, and no response can be fetched back later),
``background``, ``reasoning``, ``include``, ``top_logprobs``, and ``truncation: "auto"``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .api_errors import ApiError, bad_request
from .inputs import chat_prompt, check_model, openai_job, parse_body
from .neutral import refuse
from .openai_routes import collect_finished, log_failure, log_prompt, log_result, prepared_run, streaming, usage
from .prepare import Prepared, Preparer
from .protocol import ChatCompletionRequest, InputMessage, ResponsesRequest
from .runner import JobRun
from .scheduler import Delta, Failed, Finished
from .structured import chat_structure

router = APIRouter()


def _refuse_unsupported(req: ResponsesRequest) -> None:
    refuse("tools", req.tools, None, "tools and tool calls on /v1/responses: /v1/chat/completions has them")
    refuse("tool_choice", None if req.tool_choice in ("none", "auto") else req.tool_choice, None, "no tools")
    refuse("previous_response_id", req.previous_response_id, None, "no response is stored: send the conversation "
           "in input")
    refuse("conversation", req.conversation, None, "no conversation is stored: send it in input")
    refuse("background", req.background, False, "no background responses")
    refuse("reasoning", req.reasoning, None, "no reasoning controls")
    refuse("include", req.include, None, "nothing more to include")
    refuse("top_logprobs", req.top_logprobs, 0, "no logprobs on /v1/responses: /v1/chat/completions has them")
    refuse("truncation", req.truncation, "disabled", "the input is never cut: a prompt too long is refused")


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that ``req`` asks for."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    items = [InputMessage(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for m in items:
        content = m.content if isinstance(m.content, str) else [{"type": "text", "text": p.text} for p in m.content]
        messages.append({"role": m.role, "content": content})
    if not messages:
        raise bad_request("'input' is empty: send a string or at least one message", param="input")
    fmt = req.text.format if req.text is not None else None
    body: dict[str, Any] = {"messages": messages, "max_tokens": req.max_output_tokens, "temperature": req.temperature,
                            "top_p": req.top_p, "stream": bool(req.stream)}
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None or not fmt.name:
            raise bad_request("text.format of type json_schema needs 'name' and 'schema'", param="text.format")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                                          "strict": fmt.strict}}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return ChatCompletionRequest.model_validate(body)


def _build(p: Preparer, raw: bytes) -> Prepared:  # on the preparer's thread
    req = parse_body(raw, ResponsesRequest)
    check_model(req.model, p.served_names)
    _refuse_unsupported(req)
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(f"max_output_tokens must be at least 1, got {req.max_output_tokens}",
                          param="max_output_tokens", code="invalid_value")
    chat = chat_request(req)
    job = openai_job(chat, [chat_prompt(p.tokenizer, chat, p.max_chars)], True, p.sampling)
    if job.max_tokens_param == "max_tokens":
        job.max_tokens_param = "max_output_tokens"  # named back in a context-length refusal
    return p.prepared(req, chat_structure(job, chat))


def _ended(state, run: JobRun, f: Finished, log_fields: dict) -> dict:
    """The request's log line written, its usage in the Responses API's names (acceptance as on the chat route)."""
    u = usage(state, run.prompt_tokens, [f])
    log_result(log_fields, u, [f])
    return {"input_tokens": u.pop("prompt_tokens"), "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u.pop("completion_tokens"), "output_tokens_details": {"reasoning_tokens": 0}, **u}


def _message(mid: str, text: str, status: str) -> dict:
    """The output item; no content yet while "in_progress"."""
    content = [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": [],
                                                   "logprobs": []}]
    return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}


# why a response ended short, by the chat route's finish_reason: cut by max_output_tokens, or cancelled under way
# (the server shutting down: the chat route's "abort")
_INCOMPLETE = {"length": "max_output_tokens", "abort": "abort"}


def _finish(response: dict, f: Finished, mid: str, u: dict) -> dict:
    reason = _INCOMPLETE.get(f.reason)
    status = "completed" if reason is None else "incomplete"
    return {**response, "status": status, "incomplete_details": None if reason is None else {"reason": reason},
            "output": [_message(mid, f.text, status)], "usage": u}


@router.post("/v1/responses")
async def responses(request: Request):
    state, prep, run = await prepared_run(request, _build)
    req, job = prep.req, prep.job
    sp, mid = job.params, f"msg_{uuid.uuid4().hex}"
    response = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
                "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "model": state.served_names[0], "output": [],
                "parallel_tool_calls": True, "previous_response_id": None, "reasoning": {"effort": None},
                "store": False, "temperature": sp.temperature, "top_p": sp.top_p, "tool_choice": "none", "tools": [],
                "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)
                         if req.text is not None and req.text.format is not None else {"type": "text"}},
                "truncation": "disabled", "usage": None, "metadata": req.metadata or {}, "user": req.user}
    log_prompt(request, prep)
    if req.stream:
        return streaming(state, run, _events(state, run, response, mid, request.state.log), request.state.log)
    finished = await collect_finished(run, request)
    if finished is None:
        return Response(status_code=499)
    return JSONResponse(_finish(response, finished[0], mid, _ended(state, run, finished[0], request.state.log)))


async def _events(state, run: JobRun, response: dict, mid: str, log_fields: dict):
    seq = iter(range(1 << 62))

    def event(kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **fields})}\n\n"

    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    at = {"item_id": mid, "output_index": 0, "content_index": 0}
    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    yield event("response.output_item.added", output_index=0, item=_message(mid, "", "in_progress"))
    yield event("response.content_part.added", part=part, **at)
    finished, failure = None, None  # failure: (code, message, the log line's outcome)
    try:
        async for _, e in run.events():
            if isinstance(e, Delta) and e.text:
                yield event("response.output_text.delta", delta=e.text, logprobs=[], **at)
            elif isinstance(e, Finished):
                finished = e
            elif isinstance(e, Failed):
                failure = ("server_error", e.message, "error")
                break
    except ApiError as e:  # --request-timeout
        failure = ("timeout", e.message, "timeout")
    if failure is not None:
        code, message, outcome = failure
        log_failure(log_fields, message, outcome)
        yield event("response.failed", response={**response, "status": "failed",
                                                 "error": {"code": code, "message": message}})
        return
    if finished is None:  # cancelled under way: nothing more to say
        return
    done = _finish(response, finished, mid, _ended(state, run, finished, log_fields))
    yield event("response.output_text.done", text=finished.text, logprobs=[], **at)
    yield event("response.content_part.done", part={**part, "text": finished.text}, **at)
    yield event("response.output_item.done", output_index=0, item=done["output"][0])
    yield event("response.completed" if done["status"] == "completed" else "response.incomplete", response=done)

