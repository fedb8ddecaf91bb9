"""Structured output on the routes: a request's ``response_format``, tools, or vLLM's and SGLang's grammar
fields -> the job's grammar.

- ``/v1/chat/completions`` and ``/v1/completions``: ``response_format`` ``{"type": "json_object"}`` (any
  JSON object) or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; vLLM's
  ``structured_outputs`` ``{json | regex | choice | grammar | json_object}`` and its older flat
  ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``; SGLang's flat ``regex``,
  ``ebnf`` and ``json_schema`` (a string); chat also ``tools`` / ``tool_choice`` (``tools.py``: a forced
  call is a grammar too). ``text`` is no constraint. One constraint per request, all spellings told.
- ``/generate``: SGLang's ``sampling_params.json_schema`` (a schema as a string), ``regex`` or ``ebnf``,
  one at most.

Every spelling goes through ``grammar_spec`` (kind, source, param) -> ``GrammarSpec``; a choice list is an
EBNF alternation of its strings as JSON-escaped literals (xgrammar's EBNF reads JSON's escapes).

The grammar itself is compiled by ``Preparer.prepared`` on the preparing thread (``sample/grammar.py``);
a schema xgrammar refuses is a 400 naming the field, and so is one with a keyword it compiles but cannot
enforce (``sample/schema_keywords.py``), unless ``response_format`` says ``strict: false``.
"""

from __future__ import annotations

import dataclasses
import json

from ..sample.grammar import GrammarSpec
from ..sample.schema_keywords import UNENFORCED, unenforced
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


def grammar_spec(kind: str, source, param: str, lenient: bool = False) -> GrammarSpec:
    """One constraint as the engine's grammar: ``kind`` json_object (``source`` unused), json_schema (a
    schema, or one as a JSON string), regex, ebnf or choice (a list of strings); ``param`` names the field.
    A schema with a keyword the grammar cannot enforce (``schema_keywords``) is a 400 unless ``lenient``
    (``response_format``'s ``strict: false``: output that may not follow the schema, as OpenAI's non-strict)."""
    if kind == "json_object":
        return GrammarSpec("json_object", param=param)
    if kind == "json_schema":
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except ValueError as e:
                raise bad_request(f"{param}: a JSON schema given as a string must parse as JSON; it does not: {e}",
                                  param=param, code="invalid_value") from None
        loose = [] if lenient else unenforced(source)
        if loose:
            at, keyword = loose[0]
            raise bad_request(
                f"{param}: the schema's {keyword!r} at {at} ({UNENFORCED.get(keyword, 'every member of a conjunction')}"
                ") is not something the grammar engine (xgrammar) can hold the output to, so the output could break "
                "the schema; drop it from the schema and check it in your code" + (
                    ", or send json_schema.strict false to take output that may not follow it"
                    if param == "response_format" else ""), param=param, code="invalid_value")
        return GrammarSpec.json_schema(source, param=param)
    if kind == "choice":
        if not source:
            raise bad_request(f"{param} is an empty list: give at least one string the output may be", param=param,
                              code="invalid_value")
        return GrammarSpec("ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in source), param)
    return GrammarSpec(kind, source, param)


def response_grammar(fmt) -> GrammarSpec | None:
    """``response_format`` (``protocol.ResponseFormat``) -> its grammar; None for text."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return grammar_spec("json_object", None, "response_format")
    spec = fmt.json_schema
    if spec is None or spec.schema_ is None:
        raise bad_request("response_format of type json_schema needs json_schema.schema (OpenAI's shape: "
                          '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})',
                          param="response_format.json_schema", code="invalid_value")
    return grammar_spec("json_schema", spec.schema_, "response_format", lenient=spec.strict is False)


_FLAT = (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
         ("guided_grammar", "ebnf"), ("regex", "regex"), ("ebnf", "ebnf"), ("json_schema", "json_schema"))


def _constraints(req) -> list[tuple[str, str, object]]:
    """(param, kind, source) of each grammar field an OpenAI-route request sets, ``response_format`` aside."""
    for param, pattern in (("structured_outputs.whitespace_pattern",
                            req.structured_outputs and req.structured_outputs.whitespace_pattern),
                           ("guided_whitespace_pattern", req.guided_whitespace_pattern)):
        if pattern is not None:
            raise bad_request(f"{param} is not supported: JSON is written compactly here (xgrammar's whitespace "
                              "rule is fixed), so a custom whitespace pattern cannot be followed; leave it out",
                              param=param)
    got = []
    so = req.structured_outputs
    if so is not None:
        for name, kind, value in (("json", "json_schema", so.json_), ("regex", "regex", so.regex),
                                  ("choice", "choice", so.choice), ("grammar", "ebnf", so.grammar),
                                  ("json_object", "json_object", so.json_object or None)):
            if value is not None:
                got.append((f"structured_outputs.{name}", kind, value))
    got += [(name, kind, getattr(req, name)) for name, kind in _FLAT if getattr(req, name) is not None]
    return got


def _one(fields: list[tuple[str, str, object]], fmt, forced=None, mode: str | None = None) -> GrammarSpec | None:
    """The request's one constraint; two (a forced tool call, ``response_format``, the grammar fields) are a 400."""
    params = (["tool_choice"] if forced is not None else []) + (
        ["response_format"] if fmt is not None and fmt.type != "text" else []) + [p for p, _, _ in fields]
    if len(params) > 1:
        a, b = params[:2]
        what = f"tool_choice {mode!r} constrains the output to a tool call" if a == "tool_choice" else \
            f"{a} constrains the output"
        raise bad_request(f"{what}, and so does {b}: a request takes one constraint; send one of them", param=b)
    if fields:
        (param, kind, source), = fields
        return grammar_spec(kind, source, param)
    return forced or response_grammar(fmt)


def chat_structure(job: Job, req) -> Job:
    """The chat job with its grammar (``response_format``, a grammar field or a forced tool call) and tool plan."""
    job.tools = plan(req)
    forced = job.tools.grammar() if job.tools is not None else None
    mode = job.tools.mode if job.tools is not None else None
    return _with(job, _one(_constraints(req), req.response_format, forced, mode))


def completion_structure(job: Job, req) -> Job:
    return _with(job, _one(_constraints(req), req.response_format))


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
    return _with(job, grammar_spec(kind, source, f"sampling_params.{kind}"))
