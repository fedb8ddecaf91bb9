"""Structured output on the routes: a request's ``response_format``, tools or SGLang grammar fields -> the
job's grammar.

- ``/v1/chat/completions`` and ``/v1/completions``: ``response_format`` ``{"type": "json_object"}`` (any
  JSON object) or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; chat also
  ``tools`` / ``tool_choice`` (``tools.py``: a forced call is a grammar too). ``text`` is no constraint.
- ``/generate``: SGLang's ``sampling_params.json_schema`` (a schema as a string), ``regex`` or ``ebnf``,
  one at most.

The grammar itself is compiled by ``Preparer.prepared`` on the preparing thread (``engine/grammar.py``);
a schema xgrammar refuses is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
import json

from ..engine.grammar import GrammarSpec
from .api_errors import bad_request
from .inputs import Job
from .tools import plan


def _with(job: Job, grammar: GrammarSpec | None) -> Job:
    if grammar is not None and job.params.min_tokens:
        param = "min_tokens" if job.n_param == "n" else "sampling_params.min_new_tokens"
        raise bad_request(f"{param} with structured output: the grammar decides where the output ends, and a "
                          "minimum length would forbid the end it allows; leave one of them out", param=param)
    if grammar is not None:
        job.params = dataclasses.replace(job.params, grammar=grammar)
    return job


def response_grammar(fmt) -> GrammarSpec | None:
    """``response_format`` (``protocol.ResponseFormat``) -> its grammar; None for text."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec("json_object")
    spec = fmt.json_schema
    if spec is None or spec.schema_ is None:
        raise bad_request("response_format of type json_schema needs json_schema.schema (OpenAI's shape: "
                          '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})',
                          param="response_format.json_schema", code="invalid_value")
    return GrammarSpec.json_schema(spec.schema_)


def chat_structure(job: Job, req) -> Job:
    """The chat job with its grammar (``response_format``, or a forced tool call) and tool plan."""
    job.tools = plan(req)
    forced = job.tools.grammar() if job.tools is not None else None
    fmt = response_grammar(req.response_format)
    if forced is not None and fmt is not None:
        raise bad_request(f"tool_choice {job.tools.mode!r} constrains the output to a tool call, which a "
                          "response_format cannot constrain too; send one of them", param="response_format")
    return _with(job, forced or fmt)


def completion_structure(job: Job, req) -> Job:
    return _with(job, response_grammar(req.response_format))


def generate_structure(job: Job, req) -> Job:
    sp = req.sampling_params
    given = [(k, v) for k, v in (("json_schema", sp.json_schema), ("regex", sp.regex), ("ebnf", sp.ebnf))
             if v is not None]
    if len(given) > 1:
        raise bad_request(f"sampling_params has {' and '.join(k for k, _ in given)}: send one grammar at most",
                          param=f"sampling_params.{given[1][0]}")
    if not given:
        return job
    kind, source = given[0]
    param = f"sampling_params.{kind}"
    if kind == "json_schema":
        try:
            schema = json.loads(source)
        except ValueError as e:
            raise bad_request(f"{param} must be a JSON schema as a JSON string; it does not parse: {e}", param=param,
                              code="invalid_value") from None
        return _with(job, GrammarSpec.json_schema(schema, param=param))
    return _with(job, GrammarSpec(kind, source, param))
