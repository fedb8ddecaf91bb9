"""When the running batch changes its rows: several at once, where the overlap schedule runs.

With the overlap schedule (``scheduler.py``) the device computes one step while the host hands out the tokens
of the one before, but a change of the batch's rows (a row that ended leaves, a new prompt joins) first
collects the step in flight, and the device then waits for the host's share of the change: filtering the
batch, prefilling and merging. A speculating batch's rows emit different counts of tokens a step, so they end
at different steps, and each end was a change of its own (docs/engine.md, *`auto` at 64 clients*, measures
what that cost); real requests end at different steps in a NONE server too. So a change waits, within bounds,
for others:

- a row that ended is done for its client at once (its last event goes out) but stays in the batch, stepped
  for nothing, and a new request waits in the queue,
- until the rows that ended plus the requests waiting are an eighth of the batch, or one of them has waited
  ``wait_steps`` steps (``--membership-wait-steps``).

The batch changes at once where waiting buys nothing or risks something: no step in flight, fewer than
``SMALL`` rows, ``wait_steps`` 0, or a row that must leave now (the client left: its slot is free within a
step; an error: its slots are scrubbed as it leaves; a grammar's: its batch runs by parts anyway; or one whose
context would not hold another step).
"""

from __future__ import annotations

from collections.abc import Sequence

from .work import Work

SMALL = 8  # a batch of fewer rows changes at once
SHARE = 8  # ... and a larger one once an eighth of its rows would change


class Membership:
    """The rule above for one engine: ``wait_steps`` the most steps a change waits, ``context_limit`` the most
    tokens a row may hold before a step (``Engine.context_limit``) and ``step_tokens`` the most a step adds."""

    def __init__(self, wait_steps: int, context_limit: int, step_tokens: int):
        self.wait_steps, self.context_limit, self.step_tokens = wait_steps, context_limit, step_tokens

    @staticmethod
    def ended(w: Work) -> bool:
        return w.seq.finished or w.stopped or w.cancelled

    def due(self, running: Sequence[Work], waiting: Sequence[Work], free: int, steps: int, in_flight: bool) -> bool:
        """Whether the batch of ``running`` changes this turn: ``waiting`` the queue (oldest first), ``free`` the
        slots open without a row leaving, ``steps`` the steps so far, a step ``in_flight`` or not. Reads each
        request's ``Work.waited_from``: the step it was queued, or, once its row ended and it is ``done``, then."""
        gone = [w for w in running if self.ended(w)]
        joining = min(len(waiting), max(0, free) + len(gone))  # what the queue can put in this turn
        if not gone and not joining:
            return False
        if self.wait_steps <= 0 or not in_flight or len(running) < SMALL or len(gone) == len(running):
            return True
        if any(self.must_leave(w, steps) for w in gone) or len(gone) + joining >= len(running) // SHARE:
            return True
        started = [self._since(w, steps) for w in gone] + ([waiting[0].waited_from] if joining else [])
        started = [s for s in started if s is not None]
        return bool(started) and steps - min(started) >= self.wait_steps

    def must_leave(self, w: Work, steps: int) -> bool:
        """A row that ended and leaves the batch this turn, whatever the others do."""
        s = w.seq
        # the client left (a row that ended otherwise is cancelled too, as its handler returns: no news), an error
        if (w.cancelled and not s.finished) or s.finish_reason in ("abort", "error") or s.grammar is not None:
            return True
        lingered = steps - self._since(w, steps)
        return len(s.prompt_ids) + len(s.output_ids) + (lingered + 1) * self.step_tokens > self.context_limit

    @staticmethod
    def _since(w: Work, steps: int) -> int:
        """The step a row that ended began to wait: when it was seen to end (``done``), else now."""
        return w.waited_from if w.done and w.waited_from is not None else steps
