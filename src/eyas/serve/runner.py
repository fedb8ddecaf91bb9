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
        self.limits = limits or Limits()
        self.limits.check_job(job, scheduler.max_running, scheduler.max_queued)
        timeout = self.limits.request_timeout
        self.deadline = time.monotonic() + timeout if timeout else None
        seqs = sequences_for(engine, job)  # 400s happen here, before anything is queued
        self.queue: asyncio.Queue = asyncio.Queue()
        outbox = scheduler.outbox(asyncio.get_running_loop())
        stop = list(job.stop or [])
        self.works = [Work(seq, Receiver(outbox, self.queue, k, stop, job.skip_special_tokens))
                      for k, seq in enumerate(seqs)]
        self.prompt_tokens = sum(len(p) for p in job.prompts)
        try:
            scheduler.submit(self.works)
        except Overloaded as e:
            raise overloaded(e.running, e.queued) from None

    def cancel(self) -> None:
        for w in self.works:
            w.cancel()

    async def events(self, receive=None) -> AsyncIterator[tuple[int, object]]:
        """(choice index, Delta | Finished | Failed) until every sequence has ended.

        ``receive``: the ASGI receive callable, watched for ``http.disconnect`` (non-streaming).
        Past ``--request-timeout`` the job is cancelled and a 408 ``ApiError`` raised.
        """
        pending = len(self.works)
        watcher = asyncio.ensure_future(_disconnected(receive)) if receive is not None else None
        try:
            while pending:
                if self.queue.empty():
                    get = asyncio.ensure_future(self.queue.get())
                    waits = {get} if watcher is None else {get, watcher}
                    left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
                    done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        get.cancel()
                        raise timed_out(self.limits)
                    if get not in done:
                        get.cancel()
                        raise ClientGone()
                    events = [get.result()]
                else:  # already waiting: the same checks, without a wait
                    if self.deadline is not None and time.monotonic() > self.deadline:
                        raise timed_out(self.limits)
                    if watcher is not None and watcher.done():
                        raise ClientGone()
                    events = []
                while not self.queue.empty():
                    events.append(self.queue.get_nowait())
                for index, event in coalesce(events):
                    if isinstance(event, (Finished, Failed)):
                        pending -= 1
                    yield index, event
        finally:
            if watcher is not None:
                watcher.cancel()
            self.cancel()


async def _disconnected(receive) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
