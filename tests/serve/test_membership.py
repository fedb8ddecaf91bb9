"""When the running batch changes its rows (``serve/membership.py``): rows that ended and requests that wait are
let in and out several at once, within ``wait_steps``, and at once wherever waiting buys nothing or risks
something."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eyas.engine.batch import Sequence
from eyas.sample.sampling import SamplingParams
from eyas.serve.membership import Membership
from eyas.serve.work import Work

RULE = Membership(wait_steps=8, context_limit=1000, step_tokens=7)


def work(ended: str | None = None, since: int | None = None, cancelled: bool = False, held: int = 10,
         grammar: object = None) -> Work:
    """A request; one that ended ``since`` a step is done for its client (the scheduler's mark)."""
    seq = Sequence(list(range(held)), SamplingParams(), finish_reason=ended, grammar=grammar)
    return Work(seq, SimpleNamespace(), cancelled=cancelled, waited_from=since, done=bool(ended and since is not None))


def batch(ended: int, rows: int = 64, **kw) -> list[Work]:
    return [work("length", **kw) for _ in range(ended)] + [work() for _ in range(rows - ended)]


def test_one_row_that_ended_waits_for_others_in_a_large_batch():
    assert not RULE.due(batch(1, since=10), [], 0, steps=12, in_flight=True)
    assert not RULE.due(batch(7, since=10), [], 0, steps=12, in_flight=True)
    assert RULE.due(batch(8, since=10), [], 0, steps=12, in_flight=True)  # an eighth of 64 rows


def test_rows_that_ended_and_requests_that_wait_count_together():
    waiting = [work(since=11) for _ in range(4)]
    assert not RULE.due(batch(3, since=10), waiting, 0, steps=12, in_flight=True)
    assert RULE.due(batch(4, since=10), waiting, 0, steps=12, in_flight=True)
    # a request only counts where a slot opens for it: none free, none leaving, a full batch steps on
    assert not RULE.due(batch(0), [work(since=0) for _ in range(64)], 0, steps=100, in_flight=True)


def test_nothing_waits_longer_than_wait_steps():
    assert not RULE.due(batch(1, since=10), [], 0, steps=17, in_flight=True)
    assert RULE.due(batch(1, since=10), [], 0, steps=18, in_flight=True)
    assert not RULE.due(batch(0), [work(since=10)], 1, steps=17, in_flight=True)
    assert RULE.due(batch(0), [work(since=10)], 1, steps=18, in_flight=True)


@pytest.mark.parametrize("case", ["no step in flight", "small batch", "all ended", "wait 0"])
def test_the_batch_changes_at_once_where_waiting_buys_nothing(case):
    rows, in_flight, rule = batch(1, since=10), True, RULE
    if case == "no step in flight":
        in_flight = False
    elif case == "small batch":
        rows = batch(1, rows=7, since=10)
    elif case == "all ended":
        rows = batch(64, since=10)
    else:
        rule = Membership(0, 1000, 7)
    assert rule.due(rows, [], 0, steps=10, in_flight=in_flight)


def test_a_row_that_just_ended_starts_waiting_now_not_when_it_was_queued():
    assert not RULE.due(batch(1, since=None), [], 0, steps=100, in_flight=True)


def test_a_done_request_whose_handler_returned_is_no_reason_to_change():
    row = work("length", since=10, cancelled=True)  # its handler cancels it on the way out
    assert not RULE.due([row] + batch(0, rows=63), [], 0, steps=12, in_flight=True)


@pytest.mark.parametrize("why", ["cancelled", "aborted", "error", "grammar", "context"])
def test_a_row_that_must_leave_changes_the_batch_at_once(why):
    row = {"cancelled": work(cancelled=True), "aborted": work("abort", since=10, cancelled=True),
           "error": work("error", since=10),
           "grammar": work("stop", since=10, grammar=object()),
           "context": work("length", since=10, held=990)}[why]  # 990 + 7 x (2 + 1) > 1000 after two steps
    rows = [row] + batch(0, rows=63)
    assert RULE.due(rows, [], 0, steps=12, in_flight=True)
    if why == "context":
        assert not RULE.due(rows, [], 0, steps=10, in_flight=True)  # 990 + 7 still fits: it may step once more


def test_nothing_to_change_is_never_due():
    assert not RULE.due(batch(0), [], 5, steps=100, in_flight=False)
