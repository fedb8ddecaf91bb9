"""Inputs at the edges of what JSON can carry: each is the client's 4xx (never a 500), refused before
anything is generated, and the server carries on; a stream that fails mid-way still ends properly."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import threading
import time

import httpx
import pytest
from serve_helpers import scrape

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
GEN = "/generate"
MSG = [{"role": "user", "content": "hi"}]
I64 = 2**63 - 1


def raw(body: dict, **spliced: str) -> bytes:
    """``body`` as JSON with each ``"@name"`` string value replaced by the raw JSON text ``spliced[name]``
    (to send what ``json.dumps`` will not write, such as a lone ``\\ud800`` escape or 1e999)."""
    text = json.dumps(body)
    for name, value in spliced.items():
        text = text.replace(json.dumps("@" + name), value)
    return text.encode()


DEEP = "[" * 100_000 + "]" * 100_000
CASES = [
    # (id, path, raw body, status, words the message must contain, param (or how it begins))
    ("nesting past the recursion limit", CHAT, raw({"messages": MSG, "metadata": "@x"}, x=DEEP), 400,
     "nested deeper than 64", None),
    ("nesting past 64 levels", CHAT, raw({"messages": MSG, "chat_template_kwargs": {"a": "@x"}},
                                          x="[" * 70 + "]" * 70), 400, "nested deeper than 64",
     "chat_template_kwargs.a.0.0.0"),
    ("seed past 2^63", CHAT, raw({"messages": MSG, "seed": "@x"}, x=str(2**63)), 400, "64-bit", "seed"),
    ("seed below -2^63", COMP, raw({"prompt": "a", "seed": "@x"}, x=str(-(2**63) - 1)), 400, "64-bit", "seed"),
    ("seed of 2^200", GEN, raw({"text": "a", "sampling_params": {"seed": "@x"}}, x=str(2**200)), 400, "64-bit",
     "sampling_params.seed"),
    ("seed + n overflows", COMP, raw({"prompt": "a", "seed": I64, "n": 3, "max_tokens": 2}), 400,
     "no room for n=3", "seed"),
    ("generate seed + n overflows", GEN, raw({"text": "a", "sampling_params": {"seed": I64 - 1, "n": 3}}), 400,
     "no room for n=3", "sampling_params.seed"),
    ("5000-digit integer", COMP, raw({"prompt": "a", "max_tokens": "@x"}, x="9" * 5000), 400, "not valid JSON",
     None),
    ("NaN temperature", CHAT, raw({"messages": MSG, "temperature": "@x"}, x="NaN"), 400, "finite",
     "temperature"),
    ("Infinity top_p", COMP, raw({"prompt": "a", "top_p": "@x"}, x="Infinity"), 400, "finite", "top_p"),
    ("1e999 temperature", GEN, raw({"text": "a", "sampling_params": {"temperature": "@x"}}, x="-1e999"), 400,
     "finite", "sampling_params.temperature"),
    ("lone surrogate in chat content", CHAT, raw({"messages": [{"role": "user", "content": "@x"}]}, x='"a\\ud800"'),
     400, "surrogate", "messages.0.content"),
    ("lone surrogate in a content part", CHAT,
     raw({"messages": [{"role": "user", "content": [{"type": "text", "text": "@x"}]}]}, x='"\\udfff"'), 400,
     "surrogate", "messages.0.content.0.text"),
    ("lone surrogate in a prompt", COMP, raw({"prompt": ["ok", "@x"]}, x='"\\udc00\\ud800"'), 400, "surrogate",
     "prompt.1"),
    ("lone surrogate in generate text", GEN, raw({"text": "@x"}, x='"x\\ud83d"'), 400, "surrogate", "text"),
    ("lone surrogate in a rid", GEN, raw({"text": "a", "rid": "@x"}, x='"\\ud800"'), 400, "surrogate", "rid"),
    ("lone surrogate in a streamed rid", GEN, raw({"text": "a", "rid": "@x", "stream": True}, x='"\\ud800"'), 400,
     "surrogate", "rid"),
    ("lone surrogate in a stop string", COMP, raw({"prompt": "a", "stop": ["@x"]}, x='"\\ud800"'), 400,
     "surrogate", "stop.0"),
    ("lone surrogate in a key", CHAT, raw({"messages": MSG, "metadata": {"@x": "v"}}, x='"\\ud800"'), 400,
     "surrogate", "metadata"),
    ("a chat template brought by the request", CHAT,
     raw({"messages": MSG, "chat_template_kwargs": {"chat_template": "{% for i in range(99999) %}"
                                                                     "{% for j in range(99999) %}x{% endfor %}"
                                                                     "{% endfor %}"}}), 400,
     "cannot bring its own chat template", "chat_template_kwargs.chat_template"),
    # n is bounded (--max-n) before anything sized by it is made (a 2^40 rid list once hung the event loop)
    ("generate n of 2^40", GEN, raw({"text": "a", "sampling_params": {"n": 2**40}}), 400, "--max-n",
     "sampling_params.n"),
    ("completions n of 2^40", COMP, raw({"prompt": "a", "n": 2**40}), 400, "--max-n", "n"),
    ("chat n of 2^40", CHAT, raw({"messages": MSG, "n": 2**40, "stream": True}), 400, "--max-n", "n"),
    ("invalid role", CHAT, raw({"messages": [{"role": "wizard", "content": "hi"}]}), 400,
     "'system', 'developer', 'user', 'assistant', 'tool', got \"wizard\"", "messages.0.role"),
    # logprob_start_len is a prompt position (SGLang aborts one at or past the end): not a silently empty list
    ("logprob_start_len at the prompt's end", GEN, raw({"input_ids": [1, 2, 3], "return_logprob": True,
                                                       "logprob_start_len": 3}), 400,
     "past the end of the prompt, which has 3 tokens; send a position from 0 to 2", "logprob_start_len"),
    ("logprob_start_len past a streamed prompt", GEN, raw({"text": "hi", "return_logprob": True, "stream": True,
                                                          "logprob_start_len": 10**6}), 400,
     "past the end of the prompt", "logprob_start_len"),
    ("logprob_start_len past a batch's shorter prompt", GEN,
     raw({"input_ids": [[1, 2, 3, 4], [5, 6]], "return_logprob": True, "logprob_start_len": 2}), 400,
     "past the end of prompt 1, which has 2 tokens", "logprob_start_len"),
    # rid: a string, or a list of one id per prompt (or per output)
    ("rid list longer than the batch", GEN, raw({"text": ["a", "b"], "rid": ["x", "y", "z"]}), 400,
     "rid has 3 ids, but the request has 2 prompts: send a list of 2 (one per prompt) ids", "rid"),
    ("rid list for a batch with n", GEN, raw({"input_ids": [[1], [2]], "rid": ["x", "y", "z"],
                                              "sampling_params": {"n": 2}}), 400,
     "2 prompts x sampling_params.n=2: send a list of 2 (one per prompt) or 4 (one per output) ids", "rid"),
    ("rid list for a single prompt", GEN, raw({"text": "a", "rid": ["x", "y"], "stream": True}), 400,
     "rid has 2 ids, but the request has 1 prompt:", "rid"),
    ("empty rid list", GEN, raw({"text": "a", "rid": []}), 400, "rid has 0 ids", "rid"),
]


@pytest.mark.parametrize("path,body,status,words,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_edge_input_is_a_4xx_and_nothing_runs(server, path, body, status, words, param):
    before = scrape(server.url)
    r = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert words in err["message"], err
    assert err["param"] == param or param and err["param"].startswith(param), err["param"]
    after = scrape(server.url)
    for key in ('eyas:requests_total{outcome="error"}', "eyas:prompt_tokens_total"):  # no 5xx, nothing prefilled
        assert after.get(key, 0) == before.get(key, 0), key
    ok = httpx.post(server.url + COMP, json={"prompt": "hello", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_values_at_the_edges_that_are_valid_are_served(server):
    """The bounds are the engine's, not tighter: the extreme seeds, a surrogate pair (one real character)."""
    for seed, n in ((I64, 1), (I64 - 1, 2), (-(2**63), 3)):
        r = httpx.post(server.url + COMP, json={"prompt": "a", "seed": seed, "n": n, "max_tokens": 2,
                                                "temperature": 1.0}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == n, r.text
    body = raw({"messages": [{"role": "user", "content": "@x"}], "max_tokens": 2}, x='"smile \\ud83d\\ude00"')
    r = httpx.post(server.url + CHAT, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    deep = {"a": {"b": [[[["nested, but well within the bound"]]]]}}
    r = httpx.post(server.url + CHAT, json={"messages": MSG, "max_tokens": 2, "chat_template_kwargs": deep}, timeout=60)
    assert r.status_code == 200, r.text


def test_generate_rids_and_logprob_start_len_within_bounds_are_served(server):
    """rid: one per prompt is each prompt's n outputs' (-0, -1, ...), a string every output's; the last prompt
    position is a valid logprob_start_len (one entry), and without return_logprob it is not looked at (SGLang)."""
    sp = {"max_new_tokens": 2, "n": 2}
    for rid, ids in ((["x", "y"], ["x-0", "x-1", "y-0", "y-1"]), (["a", "b", "c", "d"], ["a", "b", "c", "d"]),
                     ("r", ["r-0", "r-1", "r-2", "r-3"])):
        r = httpx.post(server.url + GEN, json={"input_ids": [[1, 2], [3]], "rid": rid, "sampling_params": sp},
                       timeout=60)
        assert r.status_code == 200 and [o["meta_info"]["id"] for o in r.json()] == ids, r.text[:500]
    body = {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 2,
            "sampling_params": {"max_new_tokens": 1}}
    r = httpx.post(server.url + GEN, json=body, timeout=60)
    assert r.status_code == 200 and [e[1] for e in r.json()["meta_info"]["input_token_logprobs"]] == [3], r.text[:500]
    r = httpx.post(server.url + GEN, json={**body, "return_logprob": False, "logprob_start_len": 99}, timeout=60)
    assert r.status_code == 200, r.text[:500]


def patched_tokenizer(**methods):
    """A ``wrap`` for ``inprocess``: the real engine, its tokenizer's ``methods`` replaced (in every copy
    the server makes of it too); ``base(self)`` is the original class, for calling through."""

    class Patched:
        def __init__(self, engine):
            self._engine = engine
            tok = copy.deepcopy(engine.target.tokenizer)
            tok.__class__ = type("Patched" + type(tok).__name__, (type(tok),), methods)
            self.target = copy.copy(engine.target)
            self.target.tokenizer = tok

        def __getattr__(self, name):
            return getattr(self._engine, name)

    return Patched


def base(tok):
    return type(tok).__mro__[1]


# every output decodes to text with a lone surrogate, which cannot be written as UTF-8: a stream
# fails mid-way, after its first events were sent
SurrogateOutput = patched_tokenizer(
    decode=lambda self, ids, **kw: base(self).decode(self, ids, **kw) + ("\ud800" if len(ids) > 1 else ""))


@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": MSG, "max_tokens": 12, "ignore_eos": True, "stream": True}),
    (GEN, {"text": "abc", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}, "stream": True}),
])
def test_a_stream_that_fails_mid_way_ends_with_an_error_and_done(inprocess, path, body, caplog):
    with inprocess(wrap=SurrogateOutput) as srv, caplog.at_level(logging.INFO, logger="eyas.serve.requests"):
        with httpx.stream("POST", srv.url + path, json=body, timeout=60) as s:
            assert s.status_code == 200
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "internal_error" and "UnicodeEncodeError" in error["message"]
        assert scrape(srv.url)['eyas:requests_total{outcome="error"}'] == 1
        time.sleep(0.2)
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "eyas.serve.requests"]
    mine = [line for line in logged if line["path"] == path]
    assert len(mine) == 1 and mine[0]["outcome"] == "error" and "UnicodeEncodeError" in mine[0]["error"], mine


