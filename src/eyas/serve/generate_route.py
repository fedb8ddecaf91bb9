"""``POST /generate``: SGLang's native shape, with acceptance in ``meta_info``.

Request: ``{"text" | "input_ids", "sampling_params": {...}, "stream", "rid"}``; a list of texts or
of id lists (or ``n > 1``) returns a list. Response: ``{"text", "output_ids", "meta_info"}`` where
``meta_info`` holds ``id``, ``prompt_tokens``, ``completion_tokens``, ``finish_reason``
(``{"type": "stop", "matched": ...}``, ``{"type": "length", "length": n}`` or ``{"type": "abort"}``),
``e2e_latency``, ``ttft`` and, when speculating, ``spec_verify_ct``, ``spec_accept_length``,
``spec_accept_rate``, ``spec_draft_token_num``, ``spec_accept_token_num``,
``spec_accepted_per_position``; with ``return_logprob``, SGLang's ``output_token_logprobs`` (and
``output_top_logprobs`` with ``top_logprobs_num``: ``logprobs.generate``), and with ``logprob_start_len`` >= 0
the prompt's from that position in ``input_token_logprobs`` (``input_top_logprobs``). A stream sends the
cumulative object per update (as SGLang does), with an ``index`` for batches, then ``data: [DONE]``.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from . import logprobs as lp
from .api_errors import ApiError, bad_request
from .inputs import check_model, generate_job, generate_prompts, parse_body
from .openai_routes import collect_finished, log_failure, log_prompt, spec_fields, sse, streaming
from .prepare import Prepared, Preparer
from .protocol import GenerateRequest
from .runner import JobRun
from .scheduler import Delta, Failed, Finished
from .structured import generate_structure

router = APIRouter()


def _prepare(p: Preparer, raw: bytes) -> Prepared:  # on the preparer's thread
    req = parse_body(raw, GenerateRequest)
    check_model(req.model, p.served_names)
    return p.prepared(req, generate_structure(generate_job(req, generate_prompts(p.tokenizer, req, p.max_chars)), req))


@router.post("/generate")
async def generate(request: Request):
    state = request.app.state.eyas
    prep = await state.prepare(_prepare, await request.body(), request.receive)
    req, job = prep.req, prep.job
    state.options.limits.check_job(job, state.scheduler.max_running, state.scheduler.max_queued)  # n bounded first
    rids = _rids(req.rid, len(job.prompts), job.n)
    run = JobRun(state.scheduler, state.engine, job, state.options.limits)
    batched = job.n > 1 or isinstance(req.text, list) or bool(req.input_ids and isinstance(req.input_ids[0], list))
    shape = (req.top_logprobs_num or 0, bool(req.return_text_in_logprobs), max(0, req.logprob_start_len or 0)) \
        if req.return_logprob else None
    log_prompt(request, prep)
    if req.stream:
        return streaming(state, run, _stream(state, run, rids, batched, shape, request.state.log), request.state.log)
    finished = await collect_finished(run, request)
    if finished is None:
        return Response(status_code=499)
    results = [_result(state, rids[i], f, shape, run.works[i]) for i, f in enumerate(finished)]
    fields = request.state.log
    fields["completion_tokens"] = sum(r["meta_info"]["completion_tokens"] for r in results)
    fields["prompt_tokens"] = run.prompt_tokens
    if state.engine.spec.speculative:
        fields["spec_accept_length"] = [round(r["meta_info"]["spec_accept_length"], 4) for r in results]
    fields["output"] = [r["text"] for r in results]
    return JSONResponse(results if batched else results[0])


def _rids(rid, prompts: int, n: int) -> list[str]:
    """An id per output (prompt-major): ``rid`` a string, or a list of one, for all (with -0, -1, ... appended
    when there are several), or a list of one per prompt (as SGLang; with n > 1 each gets -0, -1, ...) or per
    output; any other length is a 400."""
    count = prompts * n
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    rids = [rid] if isinstance(rid, str) else list(rid)
    if len(rids) == 1 and count > 1:
        return [f"{rids[0]}-{i}" for i in range(count)]
    if len(rids) == prompts and n > 1:
        return [f"{r}-{j}" for r in rids for j in range(n)]
    if len(rids) != count:
        has = f"{prompts} prompt{'s' if prompts > 1 else ''}" + (f" x sampling_params.n={n}" if n > 1 else "")
        want = f"{prompts} (one per prompt)" + (f" or {count} (one per output)" if n > 1 else "")
        raise bad_request(f"rid has {len(rids)} ids, but the request has {has}: send a list of {want} ids, or a "
                          "single string (several outputs get it with -0, -1, ... appended)", param="rid",
                          code="invalid_value")
    return rids


def _finish_reason(f: Finished) -> dict:
    if f.reason == "length":
        return {"type": "length", "length": len(f.output_ids)}
    if f.reason == "stop":
        return {"type": "stop", "matched": f.matched}
    return {"type": "abort", "message": "cancelled"}


def _logprobs(shape: tuple[int, bool, int], entries: list, work) -> dict:
    """``meta_info``'s logprob fields: ``shape`` (top_logprobs_num, return_text_in_logprobs, logprob_start_len)."""
    prompt = lp.prompt_entries(work.receiver.outbox.texts, work.seq)
    return lp.generate(entries, shape[0], shape[1], None if prompt is None else prompt[shape[2]:])


