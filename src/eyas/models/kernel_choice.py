"""Which kernel runs each projection shape on this GPU: the fastest, measured once and remembered.

A projection of ``rows`` rows by an ``[n, k]`` weight can run as one of eyas's Triton kernels
(``_linear_kernel`` for one row, ``_linear_rows_kernel`` in a few tile shapes for 2 to 64 rows) or
as cuBLAS (the norm, the activation and the residual add then as kernels of their own). Which is
fastest depends on the GPU and the shape: the rows kernel wins on SmolLM2's small matrices and
loses on Llama-3.1-8B's (what the H200 picked: docs/engine.md, "What it measures now"), so no table
written for one model is right.

The first time a shape is met on a GPU outside a graph capture (``capture`` runs each function
twice before capturing it, so every shape a graph holds is met first there), every candidate is
run on that call's own inputs and timed with CUDA events; the fastest is kept for the process and
written to ``<cache>/kernel-choices.json`` under the GPU's name and the Triton and torch versions,
so later processes on that GPU skip the timing. On the CPU (Triton's interpreter: the tests) and
inside a capture nothing is timed: the first candidate, the built-in default, runs. Ops whose
``KernelSettings.measure`` is off never ask: they run the built-in default everywhere.

    # the file: {"NVIDIA H200 | triton 3.5.0 | torch 2.11.0": {"rows<=16 4096x4096 bf16 add": "cublas", ...}}
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from .first_use import FIRST_USE

log = logging.getLogger("eyas.kernels")

FILE = "kernel-choices.json"
CANDIDATES = 2  # the candidate sets' version: a file's choices made among fewer candidates are timed again


def row_bucket(rows: int) -> str:
    """Rows that run the same kernel tiles: one row, or the rows kernel's BLOCK_M (16, 32, 64)."""
    return "rows=1" if rows == 1 else f"rows<={max(16, 1 << (rows - 1).bit_length())}"


def shape_key(rows: int, n: int, k: int, dtype: torch.dtype, variant: str) -> str:
    """``"rows<=16 6144x4096 bf16 linear+norm"``: what a choice is remembered by."""
    kind = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))
    return f"{row_bucket(rows)} {n}x{k} {kind} {variant}"


def _time_us(fn: Callable[[], object], reps: int = 10, rounds: int = 3) -> float:
    """Microseconds per call of ``fn``, the best of ``rounds`` back-to-back runs of ``reps`` calls."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def _machine(device: torch.device) -> str | None:
    """What a choice holds for: the GPU's model and the compilers that built the kernels (None off a GPU:
    nothing is timed there)."""
    if device.type != "cuda":
        return None
    import triton  # only a GPU with the Triton kernels gets here

    return (f"{torch.cuda.get_device_name(device)} | triton {triton.__version__} | torch {torch.__version__} | "
            f"candidates {CANDIDATES}")


class KernelChoices:
    """Per-shape picks among named candidates, the process's (``CHOICES``): the first is the built-in default.

    ``timer(fn) -> microseconds`` times a candidate (CUDA events) and ``machine(device)`` names the
    file's section (the GPU, Triton, torch); tests give their own."""

    def __init__(self, folder: Path | None = None, timer=_time_us, machine=_machine):
        self.folder, self.timer, self.machine = folder, timer, machine
        self.picks: dict[str, str] = {}  # this process's choices (key -> candidate name)
        self.timings: dict[str, dict[str, float]] = {}  # key -> candidate -> us, for those timed here
        self.loaded: dict[str, str] = {}  # the file's choices for this machine
        self.section: str | None = None
        self._lock = threading.RLock()  # a candidate that itself meets a projection never waits on its caller

    def pick(self, key: str, candidates: dict[str, Callable[[], object]], device: torch.device) -> str:
        """The candidate to run for ``key``: remembered, read from the file, or timed now."""
        if key in self.picks:
            return self.picks[key]
        default = next(iter(candidates))
        if len(candidates) == 1:
            return default
        with self._lock:
            if not self._load(device):
                return default
            if key in self.loaded and self.loaded[key] in candidates:
                self.picks[key] = self.loaded[key]
                return self.picks[key]
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return default  # no timing inside a capture; not remembered, so a later eager call decides
            times, start = {}, time.perf_counter()
            for name, fn in candidates.items():
                try:
                    times[name] = self.timer(fn)
                except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is no candidate
                    log.info("kernel candidate %s for %s failed: %s: %s", name, key, type(e).__name__, e)
            choice = min(times, key=times.get) if times else default
            self.picks[key], self.timings[key] = choice, {n: round(t, 2) for n, t in times.items()}
            log.info("%s: %s (%s)", key, choice, ", ".join(f"{n} {t:.1f} us" for n, t in times.items()))
            FIRST_USE.record("kernel", f"choice for {key} (its candidates timed)", time.perf_counter() - start)
            self._save()
            return choice

    def _load(self, device: torch.device) -> bool:
        """Read the file's choices for this machine once; False where nothing can be timed."""
        if self.section is None:
            self.section = self.machine(device)
            if self.section is not None:
                self._read()
        return self.section is not None

    def _read(self) -> None:
        path = self.path
        if path is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text())
            section = data.get(self.section, {}) if isinstance(data, dict) else {}
            self.loaded = {k: v for k, v in section.items() if isinstance(k, str) and isinstance(v, str)}
        except (OSError, ValueError) as e:
            log.warning("ignoring %s (%s: %s): the projections' kernels are timed again", path, type(e).__name__, e)

    def _save(self) -> None:
        path = self.path
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                data = json.loads(path.read_text()) if path.exists() else {}
                data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                data = {}
            mine = data.get(self.section) if isinstance(data.get(self.section), dict) else {}
            data[self.section] = {**mine, **self.loaded, **self.picks}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            tmp.replace(path)
        except OSError as e:  # a read-only cache folder costs a re-timing next start, nothing more
            log.warning("could not write %s (%s); the choices hold for this process only", path, e)

    @property
    def path(self) -> Path | None:
        return None if self.folder is None else self.folder / FILE

    def summary(self) -> str | None:
        """One line for the banner: what was chosen, how many shapes were timed now. None: nothing chosen."""
        if not self.picks:
            return None
        kinds = Counter(name.split(":")[0] for name in self.picks.values())
        timed = sum(1 for k in self.picks if k in self.timings)
        where = f"; cache {self.path}" if self.path is not None else ""
        return (f"projection kernels chosen by measurement on {self.section or 'this GPU'}: {len(self.picks)} shapes "
                f"({', '.join(f'{name} {n}' for name, n in sorted(kinds.items()))}); {timed} timed now, "
                f"{len(self.picks) - timed} from the cache{where}")


def _default_folder() -> Path:
    from .loading import cache_root  # read once, when the module is first imported

    return cache_root()


CHOICES = KernelChoices(_default_folder())
