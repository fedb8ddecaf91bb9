"""Logprobs in the shapes clients read: OpenAI chat's and completions', and SGLang's ``meta_info``.

The engine gives each emitted token's log-probability and its top N ``(id, logprob)``
(``sample/logprobs.py``). The receiver (``stream.py``) turns them into ``Entry``s, each token's text
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
  token (SGLang's shape; the text with ``return_text_in_logprobs``); with ``logprob_start_len`` >= 0,
  ``input_token_logprobs`` and ``input_top_logprobs`` the same for the prompt from that position.

The prompt's logprobs (the engine's ``Sequence.prompt_logprobs``, of the raw model) become ``Entry``s too
(``prompt_entries``), the first token's logprob None: completions' ``echo`` puts them before the output's, and
``prompt_logprobs`` (vLLM's field) returns them in vLLM's shape (``vllm_prompt``): per prompt token null (the
first) or ``{token_id: {logprob, rank, decoded_token}}`` of the token and the top N.

What a request asks for (``chat_logprobs``, ``completion_logprobs``, ``generate_logprobs``, ``alternatives``)
is checked here too: at most ``MAX_LOGPROBS`` alternatives a token.

JSON has no infinity: a token filtered out by top-k, top-p or min-p (log-probability -inf) is sent as
-9999.0, as vLLM does. ``bytes`` is the token's own bytes (xgrammar's decoded vocabulary: a byte-level or
byte-fallback token that holds part of a character has that part, so a client can join them into the
character, as OpenAI's do); without xgrammar, the UTF-8 of the token's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sample.grammar import token_bytes
from ..sample.sampling import MAX_LOGPROBS
from .api_errors import bad_request
from .protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

FLOOR = -9999.0  # what -inf is sent as (vLLM's)


@dataclass
class Entry:
    """One token's logprobs, with texts: its id, text and logprob (None: a prompt's first token, which nothing
    predicts), the top ``(id, text, logprob)`` and its rank in its distribution."""

    token_id: int
    text: str
    logprob: float | None
    top: list[tuple[int, str, float]]
    rank: int | None = None
    raw: bytes | None = None  # the token's own bytes (``TokenTexts.raw``), None: its text's UTF-8
    top_raw: list[bytes | None] | None = None  # the same for ``top``


class TokenTexts:
    """Token id -> its text decoded alone (special tokens shown), cached; used on one event loop only."""

    def __init__(self, tokenizer):
        self.tokenizer, self._cache = tokenizer, {}
        self._raw: list[bytes] | None = None  # ``token_bytes``, built on first use

    def raw(self, token_id: int) -> bytes | None:
        """The token's own bytes, None where they are not known (no xgrammar, a token past its vocabulary)."""
        if self._raw is None:
            self._raw = token_bytes(self.tokenizer)
        return self._raw[token_id] if token_id < len(self._raw) else None

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text


def entries(texts: TokenTexts, tokens: list[int], raw: list) -> list[Entry]:
    """``Entry``s of ``tokens`` from the engine's ``TokenLogprob``s ``raw`` (one per token)."""
    return [Entry(t, texts(t), r.logprob, [(i, texts(i), v) for i, v in r.top], r.rank, texts.raw(t),
                  [texts.raw(i) for i, _ in r.top]) for t, r in zip(tokens, raw)]


def prompt_entries(texts: TokenTexts, seq) -> list[Entry] | None:
    """The ``Entry``s of a sequence's prompt tokens (None where it did not ask for them); read on the event
    loop once the row has posted anything, after its prefill wrote them."""
    raw = seq.prompt_logprobs
    if raw is None:
        return None
    first, rest = seq.prompt_ids[:1], seq.prompt_ids[1:len(raw)]
    return [Entry(t, texts(t), None, [], raw=texts.raw(t)) for t in first] + entries(texts, rest, raw[1:])


def _value(logprob: float) -> float:
    return max(FLOOR, logprob)  # -inf as FLOOR


def _chat_token(text: str, logprob: float, raw: bytes | None) -> dict:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8") if raw is None else raw)}


def chat(items: list[Entry] | None) -> dict | None:
    """OpenAI chat's ``choices[i].logprobs``; None without entries (not asked, or none in this chunk)."""
    if not items:
        return None
    return {"content": [{**_chat_token(e.text, e.logprob, e.raw), "top_logprobs": [
        _chat_token(t, v, r) for (_, t, v), r in zip(e.top, e.top_raw or [None] * len(e.top))]} for e in items]}


