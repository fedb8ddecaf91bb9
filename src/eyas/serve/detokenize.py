"""Incremental detokenizing with stop strings, one instance per sequence, run on the event loop.

A Hugging Face fast tokenizer's text comes from its ``tokenizers`` backend's own incremental decoder
(``tokenizers.decoders.DecodeStream``: one call a token, about 4x cheaper than two decodes, on the event
loop where every stream's tokens are turned into text). Any other tokenizer's comes from the usual
two-offset trick: decode ``ids[prefix:read]`` and ``ids[prefix:]`` and emit the difference. Either way a
token is only turned into text once the characters it completes are whole (a byte-level token may hold
half of a UTF-8 character, which decodes to U+FFFD until the rest arrives) and a leading-space token
decodes the same as it does in context; at the end, what is still held decodes as it is.

Stop strings are matched on the text (once the output has ``min_tokens``: vLLM's rule, a match ending
earlier is not one). The output stops *before* the stop string (OpenAI's rule), or
after it with ``keep_stop`` (vLLM's ``include_stop_str_in_output``, SGLang's ``no_stop_trim``), and
the tokens kept are those up to and including the one that completed the match. While streaming, a
tail of text that could be the start of a stop string is held back until it can't.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers.decoders import DecodeStream


@dataclass
class Pushed:
    text: str  # newly released text
    tokens: list[int]  # tokens of this push that are kept (a stop string may cut the push short)
    matched: str | None = None  # the stop string that ended the output, if any


# Hugging Face's own decode wrappers (transformers 5 and 4): a class that keeps them decodes by its backend alone
STOCK_DECODE = {"PreTrainedTokenizerBase.decode"}
STOCK_BACKEND_DECODE = {"TokenizersBackend._decode", "PreTrainedTokenizerFast._decode"}


def stock_backend(tokenizer):
    """The ``tokenizers`` backend of a Hugging Face fast tokenizer whose class keeps Hugging Face's own decode
    wrappers (it then decodes by its backend alone); None for any other (a class that overrides them decodes its
    own way, and keeps it)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    kind = type(tokenizer)
    stock = (getattr(getattr(kind, "decode", None), "__qualname__", None) in STOCK_DECODE
             and getattr(getattr(kind, "_decode", None), "__qualname__", None) in STOCK_BACKEND_DECODE)
    return backend if stock and backend is not None and callable(getattr(backend, "decode", None)) else None


def backend_decode(tokenizer, skip_special_tokens: bool):
    """``ids -> text`` as ``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``
    gives it. A Hugging Face fast tokenizer's is its ``tokenizers`` backend's ``decode`` behind a generic
    argument conversion (``to_py_obj``), which cost as much as the decode itself: that backend is called
    directly where the tokenizer's class keeps Hugging Face's own wrappers (``stock_backend``)."""
    backend = stock_backend(tokenizer)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        clean_up_tokenization_spaces=False)


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, skip_special_tokens: bool = True,
                 keep_stop: bool = False, min_tokens: int = 0):
        self.tokenizer, self.keep_stop = tokenizer, keep_stop
        self.min_tokens = min_tokens  # no stop string ends an output of fewer tokens (vLLM's min_tokens)
        self._decode = backend_decode(tokenizer, skip_special_tokens)
        self.stop = [s for s in (stop or []) if s]
        self.skip_special = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # all text decoded so far (up to the stop string, or through it with keep_stop)
        self.sent = 0  # characters of self.text already released
        self.prefix = 0  # ids before this one are text (the stream's: up to its last chunk)
        self.read = 0  # ids before this one were decoded
        self.matched: str | None = None
        backend = stock_backend(tokenizer)
        self._stream = None if backend is None else (DecodeStream(skip_special_tokens=skip_special_tokens), backend)

    def _advance(self, final: bool = False) -> None:
        """Move decoded text from self.ids into self.text."""
        if self._stream is not None:
            stream, backend = self._stream
            for i in range(self.read, len(self.ids)):
                chunk = stream.step(backend, self.ids[i])
                if chunk is not None:
                    self.text += chunk
                    self.prefix = i + 1
            self.read = len(self.ids)
            if final and self.prefix < len(self.ids):  # held bytes of an unfinished character, decoded as they are
                context = max(0, self.prefix - 4)  # a few tokens before, so a leading space decodes as in context
                before, after = self._decode(self.ids[context:self.prefix]), self._decode(self.ids[context:])
                self.text += after[len(before):]
                self.prefix = len(self.ids)
            return
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)

    def push(self, tokens: list[int]) -> Pushed:
        """Add tokens the engine emitted; return the text now safe to release."""
        if self.matched is not None:
            return Pushed("", [])
        if not self.stop:
            self.ids.extend(tokens)
            self._advance()
            return Pushed(self._release(hold=0), list(tokens))
        kept = []
        for t in tokens:  # one at a time, so a match says which token completed it
            kept.append(t)
            self.ids.append(t)
            start = max(0, len(self.text) - max(map(len, self.stop)) + 1)
            self._advance()
            hit = self._find_stop(start) if len(self.ids) >= self.min_tokens else None
            if hit is not None:
                self._cut(*hit)
                return Pushed(self._release(hold=0), kept, hit[1])
        return Pushed(self._release(hold=self._partial_stop_tail()), kept)

    def flush(self) -> str:
        """The rest of the text when the sequence ends (an unfinished character included).

        A stop string completed only by that last character still cuts the text (``matched`` is
        set); the tokens are all kept then, since the last one completed it.
        """
        held = self.prefix if self._stream is not None else self.read  # ids before it are text already
        if self.matched is None and held < len(self.ids):
            start = max(0, len(self.text) - max(map(len, self.stop), default=1) + 1)
            self._advance(final=True)
            hit = self._find_stop(start) if self.stop and len(self.ids) >= self.min_tokens else None
            if hit is not None:
                self._cut(*hit)
        return self._release(hold=0)

    def _cut(self, index: int, stop: str) -> None:
        """End the text at the stop string found at ``index``: before it, or after it with ``keep_stop``."""
        self.text, self.matched = self.text[:index + (len(stop) if self.keep_stop else 0)], stop

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        best = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def _partial_stop_tail(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _release(self, hold: int) -> str:
        end = max(self.sent, len(self.text) - hold)
        out = self.text[self.sent:end]
        self.sent = end
        return out
