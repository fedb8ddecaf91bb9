"""Edges of the OpenAI API that clients hit: models.retrieve, 408s the SDK must not retry, nulls for n and
stream, and OpenAI's temperature range on its routes (SGLang's /generate keeps eyas's own)."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_retrieve_through_the_sdk(client, server, models):
    card = client.models.retrieve("tiny")
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "eyas")
    assert card.model_dump()["max_model_len"] == client.models.list().data[0].model_dump()["max_model_len"]
    by_path = client.models.retrieve(str(models[0]))  # the --model-path is served too, '/' and all
    assert by_path.id == "tiny"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert "'gpt-4o' does not exist; this server serves 'tiny'" in str(e.value)
    assert e.value.body["code"] == "model_not_found"


def test_a_timed_out_request_is_not_retried_by_the_sdk(inprocess):
    from eyas.serve.limits import Limits

    sent = []
    http = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    with inprocess(step_delay=0.05, limits=Limits(request_timeout=0.3)) as srv:
        sdk = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", http_client=http)  # default: 2 retries
        with pytest.raises(openai.APIStatusError) as e:
            sdk.completions.create(model="tiny", prompt="hello", max_tokens=200, temperature=0, extra_body={
                "ignore_eos": True})
    assert e.value.status_code == 408 and e.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/completions"]  # once: the SDK would have sent it three times


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
])
def test_n_and_stream_accept_null(server, path, body):
    r = httpx.post(server.url + path, json={**body, "n": None, "stream": None, "max_tokens": 3, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert len(r.json()["choices"]) == 1


def test_temperature_is_bounded_to_openais_range_on_openai_routes(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "hi", "max_tokens": 2})):
        r = httpx.post(server.url + path, json={**body, "temperature": 2.5}, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "temperature" and "[0, 2]" in error["message"]
        assert httpx.post(server.url + path, json={**body, "temperature": 2.0}, timeout=60).status_code == 200
    r = httpx.post(server.url + "/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 2, "temperature": 2.5}}, timeout=60)
    assert r.status_code == 200, r.text  # SGLang's route: eyas's own bound


@pytest.mark.parametrize("fields", [
    {"audio": None, "modalities": ["text"], "reasoning_effort": None, "verbosity": None, "functions": None,
     "function_call": None, "web_search_options": None},
    {"prediction": {"type": "content", "content": "hello"}, "prompt_cache_key": "k", "safety_identifier": "u"},
])
def test_openai_fields_with_neutral_values_are_served(client, fields):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       temperature=0, extra_body=fields)
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("fields, param, words", [
    ({"modalities": ["text", "audio"]}, "modalities", "text only"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "text only"),
    ({"reasoning_effort": "high"}, "reasoning_effort", "chat_template_kwargs"),
    ({"web_search_options": {}}, "web_search_options", "no web search"),
    ({"functions": [{"name": "f"}]}, "functions", "'tools'"),
])
def test_openai_fields_eyas_has_not_got_are_named(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body=fields)
    assert e.value.param == param and words in e.value.message, e.value.message


def test_every_operation_id_in_the_openapi_document_is_unique(inprocess, recwarn):
    """OpenAPI requires it (client generators name methods by it); GET and HEAD /health once shared one."""
    import collections

    with inprocess() as srv:
        doc = httpx.get(srv.url + "/openapi.json", timeout=60).json()
    ids = collections.Counter(op["operationId"] for ops in doc["paths"].values() for op in ops.values())
    assert [i for i, count in ids.items() if count > 1] == []
    assert not [w for w in recwarn if "Duplicate Operation ID" in str(w.message)]


def test_head_answers_wherever_get_does(inprocess):
    """RFC 9110; uptime probes and load balancers send HEAD: GET's status and headers, no body."""
    with inprocess() as srv:
        for path in ("/health", "/v1/models", "/metrics", "/version", "/server_info", "/dashboard", "/openapi.json"):
            get, head = httpx.get(srv.url + path, timeout=60), httpx.head(srv.url + path, timeout=60)
            assert head.status_code == get.status_code == 200 and head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
        refused = httpx.head(srv.url + "/v1/chat/completions", timeout=60)
        assert refused.status_code == 405 and refused.content == b""
        assert httpx.head(srv.url + "/no/such/route", timeout=60).status_code == 404


def test_a_trailing_slash_is_the_same_route_not_a_redirect(inprocess):
    """A 307 to the slash-less path loses the body with clients that do not re-POST it: the route answers."""
    with inprocess(api_key="k") as srv, httpx.Client(base_url=srv.url, timeout=60, follow_redirects=False) as c:
        key = {"Authorization": "Bearer k"}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for path, body in [("/v1/chat/completions/", chat),
                           ("/v1/completions/", {"prompt": "hi", "max_tokens": 2}),
                           ("/v1/responses/", {"input": "hi", "max_output_tokens": 2}),
                           ("/generate/", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})]:
            r = c.post(path, json=body, headers=key)
            assert r.status_code == 200, (path, r.status_code, r.text)
            assert c.post(path, json=body).status_code == 401  # the key is still needed
        assert c.get("/v1/models/", headers=key).json()["data"][0]["id"] == "tiny"
        assert c.get("/health/").status_code == 200  # open, as /health is