def completion(items: list[Entry] | None, offset: int = 0) -> tuple[dict | None, int]:
    """(OpenAI completions' ``choices[i].logprobs`` or None without entries, the text offset after them):
    ``offset`` is where the first entry's text starts (a stream carries it from chunk to chunk)."""
    if not items:
        return None, offset
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in items:
        out["tokens"].append(e.text)
        if e.logprob is None:  # an echoed prompt's first token: nothing predicts it (OpenAI's and vLLM's null)
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            out["token_logprobs"].append(_value(e.logprob))
            top: dict[str, float] = {}
            for _, t, v in [*e.top, (e.token_id, e.text, e.logprob)]:
                top.setdefault(t, _value(v))  # two tokens of one text: the more likely one's
            out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(e.text)
    return out, offset


def vllm_prompt(items: list[Entry]) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or ``{token_id: {logprob, rank,
    decoded_token}}``, the token's own entry first, then the top N (the token among them: one entry)."""
    out: list[dict | None] = []
    for e in items:
        if e.logprob is None:
            out.append(None)
            continue
        d = {str(e.token_id): {"logprob": _value(e.logprob), "rank": e.rank, "decoded_token": e.text}}
        for rank, (i, t, v) in enumerate(e.top, 1):
            d[str(i)] = {"logprob": _value(v), "rank": rank, "decoded_token": t}
        out.append(d)
    return out


def generate(items: list[Entry], top_n: int, with_text: bool, prompt: list[Entry] | None = None) -> dict:
    """SGLang's logprob fields of ``meta_info``: ``output_top_logprobs`` when ``top_n`` > 0; ``prompt``: the
    prompt's entries from ``logprob_start_len`` on (the first token's logprob null), else none."""
    def one(logprob, token_id, text):
        return [None if logprob is None else _value(logprob), token_id, text if with_text else None]

    prompt = prompt or []
    meta = {"input_token_logprobs": [one(e.logprob, e.token_id, e.text) for e in prompt],
            "output_token_logprobs": [one(e.logprob, e.token_id, e.text) for e in items]}
    if top_n:
        meta["input_top_logprobs"] = [None if e.logprob is None else [one(v, i, t) for i, t, v in e.top]
                                      for e in prompt]
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


def completion_logprobs(req: CompletionRequest) -> tuple[int | None, int | None]:
    """Completions' ``logprobs`` (n), ``echo`` and vLLM's ``prompt_logprobs`` (n) -> (SamplingParams.logprobs,
    .prompt_logprobs): ``echo`` with ``logprobs`` asks for the prompt's too, the same n (as vLLM)."""
    logprobs = None if req.logprobs is None else alternatives("logprobs", req.logprobs)
    if req.prompt_logprobs is None:
        return logprobs, logprobs if req.echo else None
    if req.stream:  # a chunk has no field for them (vLLM refuses them too)
        raise bad_request("prompt_logprobs are not available with stream=true (a streamed chunk has no field for "
                          "them); send stream=false, or echo=true with logprobs for the prompt's in the stream",
                          param="prompt_logprobs")
    return logprobs, alternatives("prompt_logprobs", req.prompt_logprobs)


def generate_logprobs(req: GenerateRequest, prompts: list[list[int]]) -> tuple[int | None, int | None]:
    """SGLang's ``return_logprob``, ``top_logprobs_num`` and ``logprob_start_len`` -> (SamplingParams.logprobs,
    .prompt_logprobs): the prompt's when ``logprob_start_len`` >= 0 (-1, or none: the output's alone), a position
    inside every one of ``prompts`` (as SGLang, which aborts one at or past the prompt's end)."""
    if not req.return_logprob:
        if req.top_logprobs_num:
            raise bad_request("top_logprobs_num needs return_logprob: true; send both, or leave top_logprobs_num out",
                              param="top_logprobs_num", code="invalid_value")
        return None, None
    start = -1 if req.logprob_start_len is None else req.logprob_start_len
    if start < -1:
        raise bad_request(f"logprob_start_len must be -1 (the output's logprobs alone) or a prompt position >= 0, got "
                          f"{start}", param="logprob_start_len", code="invalid_value")
    size, which = min((len(p), i) for i, p in enumerate(prompts))  # a batch is never empty (text_prompts)
    if start >= size:  # else a 200 whose input_token_logprobs is silently empty
        batch = len(prompts) > 1
        raise bad_request(f"logprob_start_len={start} is past the end of {f'prompt {which}' if batch else 'the prompt'}"
                          f", which has {size} tokens; send a position from 0 to {size - 1}"
                          f"{' (it applies to every prompt of the batch)' if batch else ''}, or -1 for the output's "
                          "logprobs alone", param="logprob_start_len", code="invalid_value")
    n = alternatives("top_logprobs_num", req.top_logprobs_num or 0)
    return n, n if start >= 0 else None
