"""A request body's bytes -> a JSON object every later step can use safely, or a 400 naming the field.

Python's ``json`` accepts more than a request should carry, and each excess used to surface later as
a 500: nesting deep enough to exhaust the recursion limit, integers of any size (a ``seed`` past 64
bits overflows the generator), ``NaN`` / ``Infinity`` (not JSON, but Python reads them) and numbers
such as ``1e999`` that read as infinity, and strings holding a lone UTF-16 surrogate (``"\\ud800"``),
which are valid JSON but no valid text: they break the tokenizer, the UTF-8 response and the log.
``load_object`` refuses all of them here, before anything reads the body.
"""

from __future__ import annotations

import json
import math
import re

from .api_errors import bad_request

MAX_DEPTH = 64  # nesting of objects and arrays; chat requests and tool schemas use a handful
INT64 = (-(2**63), 2**63 - 1)
_SURROGATE = re.compile("[\ud800-\udfff]")


def load_object(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = " (it starts as gzip data does: say so with 'Content-Encoding: gzip')" if raw[:2] == b"\x1f\x8b" else ""
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r}){hint}; "
                          "send UTF-8 encoded JSON", code="invalid_encoding") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"{e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno}"  # "... starting at" ends some
        raise bad_request(f"the request body is not valid JSON: {where}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep(None) from None
    except ValueError as e:  # an integer literal past Python's digit limit
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    check_values(data)
    return data


def check_values(data) -> None:
    """Walk the decoded body (iteratively: no recursion to exhaust) and refuse the first bad value.

    Only containers go on the stack, so a prompt of a million token ids costs no tuple per id."""
    stack = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) >= MAX_DEPTH:
            raise _too_deep(path)
        if (isinstance(value, list) and value and set(map(type, value)) <= {int, bool}  # token ids: C speed
                and INT64[0] <= min(value) and max(value) <= INT64[1]):
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(k, str):
                _check_str(k, path, "a key")
            if isinstance(v, (dict, list)):
                stack.append((v, (*path, k)))
            elif isinstance(v, str):
                _check_str(v, (*path, k), "a string")
            elif isinstance(v, float):
                if not math.isfinite(v):
                    raise bad_request(f"{_name((*path, k))} is {v!r}, not a finite number (NaN, Infinity and "
                                      "numbers past 1.8e308 are not accepted); send a finite number",
                                      param=_param((*path, k)), code="invalid_value")
            elif isinstance(v, int) and not INT64[0] <= v <= INT64[1]:  # bool is an int within range
                shown = str(v) if v.bit_length() < 200 else f"an integer of {v.bit_length()} bits"
                raise bad_request(f"{_name((*path, k))} is {shown}, outside the signed 64-bit range "
                                  f"[{INT64[0]}, {INT64[1]}]; send a smaller integer", param=_param((*path, k)),
                                  code="invalid_value")


def _check_str(s: str, path: tuple, what: str) -> None:
    m = _SURROGATE.search(s)
    if m is not None:
        raise bad_request(f"{_name(path)} holds {what} with a lone UTF-16 surrogate (\\u{ord(m.group()):04x} at "
                          f"character {m.start()}), which is not text; send valid Unicode (a surrogate pair "
                          "encodes one character, half of one encodes none)", param=_param(path),
                          code="invalid_encoding")


def _too_deep(path: tuple | None):
    where = "" if not path else f" at {_param(path)!r}"
    return bad_request(f"the request body is nested deeper than {MAX_DEPTH} levels of objects and arrays{where}; "
                       "flatten it", param=None if not path else _param(path), code="invalid_json")


def _param(path: tuple) -> str | None:
    name = ".".join(map(str, path))
    return (name if len(name) <= 100 else name[:97] + "...") or None


def _name(path: tuple) -> str:
    return f"{_param(path)!r}" if path else "the request body"
