"""The engine thread: continuous batching, admission control and cancellation.

The engine is synchronous torch code, only ever called from this thread. Each turn:

    admit     move waiting requests into free slots (at most --max-running-requests rows, and
              --max-prefill-tokens prompt tokens a turn), prefill them as their own batch, emit their first
              tokens, merge them into the running batch; a prompt over --chunked-prefill-size is prefilled a
              chunk a turn and joins after its last chunk (the running rows step between chunks)
    retire    drop rows that finished (stop, length, a stop string, or cancelled by the client)
    step      one speculative verify step for every running row; emit what each row produced

With ``overlap`` (``--overlap-schedule``) the next step is launched before this one's tokens are read back
(``Engine.launch(ahead=True)``), so the host's share of a turn runs while the device computes. A membership
change (a row ended, a prompt to admit or a chunk to prefill) first collects the step in flight, so changes
wait, within bounds, to come several at once (``membership.py``).

Requests come in through ``submit`` (``Overloaded`` past capacity: HTTP 503); token ids go to the event loop,
one post a turn (``stream.Outbox``), where detokenizing and stop strings happen. One request never fails another:
a row the engine ends for its own fault (``Sequence.error``) fails alone; when a step raises, the rows that
joined this turn fail and the step is retried once without them (a second failure fails the batch).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import deque

import torch

from ..engine.batch import in_place
from ..engine.prefill import Prefilling
from ..engine.stats import SpecStats
from .membership import Membership
from .metrics import DecodeLog, ServeMetrics
from .stream import Delta, Ended, Failed, Finished, Outbox
from .work import Overloaded, Work

__all__ = ["Delta", "Failed", "Finished", "Overloaded", "Scheduler", "Work"]
log = logging.getLogger("eyas.serve")


class Scheduler:
    def __init__(self, engine, metrics: ServeMetrics, max_running: int = 32, max_queued: int = 256,
                 log_interval: float = 10.0, max_prefill_tokens: int = 16384, log_requests: bool = False,
                 chunked_prefill_size: int | None = None, overlap: bool = False, membership_wait_steps: int = 8):
        self.engine, self.overlap = engine, overlap
        self.membership = Membership(membership_wait_steps if overlap else 0, getattr(engine, "context_limit", 1 << 62),
                                     getattr(engine, "tree_size", 0) + 1)
        self._ahead = None  # the step launched and not yet collected (``Engine.launch``)
        self._collected = 0.0  # when the last step's tokens were collected
        self.chunk = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else None
        # prompt tokens one turn prefills (the first prompt always goes): a chunk's worth when chunking, as SGLang
        self.prefill_budget = min(max_prefill_tokens, self.chunk or max_prefill_tokens)
        self.metrics, self.log_requests = metrics, log_requests
        self._decode_log = DecodeLog(metrics, log_interval)  # "decode: running N, queued M, ..." while busy
        self._spend = metrics.thread.spend  # spend("prefill" | "step", run): run() timed as that activity
        self.max_running, self.max_queued = max_running, max_queued
        self._outboxes: dict[object, Outbox] = {}  # event loop -> its outbox
        self._out: list[tuple[Work, object]] = []  # this turn's payloads (engine thread only)
        self._cond = threading.Condition()
        self._waiting: deque[Work] = deque()
        self._running: list[Work] = []  # rows of self._batch, same order
        self._partial: deque[tuple[Work, Prefilling]] = deque()  # long prompts being prefilled a chunk a turn
        self._batch = None
        self._stopping = self._stopping_admissions = False
        self._inflight = 0  # submitted and not yet finished
        self._thread: threading.Thread | None = None
        self.steps = 0

    # -- called from the event loop ------------------------------------------------------------
    def start(self) -> None:
        try:  # the loop's outbox (and its tokenizer copy) made now rather than on the first request
            self.outbox(asyncio.get_running_loop())
        except RuntimeError:  # started outside an event loop: made on first use
            pass
        self._thread = threading.Thread(target=self._loop, name="eyas-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def outbox(self, loop) -> Outbox:
        """The outbox of ``loop`` (made on first use), where this scheduler hands results to that loop.
        It decodes with a tokenizer copy of its own: Hugging Face fast tokenizers are not safe to use
        from two threads at once, and prompts are tokenized on the preparer's thread."""
        with self._cond:
            box = self._outboxes.get(loop)
            if box is None:
                try:
                    tok = copy.deepcopy(self.engine.target.tokenizer)
                except Exception:  # noqa: BLE001 - an uncopyable tokenizer: share it (decode only there)
                    tok = self.engine.target.tokenizer
                box = self._outboxes[loop] = Outbox(loop, tok, self.metrics, self.log_requests)
            return box

    def submit(self, works: list[Work]) -> None:
        """Queue all of ``works`` or none: raises ``Overloaded`` past running + queue capacity."""
        with self._cond:
            # _inflight also counts those between the queue and the batch (prefilling): the error says that count
            stopping = self._stopping or self._stopping_admissions
            if stopping or self._inflight + len(works) > self.max_running + self.max_queued:
                raise Overloaded(self._inflight, len(works), self.max_running, self.max_queued, stopping)
            self._inflight += len(works)
            for w in works:
                w.on_cancel, w.waited_from = self._withdraw, self.steps
            self._waiting.extend(works)
            self.metrics.queued.set(len(self._waiting))
            self._cond.notify()

    def _withdraw(self, w: Work) -> None:
        """``w.cancel()``: a queued request leaves the queue and ends ("abort") now, its slot free for the next
        ``submit``; one already taken for admission or running is left to the engine thread."""
        with self._cond:
            try:
                self._waiting.remove(w)
            except ValueError:
                return
            self.metrics.queued.set(len(self._waiting))
            self._inflight -= 1
        w.done = True
        w.receiver.outbox.post([(w, Ended("abort", SpecStats()))])

    def counts(self) -> tuple[int, int]:  # (running, queued): a prompt being prefilled in chunks runs
        with self._cond:
            return sum(not w.done for w in self._running) + len(self._partial), len(self._waiting)

    def abort_all(self) -> int:
        """Cancel every queued and running request (shutdown past its grace period); refuse new ones."""
        with self._cond:
            self._stopping_admissions = True
            works = list(self._waiting) + list(self._running) + [w for w, _ in self._partial]
            for w in works:
                w.cancel()
            self._cond.notify()
        if works:
            log.info("cancelled %d in-flight requests", len(works))
        return len(works)

    def stop(self, timeout: float = 30.0) -> None:
        """Abort whatever is still queued or running and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        thread = self.metrics.thread  # where the thread's time goes (``engine_thread_seconds_total``)
        while True:
            thread.begin()
            with self._cond:
                while not (self._waiting or self._running or self._partial or self._stopping):
                    thread.idle(time.perf_counter())
                    self._cond.wait()
                    thread.idle(None)
                if self._stopping:
                    for w in list(self._waiting) + self._running + [w for w, _ in self._partial]:
                        w.cancel()
                admit, tokens, change = [], 0, self._due()  # a change waits for company (membership.py)
                leaving = sum(self.membership.ended(w) for w in self._running) if change else 0  # before joining
                room = self.max_running - len(self._running) - len(self._partial) + leaving
                while change and self._waiting and len(admit) < room:
                    n = min(len(self._waiting[0].seq.prompt_ids), self.chunk or 1 << 62)
                    if admit and tokens + n > self.prefill_budget:
                        break  # the rest joins next turn: one wave of prompts must not stall decoding
                    admit.append(self._waiting.popleft())
                    tokens += n
                self.metrics.queued.set(len(self._waiting))
                if self._stopping and not (self._waiting or self._running or self._partial or admit):
                    return
            try:
                self._turn(admit, change)
            except Exception as e:
                log.exception("engine step failed; failing %d running requests", len(self._running) + len(admit))
                self._fail_all(admit, f"internal engine error: {type(e).__name__}: {e}")
            self._flush()
            self.metrics.kv_usage.set(self.engine.kv_usage(self._batch))  # per turn: 0 once the batch is empty
            thread.end()

    def _turn(self, admit: list[Work], change: bool = True) -> None:
        if self._ahead is not None and (admit or self._partial):
            self._drain()  # the batch grows (and shrinks: _retire) only as its last step left it
        self._retire(change)  # rows that ended leave first: the admitted ones take their slots
        live = [w for w in admit if not w.cancelled]
        for w in admit:
            if w.cancelled:
                self._finish(w, "abort")
        if self.chunk:  # long prompts wait their turn for chunks; the rest are prefilled whole, now
            long = [w for w in live if len(w.seq.prompt_ids) > self.chunk]
            with self._cond:
                self._partial.extend((w, Prefilling(w.seq)) for w in long)
            live = [w for w in live if len(w.seq.prompt_ids) <= self.chunk]
        for group in self.engine.prefill_groups([w.seq for w in live]):
            self._prefill([live[i] for i in group])
        joined = live + self._prefill_chunk()
        self._flush()  # first tokens out before the step
        if joined:
            self._retire(change)  # a new row that its first token ended
        if self._running:
            self._step(joined)
        self._decode_log.turn(len(self._running), len(self._waiting))

    def _prefill_chunk(self) -> list[Work]:
        """The next chunk of the first long prompt; the request, once its last chunk joined the batch."""
        if not self._partial:
            return []
        w, part = self._partial[0]
        done = w.cancelled
        try:
            new = None if done else self._spend("prefill", lambda: self.engine.prefill_chunk(part, self.chunk))
        except Exception as e:  # noqa: BLE001 - this request alone: the running batch is untouched
            new, done = None, True
            self._prefill_failed([w], e)
        if new is not None or done:
            with self._cond:
                self._partial.popleft()
        if w.cancelled and new is None and not w.done:
            self._finish(w, "abort")
        if new is None:
            return []
        self._joined([w], new)
        return [w]

    def _prefill(self, works: list[Work]) -> None:
        try:
            new = self._spend("prefill", lambda: self.engine.prefill([w.seq for w in works]))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: the running batch is untouched
            if len(works) > 1:  # one at a time, so only the request that cannot fit fails
                for w in works:
                    self._prefill([w])
                return
            self._prefill_failed(works, e)
            return
        self._joined(works, new)

    def _prefill_failed(self, works: list[Work], e: Exception) -> None:
        """End one request whose prefill raised (alone: the running batch is untouched)."""
        oom = (isinstance(e, (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError))
               or "out of memory" in str(e).lower())
        log.warning("request %s failed alone in prefill: %s: %s", works[0].seq.rid, type(e).__name__, e)
        message = (f"this request does not fit in the server's memory ({len(works[0].seq.prompt_ids)} prompt "
                   "tokens); shorten the prompt or retry later" if oom
                   else f"internal engine error in prefill: {type(e).__name__}: {e}")
        self._fail(works, message, 503 if oom else 500)

    def _joined(self, works: list[Work], new) -> None:
        """``works``, freshly prefilled as the batch ``new``, join the running batch with their first tokens."""
        self.metrics.prompt_tokens.inc(sum(len(w.seq.prompt_ids) for w in works))
        with self._cond:
            self._batch = self.engine.merge(self._batch, new)
            self._running.extend(works)
        self._set_running()
        for w in works:
            self._deliver(w, list(w.seq.output_ids))

    def _flush(self) -> None:
        """Hand this turn's payloads to the event loop(s): one post per loop, however many rows."""
        if not self._out:
            return
        out, self._out = self._out, []
        boxes: dict[Outbox, list] = {}
        for item in out:
            boxes.setdefault(item[0].receiver.outbox, []).append(item)
        for box, items in boxes.items():
            box.post(items)

    def _step(self, joined: list[Work]) -> None:
        try:
            self._step_once()
        except Exception as e:
            joined_now = set(joined)  # Work hashes by identity
            new = [w for w in self._running if w in joined_now]
            if not new:
                raise  # the batch stepped without any of these rows: the engine itself is broken
            log.exception("engine step failed; ending the %d requests that joined this turn and retrying without "
                          "them (%d running)", len(new), len(self._running))
            for w in new:
                w.seq.fail(f"internal engine error: {type(e).__name__}: {e}")
            self._retire()
            if self._running:
                self._step_once()  # raises again: a broken engine, every row fails (_fail_all)

    def _step_once(self) -> None:
        """One step's tokens out; with ``overlap``, the next step launched before they are read back."""
        if not self.overlap:
            self._emit(lambda: self.engine.step(self._batch), time.perf_counter())
            return
        step, self._ahead = self._ahead or self._spend("step", lambda: self.engine.launch(self._batch)), None
        try:
            if not self._due(in_flight=True):  # the next step, launched now (None where no whole-step graph fits)
                self._ahead = self._spend("step", lambda: self.engine.launch(self._batch, ahead=True))
        finally:  # this step's tokens are the rows' own, whatever happened to the next
            self._emit(lambda: self.engine.collect(step), step.start)

    def _due(self, in_flight: bool | None = None) -> bool:
        """Whether the batch's rows change this turn (``membership.py``)."""
        free = self.max_running - len(self._running) - len(self._partial)
        return self.membership.due(self._running, self._waiting, free, self.steps,
                                   self._ahead is not None if in_flight is None else in_flight)

    def _drain(self) -> None:  # the step launched ahead, collected
        step, self._ahead = self._ahead, None
        self._emit(lambda: self.engine.collect(step), step.start)

    def _emit(self, run, start: float) -> None:
        """Hand over what ``run()`` (a step's tokens, per row) gave each row; the step took the time from
        ``start`` (its launch) or the last step's end, whichever is later."""
        before = [(w.seq.stats.drafts, w.seq.stats.draft_tokens, w.seq.stats.accepted) for w in self._running]
        emitted = self._spend("step", run)
        now = time.perf_counter()
        self.metrics.engine_step(len(self._running), now - max(start, self._collected))
        self._collected = now
        self.steps += 1
        per_row = []
        for w, (d, t, a), tokens in zip(self._running, before, emitted):
            s = w.seq.stats
            per_row.append((s.drafts - d, s.draft_tokens - t, s.accepted - a))
            self._deliver(w, tokens)
        self.metrics.record_step(per_row)

    def _deliver(self, w: Work, tokens: list[int]) -> None:
        if tokens:
            self._decode_log.tokens += len(tokens)
            self._out.append((w, tokens))

    def _retire(self, change: bool = True) -> None:
        """Rows that ended leave the batch where ``change`` (the turn's ``_due``) says so; else they are done for
        their clients now and stay in the batch until it does (``membership.py``: one the client left, the next
        turn)."""
        while True:
            keep, gone = [], []
            for i, w in enumerate(self._running):
                if w.stopped and not w.seq.finished:  # a stop string, found on the event loop
                    w.seq.finish_reason = "stop"
                elif w.cancelled and not w.seq.finished:  # (a client may leave at any moment of the turn)
                    w.seq.finish_reason = "abort"
                (gone if w.seq.finished else keep).append(i)
            if not gone:
                return
            if not change:
                for w in (self._running[i] for i in gone if not self._running[i].done):
                    w.waited_from = self.steps
                    self._finish(w, w.seq.finish_reason)
                self._set_running()
                return
            if self._ahead is None:
                break
            self._drain()  # the step in flight was launched with the leaving rows: its tokens out first
        works, keep = [self._running[i] for i in gone], in_place(keep)  # the fewest rows moved
        with self._cond:
            self._running = [self._running[i] for i in keep]
            self._batch = self.engine.filter(self._batch, keep) if keep else None
        self._set_running()
        for w in works:
            if not w.done:  # one that stayed in the batch after it ended is done already
                self._finish(w, w.seq.finish_reason)

    def _set_running(self) -> None:  # the requests still running: not the rows that ended and wait to leave
        self.metrics.running.set(sum(not w.done for w in self._running))

    def _finish(self, w: Work, reason: str) -> None:
        if reason == "error":  # the engine ended this row alone (Sequence.fail)
            self._fail([w], w.seq.error or "internal engine error", 500)
            return
        w.done = True
        with self._cond:
            self._inflight -= 1
        self._out.append((w, Ended(reason, SpecStats().add(w.seq.stats))))  # the text side ends it (stream.py)

    def _fail(self, works: list[Work], message: str, status: int) -> None:
        """End requests that are neither queued nor running (any more) with an error event."""
        with self._cond:
            self._inflight -= len(works)
        for w in works:
            w.done = True
            self.metrics.requests.labels(outcome="error").inc()
            if status >= 500 and status != 503:  # 503: one that did not fit, warned about where it happened
                log.error("request %s failed: %s", w.seq.rid, message)
            self._out.append((w, Failed(message, status)))

    def _fail_all(self, admit: list[Work], message: str) -> None:
        with self._cond:
            partial = [w for w, _ in self._partial]
            self._partial.clear()
            waiting = [a for a in dict.fromkeys(admit + partial) if a not in self._running]  # a long one: in both
            works = [w for w in self._running + waiting if not w.done]
            self._running, self._batch, self._ahead = [], None, None
            self._inflight -= len(works)
        self.metrics.running.set(0)
        for w in works:
            w.done = True
            self.metrics.requests.labels(outcome="error").inc()
            self._out.append((w, Failed(message)))
