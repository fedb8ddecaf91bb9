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
