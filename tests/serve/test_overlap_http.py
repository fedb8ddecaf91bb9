"""The overlap schedule (``--overlap-schedule``) behind real HTTP on loopback: each step launched before
the last one is read back, and every answer still the target's own greedy one, with clients of different
lengths, one leaving mid-stream and counters that add up."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import InProcessServer, scrape, wait_idle


@pytest.fixture(scope="module")
def native(models):
    from eyas.pipeline import EngineArgs, build_engine

    tiny, draft = models
    return build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                   engine="native", speculative_num_steps=3, speculative_eagle_topk=2,
                                   speculative_num_draft_tokens=6, max_batch=16))


def launches_ahead(engine, monkeypatch) -> list[bool]:
    """One entry per ``engine.launch`` from now on: whether it launched a step ahead."""
    ahead, launch = [], engine.launch

    def counted(*args, **kwargs):
        step = launch(*args, **kwargs)
        ahead.append(kwargs.get("ahead", False) and step is not None)
        return step

    monkeypatch.setattr(engine, "launch", counted)
    return ahead


@pytest.fixture
def overlapped(native, monkeypatch):
    """(an in-process server with the overlap schedule, the steps launched ahead so far)."""
    from eyas.serve.app import ServeOptions, create_app

    ahead = launches_ahead(native, monkeypatch)
    app = create_app(native, ServeOptions(served_model_name="tiny", log_interval=0, overlap_schedule=True))
    with InProcessServer(app) as srv:
        yield srv, ahead


def test_sixteen_clients_get_the_targets_greedy_answers(overlapped, native, reference):
    srv, ahead = overlapped
    tok = native.target.tokenizer
    ids = [tok(f"client {i}: " + "abc" * (i % 5)).input_ids for i in range(16)]
    lengths = [3 + (5 * i) % 27 for i in range(16)]  # rows end at different steps
    want = reference(ids, lengths)

    def call(i: int) -> list[int]:
        body = {"input_ids": ids[i], "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0}}
        r = httpx.post(srv.url + "/generate", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    before = scrape(srv.url)
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(call, range(16)))
    after = scrape(srv.url)
    assert got == want
    assert sum(ahead) > 10  # the steps did run ahead
    assert after["eyas:generation_tokens_total"] - before["eyas:generation_tokens_total"] == sum(lengths)
    assert after["eyas:num_requests_running"] == 0


def test_rows_that_end_apart_leave_the_batch_together(native, reference, monkeypatch):
    """Sixteen clients whose rows end at different steps: with ``membership_wait_steps`` a row that ended stays in
    the batch (done for its client) until others join it, so the batch changes fewer times than without, and
    every answer is the target's own either way (a quarter of the batch at a time here: 16 rows are few)."""
    from eyas.serve import membership
    from eyas.serve.app import ServeOptions, create_app

    monkeypatch.setattr(membership, "SHARE", 4)

    tok = native.target.tokenizer
    ids = [tok(f"member {i}: " + "ab" * (i % 3)).input_ids for i in range(16)]
    lengths = [6 + (11 * i) % 37 for i in range(16)]
    want = reference(ids, lengths, ignore_eos=True)
    filters, filter_ = [], native.filter
    monkeypatch.setattr(native, "filter", lambda batch, keep: filters.append(len(keep)) or filter_(batch, keep))
    changes = {}
    for wait in (0, 8):
        filters.clear()
        app = create_app(native, ServeOptions(served_model_name="tiny", log_interval=0, membership_wait_steps=wait))
        assert app.state.eyas.scheduler.membership.wait_steps == wait

        def call(i: int) -> list[int]:
            params = {"max_new_tokens": lengths[i], "temperature": 0, "ignore_eos": True}
            r = httpx.post(srv.url + "/generate", json={"input_ids": ids[i], "sampling_params": params}, timeout=300)
            assert r.status_code == 200, r.text
            return r.json()["output_ids"]

        with InProcessServer(app) as srv, ThreadPoolExecutor(16) as pool:
            got = list(pool.map(call, range(16)))
            assert wait_idle(srv.url) == {"status": "ok", "running": 0, "queued": 0}
            assert scrape(srv.url)["eyas:num_requests_running"] == 0
        assert got == want
        changes[wait] = len(filters)
    assert changes[8] < changes[0], changes


