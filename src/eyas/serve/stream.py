"""The hand-over from the engine thread to the event loop, and the text side of every request.

The engine thread only steps and hands token ids over: per turn it posts one list of
``(work, payload)`` pairs (``list[int]`` tokens, ``Ended`` or ``Failed``) to the loop's ``Outbox``,
which costs at most one ``loop.call_soon_threadsafe`` however many rows stepped, and none while a
drain is already pending (a busy loop takes several steps in one go).

On the event loop, ``Outbox.drain`` hands each pair to its request's ``Receiver``, which does the
per-token work: incremental detokenization, stop strings, the first-token time, the token count,
and the request's end (``Finished``: its reason, the stop that matched, its kept ids and text).
Events go straight onto the handler's ``asyncio.Queue``, no thread hop left.

A stop string is found here, after the engine emitted the token that completed it. The receiver
then keeps no more tokens and sets ``work.stopped``; the engine thread reads it before its next
step and ends the row as "stop" (at most one step later), so a row never runs on past its stop
string, and what the client gets is exact: the text before the stop string and the tokens up to
and including the one that completed it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ..engine.stats import SpecStats
from .detokenize import Detokenizer
from .logprobs import Entry, TokenTexts, entries
from .metrics import ServeMetrics

log = logging.getLogger("eyas.serve")


# -- events sent to the waiting handler -----------------------------------------------------------
@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[Entry] | None = None  # with logprobs asked: those of token_ids


@dataclass
class Finished:
    reason: str  # "stop" | "length" | "abort"
    matched: str | int | None  # stop string or stop token id that ended the output
    output_ids: list[int]
    text: str  # whole output text (the deltas joined)
    prompt_tokens: int
    stats: SpecStats  # this request's acceptance (a copy)
    ttft: float | None
    e2e: float
    logprobs: list[Entry] | None = None  # with logprobs asked: one per output id


@dataclass
class Failed:
    message: str
    status: int = 500  # 503: this request alone did not fit (memory); the server carries on


@dataclass
class Ended:
    """Engine thread -> receiver: the row left the batch (``reason`` as the engine saw it)."""

    reason: str
    stats: SpecStats  # a copy, taken on the engine thread


def coalesce(events: list[tuple[int, object]]) -> list[tuple[int, object]]:
    """Consecutive deltas of one choice joined into one (a handler that fell behind sends one chunk)."""
    out: list[tuple[int, object]] = []
    for index, event in events:
        if out and isinstance(event, Delta) and out[-1][0] == index and isinstance(out[-1][1], Delta):
            last = out[-1][1]
            joined = None if last.logprobs is None else last.logprobs + (event.logprobs or [])
            out[-1] = (index, Delta(last.text + event.text, last.token_ids + event.token_ids, joined))
        else:
            out.append((index, event))
    return out


class Receiver:
    """One sequence's text side, on the event loop: tokens in, events onto the handler's queue."""

    def __init__(self, outbox: Outbox, queue, index: int, stop: list[str], skip_special_tokens: bool,
                 keep_stop: bool = False, stop_ids: frozenset[int] = frozenset(), min_tokens: int = 0):
        self.outbox, self.queue, self.index = outbox, queue, index
        self.detok = Detokenizer(outbox.tokenizer, stop, skip_special_tokens, keep_stop, min_tokens)
        # the ids that end the row (its stop_token_ids, EOS): counted, their text left out unless keep_stop (vLLM)
        self.stop_ids = frozenset() if keep_stop else stop_ids
        self.kept_ids: list[int] = []
        self.text = ""
        self.first_token_at: float | None = None
        self.closed = False  # its last event (Finished or Failed) is queued: later payloads are dropped
        self.received = 0  # tokens the engine emitted for this row so far (a stop string may keep fewer)
        self.kept_logprobs: list[Entry] | None = None  # with logprobs asked: those of kept_ids

    def tokens(self, work, tokens: list[int]) -> int:
        """The engine emitted ``tokens`` for this row; returns how many are kept."""
        if not tokens or self.detok.matched is not None:
            return 0
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        end = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
        pushed = self.detok.push(tokens if end is None else tokens[:end])
        if end is not None and pushed.matched is None:  # the row ends on this token: kept, not written
            pushed.tokens.append(tokens[end])
        if pushed.matched is not None:
            work.stopped = True  # the engine thread ends the row before its next step
        self.kept_ids += pushed.tokens
        logprobs = self._logprobs(work.seq, tokens, pushed.tokens)
        if pushed.text or pushed.tokens:
            self.text += pushed.text
            self.queue.put_nowait((self.index, Delta(pushed.text, pushed.tokens, logprobs)))
        return len(pushed.tokens)

    def _logprobs(self, seq, tokens: list[int], kept: list[int]) -> list[Entry] | None:
        """The entries of the ``kept`` tokens of ``tokens`` (None when the row did not ask). The engine
        thread appends a token's logprobs to ``seq.logprobs`` before it posts the token, so the entries
        of every token received so far are there."""
        if seq.logprobs is None:
            return None
        start, self.received = self.received, self.received + len(tokens)
        new = entries(self.outbox.texts, kept, seq.logprobs[start:start + len(kept)])
        if self.kept_logprobs is None:
            self.kept_logprobs = []
        self.kept_logprobs += new
        return new

    def failed(self, failed: Failed) -> None:
        self.closed = True
        self.queue.put_nowait((self.index, failed))

    def ended(self, work, ended: Ended) -> None:
        self.closed = True
        now = time.perf_counter()
        reason = ended.reason
        rest = self.detok.flush()
        if rest:
            self.text += rest
            self.queue.put_nowait((self.index, Delta(rest, [])))
        matched = self.detok.matched
        if matched is not None and reason in ("length", "abort"):
            reason = "stop"  # OpenAI reports "stop" whenever a stop matched
        elif matched is None and reason == "stop" and self.kept_ids:
            matched = self.kept_ids[-1]  # a stop token
        ttft = None if self.first_token_at is None else self.first_token_at - work.arrival
        e2e = now - work.arrival
        self.outbox.metrics.finished(work.outcome or reason, ttft, e2e, len(self.kept_ids))
        if self.outbox.log_requests:
            st, seq = ended.stats, work.seq
            spec = f", accept len {st.accept_length:.2f} ({st.accepted}/{st.drafts} steps)" if st.drafts else ""
            log.info("request %s: %s after %d prompt + %d output tokens in %.2f s (first token %s)%s",
                     seq.rid, reason, len(seq.prompt_ids), len(self.kept_ids), e2e,
                     "-" if ttft is None else f"{ttft:.3f} s", spec)
        self.queue.put_nowait((self.index, Finished(reason, matched, list(self.kept_ids), self.text,
                                                    len(work.seq.prompt_ids), ended.stats, ttft, e2e,
                                                    self.kept_logprobs)))


class Outbox:
    """One per event loop: takes what the engine thread posts, and feeds it to the receivers there.

    ``tokenizer`` is a copy only this loop decodes with (Hugging Face fast tokenizers are not safe to
    use from two threads at once)."""

    def __init__(self, loop, tokenizer, metrics: ServeMetrics, log_requests: bool = False):
        self.loop, self.tokenizer, self.metrics, self.log_requests = loop, tokenizer, metrics, log_requests
        self.texts = TokenTexts(tokenizer)  # token texts for logprobs
        self._lock = threading.Lock()
        self._items: list[tuple[object, object]] = []
        self._scheduled = False

    def post(self, items: list[tuple[object, object]]) -> None:
        """Any thread: queue ``(work, payload)`` pairs; wake the loop unless a drain is pending already."""
        with self._lock:
            self._items += items
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def drain(self) -> None:
        """On the loop: everything posted so far, in order."""
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        kept = 0
        for work, payload in items:
            receiver = work.receiver
            if receiver.closed:
                continue
            try:
                if isinstance(payload, list):
                    kept += receiver.tokens(work, payload)
                elif isinstance(payload, Ended):
                    receiver.ended(work, payload)
                else:
                    receiver.failed(payload)
            except Exception as e:  # one request's text failing must not touch the others
                log.exception("request %s failed while detokenizing", work.seq.rid)
                work.cancel()  # the engine drops the row before its next step
                self.metrics.requests.labels(outcome="error").inc()
                receiver.failed(Failed(f"internal error while detokenizing: {type(e).__name__}: {e}"))
        if kept:
            self.metrics.generation_tokens.inc(kept)
