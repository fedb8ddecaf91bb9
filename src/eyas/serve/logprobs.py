"""Logprobs in the shapes clients read: OpenAI chat's and completions', and SGLang's ``meta_info``.

The engine gives each emitted token's log-probability and its top N ``(id, logprob)``
(``engine/logprobs.py``). The receiver (``stream.py``) turns them into ``Entry``s, each token's text
decoded alone with special tokens shown (``TokenTexts``, cached per event loop), and the routes shape
those, streamed or not (a chunk carries the entries of the tokens in its delta):

- chat (``logprobs: true``, ``top_logprobs: n``): ``{"content": [{token, logprob, bytes, top_logprobs:
  [{token, logprob, bytes}]}]}``, the top n most likely first (vLLM's and OpenAI's shape);
- completions (``logprobs: n``): ``{tokens, token_logprobs, top_logprobs, text_offset}``, each
  ``top_logprobs`` entry a ``{text: logprob}`` of the top n and the chosen token (so up to n + 1, as
  OpenAI documents; tokens of the same text share a key, the more likely one's value), ``text_offset``
  each token's offset in the output, counted by the token texts;
- ``/generate`` (``return_logprob``, ``top_logprobs_num``): ``output_token_logprobs`` as
  ``[logprob, token_id, text or null]`` per token and ``output_top_logprobs`` a list of those per
  token (SGLang's shape; the text with ``return_text_in_logprobs``). Prompt logprobs are not
  computed: ``input_token_logprobs`` is empty.

What a request asks for (``chat_logprobs``, ``generate_logprobs``, ``alternatives``) is checked here too:
at most ``MAX_LOGPROBS`` alternatives a token, the output's logprobs alone.

JSON has no infinity: a token filtered out by top-k, top-p or min-p (log-probability -inf) is sent as
-9999.0, as vLLM does. ``bytes`` is the UTF-8 of the token's text, so a token that holds part of a
character has the bytes of U+FFFD there.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.sampling import MAX_LOGPROBS
from .api_errors import bad_request
from .protocol import ChatCompletionRequest, GenerateRequest

FLOOR = -9999.0  # what -inf is sent as (vLLM's)


@dataclass
class Entry:
    """One emitted token's logprobs, with texts: its id, text and logprob, and the top ``(id, text, logprob)``."""

    token_id: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]


class TokenTexts:
    """Token id -> its text decoded alone (special tokens shown), cached; used on one event loop only."""

    def __init__(self, tokenizer):
        self.tokenizer, self._cache = tokenizer, {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text


def entries(texts: TokenTexts, tokens: list[int], raw: list) -> list[Entry]:
    """``Entry``s of ``tokens`` from the engine's ``TokenLogprob``s ``raw`` (one per token)."""
    return [Entry(t, texts(t), r.logprob, [(i, texts(i), v) for i, v in r.top]) for t, r in zip(tokens, raw)]


def _value(logprob: float) -> float:
    return max(FLOOR, logprob)  # -inf as FLOOR


def _chat_token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8"))}


def chat(items: list[Entry] | None) -> dict | None:
    """OpenAI chat's ``choices[i].logprobs``; None without entries (not asked, or none in this chunk)."""
    if not items:
        return None
    return {"content": [{**_chat_token(e.text, e.logprob), "top_logprobs": [_chat_token(t, v) for _, t, v in e.top]}
                        for e in items]}


def completion(items: list[Entry] | None, offset: int = 0) -> tuple[dict | None, int]:
    """(OpenAI completions' ``choices[i].logprobs`` or None without entries, the text offset after them):
    ``offset`` is where the first entry's text starts (a stream carries it from chunk to chunk)."""
    if not items:
        return None, offset
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in items:
        out["tokens"].append(e.text)
        out["token_logprobs"].append(_value(e.logprob))
        top: dict[str, float] = {}
        for _, t, v in [*e.top, (e.token_id, e.text, e.logprob)]:
            top.setdefault(t, _value(v))  # two tokens of one text: the more likely one's
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(e.text)
    return out, offset


def generate(items: list[Entry], top_n: int, with_text: bool) -> dict:
    """SGLang's logprob fields of ``meta_info``: ``output_top_logprobs`` when ``top_n`` > 0."""
    def one(logprob, token_id, text):
        return [_value(logprob), token_id, text if with_text else None]

    meta = {"input_token_logprobs": [], "output_token_logprobs": [one(e.logprob, e.token_id, e.text) for e in items]}
    if top_n:
        meta["input_top_logprobs"] = []
        meta["output_top_logprobs"] = [[one(v, i, t) for i, t, v in e.top] for e in items]
    return meta


# -- what a request asks for ----------------------------------------------------------------------
def alternatives(param: str, n: int) -> int:
    """How many alternatives per token a logprobs field asks for, within [0, MAX_LOGPROBS]."""
    if not 0 <= n <= MAX_LOGPROBS:
        raise bad_request(f"{param} must be in [0, {MAX_LOGPROBS}] (the most alternatives per token eyas returns, "
                          f"vLLM's cap), got {n}; ask for at most {MAX_LOGPROBS}", param=param, code="invalid_value")
    return n


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """OpenAI chat's ``logprobs`` (bool) and ``top_logprobs`` (n) -> SamplingParams.logprobs."""
    if not req.logprobs:
        if req.top_logprobs:
            raise bad_request("top_logprobs needs logprobs: true (OpenAI's rule); send both, or leave top_logprobs "
                              "out", param="top_logprobs", code="invalid_value")
        return None
    return alternatives("top_logprobs", req.top_logprobs or 0)


def generate_logprobs(req: GenerateRequest) -> int | None:
    """SGLang's ``return_logprob`` and ``top_logprobs_num`` -> SamplingParams.logprobs (output tokens only)."""
    if not req.return_logprob:
        if req.top_logprobs_num:
            raise bad_request("top_logprobs_num needs return_logprob: true; send both, or leave top_logprobs_num out",
                              param="top_logprobs_num", code="invalid_value")
        return None
    if req.logprob_start_len not in (None, -1):
        raise bad_request(f"logprob_start_len={req.logprob_start_len} asks for the prompt's logprobs, which eyas does "
                          "not compute (only the output's); leave it out or send -1", param="logprob_start_len")
    return alternatives("top_logprobs_num", req.top_logprobs_num or 0)