def test_rows_that_wait_to_leave_among_every_kind_of_request(overlapped, native, reference):
    """While rows that ended wait in the batch: greedy rows of every length, streams dropped mid-way, stop strings
    and n = 2 at once. The greedy answers are the target's own, every request ends, nothing is left running."""
    srv, ahead = overlapped
    tok = native.target.tokenizer
    ids = [tok(f"mixed {i}: " + "q" * (i % 4)).input_ids for i in range(8)]
    lengths = [5 + (13 * i) % 31 for i in range(8)]
    want = reference(ids, lengths, ignore_eos=True)

    def greedy(i: int):
        params = {"max_new_tokens": lengths[i], "temperature": 0, "ignore_eos": True}
        r = httpx.post(srv.url + "/generate", json={"input_ids": ids[i], "sampling_params": params}, timeout=300)
        return r.status_code, r.json()["output_ids"]

    def dropped(i: int):
        body = {"prompt": f"drop {i}", "max_tokens": 60, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n == 2:
                    break
            return r.status_code, None

    def other(i: int):
        body = {"prompt": f"other {i}", "max_tokens": 20 + i, "temperature": 0.8, "seed": i, "n": 2,
                "stop": ["e"] if i % 2 else None}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=300)
        return r.status_code, [c["finish_reason"] for c in r.json()["choices"]]

    calls = [(greedy, i) for i in range(8)] + [(dropped, i) for i in range(4)] + [(other, i) for i in range(4)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda c: c[0](c[1]), calls))
    assert all(code == 200 for code, _ in got), got
    assert [out for _, out in got[:8]] == want
    assert all(set(reasons) <= {"stop", "length"} for _, reasons in got[12:])
    assert wait_idle(srv.url) == {"status": "ok", "running": 0, "queued": 0}
    assert scrape(srv.url).get('eyas:requests_total{outcome="error"}', 0) == 0 and any(ahead)


@pytest.fixture(scope="module")
def native_auto(models):
    """The native engine with ``--speculative-batch-schedule auto`` and a cost table under which the setting
    changes with the batch: the big tree at 1 row, chains at 2 and 4, no speculation from 8 rows."""
    from eyas.pipeline import EngineArgs, build_engine

    tiny, draft = models
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                     engine="native", speculative_batch_schedule="auto", max_batch=16))
    table = {1: (1.0, 1.2, 1.3, 1.6, 2.2), 2: (1.0, 1.5, 2.0, 2.4, 3.0), 4: (1.0, 1.9, 2.6, 8.0, 12.0),
             8: (1.0, 8.0, 10.0, 16.0, 24.0), 16: (1.0, 16.0, 20.0, 32.0, 48.0)}
    engine.chooser.set_costs({s: {b: row[i] for b, row in table.items()} for i, s in enumerate(engine.spec.options)})
    return engine


