"""Published conversation formats -> eyas messages ``[{"role", "content": str}]``.

One record, whatever shape it was published in:

    OpenAI       {"messages": [{"role": "user", "content": "..." | [{"type": "text", "text": "..."}]}]}
    ShareGPT     {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}
    SpecForge    {"id": ..., "conversations": [{"role": "user", "content": "..."}, ...]}
    UltraChat    {"id": ..., "data": ["user turn", "assistant turn", "user turn", ...]}
    prompt       {"prompt": "..."}   (a bare user prompt, e.g. ``chat-prompts``; answers come from regeneration)

The first key present wins, in that order (UltraChat-200k rows carry ``prompt`` beside ``messages``).
Content-part lists are flattened to their text parts joined by newlines, as ``eyas serve`` renders
them, so a draft trains on the text a server will see; images and audio are refused, naming the
record, since a text draft cannot learn from them and silently dropping them would change the turn.
"""

from __future__ import annotations

from ..errors import EyasError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system",
         "developer": "system"}  # OpenAI's name for the system turn of its reasoning models
TOOL_ROLES = ("tool", "function", "ipython")  # results of tool calls: not text turns a draft learns from
TEXT_PARTS = ("text", "input_text", "output_text")  # chat completions; the Responses API's two
SHAPES = ("{'messages': [{'role', 'content'}]}, {'conversations': [{'from', 'value'}]}, "
          "{'data': ['user turn', 'assistant turn', ...]} or {'prompt': '...'}")


def text_of(content, where: str) -> str:
    """A turn's content as text: a string as is, a content-part list as its text parts joined by
    newlines; anything else (images, audio, files) is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise EyasError(f"{where}: a turn's content is {type(content).__name__}, not text",
                        "give content as a string or a list of {'type': 'text', 'text': ...} parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
            continue
        what = f"a {kind!r} part" if kind else f"a part that is not a typed object ({str(part)[:40]})"
        raise EyasError(f"{where}: a turn holds {what}; an EAGLE-3 draft trains on text only",
                        "drop that record, or keep only its {'type': 'text'} parts")
    return "\n".join(texts)


def _turns(record: dict, where: str) -> list[tuple[object, object]]:
    """(role, content) pairs of whichever shape the record has."""
    for key in ("messages", "conversations"):
        turns = record.get(key)
        if turns is not None:
            if not isinstance(turns, list):
                raise EyasError(f"{where}: '{key}' is {type(turns).__name__}, not a list of turns", f"use {SHAPES}")
            out = []
            for t in turns:
                if not isinstance(t, dict):
                    raise EyasError(f"{where}: a turn is not an object: {str(t)[:80]}", f"use {SHAPES}")
                out.append((t.get("role", t.get("from")), t.get("content", t.get("value"))))
            return out
    data = record.get("data")
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        return [("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(data)]
    if isinstance(record.get("prompt"), str):
        return [("user", record["prompt"])]
    if "prompt" in record:
        raise EyasError(f"{where}: 'prompt' is {type(record['prompt']).__name__}, not a string",
                        "give each prompt as a string, one record a prompt")
    raise EyasError(f"{where}: a record in none of the known shapes: keys {sorted(record)[:6]}", f"use {SHAPES}")


def normalize(record: dict, where: str = "a record") -> list[dict]:
    """Any of the shapes above -> ``[{"role": user|assistant|system, "content": str}]``; ``where``
    (``file:line``) names the record in errors."""
    if not isinstance(record, dict):
        raise EyasError(f"{where} is {type(record).__name__}, not a JSON object", f"use {SHAPES}")
    out = []
    for i, (role, content) in enumerate(_turns(record, where)):
        if role is None or content is None:
            missing = "role" if role is None else "content"
            call = " (a tool call?)" if role is not None and content is None else ""
            raise EyasError(f"{where}: turn {i} ({'role ' + repr(role) if role is not None else 'no role'}) has no "
                            f"{missing}{call}", "use {'role', 'content'} or {'from', 'value'} turns of text; drop "
                            "records of tool calls (an EAGLE-3 draft's data is text turns)")
        mapped = ROLES.get(str(role).lower())
        if mapped is None and str(role).lower() in TOOL_ROLES:
            raise EyasError(f"{where}: turn {i} is a {role!r} turn (a tool call's result), which eyas does not train "
                            "on", "drop records with tool turns, e.g. jq -c 'select(all(.messages[]; .role != "
                            "\"tool\"))' IN > OUT")
        if mapped is None:
            raise EyasError(f"{where}: unknown role {role!r}", f"use one of {sorted(ROLES)}")
        out.append({"role": mapped, "content": text_of(content, where)})
    return out
