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
    """The real engine, its prefill chunks and steps (called whole, or launched) recorded in order (steps
    slowed a little, so the bystander is still running when the long prompt arrives)."""

    def __init__(self, engine):
        self._engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, batch):
        self.calls.append("step")
        time.sleep(0.01)
        return self._engine.step(batch)

    def launch(self, batch, *args, **kwargs):  # a step under the overlap schedule: launched, collected later
        self.calls.append("step")
        time.sleep(0.01)
        return self._engine.launch(batch, *args, **kwargs)

    def prefill_chunk(self, part, chunk):
        self.calls.append("chunk")
        return self._engine.prefill_chunk(part, chunk)

    def prefill(self, seqs):
        self.calls.append(f"prefill {len(seqs)}")
        return self._engine.prefill(seqs)


def generate(url: str, prompt: list[int], n: int) -> list[int]:
    r = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {**GREEDY, "max_new_tokens": n}},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def recorded(engines: list):
    """A ``wrap`` for ``inprocess`` that keeps the ``Recording`` it makes in ``engines``."""
    return lambda engine: engines.append(Recording(engine)) or engines[-1]


def test_a_long_prompt_is_prefilled_a_chunk_a_turn_between_the_running_steps(inprocess, reference):
    # before the server runs: its engine thread and a reference generation must not share the target at once
    alone = reference([BYSTANDER, LONG_PROMPT], [60, 8], ignore_eos=True)
    engines = []
    with inprocess(wrap=recorded(engines), chunked_prefill_size=16) as srv, ThreadPoolExecutor(1) as pool:
        bystander = pool.submit(generate, srv.url, BYSTANDER, 60)
        scheduler = srv.app.state.eyas.scheduler
        end = time.time() + 30
        while scheduler.counts()[0] < 1 and time.time() < end:
            time.sleep(0.005)
        long_ids = generate(srv.url, LONG_PROMPT, 8)
        assert bystander.result() == alone[0]
    assert long_ids == alone[1]
    calls = engines[0].calls
    calls = [c for c in calls if not c.startswith("prefill")]  # the bystander's
    first, last = calls.index("chunk"), len(calls) - 1 - calls[::-1].index("chunk")
    assert calls.count("chunk") == 6
    gaps = "".join("c" if c == "chunk" else "s" for c in calls[first : last + 1]).split("c")[1:-1]
    # the bystander stepped between chunks: once, or (overlap schedule) also the step launched ahead of it
    assert len(gaps) == 5 and all(g in ("s", "ss") for g in gaps), calls


def test_a_prompt_within_the_chunk_and_chunking_off_prefill_whole(inprocess, reference):
    for size, prompt in ((-1, LONG_PROMPT), (2048, LONG_PROMPT), (16, BYSTANDER)):
        engines, alone = [], reference([prompt], 5, ignore_eos=True)[0]
        with inprocess(wrap=recorded(engines), chunked_prefill_size=size) as srv:
            assert generate(srv.url, prompt, 5) == alone
        assert "chunk" not in engines[0].calls


def test_a_wave_of_prompts_is_prefilled_a_chunks_worth_a_turn(inprocess, reference):
    """Four 10-token prompts in one request, chunks of 16: one prompt a turn (SGLang's budget), the bystander
    stepping between them; --chunked-prefill-size -1 keeps --max-prefill-tokens' budget (all four at once)."""
    prompts = [[5 + i, 6, 7, 8, 9, 10, 11, 12, 13, 14] for i in range(4)]
    alone = reference(prompts, 4, ignore_eos=True)  # before the server runs (one thread on the target at a time)
    for size, most in ((16, 1), (-1, 4)):
        engines = []
        with inprocess(wrap=recorded(engines), chunked_prefill_size=size) as srv, ThreadPoolExecutor(1) as pool:
            bystander = pool.submit(generate, srv.url, BYSTANDER, 40)
            scheduler = srv.app.state.eyas.scheduler
            end = time.time() + 30
            while scheduler.counts()[0] < 1 and time.time() < end:
                time.sleep(0.005)
            r = httpx.post(srv.url + "/generate", json={"input_ids": prompts, "sampling_params": {
                **GREEDY, "max_new_tokens": 4}}, timeout=120)
            assert [o["output_ids"] for o in r.json()] == alone
            bystander.result()
        waves = [int(c.split()[1]) for c in engines[0].calls if c.startswith("prefill")][1:]  # after the bystander's
        assert max(waves) == most and sum(waves) == 4


class SlowChunks(Recording):
    def prefill_chunk(self, part, chunk):
        time.sleep(0.15)
        return super().prefill_chunk(part, chunk)


def test_a_client_that_leaves_during_a_chunked_prefill_frees_its_slot(inprocess):
    engines = []
    with inprocess(wrap=lambda e: engines.append(SlowChunks(e)) or engines[-1], chunked_prefill_size=16) as srv:
        try:
            httpx.post(srv.url + "/generate", json={"input_ids": LONG_PROMPT, "sampling_params": {
                **GREEDY, "max_new_tokens": 8}}, timeout=0.3)
        except httpx.TimeoutException:
            pass
        scheduler = srv.app.state.eyas.scheduler
        end = time.time() + 10
        while (scheduler.counts() != (0, 0) or scheduler._inflight) and time.time() < end:
            time.sleep(0.02)
        assert scheduler.counts() == (0, 0) and scheduler._inflight == 0
        assert 1 <= engines[0].calls.count("chunk") < 6  # dropped between chunks, never joined the batch
        assert "prefill 1" not in engines[0].calls and "step" not in engines[0].calls
        assert generate(srv.url, BYSTANDER, 3)  # the server goes on
