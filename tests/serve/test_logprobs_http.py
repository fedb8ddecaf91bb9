"""Logprobs over HTTP against a real speculative server (EAGLE-3 tree, float64): OpenAI chat's and
completions' shapes (the ``openai`` SDK parses them), SGLang's ``/generate`` meta_info, streamed equal
to non-streamed, greedy logprobs equal plain decoding's (NONE) for the same tokens, sampled ones equal
the processed distribution of the target's own forward, and out-of-range fields refused by name."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from helpers import byte_tokenizer, bytes_to_unicode

from eyas.config import Algorithm, SpecConfig
from eyas.engine.engine import Engine
from eyas.sample.sampling import SamplingParams, probs
from eyas.serve import logprobs as served_logprobs

openai = pytest.importorskip("openai")
TOL = 1e-4
MSG = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def plain(engine):
    """(prompt ids, n tokens, top) -> plain decoding's greedy Output with logprobs (the core engine, NONE)."""
    none = Engine(engine.target, None, SpecConfig(Algorithm.NONE))
    return lambda ids, n, top=3: none.generate([ids], SamplingParams(max_new_tokens=n, logprobs=top))[0]


def _chat_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _raw(tok, token: int) -> bytes:
    """A byte-level token's own bytes (a special token's: its text's UTF-8)."""
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    piece = tok.convert_ids_to_tokens(token)
    return bytes(inverse[c] for c in piece) if all(c in inverse for c in piece) else piece.encode("utf-8")


def test_a_tokens_bytes_are_its_own_so_a_split_character_joins_back():
    """OpenAI's ``bytes``: a token that holds part of a character (its text alone is U+FFFD) carries that part,
    so a client joins the parts into the character."""
    texts = served_logprobs.TokenTexts(byte_tokenizer())
    ids = texts.tokenizer.encode("é😀", add_special_tokens=False)
    assert len(ids) == 6 and all(texts(i) == "\ufffd" for i in ids)
    entries = [served_logprobs.Entry(i, texts(i), -1.0, [], raw=texts.raw(i)) for i in ids]
    content = served_logprobs.chat(entries)["content"]
    assert b"".join(bytes(c["bytes"]) for c in content).decode("utf-8") == "é😀"


def test_chat_logprobs_through_the_sdk_equal_plain_decodings(client, engine, plain):
    tok = engine.target.tokenizer
    out = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0, logprobs=True,
                                         top_logprobs=3)
    want = plain(_chat_ids(tok, MSG), 16)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == len(want.output_ids)
    assert out.usage.model_dump()["spec_verify_ct"] >= 1  # it speculated
    for item, token, ref in zip(content, want.output_ids, want.logprobs):
        assert item.token == tok.decode([token]) and item.bytes == list(_raw(tok, token))
        assert item.logprob == pytest.approx(ref.logprob, abs=TOL)
        assert [t.token for t in item.top_logprobs] == [tok.decode([i]) for i, _ in ref.top]
        assert [t.logprob for t in item.top_logprobs] == pytest.approx([v for _, v in ref.top], abs=TOL)
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob)  # greedy: the chosen is the top
    plain_chat = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=0)
    assert plain_chat.choices[0].logprobs is None


def test_streamed_chat_logprobs_equal_non_streamed(server, client):
    body = {"messages": MSG, "max_tokens": 20, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    chunks = _events(server.url, "/v1/chat/completions", body)
    streamed = [c for ch in chunks for choice in ch["choices"] if choice["logprobs"]
                for c in choice["logprobs"]["content"]]
    assert streamed == whole["logprobs"]["content"] and len(streamed) == 20
    for ch in chunks:  # each chunk's logprobs are its delta's tokens' (text held back waits for the next)
        for choice in ch["choices"]:
            if choice["logprobs"] and choice["delta"].get("content"):
                assert "".join(c["token"] for c in choice["logprobs"]["content"]).endswith(choice["delta"]["content"])
    sdk = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0, logprobs=True,
                                              top_logprobs=2, stream=True))
    assert [c.token for ch in sdk if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content] \
        == [c["token"] for c in streamed]


