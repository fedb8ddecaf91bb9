"""Structured output and tools over real HTTP on loopback (in-process app, the tiny float64 pair).

response_format answers parse and match their schema; SGLang's regex on /generate holds; tool_choice
required and named come back as tool_calls the ``openai`` SDK parses (streamed too); auto parses a
Hermes-style call; a history with tool calls and tool results renders through a template that knows
tools and through one that does not (the calls written as <tool_call> blocks), and one that cannot render
is a 400 with no template text; a bad schema is a 400 while another request streams on untouched.
"""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
from serve_helpers import InProcessServer

from eyas.serve.app import ServeOptions, create_app
from eyas.serve.tools import ToolPlan, ToolStream, parse_auto, tool_delta, tool_message

SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "the weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
TOOL_TEMPLATE = (  # a Hermes-style template: tools in a system turn, calls as <tool_call> blocks
    "{% if tools %}<|im_start|>system\ntools: {{ tools | map(attribute='function.name') | join(', ') }}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MSG = [{"role": "user", "content": "weather?"}]


@pytest.fixture(scope="module")
def served(engine):
    app = create_app(engine, ServeOptions(served_model_name="tiny", log_interval=0))
    for tok in app.state.eyas.prepare.tokenizers:  # the preparer's own tokenizer copies
        tok.chat_template = TOOL_TEMPLATE
    with InProcessServer(app) as s:
        yield s


@pytest.fixture(scope="module")
def plain_template(engine):
    with InProcessServer(create_app(engine, ServeOptions(served_model_name="tiny", log_interval=0))) as s:
        yield s


STRICT_TEMPLATE = (  # refuses any role but system, user and assistant, as some models' templates do
    "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Conversation roles must be system, user or assistant') }}{% endif %}"
    "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def strict_template(engine):
    app = create_app(engine, ServeOptions(served_model_name="tiny", log_interval=0))
    for tok in app.state.eyas.prepare.tokenizers:
        tok.chat_template = STRICT_TEMPLATE
    with InProcessServer(app) as s:
        yield s


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def _chat(server, **kw) -> httpx.Response:
    return _post(server, "/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 80, **kw})


def test_json_schema_and_json_object_answers_parse(served):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    for route, body in [("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})]:
        for seed in range(3):
            r = _post(served, route, {**body, "max_tokens": 40, "temperature": 1.0, "seed": seed,
                                      "response_format": fmt})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            assert choice["finish_reason"] == "stop"
            assert json.loads(text)["city"] in ("Paris", "Rome") and set(json.loads(text)) == {"city"}
    # any JSON object: a bias toward "}" ends the random model's object at once
    r = _chat(served, response_format={"type": "json_object"}, logit_bias={"125": 40})
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {}


def test_generate_regex_and_json_schema(served, engine):
    r = _post(served, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                                       "regex": "(ab|cd)+x[0-9]"}})
    assert re.fullmatch("(ab|cd)+x[0-9]", r.json()["text"]), r.json()
    r = _post(served, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                                       "json_schema": json.dumps(SCHEMA)}})
    assert json.loads(r.json()["text"])["city"] in ("Paris", "Rome")


def test_tool_choice_required_and_named_through_the_openai_sdk(served):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", timeout=120, max_retries=0)
    for choice in ["required", {"type": "function", "function": {"name": "time"}}]:
        out = client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice=choice,
                                             temperature=0, max_tokens=80)
        c = out.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        call = c.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        args = json.loads(call.function.arguments)
        if isinstance(choice, dict):
            assert call.function.name == "time" and args["zone"] in ("UTC", "CET")
        else:
            assert call.function.name in ("weather", "time") and set(args) <= {"city", "zone"}
        # streamed, in OpenAI's delta shape: a named call as it is written (id and name first, then the arguments
        # piece by piece), "required"'s calls whole once the array closes; then a chunk with the finish_reason
        chunks = [ch.choices[0] for ch in client.chat.completions.create(
            model="tiny", messages=MSG, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=80, stream=True)
            if ch.choices]
        assert [c.finish_reason for c in chunks][-2:] == [None, "tool_calls"] and not chunks[-1].delta.tool_calls
        pieces = [t for c in chunks if c.delta.tool_calls for t in c.delta.tool_calls]
        assert len(pieces) > (1 if isinstance(choice, dict) else 0) and pieces[0].id.startswith("call_")
        assert pieces[0].function.name == call.function.name and all(p.index == 0 for p in pieces)
        assert "".join(p.function.arguments for p in pieces) == call.function.arguments
        # the SDK's stream helper sees the call end (it needs the call before the chunk that ends it)
        with client.chat.completions.stream(model="tiny", messages=MSG, tools=TOOLS, tool_choice=choice,
                                            temperature=0, max_tokens=80) as stream:
            done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        assert [(e.name, e.arguments) for e in done] == [(call.function.name, call.function.arguments)]