VLLM_NEUTRAL = {"use_beam_search": False, "length_penalty": 1.0, "priority": 0, "truncate_prompt_tokens": None,
                "spaces_between_special_tokens": True, "return_tokens_as_token_ids": False, "bad_words": [],
                "allowed_token_ids": None, "logits_processors": None, "kv_transfer_params": None,
                "vllm_xargs": None, "cache_salt": "s", "request_id": "abc-1"}


@pytest.mark.parametrize("path, body, chat_only, prefix", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
     {"echo": False, "prompt_logprobs": None, "documents": None, "mm_processor_kwargs": None}, "chatcmpl-"),
    ("/v1/completions", {"prompt": "hi"}, {}, "cmpl-"),
])
def test_a_whole_vllm_request_body_is_served(server, path, body, chat_only, prefix):
    """A client built for vLLM sends its extensions at their neutral values: served, and the response's id is
    the request's request_id, as vLLM's."""
    r = httpx.post(server.url + path, json={**body, **VLLM_NEUTRAL, **chat_only, "max_tokens": 2, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == prefix + "abc-1"
    r = httpx.post(server.url + path, json={**body, "request_id": "abc-1", "max_tokens": 1},
                   headers={"X-Request-Id": "trace-7"}, timeout=60)
    assert r.json()["id"] == prefix + "trace-7" and r.headers["x-request-id"] == "trace-7"  # the header wins
    ids = {httpx.post(server.url + path, json={**body, "max_tokens": 1}, timeout=60).json()["id"] for _ in range(2)}
    assert len(ids) == 2 and all(i.startswith(prefix) for i in ids)


@pytest.mark.parametrize("fields, param, words", [
    ({"use_beam_search": True}, "use_beam_search", "no beam search"),
    ({"priority": 5}, "priority", "order they come"),
    ({"truncate_prompt_tokens": 10}, "truncate_prompt_tokens", "never cut"),
    ({"bad_words": ["x"]}, "bad_words", "logit_bias"),
    ({"allowed_token_ids": [1, 2]}, "allowed_token_ids", "structured-output"),
    ({"echo": True}, "echo", "/v1/completions"),
    ({"prompt_logprobs": 1}, "prompt_logprobs", "/v1/completions"),
])
def test_vllm_extensions_eyas_has_not_got_are_named(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body=fields)
    assert e.value.param == param and words in e.value.message, e.value.message


def test_add_special_tokens_tokenizes_the_prompt_as_tokenize_does(server):
    """vLLM's add_special_tokens: a completion's prompt with the tokenizer's special tokens unless false, a chat's
    with them on top of the template only when true; usage counts what /tokenize counts for the same choice."""
    for special in (True, False):
        count = httpx.post(server.url + "/tokenize", json={"prompt": "hello there", "add_special_tokens": special},
                           timeout=60).json()["count"]
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 1,
                                                             "add_special_tokens": special}, timeout=60)
        assert r.json()["usage"]["prompt_tokens"] == count
        msgs = [{"role": "user", "content": "hello"}]
        r = httpx.post(server.url + "/tokenize", json={"messages": msgs, "add_special_tokens": special}, timeout=60)
        assert r.status_code == 200, r.text
        count = r.json()["count"]
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 1,
                                                                  "add_special_tokens": special}, timeout=60)
        assert r.json()["usage"]["prompt_tokens"] == count


def test_documents_reach_the_chat_template(engine):
    """vLLM's ``documents``: Hugging Face's retrieval-augmented templates read them beside the messages."""
    import copy

    from eyas.serve.inputs import chat_prompt
    from eyas.serve.protocol import ChatCompletionRequest

    tok = copy.deepcopy(engine.target.tokenizer)
    tok.chat_template = ("{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
                         "{% for m in messages %}{{ m.content }}{% endfor %}")
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "q"}],
                                documents=[{"title": "T", "text": "the doc"}])
    assert tok.decode(chat_prompt(tok, req)) == "[T: the doc]q"
    assert tok.decode(chat_prompt(tok, ChatCompletionRequest(messages=[{"role": "user", "content": "q"}]))) == "q"


def test_add_special_tokens_is_the_tokenizers_own_on_top_of_the_text(engine):
    """With a tokenizer that writes a BOS (the tiny one writes none): a completion's prompt gets it unless
    add_special_tokens is false; a chat's rendered prompt only when it is true (the template wrote its own)."""
    from types import SimpleNamespace

    from eyas.serve.inputs import chat_prompt, text_prompts
    from eyas.serve.protocol import ChatCompletionRequest

    class WithBos:
        def __init__(self, tok):
            self.tok = tok

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def __call__(self, text, add_special_tokens=True):
            return SimpleNamespace(input_ids=[7] * add_special_tokens + self.tok(text, add_special_tokens=False)
                                   .input_ids)

    tok = WithBos(engine.target.tokenizer)
    assert text_prompts(tok, "hi", "prompt")[0][0] == 7 and text_prompts(tok, "hi", "prompt", None, True)[0][0] == 7
    assert text_prompts(tok, "hi", "prompt", None, False)[0][0] != 7
    msgs = [{"role": "user", "content": "hi"}]
    plain = chat_prompt(tok, ChatCompletionRequest(messages=msgs))
    assert chat_prompt(tok, ChatCompletionRequest(messages=msgs, add_special_tokens=False)) == plain
    assert chat_prompt(tok, ChatCompletionRequest(messages=msgs, add_special_tokens=True)) == [7, *plain]
