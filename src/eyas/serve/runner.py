"""Run one request's job on the scheduler from asyncio: submit, await events, cancel on the way out.

``JobRun`` is the only bridge between an HTTP handler and the engine thread. Its ``events``
generator cancels every one of the job's sequences in ``finally``: whether the handler returns,
the client disconnects (non-streaming: a watcher on the ASGI ``receive`` channel; streaming: the
server closes the generator when a send fails), or the server shuts down, the slot is freed.
Results arrive on this loop through the scheduler's ``Outbox`` (``stream.py``), already turned into
text; a handler that fell behind gets a choice's waiting deltas as one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from .api_errors import overloaded
from .inputs import Job, sequences_for
from .limits import Limits, timed_out
from .scheduler import Overloaded, Scheduler, Work
from .stream import Failed, Finished, Receiver, coalesce


class ClientGone(Exception):
    pass


class JobRun:
    def __init__(self, scheduler: Scheduler, engine, job: Job, limits: Limits | None = None):
        self.job, self.limits = job, limits or Limits()
        self.limits.check_job(job, scheduler.max_running, scheduler.max_queued)
        timeout = self.limits.request_timeout
        self.deadline = job.arrived + timeout if timeout else None  # counted from the request's reading
        seqs = sequences_for(engine, job)  # 400s happen here, before anything is queued
        self.queue: asyncio.Queue = asyncio.Queue()
        outbox = scheduler.outbox(asyncio.get_running_loop())
        stop, params = list(job.stop or []), job.params
        stop_ids = params.stop_ids(engine.target.eos_token_ids)  # the ids that end a row: their text is left out
        self.works = [Work(seq, Receiver(outbox, self.queue, k, stop, job.skip_special_tokens, job.keep_stop, stop_ids,
                                         params.min_tokens)) for k, seq in enumerate(seqs)]
        self.prompt_tokens = sum(len(p) for p in job.prompts)
        try:
            scheduler.submit(self.works)
        except Overloaded as e:
            raise overloaded(e) from None

    def cancel(self, outcome: str | None = None) -> None:
        """End every sequence; ``outcome`` (``Work.outcome``): what ``eyas:requests_total`` counts them as, where
        the server, not the client, ended them."""
        for w in self.works:
            if outcome is not None and not w.done:
                w.outcome = outcome
            w.cancel()

    async def events(self, receive=None) -> AsyncIterator[tuple[int, object]]:
        """(choice index, Delta | Finished | Failed) until every sequence has ended.

        ``receive``: the ASGI receive callable, watched for ``http.disconnect`` (non-streaming).
        Past ``--request-timeout`` the job is cancelled and a 408 ``ApiError`` raised. Both arrive as
        markers on the job's own queue, so each wait is one ``queue.get``: it happens once per engine
        step for every stream, on the event loop.
        """
        pending = len(self.works)
        loop = asyncio.get_running_loop()
        put = self.queue.put_nowait
        watcher = asyncio.ensure_future(_disconnected(receive, put)) if receive is not None else None
        timer = (loop.call_later(max(0.0, self.deadline - time.monotonic()), put, (None, _TIMEOUT))
                 if self.deadline is not None else None)
        try:
            while pending:
                events = [await self.queue.get()]
                while not self.queue.empty():
                    events.append(self.queue.get_nowait())
                if any(index is None for index, _ in events):  # a marker: the deadline, or the client left
                    if any(e is _TIMEOUT for index, e in events if index is None):
                        self.cancel("timeout")
                        error = timed_out(self.limits)
                        error.counted = True
                        raise error
                    raise ClientGone()
                for index, event in coalesce(events):
                    if isinstance(event, (Finished, Failed)):
                        pending -= 1
                    yield index, event
        finally:
            if watcher is not None:
                watcher.cancel()
            if timer is not None:
                timer.cancel()
            self.cancel()


_TIMEOUT, _GONE = object(), object()  # the markers ``events`` finds on the queue (with index None)


async def _disconnected(receive, put) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            put((None, _GONE))
            return
