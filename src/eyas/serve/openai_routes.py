"""``/v1/chat/completions`` and ``/v1/completions``: OpenAI's shapes, streamed as server-sent events.

Each response carries its own acceptance in ``usage`` (SGLang's ``meta_info`` names):
``spec_verify_ct`` (verify steps), ``spec_draft_token_num``, ``spec_accept_token_num``,
``spec_accept_length`` (1 + accepted / steps), ``spec_accept_rate`` (accepted / draft tokens) and
``spec_accepted_per_position``. A stream sends them in the usage chunk
(``stream_options.include_usage``) and, per choice, in ``meta_info`` on its last chunk.
Logprobs (chat's ``logprobs``/``top_logprobs``, completions' ``logprobs``) are shaped by ``logprobs.py``;
a streamed chunk carries those of the tokens its delta holds (of tokens whose text was held back, in the
next chunk with text, or the last one). Completions' ``echo`` puts each prompt's text (and with ``logprobs``
its tokens' logprobs, the first null) before its choices' output, streamed in the choice's first chunk;
vLLM's ``prompt_logprobs`` come back in ``choices[i].prompt_logprobs``, vLLM's shape.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from ..engine.stats import SpecStats
from . import logprobs as lp
from .api_errors import ApiError, error_body
from .inputs import Job, chat_prompt, check_model, echo_texts, openai_job, parse_body, text_prompts
from .prepare import Prepared, Preparer
from .protocol import ChatCompletionRequest, CompletionRequest
from .runner import ClientGone, JobRun
from .scheduler import Delta, Failed, Finished
from .structured import chat_structure, completion_structure
from .tools import ToolPlan, ToolStream, tool_delta, tool_message

router = APIRouter()
log = logging.getLogger("eyas.serve")


def spec_fields(stats: SpecStats) -> dict:
    return {
        "spec_verify_ct": stats.drafts,
        "spec_draft_token_num": stats.draft_tokens,
        "spec_accept_token_num": stats.accepted,
        "spec_accept_length": stats.accept_length,
        "spec_accept_rate": stats.accept_rate,
        "spec_accepted_per_position": list(stats.accepted_per_position),
    }


def usage(state, prompt_tokens: int, finished: list[Finished]) -> dict:
    completion = sum(len(f.output_ids) for f in finished)
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
    if state.engine.spec.speculative:
        total = SpecStats()
        for f in finished:
            total.add(f.stats)
        u.update(spec_fields(total))
    return u


# Characters JSON leaves raw that Python's str.splitlines ends a line at (and so httpx's aiter_lines and the SSE
# readers built on it): a sampled token that decodes to one would cut its event in two for such a client.
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(obj) -> str:
    """One server-sent event: the JSON on one line whichever way a client splits lines."""
    return f"data: {json.dumps(obj, ensure_ascii=False).translate(_LINE_BREAKS)}\n\n"


def failed_error(event: Failed) -> ApiError:
    return ApiError(event.status, event.message, code="engine_error" if event.status == 500 else "out_of_memory")


def _chat(p: Preparer, raw: bytes) -> Prepared:  # on the preparer's thread
    req = parse_body(raw, ChatCompletionRequest, max_messages=p.max_tokens)
    check_model(req.model, p.served_names)
    job = openai_job(req, [chat_prompt(p.tokenizer, req, p.max_chars)], True, p.sampling)
    return p.prepared(req, chat_structure(job, req))


def _completion(p: Preparer, raw: bytes) -> Prepared:  # on the preparer's thread
    req = parse_body(raw, CompletionRequest)
    check_model(req.model, p.served_names)
    prompts = text_prompts(p.tokenizer, req.prompt, "prompt", p.max_chars, req.add_special_tokens)
    job = openai_job(req, prompts, False, p.sampling)
    if req.echo:
        job.echo = echo_texts(p.tokenizer, req.prompt, prompts)
    return p.prepared(req, completion_structure(job, req))


async def prepared_run(request: Request, build) -> tuple:
    """(the app's state, the request prepared by ``build`` on a worker thread, its job's run): each route's start."""
    state = request.app.state.eyas
    prep = await state.prepare(build, await request.body(), request.receive)
    return state, prep, JobRun(state.scheduler, state.engine, prep.job, state.options.limits)