def _result(state, rid: str, f: Finished, shape: tuple[int, bool, int] | None, work) -> dict:
    """The response of one output; ``shape`` with return_logprob (``_logprobs``)."""
    meta = {
        "id": rid,
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": len(f.output_ids),
        "finish_reason": _finish_reason(f),
        "e2e_latency": f.e2e,
        "ttft": f.ttft,
    }
    if state.engine.spec.speculative:
        meta.update(spec_fields(f.stats))
    if shape is not None:
        meta.update(_logprobs(shape, f.logprobs or [], work))
    return {"text": f.text, "output_ids": list(f.output_ids), "meta_info": meta}


async def _guarded(run: JobRun):
    """run.events(), with a timeout turned into a final (None, ApiError) pair."""
    try:
        async for index, event in run.events():
            yield index, event
    except ApiError as e:  # --request-timeout
        yield None, e


async def _stream(state, run: JobRun, rids: list[str], batched: bool, shape, log_fields: dict):
    texts = [""] * len(run.works)
    ids: list[list[int]] = [[] for _ in run.works]
    entries: list[list] = [[] for _ in run.works]
    try:
        async for index, event in _guarded(run):
            if isinstance(event, ApiError):
                log_failure(log_fields, event.message, "timeout")
                yield sse(event.body())
                break
            if isinstance(event, Delta):
                texts[index] += event.text
                ids[index] += event.token_ids
                entries[index] += event.logprobs or []
                body = {"text": texts[index], "output_ids": list(ids[index]),
                        "meta_info": {"id": rids[index], "prompt_tokens": len(run.works[index].seq.prompt_ids),
                                      "completion_tokens": len(ids[index]), "finish_reason": None}}
                if shape is not None:
                    body["meta_info"].update(_logprobs(shape, entries[index], run.works[index]))
            elif isinstance(event, Finished):
                body = _result(state, rids[index], event, shape, run.works[index])
            elif isinstance(event, Failed):
                log_failure(log_fields, event.message)
                yield sse({"error": {"message": event.message, "type": "server_error", "code": "engine_error"}})
                break
            else:
                continue
            if batched:
                body["index"] = index
            yield sse(body)
    finally:  # also when the client left mid-way (the log line is written all the same)
        log_fields.update(prompt_tokens=run.prompt_tokens, completion_tokens=sum(len(i) for i in ids), output=texts)
    yield "data: [DONE]\n\n"
