"""Plain steps beside speculative ones keep the draft's feed and give it at once (``engine/feed.py``): every row's
tokens, and what the draft then accepts, equal those of an engine that feeds the draft on every plain step
(float64 target: the draft sees the same states to rounding) and the target's own greedy tokens; rows join and
leave while a feed is pending, steps launch ahead, and a full feed is given without any speculative step."""

from __future__ import annotations

import pytest
import torch
from helpers import reference_greedy

from eyas.config import SpecConfig, parse_schedule
from eyas.engine.engine import Engine
from eyas.engine.feed import feed_draft
from eyas.models.native import NativeTarget
from eyas.sample.sampling import SamplingParams

PROMPTS = ([72, 101, 108, 108], [7] * 9, [200, 13], [5, 6, 7, 8, 9, 10, 11])
LATE = [31, 41, 59, 26, 53]  # joins the batch while a feed is pending, just before a drafting step
AUTO = SpecConfig.auto("EAGLE3")
NONE, CHAIN, TREE = AUTO.options[0], AUTO.options[1], AUTO.options[4]
# the settings of the steps in turn: runs of plain steps longer and shorter than the feed, between drafting ones
TURNS = [NONE] * 5 + [CHAIN] + [NONE] * 2 + [TREE, TREE] + [NONE] * 9 + [CHAIN] + [NONE, TREE] * 3


def engine(target, draft, interval: int) -> Engine:
    return Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=8, cuda_graphs=True,
                  draft_feed_interval=interval)


def run(engine: Engine, rows: list[SamplingParams], ahead: bool = False, join_at: int = 8):
    """Every row to its end, each step's setting from ``TURNS``, ``LATE`` merged in at step ``join_at``, finished
    rows filtered out; ``ahead``: each step launched before the last is collected where the batch stays."""
    seqs = [engine.new_sequence(p, sp) for p, sp in zip(PROMPTS, rows)]
    batch, n, pending, flushed = engine.prefill_all(seqs), 0, None, 0
    late = engine.new_sequence(LATE, rows[0])
    while True:
        if pending is not None and (n == join_at or any(s.finished for s in batch.seqs)):
            engine.collect(pending)
            pending = None
        if n == join_at:
            batch = engine.merge(batch, engine.prefill([late]))
        alive = [i for i, s in enumerate(batch.seqs) if not s.finished]
        if not alive:
            return [s.output_ids for s in seqs + [late]], [s.stats.accepted for s in seqs + [late]], flushed
        if len(alive) < len(batch):
            batch = engine.filter(batch, alive)
        before = batch.feeds
        step = pending or engine.launch(batch, TURNS[n % len(TURNS)])
        n += pending is None
        pending = engine.launch(batch, TURNS[n % len(TURNS)], ahead=True) if ahead and n != join_at else None
        n += pending is not None
        engine.collect(step)
        flushed += batch.feeds - before  # the draft took the feed


@pytest.mark.parametrize("ahead", [False, True], ids=["one-at-a-time", "ahead"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_deferred_feed_gives_the_tokens_and_acceptance_of_a_feed_every_step(target, draft, sampled, ahead):
    extra = dict(temperature=0.8, top_p=0.9, seed=5) if sampled else {}
    rows = [SamplingParams(max_new_tokens=n, ignore_eos=True, **extra) for n in (30, 44, 12, 38)]
    every, every_accepted, _ = run(engine(target, draft, 1), rows)
    got, accepted, flushed = run(engine(target, draft, 4), rows, ahead)
    assert got == every and accepted == every_accepted
    assert sum(accepted) > 0 and flushed > 0
    if not sampled:
        refs = [reference_greedy(target.model, p, 44) for p in (*PROMPTS, LATE)]
        assert got == [r[:len(g)] for r, g in zip(refs, got)]


def test_the_draft_after_a_deferred_feed_is_the_draft_fed_every_step(target, draft):
    """The draft's state and cache after three plain steps and the deferred feed equal those after three fed
    plain steps; a feed that fills up is given before the next plain step."""
    batches = {}
    for interval in (1, 3):
        e = engine(target, draft, interval)
        batch = e.prefill_all([e.new_sequence(p, SamplingParams(max_new_tokens=40)) for p in PROMPTS])
        for _ in range(3):
            e.step(batch, NONE)
        if interval > 1:
            assert batch.deferred == 3 and batch.feeds == 0 and (batch.feed.n == 3).all()
            e.step(batch, NONE)  # full: the draft takes the feed first
            assert batch.deferred == 1 and batch.feeds == 1 and (batch.feed.n == 1).all()
            feed_draft(batch, e.extenders, e.by_parts.draft_extend)
        else:
            e.step(batch, NONE)
            assert batch.feed is None
        batches[interval] = (e, batch)
    (e1, b1), (e3, b3) = batches[1], batches[3]
    torch.testing.assert_close(b3.draft_hidden, b1.draft_hidden)
    assert b3.lengths.tolist() == b1.lengths.tolist()
    kv1, kv3 = e1.draft_steps.pool.buf, e3.draft_steps.pool.buf  # [layers, 2, rows, heads, slots, head_dim]
    for row, length in enumerate(b1.lengths.tolist()):  # each row's committed draft keys and values
        torch.testing.assert_close(kv3[:, :, row, :, :length], kv1[:, :, row, :, :length])


def test_a_schedule_defers_only_where_it_runs_plain_steps(target, draft):
    plain = Engine(NativeTarget.from_target(target), draft, SpecConfig("EAGLE3", 3, 1, 4), max_batch=4)
    assert not any(s.defers for s in plain.whole_steps.values())
    scheduled = Engine(NativeTarget.from_target(target), draft,
                       SpecConfig("EAGLE3", schedule=parse_schedule("1:3,1,4;2:0")), max_batch=4)
    assert [s.feed_width for s in scheduled.whole_steps.values()] == [0, 8]
    every = Engine(NativeTarget.from_target(target), draft, AUTO, max_batch=4, draft_feed_interval=1)
    assert not any(s.defers for s in every.whole_steps.values())


def test_an_interval_below_one_is_refused_with_the_fix(target):
    from eyas.errors import EyasError

    with pytest.raises(EyasError, match="(?s)at least 1, got 0.*pass 1 to feed the draft on every plain step"):
        Engine(NativeTarget.from_target(target), max_batch=2, draft_feed_interval=0)
