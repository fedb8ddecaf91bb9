"""A request's life in the server (``Work``), from ``Scheduler.submit`` to its last event, and the refusal
of one the server has no room for (``Overloaded``: the HTTP layer answers 503)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.batch import Sequence
from .stream import Receiver


@dataclass(eq=False)  # identity: the queue and the batch find a request by itself, never by its fields
class Work:
    """One sequence's life in the server. The engine thread owns ``seq``; the event loop owns
    ``receiver`` (its text and events) and sets ``stopped`` when a stop string matched."""

    seq: Sequence
    receiver: Receiver
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    stopped: bool = False
    done: bool = False  # its last payload (Ended or Failed) was handed over
    waited_from: int | None = None  # the scheduler's step count when it was queued, or when its row ended
    outcome: str | None = None  # how the server ended it, where not by its own reason: "timeout", "rejected"
    on_cancel: Callable[[Work], None] | None = field(default=None, repr=False)  # set by Scheduler.submit

    def cancel(self) -> None:
        """Called from any thread: a queued request leaves the queue now; the engine thread drops a
        running row before its next step."""
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel(self)


class Overloaded(Exception):
    """No room for ``asked`` more sequences: ``inflight`` (running, being prefilled or queued: what ``submit``
    counts) of ``running + queued`` (the two flags' capacities); ``stopping``: the server is shutting down."""

    def __init__(self, inflight: int, asked: int, running: int, queued: int, stopping: bool = False):
        super().__init__("shutting down" if stopping else f"{inflight} + {asked} sequences > {running} + {queued}")
        self.inflight, self.asked, self.running, self.queued, self.stopping = inflight, asked, running, queued, stopping
