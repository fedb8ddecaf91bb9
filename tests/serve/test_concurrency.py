"""Thirty-two concurrent clients, mixed lengths and endpoints: all lossless, counters consistent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from serve_helpers import scrape

COUNTERS = ["eyas:engine_step_batch_size_sum", "eyas:engine_steps_total", "eyas:spec_decode_num_drafts_total",
            "eyas:spec_decode_num_draft_tokens_total",
            "eyas:spec_decode_num_accepted_tokens_total", "eyas:generation_tokens_total", "eyas:prompt_tokens_total",
            'eyas:requests_total{outcome="length"}', 'eyas:requests_total{outcome="stop"}']


def test_32_concurrent_clients_lossless_and_counted(server, engine, reference):
    tok = engine.target.tokenizer
    prompts = [f"client {i}: " + "abcdefgh"[: i % 8] * (1 + i % 3) for i in range(32)]
    ids = [tok(p).input_ids for p in prompts]
    lengths = [4 + (7 * i) % 29 for i in range(32)]  # 4 .. 32 new tokens
    want = reference(ids, lengths)

    def call(i: int) -> dict:
        with httpx.Client(timeout=300) as c:
            if i % 2:  # SGLang's /generate, exact token ids
                r = c.post(server.url + "/generate", json={
                    "input_ids": ids[i], "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0}})
                assert r.status_code == 200, r.text
                body = r.json()
                return {"ids": body["output_ids"], "text": body["text"], "spec": body["meta_info"],
                        "prompt": body["meta_info"]["prompt_tokens"], "n": body["meta_info"]["completion_tokens"]}
            r = c.post(server.url + "/v1/completions", json={
                "model": "tiny", "prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            u = body["usage"]
            return {"ids": None, "text": body["choices"][0]["text"], "spec": u, "prompt": u["prompt_tokens"],
                    "n": u["completion_tokens"]}

    before, steps_before = scrape(server.url), httpx.get(server.url + "/server_info").json()["engine_steps"]
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, range(32)))
    after, steps_after = scrape(server.url), httpx.get(server.url + "/server_info").json()["engine_steps"]

    for i, r in enumerate(results):
        if r["ids"] is not None:
            assert r["ids"] == want[i], i
        assert r["text"] == tok.decode(want[i], skip_special_tokens=True), i
        assert r["n"] == len(want[i])
    delta = {k: after[k] - before[k] for k in COUNTERS}
    assert delta["eyas:spec_decode_num_drafts_total"] == sum(r["spec"]["spec_verify_ct"] for r in results)
    assert delta["eyas:spec_decode_num_draft_tokens_total"] == sum(r["spec"]["spec_draft_token_num"] for r in results)
    assert delta["eyas:spec_decode_num_accepted_tokens_total"] == sum(
        r["spec"]["spec_accept_token_num"] for r in results)
    assert delta["eyas:generation_tokens_total"] == sum(r["n"] for r in results)
    assert delta["eyas:prompt_tokens_total"] == sum(r["prompt"] for r in results)
    assert delta['eyas:requests_total{outcome="length"}'] + delta['eyas:requests_total{outcome="stop"}'] == 32
    assert after["eyas:num_requests_running"] == 0 and after["eyas:num_requests_waiting"] == 0
    for r in results:
        s = r["spec"]
        if s["spec_verify_ct"]:
            assert s["spec_accept_length"] == 1 + s["spec_accept_token_num"] / s["spec_verify_ct"]
    # decoded together: far fewer engine steps than per-request verify steps
    assert steps_after - steps_before == delta["eyas:engine_steps_total"]
    assert delta["eyas:engine_steps_total"] < delta["eyas:spec_decode_num_drafts_total"] / 4
    # every running row drafts once per engine step
    assert delta["eyas:engine_step_batch_size_sum"] == delta["eyas:spec_decode_num_drafts_total"]


def test_prefill_budget_admits_in_waves_and_stays_lossless(inprocess, engine, reference):
    tok = engine.target.tokenizer
    prompts = [f"wave {i} " * (1 + i) for i in range(6)]
    want = reference([tok(p).input_ids for p in prompts], 10)
    with inprocess(max_prefill_tokens=1) as srv:  # one prompt per engine turn

        def call(i):
            return httpx.post(srv.url + "/v1/completions", timeout=120, json={
                "prompt": prompts[i], "max_tokens": 10, "temperature": 0}).json()["choices"][0]["text"]

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(call, range(6)))
    assert texts == [tok.decode(w, skip_special_tokens=True) for w in want]


def test_native_engine_serves_bursts_through_graph_prefill_groups(models, reference):
    """The native path's prefill (graph-sized groups, caches lent until each group joins) behind the
    real scheduler: ten clients at once, every answer the target's own greedy one."""
    from serve_helpers import InProcessServer

    from eyas.pipeline import EngineArgs, build_engine
    from eyas.serve.app import ServeOptions, create_app

    tiny, draft = models
    native = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), dtype="float64",
                                     engine="native", speculative_num_steps=3, speculative_eagle_topk=2,
                                     speculative_num_draft_tokens=6, max_batch=16))
    assert native.prefiller is not None
    tok = native.target.tokenizer
    ids = [tok(f"burst {i}: " + "xyz" * (i % 4)).input_ids for i in range(10)]
    want = reference(ids, 12)

    def call(url: str, i: int) -> list[int]:
        body = {"input_ids": ids[i], "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
        r = httpx.post(url + "/generate", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    with InProcessServer(create_app(native, ServeOptions(served_model_name="tiny", log_interval=0))) as srv:
        with ThreadPoolExecutor(10) as pool:
            got = list(pool.map(lambda i: call(srv.url, i), range(10)))
    assert got == want
    assert any(g.graphs for g in native.prefiller.targets.values())  # prefilled from the graph buckets