def test_completion_logprobs_shape_and_values(server, client, engine, plain):
    tok = engine.target.tokenizer
    ids = tok("The quick brown fox").input_ids
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    want = plain(ids, 16)
    lp = out.choices[0].logprobs
    assert lp.tokens == [tok.decode([t]) for t in want.output_ids]
    assert lp.token_logprobs == pytest.approx([r.logprob for r in want.logprobs], abs=TOL)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(16)]
    for token, value, top, ref in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, want.logprobs):
        texts = {tok.decode([i]): v for i, v in reversed(ref.top)}  # the byte tokenizer: texts repeat ('\ufffd')
        assert top == pytest.approx({**texts, token: max(value, texts.get(token, value))}, abs=TOL)
        assert top[token] == max(top.values()) == value  # greedy: the chosen token is the most likely
    chunks = _events(server.url, "/v1/completions", {"prompt": ids, "max_tokens": 16, "temperature": 0,
                                                       "logprobs": 3, "ignore_eos": True})
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    joined = {k: [v for p in parts for v in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert joined == lp.model_dump()


def test_generate_return_logprob_in_sglangs_shape(server, engine, plain):
    tok = engine.target.tokenizer
    ids = tok("abab abab ab").input_ids
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True, "logprob_start_len": -1}
    r = httpx.post(server.url + "/generate", json=body, timeout=120).json()
    want = plain(ids, 12, 2)
    meta = r["meta_info"]
    assert r["output_ids"] == want.output_ids
    assert [e[1] for e in meta["output_token_logprobs"]] == r["output_ids"]
    assert [e[2] for e in meta["output_token_logprobs"]] == [tok.decode([t]) for t in r["output_ids"]]
    assert [e[0] for e in meta["output_token_logprobs"]] == pytest.approx([x.logprob for x in want.logprobs], abs=TOL)
    assert [[e[1] for e in top] for top in meta["output_top_logprobs"]] == [[i for i, _ in x.top]
                                                                            for x in want.logprobs]
    assert meta["input_token_logprobs"] == []
    last = _events(server.url, "/generate", body)[-1]["meta_info"]
    assert last["output_token_logprobs"] == meta["output_token_logprobs"]
    assert last["output_top_logprobs"] == meta["output_top_logprobs"]
    bare = httpx.post(server.url + "/generate", json={**body, "top_logprobs_num": 0, "return_text_in_logprobs": False},
                      timeout=120).json()["meta_info"]
    assert "output_top_logprobs" not in bare and all(e[2] is None for e in bare["output_token_logprobs"])


def test_sampled_logprobs_are_the_processed_distributions(server, engine):
    tok = engine.target.tokenizer
    ids = tok("The quick brown fox").input_ids
    params = SamplingParams(temperature=0.7, top_p=0.9)
    r = httpx.post(server.url + "/generate", timeout=120, json={
        "input_ids": ids, "return_logprob": True, "top_logprobs_num": 3, "sampling_params": {
            "max_new_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 11, "ignore_eos": True}}).json()
    out = r["output_ids"]
    with torch.no_grad():
        logits = engine.target.model(torch.tensor([ids + out[:-1]])).logits[0, len(ids) - 1:]
    ref = probs(logits, params).double().log().clamp(min=-9999.0)  # -inf is sent as -9999.0
    for j, (lp, token) in enumerate(zip(r["meta_info"]["output_token_logprobs"], out)):
        assert lp[1] == token and lp[0] == pytest.approx(ref[j, token].item(), abs=TOL)
        top = r["meta_info"]["output_top_logprobs"][j]
        assert [e[0] for e in top] == pytest.approx(ref[j].topk(3).values.tolist(), abs=TOL)


def test_rows_with_and_without_logprobs_side_by_side_give_their_solo_outputs(server, engine, reference):
    tok = engine.target.tokenizer
    prompts = [tok(p).input_ids for p in ("hello there, how", "The quick brown fox", "abab abab ab", "once upon")]

    def ask(i):
        extra = {"logprobs": 2} if i % 2 else {}
        return httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": prompts[i], "max_tokens": 24, "temperature": 0, "ignore_eos": True, **extra}).json()

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(ask, range(4)))
    want = reference(prompts, 24, ignore_eos=True)
    for i, (out, w) in enumerate(zip(outs, want)):
        choice = out["choices"][0]
        assert choice["text"] == tok.decode(w, skip_special_tokens=True)
        assert (choice["logprobs"] is None) == (i % 2 == 0)
        if choice["logprobs"]:
            assert choice["logprobs"]["tokens"] == [tok.decode([t]) for t in w]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 25}, "top_logprobs_num"),
    ("/generate", {"text": "a", "top_logprobs_num": 2}, "top_logprobs_num"),
    ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": -5}, "logprob_start_len"),
])
def test_out_of_range_logprobs_fields_are_refused_by_name(server, path, body, param):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
    if "21" in json.dumps(body) or "25" in json.dumps(body):
        assert "[0, 20]" in err["message"]
