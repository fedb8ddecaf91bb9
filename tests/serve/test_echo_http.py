"""Scoring a prompt over HTTP against a real speculative server (EAGLE-3 tree, float64): completions' ``echo``
(the prompt's text, and with ``logprobs`` its tokens' logprobs first, the first null), ``max_tokens`` 0 (what
lm-evaluation-harness sends for loglikelihood), streamed and not, vLLM's ``prompt_logprobs`` and SGLang's
``logprob_start_len`` in their shapes, each prompt logprob Hugging Face's own ``log_softmax``; a request that
does not ask, batched with ones that do, gets its answer alone; what cannot be served is refused by name."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
TOL = 1e-4
PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "ignore_eos": True}


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def events(server, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def raw(engine, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: Hugging Face's log_softmax at each prompt position (over the token after it)."""
    with torch.no_grad():
        return torch.log_softmax(engine.target.model(torch.tensor([ids])).logits[0].double(), dim=-1)


def completion_top(tok, ref: torch.Tensor, token: int, n: int) -> dict:
    """OpenAI's ``top_logprobs`` entry from a reference row: the top n and the token, by text (the more likely
    one where texts repeat, as the byte tokenizer's '\\ufffd' do)."""
    best = ref.topk(n)
    out: dict[str, float] = {}
    for i, v in [*zip(best.indices.tolist(), best.values.tolist()), (token, ref[token].item())]:
        out.setdefault(tok.decode([i]), v)
    return out


