"""SGLang's /generate: single and batched, streamed cumulative objects, meta_info acceptance."""

from __future__ import annotations

import json

import httpx


def test_generate_single_is_the_target_greedy_output(server, engine, reference):
    ids = engine.target.tokenizer("gen").input_ids
    r = httpx.post(server.url + "/generate", timeout=60, json={
        "input_ids": ids, "rid": "my-id", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}).json()
    assert r["output_ids"] == reference([ids], 16)[0]
    m = r["meta_info"]
    assert m["id"] == "my-id" and m["prompt_tokens"] == len(ids) and m["completion_tokens"] == len(r["output_ids"])
    assert m["finish_reason"]["type"] in ("length", "stop")
    assert m["spec_accept_length"] == 1 + m["spec_accept_token_num"] / m["spec_verify_ct"]


def test_generate_batch_and_n(server, engine, reference):
    tok = engine.target.tokenizer
    texts = ["first", "second prompt"]
    r = httpx.post(server.url + "/generate", timeout=60, json={
        "text": texts, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    want = reference([tok(t).input_ids for t in texts], 8)
    assert [x["output_ids"] for x in r] == want
    r = httpx.post(server.url + "/generate", timeout=60, json={
        "text": "same", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "n": 3}}).json()
    assert len(r) == 3 and len({tuple(x["output_ids"]) for x in r}) == 1


def test_generate_stream_sends_cumulative_objects(server, engine, reference):
    ids = engine.target.tokenizer("stream me").input_ids
    events = []
    with httpx.stream("POST", server.url + "/generate", timeout=60, json={
            "input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 20, "temperature": 0,
                                                                  "ignore_eos": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    lengths = [len(b["output_ids"]) for b in bodies]
    assert lengths == sorted(lengths) and lengths[-1] == 20
    assert bodies[-1]["output_ids"] == reference([ids], 20, ignore_eos=True)[0]
    assert bodies[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    assert all(b["meta_info"]["finish_reason"] is None for b in bodies[:-1])
    assert "spec_verify_ct" in bodies[-1]["meta_info"]


def test_generate_accepts_what_sglang_clients_send_with_neutral_values(server):
    r = httpx.post(server.url + "/generate", timeout=60, json={
        "text": "bench", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True},
        "stream": False, "return_logprob": False, "logprob_start_len": -1, "lora_path": None})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
    r = httpx.post(server.url + "/generate", timeout=60, json={"text": "x", "lora_path": "adapter"})
    assert r.status_code == 400 and "lora_path" in r.json()["error"]["message"]