def _head(kind: str, req, request: Request, state) -> dict:
    """A response's id, as vLLM's: ``<kind>-`` and the client's ``X-Request-Id`` header (one the log line keeps
    too), else the body's ``request_id``, else a fresh one; its time and model."""
    rid = request.state.client_request_id or req.request_id or uuid.uuid4().hex
    return {"id": f"{kind}-{rid}", "created": int(time.time()), "model": state.served_names[0]}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state, prep, run = await prepared_run(request, _chat)
    req, job = prep.req, prep.job
    head = _head("chatcmpl", req, request, state)
    log_prompt(request, prep)
    if req.stream:
        return streaming(state, run, _chat_stream(state, run, head, req.stream_options, request.state.log, job.tools),
                         request.state.log)
    finished = await collect_finished(run, request)
    if finished is None:
        return Response(status_code=499)
    choices = [{"index": i, "message": {"role": "assistant", "content": f.text}, "finish_reason": f.reason,
                "stop_reason": stop_reason(f, job), "logprobs": lp.chat(f.logprobs)} for i, f in enumerate(finished)]
    if job.tools is not None:  # the calls read back from the output (tools.py)
        for c, f in zip(choices, finished):
            tool_message(c, f.text, job.tools)
    body_usage = usage(state, run.prompt_tokens, finished)
    log_result(request.state.log, body_usage, finished)
    return JSONResponse({**head, "object": "chat.completion", "choices": choices, "usage": body_usage})


@router.post("/v1/completions")
async def completions(request: Request):
    state, prep, run = await prepared_run(request, _completion)
    req = prep.req
    head = _head("cmpl", req, request, state)
    log_prompt(request, prep)
    if req.stream:
        return streaming(state, run, _completion_stream(state, run, head, req.stream_options, request.state.log,
                                                        req.logprobs is not None), request.state.log)
    finished = await collect_finished(run, request)
    if finished is None:
        return Response(status_code=499)
    choices = []
    for i, f in enumerate(finished):
        echo, items, prompt = _echoed(run, i, f.logprobs, req.logprobs is not None)
        choice = {"index": i, "text": echo + f.text, "finish_reason": f.reason, "stop_reason": stop_reason(f, prep.job),
                  "logprobs": lp.completion(items)[0]}
        if prompt is not None:
            choice["prompt_logprobs"] = lp.vllm_prompt(prompt)
        choices.append(choice)
    body_usage = usage(state, run.prompt_tokens, finished)
    log_result(request.state.log, body_usage, finished)
    return JSONResponse({**head, "object": "text_completion", "choices": choices, "usage": body_usage})


def streaming(state, run: JobRun, lines, log_fields: dict) -> StreamingResponse:
    """A server-sent-events response holding one of the --max-concurrent-streams slots.

    Lines are encoded here, so a failure anywhere in making or encoding one is caught: the stream
    then ends as a failed stream should (vLLM and SGLang alike), with an error event and ``[DONE]``,
    never a 200 body that just stops."""
    try:
        ticket = state.streams.acquire()
    except ApiError as e:
        run.cancel("rejected")  # it was queued already: free its slot before refusing
        e.counted = True
        raise

    async def guarded():
        try:
            async for line in lines:
                yield line.encode("utf-8")
        except Exception as e:  # whatever failed, the client gets an ending it can read
            log.exception("a stream failed mid-way")
            state.metrics.requests.labels(outcome="error").inc()
            message = f"internal server error while streaming: {type(e).__name__}: {e}".encode(
                "utf-8", "backslashreplace").decode("utf-8")  # for the log line too
            log_failure(log_fields, message)
            yield sse(error_body(message, "server_error", code="internal_error")).encode("utf-8")
            yield b"data: [DONE]\n\n"
        finally:
            ticket.release()

    def done():
        ticket.release()
        run.cancel()

    return StreamingResponse(guarded(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                             background=BackgroundTask(done))


def log_prompt(request: Request, prep: Prepared) -> None:
    """Prompt text for the request's log line (decoded only with --log-requests)."""
    if prep.prompt_text is not None:
        request.state.log["prompt"] = prep.prompt_text


def log_failure(fields: dict, message: str, outcome: str = "error") -> None:
    """A stream answered 200 before it failed: its log line says how it really ended, and why."""
    fields.update(outcome=outcome, error=message)


def log_result(fields: dict, body_usage: dict, finished: list[Finished], streamed: int | None = None) -> None:
    """The request's log line: its usage, and for a stream the tokens it sent (``streamed``: also those of
    choices that never finished, when a failure or a client that left ended it)."""
    fields.update({k: body_usage[k] for k in ("prompt_tokens", "completion_tokens") if k in body_usage})
    if streamed is not None:
        fields["completion_tokens"] = streamed
    fields["finish_reason"] = [f.reason for f in finished if f is not None]
    if "spec_accept_length" in body_usage:
        fields["spec_accept_length"] = round(body_usage["spec_accept_length"], 4)
        fields["spec_verify_ct"] = body_usage["spec_verify_ct"]
    fields["output"] = [f.text for f in finished if f is not None]


async def collect_finished(run: JobRun, request: Request) -> list[Finished] | None:
    """Every choice's Finished event, in index order; None when the client went away."""
    finished: list[Finished | None] = [None] * len(run.works)
    try:
        async for index, event in run.events(request.receive):
            if isinstance(event, Failed):
                request.state.log["error"] = event.message
                raise failed_error(event)
            if isinstance(event, Finished):
                finished[index] = event
    except ClientGone:
        return None
    return finished  # type: ignore[return-value]


async def _chat_stream(state, run: JobRun, head: dict, options, log_fields: dict, tools: ToolPlan | None = None):
    chunk = {**head, "object": "chat.completion.chunk"}
    continuous = options and options.include_usage and options.continuous_usage_stats
    usage0 = {"usage": {"prompt_tokens": run.prompt_tokens, "completion_tokens": 0,
                        "total_tokens": run.prompt_tokens}} if continuous else {}
    for i in range(len(run.works)):
        yield sse({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None, "logprobs": None}], **usage0})

    held: dict[int, ToolStream] = {}  # with tools: each choice's text, held back from a possible tool call on

    def piece(index, text, reason, items):
        delta = {"content": text} if text else {}
        if tools is not None:
            delta, reason = tool_delta(held.setdefault(index, ToolStream(tools)), text, reason)
        return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": lp.chat(items)}

    async for line in _stream(state, run, chunk, options, piece, log_fields):
        yield line


