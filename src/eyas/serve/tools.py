"""Tool calling on ``/v1/chat/completions``: what ``tools`` and ``tool_choice`` ask for, and the calls in the output.

``plan(req)`` reads the request into a ``ToolPlan``:

- ``"none"``: the chat template still sees the tools, generation is free and nothing is parsed;
- a named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to
  that function's ``parameters`` schema and is the call's ``arguments`` (vLLM's way);
- ``"required"``: the output is constrained to a JSON array of ``{"name": ..., "parameters": {...}}``
  objects, each naming one of the tools with arguments that match its schema;
- ``"auto"`` (the default with tools): generation is free and calls are parsed from the text in the form
  Hermes- and Qwen-style chat templates teach (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``),
  or, failing that, a whole output that is one such JSON object (Llama-3-style templates).

With ``parallel_tool_calls: false`` a response holds one call at most: "required" constrains the array to one
item, "auto" keeps the first call it parses.

Each call comes back as OpenAI's ``{"id": "call_<hex>", "type": "function", "function": {"name",
"arguments"}}`` with ``arguments`` a JSON string. Streamed, a named function's call goes out as it is written
(its arguments piece by piece); otherwise ``ToolStream`` holds the text back from the first possible
``<tool_call>`` on (under "required", all of it), so the calls arrive whole at the end, in a chunk of their
own before the one with the finish_reason (OpenAI's SDK registers a call before the end that completes it).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..sample.grammar import GrammarSpec
from .api_errors import bad_request

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    schemas: dict[str, dict]  # tool name -> its parameters' JSON schema
    name: str | None = None  # with "named"
    parallel: bool = True

    def grammar(self) -> GrammarSpec | None:
        """What the output is constrained to: none for "none" and "auto"."""
        if self.mode == "named":
            return GrammarSpec.json_schema(self.schemas[self.name], param="tool_choice")
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"enum": [n]}, "parameters": s},
                  "required": ["name", "parameters"], "additionalProperties": False} for n, s in self.schemas.items()]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return GrammarSpec.json_schema(schema, param="tool_choice")

    @property
    def forced(self) -> bool:
        """Whether the whole output is calls (a named function's arguments, or "required"'s array): never content."""
        return self.mode in ("named", "required")

    def outcome(self, text: str, reason: str) -> tuple[str | None, list[dict]]:
        """(content, tool calls) of an output that ended for ``reason``: parsed where it stopped. An output cut
        off before it stopped ("length") holds, under a forced choice, the calls written so far, the last with
        its arguments as far as they got (vLLM's); under "auto" none it could be sure of. No calls: the text is
        the content, but a forced choice's output is never content."""
        if reason == "stop" or self.mode == "required":
            return self.calls(text)
        if self.mode == "named":
            return None, [call(self.name, text)]
        return text, []

    def calls(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool calls) of a finished output; no calls: the text is the content."""
        if self.mode == "named":
            return None, [call(self.name, text)] if _loads(text, dict) is not None else []
        if self.mode == "required":
            return None, _required_calls(text, self.schemas)
        if self.mode == "auto":  # parallel_tool_calls false: the first call alone (as vLLM)
            content, found = parse_auto(text, self.schemas)
            return content, found if self.parallel else found[:1]
        return text, []


_PARTIAL_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"parameters"\s*:\s*(.*)', re.DOTALL)


def _required_calls(text: str, schemas: dict[str, dict]) -> list[dict]:
    """The calls of "required"'s array: each whole item, then, where the array was cut off mid-way, the last
    one's name and its arguments as far as they got, where its name was written whole."""
    decoder, calls, at = json.JSONDecoder(), [], text.find("[") + 1
    while 0 < at < len(text):
        at += len(text[at:]) - len(text[at:].lstrip(" \n\t,"))
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            m = _PARTIAL_CALL.match(text, at)
            name = m and json.loads(f'"{m.group(1)}"')
            if name in schemas:
                calls.append(call(name, m.group(2)))
            break
        if isinstance(item, dict) and item.get("name") in schemas:
            calls.append(call(item["name"], json.dumps(item.get("parameters", {}), ensure_ascii=False)))
    return calls


def plan(req) -> ToolPlan | None:
    """The request's ``ToolPlan`` (None without tools); a 400 for a choice the tools cannot meet."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools: send the functions in 'tools', or leave tool_choice out",
                              param="tool_choice")
        return None
    schemas = {}
    for i, tool in enumerate(req.tools):
        name = tool.function.name
        if name in schemas:
            raise bad_request(f"tools has two functions named {name!r}; names must be unique", param=f"tools.{i}")
        schemas[name] = tool.function.parameters if tool.function.parameters is not None else {"type": "object"}
    parallel = req.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        return ToolPlan(choice or "auto", schemas, parallel=parallel)
    name = choice.function.name
    if name not in schemas:
        raise bad_request(f"tool_choice names the function {name!r}, which is not among the tools "
                          f"({', '.join(map(repr, schemas))})", param="tool_choice.function.name")
    return ToolPlan("named", schemas, name, parallel)


def template_tools(req) -> list[dict] | None:
    """The tools as the chat template takes them (OpenAI's shape, as Hugging Face documents it)."""
    return [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None


def template_message(d: dict, template_knows_calls: bool) -> dict:
    """A history message for the chat template: an assistant's ``tool_calls`` carry their arguments as
    objects (as Hugging Face's templates expect), not the JSON strings OpenAI's clients send back, and a
    missing content is "" (clients send null beside tool calls; templates read it).

    A template with no tool-call format (``template_knows_calls`` false: it never mentions ``tool_calls``)
    gets the calls written into the content in the form ``parse_auto`` reads back (``<tool_call>`` blocks),
    so an agent's second turn renders with its calls in the prompt instead of failing or dropping them."""
    calls = d.get("tool_calls")
    if not isinstance(calls, list):
        return d
    calls = [_with_object_arguments(c) for c in calls]
    if d.get("content") is None:
        d["content"] = ""
    if template_knows_calls:
        d["tool_calls"] = calls
        return d
    blocks = [f"{OPEN}{json.dumps(c['function'], ensure_ascii=False)}{CLOSE}" for c in calls
              if isinstance(c, dict) and isinstance(c.get("function"), dict)]
    d["content"] = "\n".join(([d["content"]] if d["content"] else []) + blocks)
    del d["tool_calls"]
    return d


def _with_object_arguments(c):
    fn = c.get("function") if isinstance(c, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        parsed = _loads(fn["arguments"], dict)
        if parsed is not None:
            return {**c, "function": {**fn, "arguments": parsed}}
    return c


def call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def parse_auto(text: str, schemas: dict[str, dict]) -> tuple[str | None, list[dict]]:
    """Hermes/Qwen ``<tool_call>`` blocks (the last one may be cut off by the end of the output), else a
    whole output that is one ``{"name", "arguments" | "parameters"}`` object naming a tool. The content is the
    text around the blocks, or None where that is only spacing."""
    calls, spans = [], []
    for m in _HERMES.finditer(text):
        c = _as_call(_loads(m.group(1), dict), schemas)
        if c is not None:
            calls.append(c)
            spans.append(m.span())
    if not calls:
        c = _as_call(_loads(text.strip(), dict), schemas)
        return (None, [c]) if c is not None else (text, [])
    content, last = [], 0
    for a, b in spans:
        content.append(text[last:a])
        last = b
    content.append(text[last:])
    rest = "".join(content)  # as written, spacing kept (as vLLM's parsers): what a stream sent before the calls
    return (rest if rest.strip() else None), calls


def _as_call(obj: dict | None, schemas: dict[str, dict]) -> dict | None:
    if obj is None or obj.get("name") not in schemas:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return call(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _loads(text: str, kind: type):
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


class ToolStream:
    """A streamed choice's text under a plan: ``feed`` returns the content that can go out now, ``finish`` the
    (content still held, tool calls) once the output is complete, so that the stream's content adds up to the
    content of the same output unstreamed. With "auto" a stream holds back spacing at the start, everything from
    a possible ``<tool_call>`` on, and an output that may still be one whole JSON object naming a tool (a
    Llama-3-style call); with a forced call, everything."""

    def __init__(self, plan: ToolPlan):
        self.plan, self.text, self.sent = plan, "", 0
        self.bare_end: int | None = None  # where a whole JSON object naming a tool ended (a bare call so far)
        self.call_id: str | None = None  # a named call's, once its first piece went out (``_named_delta``)

    def feed(self, text: str) -> str:
        self.text += text
        if self.plan.mode in ("named", "required"):
            return ""
        safe = len(self.text)
        if self.plan.mode == "auto":
            start = self.text.find(OPEN, self.sent)
            safe = start if start >= 0 else len(self.text) - _partial_open(self.text)
            if self.sent == 0 and (not self.text[:safe].strip() or self._may_be_bare_call()):
                safe = 0
        out, self.sent = self.text[self.sent:max(safe, self.sent)], max(safe, self.sent)
        return out

    def _may_be_bare_call(self) -> bool:
        """Whether the output so far may still be one whole JSON object naming a tool (``parse_auto``'s other
        form); checked where it could have just closed, so a long answer is not re-parsed every token."""
        body = self.text.strip()
        if not body.startswith("{"):
            return False
        if self.bare_end is None and body.endswith("}"):
            obj = _loads(body, dict)
            if obj is not None:
                if obj.get("name") not in self.plan.schemas:
                    return False
                self.bare_end = len(self.text)
        return self.bare_end is None or not self.text[self.bare_end:].strip()

    def finish(self, reason: str = "stop") -> tuple[str, list[dict]]:
        content, calls = self.plan.outcome(self.text, reason)
        if not calls and not self.plan.forced:
            return self.text[self.sent:], []
        return (content or "")[self.sent:], calls  # what was sent is the start of the content (text before a call)


def _partial_open(text: str) -> int:
    """Length of the longest end of ``text`` that begins ``<tool_call>`` (held back: it may become one)."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0


def tool_message(choice: dict, text: str, plan: ToolPlan) -> None:
    """A chat choice with the calls its finished output holds (``ToolPlan.outcome``): ``message.tool_calls``, and
    finish_reason "tool_calls" where the output stopped."""
    content, calls = plan.outcome(text, choice["finish_reason"])
    if calls:
        choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
        choice["finish_reason"] = "tool_calls" if choice["finish_reason"] == "stop" else choice["finish_reason"]
    elif plan.forced:  # cut off before a call's name was whole: no call, and no grammar's JSON as content
        choice["message"] = {"role": "assistant", "content": None}


def tool_delta(stream: ToolStream, text: str, reason: str | None) -> tuple[dict, str | None]:
    """A streamed chunk's (delta, finish_reason) under a plan: the content that can go out now; at the end
    (``reason`` set) the rest of it and the calls in OpenAI's delta shape (each with its ``index``), as
    ``tool_message`` reads them. A named function's call streams as it is written (``_named_delta``)."""
    if stream.plan.mode == "named":
        return _named_delta(stream, text, reason)
    out = stream.feed(text)
    if reason is None:
        return ({"content": out} if out else {}), None
    rest, calls = stream.finish(reason)
    delta = {"content": out + rest} if out + rest else {}
    if calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
        reason = "tool_calls" if reason == "stop" else reason
    return delta, reason


def _named_delta(stream: ToolStream, text: str, reason: str | None) -> tuple[dict, str | None]:
    """A named function's call as it is written (vLLM's): its first delta holds the call's id, type, name and
    the first piece of the arguments, each later one the next piece; finish_reason "tool_calls" where it stopped."""
    stream.text += text
    delta = {}
    if text or (reason is not None and stream.call_id is None):
        piece = {"index": 0, "function": {"arguments": text}}
        if stream.call_id is None:
            piece = {"index": 0, **call(stream.plan.name, text)}
            stream.call_id = piece["id"]
        delta = {"tool_calls": [piece]}
    return delta, "tool_calls" if reason == "stop" else reason
