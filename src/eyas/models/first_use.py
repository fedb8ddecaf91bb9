"""What the engine builds on first use once warm-up is over: a Triton kernel variant compiled, a CUDA graph captured.

Warm-up (``engine/warmup.py``) exists so that no request waits for either. One that happens later anyway stalls
every running request for as long as it takes (a Triton compile takes 0.2-2 s, a capture tens of milliseconds),
so each is logged, with what was built and how long it took, and counted (``FIRST_USE.events``, which the
server exports as ``eyas:engine_first_use_total`` and ``eyas:engine_first_use_seconds_total``): a warm-up that
misses a variant shows itself the first time a request needs it.

Kernels are the projections' kernel choices timed on first use of a shape (``models/kernel_choice.py``), and
Triton's compiles, seen through its hooks (``triton.knobs.runtime``: ``jit_cache_hook`` before a variant
missing from the process's cache is compiled or loaded from Triton's disk cache, ``jit_post_compile_hook``
after); any hook already installed still runs. Graphs are reported by the graph runners
(``models/graphs.py``). ``FIRST_USE.arm()`` starts recording; warm-up stops it while it runs (another engine of
the process may have armed it) and calls it when it is done, on a GPU only (the CPU compiles nothing: Triton
runs interpreted there, and nothing is captured).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("eyas.engine")

SLOW = 0.1  # seconds: a first use that took longer is a warning, a shorter one (a disk cache hit) information


class FirstUse:
    """Counts and logs what is built after ``arm()``: ``events`` {kind: [count, seconds]} for "kernel" and "graph"."""

    def __init__(self):
        self.armed = False
        self.events: dict[str, list[float]] = {"kernel": [0, 0.0], "graph": [0, 0.0]}
        self._local = threading.local()  # the compile in progress on this thread: its start
        self._hooked = False

    def arm(self) -> None:
        """Record from now on (idempotent); installs the Triton hooks on the first call."""
        if not self._hooked:
            self._hooked = True
            self._hook_triton()
        self.armed = True

    def record(self, kind: str, what: str, seconds: float) -> None:
        """One thing built on first use after warm-up (nothing while not armed)."""
        if not self.armed:
            return
        tally = self.events[kind]
        tally[0], tally[1] = tally[0] + 1, tally[1] + seconds
        level = logging.WARNING if seconds >= SLOW else logging.INFO
        log.log(level, "after warm-up: %s %s in %.3f s (the running requests waited for it; warm-up did not reach "
                "this variant)", "compiled Triton kernel" if kind == "kernel" else "captured CUDA graph", what,
                seconds)

    def _hook_triton(self) -> None:
        try:
            from triton import knobs
        except ImportError:  # no Triton, or one older than its knobs (3.4): kernels go unseen
            log.debug("first-use watch: no triton.knobs; kernel compiles after warm-up are not counted")
            return
        runtime = knobs.runtime
        before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

        def starting(**kwargs):
            self._local.start = time.perf_counter()
            return before(**kwargs) if before else None

        def done(**kwargs):
            start = getattr(self._local, "start", None)
            self._local.start = None
            if start is not None:
                self.record("kernel", str(kwargs.get("repr", "?")), time.perf_counter() - start)
            return after(**kwargs) if after else None

        runtime.jit_cache_hook, runtime.jit_post_compile_hook = starting, done


FIRST_USE = FirstUse()  # one per process: Triton's hooks are the process's