def test_auto_overlapped_under_sixteen_clients_answers_as_plain_decoding(native_auto, reference, monkeypatch):
    """``auto`` with the overlap schedule (both the defaults on this path), greedy and seeded sampled clients
    together: as rows come and go the setting may change between steps launched ahead, and every greedy answer
    is the target's own."""
    from eyas.serve.app import ServeOptions, create_app

    ahead = launches_ahead(native_auto, monkeypatch)
    app = create_app(native_auto, ServeOptions(served_model_name="tiny", log_interval=0))
    assert app.state.eyas.scheduler.overlap
    tok = native_auto.target.tokenizer
    ids = [tok(f"auto {i}: " + "xy" * (i % 4)).input_ids for i in range(16)]
    lengths = [4 + (7 * i) % 29 for i in range(16)]
    want = reference(ids, lengths, ignore_eos=True)

    def call(i: int) -> list[int]:
        params = {"max_new_tokens": lengths[i], "temperature": 0 if i % 4 else 1.0, "seed": i, "ignore_eos": True}
        r = httpx.post(srv.url + "/generate", json={"input_ids": ids[i], "sampling_params": params}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    with InProcessServer(app) as srv, ThreadPoolExecutor(16) as pool:
        got = list(pool.map(call, range(16)))
        wait_idle(srv.url)
    assert [g for i, g in enumerate(got) if i % 4] == [w for i, w in enumerate(want) if i % 4]
    assert [len(g) for g in got] == lengths
    # how the rows overlap depends on when each request arrives (which kinds of row a drafting step holds, which
    # setting it picked), so the chooser is not asserted beyond this: tests/engine/test_adaptive.py and
    # test_overlap.py check those deterministically
    assert any(n for s, n in native_auto.chooser.steps.items() if s.speculative), native_auto.chooser.steps
    assert sum(ahead) > 10  # the steps did run ahead


def test_a_client_leaving_mid_stream_leaves_the_others_whole(overlapped, native, reference):
    srv, ahead = overlapped
    tok = native.target.tokenizer
    ids = [tok(f"stream {i} " * (1 + i)).input_ids for i in range(4)]
    want = reference(ids, 24)

    def leave() -> None:
        body = {"prompt": ids[0], "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i == 3:
                    return  # the connection closes: the row is cancelled mid-batch

    def stay(i: int) -> list[int]:
        body = {"input_ids": ids[i], "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
        return httpx.post(srv.url + "/generate", json=body, timeout=300).json()["output_ids"]

    with ThreadPoolExecutor(4) as pool:
        gone = pool.submit(leave)
        got = list(pool.map(stay, range(1, 4)))
        gone.result()
    assert got == want[1:]
    assert any(ahead)
    info = json.loads(httpx.get(srv.url + "/server_info").text)
    assert info["engine_steps"] > 0 and info["overlap_schedule"] is True


def test_a_storm_of_dropped_streams_leaves_nothing_behind(overlapped):
    """Streams opened and dropped after 0, 1 or 2 events while steps run ahead: every row leaves, no errors,
    and the server answers the next request."""
    srv, ahead = overlapped
    body = {"prompt": "storm", "max_tokens": 64, "stream": True, "ignore_eos": True}

    def client(i: int):
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as s:
                for n, _ in enumerate(s.iter_lines()):
                    if n >= i % 3:
                        break
            return s.status_code
        except httpx.HTTPError as e:
            return type(e).__name__

    with ThreadPoolExecutor(24) as pool:
        codes = list(pool.map(client, range(72)))
    assert set(codes) <= {200, 503}, set(codes)
    assert wait_idle(srv.url) == {"status": "ok", "running": 0, "queued": 0}
    m = scrape(srv.url)
    assert m.get('eyas:requests_total{outcome="error"}', 0) == 0
    ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "after", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and any(ahead)


def test_an_app_runs_no_more_rows_than_the_cache_holds(native, caplog):
    """An engine whose KV cache holds 16 rows, asked to run 32: the app runs 16, says so, and /server_info
    reports it (past it, every step of a full batch failed)."""
    from eyas.serve.app import ServeOptions, create_app

    app = create_app(native, ServeOptions(served_model_name="tiny", log_interval=0, max_running_requests=32))
    assert app.state.eyas.scheduler.max_running == 16
    assert "KV cache holds (16 rows" in caplog.text
    with InProcessServer(app) as srv:
        assert httpx.get(srv.url + "/server_info").json()["max_running_requests"] == 16


def test_the_schedule_is_on_by_default_where_steps_launch_ahead(native, engine):
    """``ServeOptions()`` (and ``eyas serve`` without the flag) overlaps on the native path; the generic path,
    which launches nothing ahead, steps one at a time whatever the flag says, and ``/server_info`` says so."""
    from eyas.serve.app import ServeOptions, create_app

    for eng, on in ((native, True), (engine, False)):
        app = create_app(eng, ServeOptions(served_model_name="tiny", log_interval=0))
        assert app.state.eyas.scheduler.overlap is on
        with InProcessServer(app) as srv:
            assert httpx.get(srv.url + "/server_info").json()["overlap_schedule"] is on
    off = create_app(native, ServeOptions(served_model_name="tiny", log_interval=0, overlap_schedule=False))
    assert off.state.eyas.scheduler.overlap is False


def test_the_banner_says_whether_the_overlap_schedule_applies(native, engine):
    """The native path's whole-step graphs run ahead (the default); the generic path has none: the banner says
    the flag does nothing there when it was asked for, and is silent when it was only the default."""
    from eyas.serve.banner import overlap_line

    assert "launched before" in overlap_line(native) and "within 8 steps" in overlap_line(native)
    assert "each row leaves or joins at once" in overlap_line(native, wait_steps=0)
    assert "read back before the next" in overlap_line(native, on=False)
    assert not engine.launches_ahead and "no effect" in overlap_line(engine, asked=True)
    assert overlap_line(engine) is None


def test_a_row_cancelled_mid_turn_never_shifts_the_others_tokens(native, reference, monkeypatch):
    """A client may leave at any moment of a turn, here after the turn began and before it retires leavers. The
    step launched ahead was launched for the batch with that row: the turn must collect it before the row leaves
    the batch, or its tokens land on the wrong rows (here: every later row's)."""
    from eyas.serve.app import ServeOptions, create_app

    app = create_app(native, ServeOptions(served_model_name="tiny", log_interval=0, overlap_schedule=True))
    scheduler, groups = app.state.eyas.scheduler, native.prefill_groups
    left = []

    def leave_mid_turn(seqs):  # called each turn after it began, before its retire
        running = scheduler._running
        if not left and scheduler._ahead is not None and len(running) == 4 and scheduler.steps >= 3:
            left.append(running[0])
            running[0].cancel()
        return groups(seqs)

    monkeypatch.setattr(native, "prefill_groups", leave_mid_turn)
    tok = native.target.tokenizer
    ids = [tok(f"row {i} " * (2 + i)).input_ids for i in range(4)]
    want = reference(ids, 40, ignore_eos=True)
    with InProcessServer(app) as srv:
        batch = httpx.post(srv.url + "/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}, timeout=300).json()
    assert left, "the hook never ran"
    got = [r["output_ids"] for r in batch]
    assert got[1:] == want[1:]
