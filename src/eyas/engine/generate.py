"""The simple static-batch loop: every sequence of a batch to its end, with the engine's own steps.

``Engine.generate`` (``eyas eval``, regeneration, the demo) runs it; the server runs its scheduler instead.
With ``overlap`` (where whole steps launch ahead, ``Engine.launches_ahead``) each step is launched before
the last one is collected, as the server's overlap schedule does: the same tokens.
"""

from __future__ import annotations

import time

from .batch import Output, Sequence, in_place


def run_to_end(engine, seqs: list[Sequence], overlap: bool = True, after_step=None) -> list[Output]:
    """``seqs`` (``Engine.new_sequence``'s) prefilled together and stepped until each has ended;
    ``after_step()`` (a benchmark's clock) runs after the prefill and after each step is collected."""
    if not seqs:
        return []
    after_step = after_step or (lambda: None)
    start = time.perf_counter()
    batch, ahead = engine.prefill_all(seqs), None
    after_step()
    while True:
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if ahead is not None and len(alive) < len(batch):  # launched with rows that ended: collected first
            engine.collect(ahead)
            after_step()
            ahead = None
            continue
        if not alive:
            break
        if len(alive) < len(batch):
            batch = engine.filter(batch, in_place(alive))
        step = ahead or engine.launch(batch)
        ahead = engine.launch(batch, ahead=True) if overlap and engine.launches_ahead else None
        engine.collect(step)
        after_step()
    seconds = time.perf_counter() - start
    return [Output(s.prompt_ids, s.output_ids, s.finish_reason, s.stats, seconds, s.logprobs) for s in seqs]