def _slow_render(self, messages, *a, **kw):
    if any("SLOW" in str(m.get("content")) for m in messages):
        time.sleep(3.0)  # a stand-in for a big prompt's template and tokenizing, on whatever thread renders
    return base(self).apply_chat_template(self, messages, *a, **kw)


def test_a_failure_while_reading_a_request_is_a_400(inprocess):
    """The catch-all: an exception no check foresaw, raised while the request is read, is the client's 400."""
    def tokenize(self, text, *a, **kw):
        if "BOOM" in text:
            raise RuntimeError("the tokenizer choked on BOOM")
        return base(self).__call__(self, text, *a, **kw)

    with inprocess(wrap=patched_tokenizer(__call__=tokenize)) as srv:
        r = httpx.post(srv.url + COMP, json={"prompt": "BOOM", "max_tokens": 2}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_request" and "RuntimeError: the tokenizer choked on BOOM" in err["message"]
        assert httpx.post(srv.url + COMP, json={"prompt": "fine", "max_tokens": 2}, timeout=60).status_code == 200


def test_parsing_runs_off_the_event_loop(inprocess):
    """While one request's prompt is being prepared, /health answers at once and a running stream flows."""
    with inprocess(step_delay=0.03, wrap=patched_tokenizer(apply_chat_template=_slow_render)) as srv:
        stamps, slow = [], {}
        body = {"messages": MSG, "max_tokens": 900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + CHAT, json=body, timeout=60) as s:
            lines = s.iter_lines()
            next(lines)

            def call():
                slow["start"] = time.monotonic()
                slow["r"] = httpx.post(srv.url + CHAT, json={"messages": [{"role": "user", "content": "SLOW"}],
                                                             "max_tokens": 2}, timeout=60)
                slow["end"] = time.monotonic()

            t = threading.Thread(target=call)
            t.start()
            time.sleep(0.5)
            start = time.monotonic()
            health = httpx.get(srv.url + "/health", timeout=60)
            health_s = time.monotonic() - start
            for _line in lines:
                stamps.append(time.monotonic())
                if "end" in slow:
                    break
            t.join(60)
        assert slow["r"].status_code == 200 and slow["end"] - slow["start"] >= 3.0
        assert health.status_code == 200 and health_s < 1.0, health_s
        during = [b - a for a, b in itertools.pairwise(stamps) if slow["start"] < a < slow["end"]]
        assert len(during) > 10 and max(during) < 1.0, (len(during), max(during, default=None))


def test_a_prompt_too_long_to_fit_is_refused_before_tokenizing(server):
    """A 3.9 MB chat body (under the 4 MiB limit): refused by its length at once, the server stays
    responsive and keeps no memory from it."""
    big = {"messages": [{"role": "user", "content": "word " * 780_000}], "max_tokens": 2}
    rss = server.rss_kb()
    for _ in range(4):
        start = time.monotonic()
        r = httpx.post(server.url + CHAT, json=big, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
        assert "characters" in r.json()["error"]["message"]
        assert time.monotonic() - start < 5.0
    assert server.rss_kb() - rss < 100 * 1024
    start = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - start < 1.0
    ok = httpx.post(server.url + COMP, json={"prompt": "x" * 900, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200  # a long prompt that fits is still served


def test_a_request_slow_to_prepare_does_not_hold_the_others_behind_it(inprocess):
    """One body that takes seconds to render (a few MB of messages) must not delay the next request's preparing."""
    with inprocess(wrap=patched_tokenizer(apply_chat_template=_slow_render)) as srv:
        slow = {}

        def call():
            slow["r"] = httpx.post(srv.url + CHAT, json={"messages": [{"role": "user", "content": "SLOW"}],
                                                         "max_tokens": 2}, timeout=60)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.5)  # the slow one is rendering now (3 s)
        start = time.monotonic()
        quick = httpx.post(srv.url + CHAT, json={"messages": MSG, "max_tokens": 2}, timeout=60)
        took = time.monotonic() - start
        t.join(60)
        assert quick.status_code == 200 and slow["r"].status_code == 200
        assert took < 2.0, took  # behind the slow one it took 2.5 s or more


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "SLOW"}] * 2000,  # more messages than the 1024 tokens of the context
    [{"role": "user", "content": "SLOW " * 300_000}, {"role": "user", "content": [{"type": "text", "text": "a"}]}],
])
def test_messages_that_cannot_fit_are_refused_before_they_are_rendered(inprocess, messages):
    with inprocess(wrap=patched_tokenizer(apply_chat_template=_slow_render)) as srv:
        start = time.monotonic()
        r = httpx.post(srv.url + CHAT, json={"messages": messages, "max_tokens": 2}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
        assert r.json()["error"]["param"] == "messages"
        assert time.monotonic() - start < 2.5  # the render would have slept 3 s


def test_a_default_max_tokens_that_does_not_fit_is_named_as_the_default(server):
    """A completion's default max_tokens (16) past the context: the 400 says it was the default, not the client's."""
    context = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    prompt = [5] * (context - 4)
    cases = (({}, ("its default", "set max_tokens")), ({"max_tokens": 8}, ("asks for 8", "lower max_tokens")))
    for body, words in cases:
        r = httpx.post(server.url + COMP, json={"prompt": prompt, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text[:300]
        message = r.json()["error"]["message"]
        assert all(w in message for w in words) and ("default" in message) == (not body), message


def test_a_request_that_fits_the_context_gets_every_token_it_asks_for(server):
    """prompt + max_tokens = max_model_len: every token comes back (a server that stopped a tree short of the
    context cut such a request with a 200 and "length"), and a chat answer with no max_tokens runs to the end."""
    context = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    r = httpx.post(server.url + COMP, json={"prompt": [5] * (context - 6), "max_tokens": 6, "ignore_eos": True,
                                            "temperature": 0}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6, r.text[:300]
    r = httpx.post(server.url + COMP, json={"prompt": [5] * (context - 1), "max_tokens": 1}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text[:300]


def test_a_developer_message_is_a_system_one_unless_the_template_knows_developer():
    """OpenAI's newer name for system instructions: a template without it (SmolLM2's) would render an unknown turn
    and add its own default system prompt; one that names it (gpt-oss's) gets it as sent."""
    from helpers import byte_tokenizer

    from eyas.serve.inputs import chat_prompt
    from eyas.serve.protocol import ChatCompletionRequest

    tok = byte_tokenizer()

    def render(role: str) -> list[int]:
        messages = [{"role": role, "content": "Be brief."}, {"role": "user", "content": "hi"}]
        return chat_prompt(tok, ChatCompletionRequest(messages=messages))

    assert "developer" not in tok.chat_template and render("developer") == render("system")
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'developer' %}[dev]{% endif %}{{ m.content }}"
                         "{% endfor %}")
    assert render("developer") != render("system")


def test_a_text_part_with_other_keys_is_its_text():
    """LiteLLM and Anthropic-style clients mark parts with ``cache_control``: the part is its text, as in vLLM
    (a 400 that said parts must be "each with its text" misnamed the problem)."""
    from helpers import byte_tokenizer

    from eyas.serve.inputs import chat_prompt
    from eyas.serve.protocol import ChatCompletionRequest

    tok = byte_tokenizer()
    marked = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    plain = chat_prompt(tok, ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]))
    assert chat_prompt(tok, ChatCompletionRequest(messages=[{"role": "user", "content": [marked]}])) == plain


def test_suffix_and_best_of_pass_at_their_neutral_values_and_are_refused_otherwise(server):
    """No insertion mode and no best-of here: a non-empty suffix and best_of above 1 are 400s that name the field
    (never silently ignored); the neutral values clients send (``suffix: ""``, ``best_of: 1``) pass."""
    for extra, status in (({"suffix": ""}, 200), ({"best_of": 1}, 200), ({"suffix": "end"}, 400),
                          ({"best_of": 2}, 400)):
        r = httpx.post(server.url + COMP, json={"prompt": "hi", "max_tokens": 1, **extra}, timeout=60)
        assert r.status_code == status, (extra, r.text[:300])
        if status == 400:
            assert r.json()["error"]["param"] == next(iter(extra)), r.text