def test_echo_with_logprobs_and_max_tokens_zero_scores_the_prompt(server, engine):
    tok = engine.target.tokenizer
    ids, ref = tok(PROMPT).input_ids, raw(engine, tok(PROMPT).input_ids)
    r = post(server, "/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 3, "max_tokens": 0,
                                         "temperature": 0})
    choice = r["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == len(ids)
    lp = choice["logprobs"]
    assert lp["tokens"] == [tok.decode([t]) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first token
    assert lp["token_logprobs"][1:] == pytest.approx([ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=TOL)
    for i in range(1, len(ids)):
        assert lp["top_logprobs"][i] == pytest.approx(completion_top(tok, ref[i - 1], ids[i], 3), abs=TOL)
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    sdk = client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=3, max_tokens=0, temperature=0)
    assert sdk.choices[0].text == PROMPT and sdk.usage.completion_tokens == 0
    assert sdk.choices[0].logprobs.token_logprobs == lp["token_logprobs"]


def test_echo_puts_the_prompt_before_the_output_streamed_or_not(server, engine):
    tok = engine.target.tokenizer
    ids = tok(PROMPT).input_ids
    body = {"prompt": PROMPT, "logprobs": 2, "max_tokens": 10, **GREEDY}
    plain, echoed = post(server, "/v1/completions", body), post(server, "/v1/completions", {**body, "echo": True})
    out, both = plain["choices"][0], echoed["choices"][0]
    assert both["text"] == PROMPT + out["text"] and echoed["usage"] == plain["usage"]
    lp, tail = both["logprobs"], out["logprobs"]
    n = len(ids)
    assert lp["tokens"] == [tok.decode([t]) for t in ids] + tail["tokens"]
    assert lp["token_logprobs"][0] is None and lp["token_logprobs"][n:] == pytest.approx(tail["token_logprobs"],
                                                                                         abs=TOL)
    assert lp["text_offset"][n:] == [lp["text_offset"][n] + o for o in tail["text_offset"]]
    chunks = events(server, {**body, "echo": True})
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts[0].startswith(PROMPT) and "".join(texts) == both["text"]
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert {k: [v for p in parts for v in p[k]] for k in lp} == lp
    only = events(server, {"prompt": PROMPT, "echo": True, "max_tokens": 0})  # the prompt alone, in one chunk
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in only if c["choices"]] \
        == [(PROMPT, "length")]


def test_prompt_logprobs_in_vllms_shape_leave_the_output_as_it_is(server, engine):
    tok = engine.target.tokenizer
    ids = tok("abab abab ab").input_ids
    ref = raw(engine, ids)
    body = {"prompt": ids, "max_tokens": 6, **GREEDY}
    plain = post(server, "/v1/completions", body)
    asked = post(server, "/v1/completions", {**body, "prompt_logprobs": 2})
    choice = asked["choices"][0]
    assert choice["text"] == plain["choices"][0]["text"] and choice["logprobs"] is None
    got = choice["prompt_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    for i in range(1, len(ids)):
        row, token = ref[i - 1], ids[i]
        first, *rest = got[i].items()
        assert first[0] == str(token) and first[1]["decoded_token"] == tok.decode([token])
        assert first[1]["logprob"] == pytest.approx(row[token].item(), abs=TOL)
        assert first[1]["rank"] == int((row >= row[token]).sum())
        best = row.topk(2)
        top = sorted((v["rank"], int(k), v["logprob"]) for k, v in got[i].items() if v["rank"] <= 2)
        assert [(rank, k) for rank, k, _ in top] == [(1, best.indices[0].item()), (2, best.indices[1].item())]
        assert [v for *_, v in top] == pytest.approx(best.values.tolist(), abs=TOL)
        assert len(got[i]) == 2 + (first[1]["rank"] > 2)
    echoed = post(server, "/v1/completions", {**body, "echo": True})["choices"][0]  # token ids echo as their text
    assert echoed["text"] == tok.decode(ids) + plain["choices"][0]["text"]


def test_generate_logprob_start_len_returns_the_prompts_in_sglangs_shape(server, engine):
    tok = engine.target.tokenizer
    ids = tok(PROMPT).input_ids
    ref = raw(engine, ids)
    body = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}
    r = post(server, "/generate", body)
    meta = r["meta_info"]
    assert r["output_ids"] == [] and meta["completion_tokens"] == 0 and meta["finish_reason"]["type"] == "length"
    assert meta["input_token_logprobs"][0] == [None, ids[0], None] and meta["input_top_logprobs"][0] is None
    assert [e[1] for e in meta["input_token_logprobs"]] == ids
    assert [e[0] for e in meta["input_token_logprobs"][1:]] == pytest.approx(
        [ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=TOL)
    assert [[e[1] for e in top] for top in meta["input_top_logprobs"][1:]] == [
        ref[i].topk(2).indices.tolist() for i in range(len(ids) - 1)]
    later = post(server, "/generate", {**body, "logprob_start_len": 3})["meta_info"]
    assert later["input_token_logprobs"] == meta["input_token_logprobs"][3:]


def test_requests_that_ask_joining_a_running_batch_leave_it_as_it_was(inprocess, engine, reference):
    """A plain request runs (slowed steps); scoring requests join its batch mid-way, one of them long enough to be
    prefilled in server chunks: the plain one's output is its output alone, and each prompt's logprobs are still
    Hugging Face's."""
    tok = engine.target.tokenizer
    plain_ids, long_ids = tok("hello there, how").input_ids, [(7 * i) % 250 + 3 for i in range(40)]
    prompts = [tok(PROMPT).input_ids, tok("abab abab ab").input_ids, long_ids]
    extras = [{"max_tokens": 0}, {"max_tokens": 8}, {"max_tokens": 3}]
    alone = reference([plain_ids, prompts[1]], [60, 8], ignore_eos=True)  # before the server shares the target
    with inprocess(step_delay=0.02, chunked_prefill_size=16) as srv, ThreadPoolExecutor(4) as pool:
        running = pool.submit(post, srv, "/v1/completions", {"prompt": plain_ids, "max_tokens": 60, **GREEDY})
        scheduler, end = srv.app.state.eyas.scheduler, time.time() + 30
        while scheduler.counts()[0] < 1 and time.time() < end:
            time.sleep(0.005)
        scored = list(pool.map(lambda k: post(srv, "/v1/completions", {
            "prompt": prompts[k], "echo": True, "logprobs": 2, **GREEDY, **extras[k]}), range(3)))
        assert running.result()["choices"][0]["text"] == tok.decode(alone[0], skip_special_tokens=True)
    assert scored[1]["choices"][0]["text"] == tok.decode(prompts[1]) + tok.decode(alone[1], skip_special_tokens=True)
    for out, ids, extra in zip(scored, prompts, extras):
        ref = raw(engine, ids)
        lp = out["choices"][0]["logprobs"]
        assert out["usage"]["completion_tokens"] == extra["max_tokens"] == len(lp["tokens"]) - len(ids)
        assert lp["token_logprobs"][1:len(ids)] == pytest.approx(
            [ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=TOL)


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens", "echo or prompt_logprobs"),
    ("/v1/completions", {"prompt": "a", "echo": True, "max_tokens": -1}, "max_tokens", "at least 0"),
    ("/v1/completions", {"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs", "[0, 20]"),
    ("/v1/completions", {"prompt": "a", "echo": True, "logprobs": 21, "max_tokens": 0}, "logprobs", "[0, 20]"),
    ("/v1/completions", {"prompt": "a", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens",
     "at least 1"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens",
     "logprob_start_len"),
    ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len", "-1"),
])
def test_what_cannot_be_scored_is_refused_by_name(server, path, body, param, words):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