def _echoed(run: JobRun, index: int, items: list | None, logprobs: bool) -> tuple[str, list | None, list | None]:
    """(choice ``index``'s echoed prompt text, or "" without echo; its logprob entries, the prompt's first where
    echoed with logprobs; the prompt's entries where its logprobs were computed, else None)."""
    work = run.works[index]
    prompt = lp.prompt_entries(work.receiver.outbox.texts, work.seq)
    if run.job.echo is None:
        return "", items, prompt
    return run.job.echo[index // run.job.n], (prompt or []) + (items or []) if logprobs else items, prompt


async def _completion_stream(state, run: JobRun, head: dict, options, log_fields: dict, asked: bool):
    chunk = {**head, "object": "text_completion"}
    offsets: dict[int, int] = {}  # per choice: where its next token's text starts (text_offset)

    def piece(index, text, reason, items):
        if index not in offsets:  # the choice's first chunk: the echoed prompt first
            echo, items, _ = _echoed(run, index, items, asked)
            text = echo + text
        logprobs, offsets[index] = lp.completion(items, offsets.get(index, 0))
        return {"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs}

    async for line in _stream(state, run, chunk, options, piece, log_fields):
        yield line


async def _stream(state, run: JobRun, chunk: dict, options, piece, log_fields: dict):
    """SSE lines for either endpoint; ``piece(index, text, finish_reason, logprob entries)`` shapes one choice."""
    include_usage = bool(options and options.include_usage)
    continuous = include_usage and options.continuous_usage_stats  # as vLLM: only with include_usage
    done: list[Finished] = []
    generated = 0
    pending: dict[int, list] = {}  # per choice: logprob entries not sent yet (their delta had no text)
    try:
        async for index, event in run.events():
            extra = {}
            if isinstance(event, Delta):
                generated += len(event.token_ids)
                pending.setdefault(index, []).extend(event.logprobs or [])
                if not event.text:
                    continue
                choice = piece(index, event.text, None, pending[index])
                if choice.get("delta") == {} and not choice["logprobs"]:
                    continue  # text held back (a tool call being written): nothing to send yet
                pending.pop(index)
                body = {**chunk, "choices": [choice]}
            elif isinstance(event, Finished):
                done.append(event)
                choice = piece(index, "", event.reason, pending.pop(index, None))
                if choice.get("delta"):  # what the end released (held text, the calls): a chunk of its own first
                    yield sse({**chunk, "choices": [{**choice, "finish_reason": None}]})
                    choice = {**choice, "delta": {}, "logprobs": None}
                body = {**chunk, "choices": [{**choice, "stop_reason": stop_reason(event, run.job)}],
                        "meta_info": _meta(state, event)}
            else:  # Failed
                log_failure(log_fields, event.message)
                yield sse(error_body(event.message, "server_error", code="engine_error"))
                break
            if continuous:
                extra["usage"] = {"prompt_tokens": run.prompt_tokens, "completion_tokens": generated,
                                  "total_tokens": run.prompt_tokens + generated}
            yield sse({**body, **extra})
    except ApiError as e:  # --request-timeout: the stream ends with the error, then [DONE]
        log_failure(log_fields, e.message, "timeout")
        yield sse(e.body())
    finally:  # also when the client left mid-way (the log line is written all the same)
        body_usage = usage(state, run.prompt_tokens, done)
        log_result(log_fields, body_usage, done, generated)
    if include_usage:
        yield sse({**chunk, "choices": [], "usage": body_usage})
    yield "data: [DONE]\n\n"


def stop_reason(f: Finished, job: Job) -> str | int | None:
    """vLLM's ``stop_reason``: the stop string or ``stop_token_ids`` entry that ended the output; None where it
    ended otherwise (EOS, length)."""
    if f.reason != "stop" or not (isinstance(f.matched, str) or f.matched in job.params.stop_token_ids):
        return None
    return f.matched


def _meta(state, f: Finished) -> dict:
    meta = {"completion_tokens": len(f.output_ids)}
    if state.engine.spec.speculative:
        meta.update(spec_fields(f.stats))
    return meta