def test_tool_history_renders_and_auto_and_none_generate_freely(served, plain_template, strict_template):
    history = MSG + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    for tc in ("auto", "none"):
        r = _post(served, "/v1/chat/completions", {"messages": history, "tools": TOOLS, "tool_choice": tc,
                                                   "temperature": 0, "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
    r = _post(plain_template, "/v1/chat/completions", {"messages": history, "tools": TOOLS, "max_tokens": 8,
                                                       "tool_choice": "required"})
    assert r.status_code == 200, r.text  # a template with no tool format: the calls go in as <tool_call> text
    # ... but the tools themselves never reach the model: "auto" would answer in prose, so it is refused
    r = _post(plain_template, "/v1/chat/completions", {"messages": MSG, "tools": TOOLS, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "does not show 'tools'" in r.json()["error"]["message"] and "'required'" in r.json()["error"]["message"]
    r = _post(plain_template, "/tokenize", {"messages": MSG, "tools": TOOLS})
    assert r.status_code == 200, r.text  # counting the prompt is no request for a call
    r = _post(strict_template, "/v1/chat/completions", {"messages": history, "tools": TOOLS, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    message = r.json()["error"]["message"]
    assert "could not render" in message and "tools" in message
    assert "jinja" not in message.lower() and "undefined" not in message.lower()


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
])
def test_bad_structured_requests_are_400s(served, body, param):
    r = _chat(served, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    r = _post(served, "/generate", {"text": "hi", "sampling_params": {"regex": "[a-"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.regex"


def test_a_bad_schema_leaves_a_running_stream_untouched(served, reference, engine):
    prompt = engine.target.tokenizer("steady").input_ids
    lines = []

    def stream():
        with httpx.stream("POST", served.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 24,
                                                                        "temperature": 0, "stream": True,
                                                                        "ignore_eos": True}, timeout=120) as r:
            lines.extend(r.iter_lines())

    t = threading.Thread(target=stream)
    t.start()
    for _ in range(3):
        bad = _chat(served, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}})
        assert bad.status_code == 400
    t.join()
    text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines if x.startswith("data: {"))
    want = reference([prompt], 24, ignore_eos=True)[0]
    assert text == engine.target.tokenizer.decode(want)


def test_auto_parsing_and_stream_hold_back():
    schemas = {"weather": SCHEMA}
    content, calls = parse_auto('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Rome"}}\n'
                                "</tool_call>", schemas)
    assert content == "Let me look.\n" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}
    assert parse_auto('{"name": "weather", "parameters": {"city": "Paris"}}', schemas)[1][0]["function"]["name"] \
        == "weather"
    assert parse_auto('<tool_call>{"name": "other", "arguments": {}}</tool_call>', schemas)[1] == []
    s = ToolStream(ToolPlan("auto", schemas))
    sent = [s.feed(x) for x in ["Hi <to", "ol_", "call>", '{"name": "weather", "arguments": {}}</tool_call>']]
    assert "".join(sent) == "Hi " and s.finish()[1][0]["function"]["name"] == "weather"
    s = ToolStream(ToolPlan("auto", schemas))
    assert s.feed("a <t") == "a " and s.feed("x") == "<tx" and s.feed("<") == "" and s.finish() == ("<", [])


def test_a_streamed_answer_adds_up_to_the_unstreamed_one_call_for_call():
    """Whatever the chunking, a stream's content is the unstreamed message's content ("" for null) and its calls
    the same: a Llama-3-style bare JSON call is never also sent as text, spacing around a call and text after it
    come as unstreamed, and JSON that is no call goes out as text."""
    schemas = {"weather": SCHEMA}
    call = '{"name": "weather", "arguments": {"city": "Rome"}}'
    outputs = [call, f"  {call}\n", f" A<tool_call>{call}</tool_call>B", f"\n<tool_call>{call}</tool_call>",
               f"Sure.\n<tool_call>{call}</tool_call>\n", '{"a": 1} is JSON', '{"name": "other", "arguments": {}}',
               f"{call} and then some", "  plain text", "{unclosed"]
    for text in outputs:
        want_content, want_calls = ToolPlan("auto", schemas).calls(text)
        for size in (1, 3, len(text)):
            s = ToolStream(ToolPlan("auto", schemas))
            sent = "".join(s.feed(text[i:i + size]) for i in range(0, len(text), size))
            rest, calls = s.finish()
            assert sent + rest == (want_content or ""), (text, size)
            assert [c["function"] for c in calls] == [c["function"] for c in want_calls], (text, size)
    assert ToolPlan("auto", schemas).calls(f"\n<tool_call>{call}</tool_call>")[0] is None  # spacing alone: no content
    s = ToolStream(ToolPlan("auto", schemas))  # JSON that names no tool goes out as soon as it closes
    assert s.feed('{"name": "other"') == "" and s.feed("}") == '{"name": "other"}'


def test_a_named_call_cut_off_by_max_tokens_keeps_its_arguments_so_far():
    """As vLLM: finish_reason stays "length" and the call carries the arguments as far as they got, streamed or
    not; a cut-off "auto" output holds no call (the text comes back as content)."""
    named = ToolPlan("named", {"weather": SCHEMA}, "weather")
    choice = {"index": 0, "message": {"role": "assistant", "content": '{"ci'}, "finish_reason": "length"}
    tool_message(choice, '{"ci', named)
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"ci'}
    stream = ToolStream(named)
    deltas = [tool_delta(stream, piece, None) for piece in ('{"', "ci")] + [tool_delta(stream, "", "length")]
    assert [r for _, r in deltas] == [None, None, "length"] and all("content" not in d for d, _ in deltas)
    assert deltas[0][0]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"'}
    assert deltas[1][0]["tool_calls"] == [{"index": 0, "function": {"arguments": "ci"}}] and deltas[2][0] == {}
    delta, reason = tool_delta(ToolStream(ToolPlan("auto", {"weather": SCHEMA})), "<tool_call>{", "length")
    assert reason == "length" and delta == {"content": "<tool_call>{"}


def test_required_calls_cut_off_by_max_tokens_come_back_as_calls_never_as_content():
    """As a named call: the array's whole calls, then the last one's arguments as far as they got where its name
    was written whole; cut before any name, no call and no content (the grammar's JSON is never the answer)."""
    required = ToolPlan("required", {"weather": SCHEMA, "time": {}})
    two = '[{"name": "weather", "parameters": {"city": "Rome"}}, {"name": "time", "parameters": {"zo'
    for text, want in [(two, [("weather", '{"city": "Rome"}'), ("time", '{"zo')]), ('[{"name": "wea', [])]:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        tool_message(choice, text, required)
        assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in
                choice["message"].get("tool_calls", [])] == want
        stream = ToolStream(required)
        delta, reason = tool_delta(stream, text, None)
        assert delta == {} and reason is None
        delta, reason = tool_delta(stream, "", "length")
        assert "content" not in delta and [c["function"]["name"] for c in delta.get("tool_calls", [])] == \
            [n for n, _ in want]


def test_a_template_without_a_tool_format_sees_the_calls_as_text(engine):
    """An agent's second turn (assistant content null beside its tool_calls, then the tool's result) renders
    through a template that knows no tools: the call is in the prompt in the form auto mode parses back."""
    import copy

    from eyas.serve.inputs import chat_prompt
    from eyas.serve.protocol import ChatCompletionRequest

    tok = copy.deepcopy(engine.target.tokenizer)
    assert "tool_calls" not in str(tok.chat_template)
    history = MSG + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = tok.decode(chat_prompt(tok, ChatCompletionRequest(messages=history, tools=TOOLS, tool_choice="required")))
    block = '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>'
    assert block in text and "sunny" in text
    assert parse_auto(block, {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS})[1][0][
        "function"] == {"name": "weather", "arguments": '{"city": "Rome"}'}


def test_a_json_schema_answer_keeps_the_schemas_key_order(served):
    """The output follows the properties in the order the schema gives them (models answer "reasoning"
    before "answer" when asked to), not sorted."""
    schema = {"type": "object", "properties": {"zeta": {"enum": ["a"]}, "alpha": {"enum": ["b"]}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    r = _chat(served, response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": schema}})
    assert r.status_code == 200, r.text
    assert list(json.loads(r.json()["choices"][0]["message"]["content"])) == ["zeta", "alpha"]


def test_auto_keeps_one_call_without_parallel_tool_calls():
    """``parallel_tool_calls: false`` under "auto": the first call the text holds, as vLLM (agent loops built for
    one call at a time), streamed or not; with it left out, every call."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    text = ('<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>\n'
            '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>')
    for parallel, n in ((True, 2), (False, 1)):
        plan = ToolPlan("auto", schemas, parallel=parallel)
        assert len(plan.calls(text)[1]) == n
        stream = ToolStream(plan)
        stream.feed(text)
        assert [c["function"]["arguments"] for c in stream.finish()[1]][:1] == ['{"city": "Rome"}']
        assert len(stream.finish()[1]) == n


def test_a_schema_keyword_the_grammar_cannot_hold_is_a_400_unless_not_strict(served):
    """A schema asking what the grammar cannot enforce (``uniqueItems`` here) would get JSON that fails its own
    validator with a 200: a 400 names the keyword and where it is; ``strict: false`` takes the output as it comes."""
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "integer"},
                                                        "uniqueItems": True}}, "required": ["tags"]}
    body = {"messages": MSG, "max_tokens": 4, "temperature": 0}
    for strict in (True, None):
        fmt = {"name": "x", "schema": schema, **({} if strict is None else {"strict": strict})}
        r = _post(served, "/v1/chat/completions", {**body, "response_format": {"type": "json_schema",
                                                                                "json_schema": fmt}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        message = r.json()["error"]["message"]
        assert "'uniqueItems' at #/properties/tags" in message and "strict false" in message, message
    fmt = {"name": "x", "schema": schema, "strict": False}
    r = _post(served, "/v1/chat/completions", {**body, "response_format": {"type": "json_schema", "json_schema": fmt}})
    assert r.status_code == 200, r.text
    r = _post(served, "/v1/chat/completions", {**body, "guided_json": {"type": "integer", "not": {"const": 3}}})
    assert r.status_code == 400 and "'not' at #" in r.json()["error"]["message"], r.text
