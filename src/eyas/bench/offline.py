"""In-process benchmark: the engine with speculation against the same target without it.

Prompts run in batches of ``concurrency`` through the engine's own loop (``engine.generate.run_to_end``:
each step launched ahead where the engine can, as the server's overlap schedule does), timed per
request: TTFT is the prefill (which emits the first token), a request ends at the step that
finishes it. Both sides share one loaded target, so the comparison is exact: the same weights,
prompts, sampling and thread settings.
"""

from __future__ import annotations

import time

from ..engine.generate import run_to_end
from ..engine.stats import SpecStats
from ..sample.sampling import SamplingParams
from .results import Request, Run


def run_engine(engine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], concurrency: int,
               label: str, progress=None, categories: list[str | None] | None = None) -> Run:
    """``prompts`` through ``engine`` ``concurrency`` at a time, with ``params`` (or one per prompt);
    ``categories`` (one per prompt) are kept on the requests, for ``Run.per_category``."""
    categories = categories or [None] * len(prompts)
    params = params if isinstance(params, list) else [params] * len(prompts)
    requests: list[Request] = []
    total = SpecStats()
    start = time.perf_counter()
    for lo in range(0, len(prompts), concurrency):
        chunk = prompts[lo: lo + concurrency]
        seqs = [engine.new_sequence(p, sp) for p, sp in zip(chunk, params[lo: lo + concurrency])]
        clock = Clock(seqs)
        run_to_end(engine, seqs, after_step=clock)
        for i, s in enumerate(seqs):
            spec = engine.spec.speculative and s.stats.drafts
            requests.append(Request(len(s.output_ids), clock.ttft, clock.done[i],
                                    s.stats.accept_length if spec else None, s.stats.drafts if spec else None,
                                    s.stats.accepted if spec else None, categories[lo + i]))
            total.add(s.stats)
        if progress is not None:
            progress.update(len(chunk))
    run = Run(label, concurrency, time.perf_counter() - start, requests)
    if engine.spec.speculative:
        depth = max(engine.spec.num_steps, len(total.accepted_per_position))
        counts = total.accepted_per_position + [0] * (depth - len(total.accepted_per_position))
        run.acceptance = {"tau": round(total.accept_length, 4), "accept_rate": round(total.accept_rate, 4),
                          "per_position": [round(a / total.drafts, 4) for a in counts] if total.drafts else [],
                          "verify_steps": total.drafts}
    return run


class Clock:
    """``run_to_end``'s ``after_step``: the prefill's end (TTFT: it emits the first token) and the step
    that ended each of ``seqs``, in seconds from its creation."""

    def __init__(self, seqs: list):
        self.seqs, self.start, self.ttft, self.done = seqs, time.perf_counter(), None, {}

    def __call__(self) -> None:
        now = time.perf_counter() - self.start
        self.ttft = now if self.ttft is None else self.ttft
        self.done.update({i: now for i, s in enumerate(self.seqs) if s.finished and i not in self.done})


def warm_up(engine, prompt: list[int]) -> None:
    engine.generate([prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))
