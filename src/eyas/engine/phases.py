"""The engine's phases by name, for whoever measures them: ``with phase("verify"): ...``.

While a ``torch.profiler`` runs, a phase is a ``record_function("eyas.<name>")`` range: on the host's
timeline, and on a GPU's (``gpu_user_annotation``) around the kernels it launched. A graph replay is one
launch, so the phases inside a captured step do not show; a step by parts shows each. Without a profiler a
phase costs one check (``record_function`` alone would be a dispatcher call, several microseconds, at every
phase of every step).

The phases: ``prefill``; ``step``, and inside a step by parts ``draft`` (the tree), ``mask`` (the verify's
attention mask), ``verify`` (the target's forward over the tree), ``accept``, ``commit`` (the accepted path's
keys kept, its tokens and states gathered), ``extend`` (the draft fed the accepted tokens); ``finish`` (the
step's one read-back and the host's share after it).

A profiler slows the host at every op it records, so the host's time per phase comes out inflated.
``timed_by(timer)`` runs every phase inside ``timer(name)`` instead, a context manager of the caller's
(``benchmarks/step_profile.py`` synchronises the device around each phase and reads the clock).
"""

from __future__ import annotations

import contextlib

from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

PREFIX = "eyas."
NAMES = ("prefill", "step", "draft", "mask", "verify", "accept", "commit", "extend", "finish")  # in a step's order
_NOTHING = contextlib.nullcontext()
_timer = None  # set by ``timed_by``


def phase(name: str):
    """The context a phase runs in: a profiler range, the ``timed_by`` timer's, or nothing."""
    if _timer is not None:
        return _timer(name)
    return record_function(PREFIX + name) if _profiler_enabled() else _NOTHING


@contextlib.contextmanager
def timed_by(timer):
    """Within this block every phase runs inside ``timer(name)`` (a context manager), in this process."""
    global _timer
    before, _timer = _timer, timer
    try:
        yield
    finally:
        _timer = before
