"""A long prompt never stalls the running requests (``--chunked-prefill-size``), over real HTTP on loopback:
it is prefilled one chunk a turn with a step of the running batch between chunks, and both answers are the
ones each request gets alone."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

LONG_PROMPT = [(7 * i) % 250 + 3 for i in range(83)]  # 6 chunks of 16 (the last 3 tokens)
BYSTANDER = [72, 101, 108]
GREEDY = {"temperature": 0, "ignore_eos": True}


class Recording:
    """The real engine, its prefill chunks and steps recorded in order (steps slowed a little, so the
    bystander is still running when the long prompt arrives)."""

    def __init__(self, engine):
        self._engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, batch):
        self.calls.append("step")
        time.sleep(0.01)
        return self._engine.step(batch)

    def prefill_chunk(self, part, chunk):
        self.calls.append("chunk")
        return self._engine.prefill_chunk(part, chunk)


def generate(url: str, prompt: list[int], n: int) -> list[int]:
    r = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {**GREEDY, "max_new_tokens": n}},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def recorded(engines: list):
    """A ``wrap`` for ``inprocess`` that keeps the ``Recording`` it makes in ``engines``."""
    return lambda engine: engines.append(Recording(engine)) or engines[-1]


def test_a_long_prompt_is_prefilled_a_chunk_a_turn_between_the_running_steps(inprocess, reference):
    engines = []
    with inprocess(wrap=recorded(engines), chunked_prefill_size=16) as srv, ThreadPoolExecutor(1) as pool:
        bystander = pool.submit(generate, srv.url, BYSTANDER, 60)
        scheduler = srv.app.state.eyas.scheduler
        end = time.time() + 30
        while scheduler.counts()[0] < 1 and time.time() < end:
            time.sleep(0.005)
        long_ids = generate(srv.url, LONG_PROMPT, 8)
        assert bystander.result() == reference([BYSTANDER], 60, ignore_eos=True)[0]
    assert long_ids == reference([LONG_PROMPT], 8, ignore_eos=True)[0]
    calls = engines[0].calls
    first, last = calls.index("chunk"), len(calls) - 1 - calls[::-1].index("chunk")
    assert calls.count("chunk") == 6
    assert calls[first : last + 1] == ["chunk", "step"] * 5 + ["chunk"]  # the bystander stepped between chunks


def test_a_prompt_within_the_chunk_and_chunking_off_prefill_whole(inprocess, reference):
    for size, prompt in ((-1, LONG_PROMPT), (2048, LONG_PROMPT), (16, BYSTANDER)):
        engines = []
        with inprocess(wrap=recorded(engines), chunked_prefill_size=size) as srv:
            assert generate(srv.url, prompt, 5) == reference([prompt], 5, ignore_eos=True)[0]
        assert "chunk" not in engines[0].calls
