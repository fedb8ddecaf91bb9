"""``train.time_budget_s``: when to fit a run's step count to its wall-clock budget, and from what rate.

Steps/s is measured over steps 15-45 after the start (past the warm-up), then again from the steps since
the last fit once a quarter and a half of the budget are spent: the rate drifts with the batches' lengths
and the allocator's warm-up (a chat-mix run measured 0.81 steps/s there and averaged 1.45). Never later,
so the learning-rate schedule settles. Steps so slow that a quarter of the budget is spent before step 45
are fitted then, from the steps done so far, so the run cannot overrun its budget waiting for the
measurement. The trainer applies the fit (``Trainer._fit_budget``).
"""

from __future__ import annotations


class TimeBudget:
    def __init__(self, seconds: float, step: int, start: float):
        self.seconds, self.start = seconds, start
        self.first = (step, start)
        self.calib = (step + 15, step + 45)
        self.refits = [0.25, 0.5]  # shares of the budget spent at which to fit again
        self.last: tuple[int, float] | None = None  # (step, time) of the last fit, or of the calibration's start

    def due(self, step: int, log_step: bool, now, elapsed_all) -> tuple[int, float, float] | None:
        """(steps done, their seconds, seconds left) to fit from after ``step``, or None. ``now()``: the time,
        the device synchronized; ``elapsed_all()``: seconds since the start as every rank agrees (a collective,
        so called only on ``log_step`` s, where every rank gets to the same decision)."""
        if step == self.calib[0]:
            self.last = (step, now())
            return None
        if step != self.calib[1]:  # after the calibration, or before its end in a run of slow steps
            if not (self.refits and log_step and elapsed_all() >= self.refits[0] * self.seconds):
                return None
            self.refits.pop(0)
        t = now()
        last = self.last or self.first  # before step 15: from the start, warm-up included
        done, seconds = step - last[0], t - last[1]
        self.last = (step, t)
        return done, seconds, self.seconds - (t - self.start)
