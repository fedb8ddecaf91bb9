"""Request bodies: OpenAI's chat and completions shapes and SGLang's ``/generate`` shape.

Types are strict (``"10"`` is not an integer, ``true`` is not a number) and unknown top-level fields
are refused, naming the field, because a silently ignored field (``logprobs``, ``tools``, a typo
such as ``max_token``) would return something other than what was asked for. Fields that clients
commonly send with neutral values are accepted; ``neutral.py`` refuses their non-neutral values.
Responses are plain dicts built in the route modules.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Stop = str | list[str] | None
TokenIds = list[int]
Role = Literal["system", "developer", "user", "assistant", "tool"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]  # OpenAI's; every tier is the same here


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(BaseModel):
    """A chat message's text part. Other keys of a part (``cache_control``, which LiteLLM and Anthropic-style
    clients send) are dropped, as vLLM drops them: they change nothing about the text."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """A chat message; extra keys (name, tool_call_id, ...) pass through to the chat template."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Role
    content: str | list[TextPart] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk, with include_usage only
    include_obfuscation: bool | None = None  # OpenAI's padding against length side channels: nothing to pad here


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: OpenAI's ``{"name", "description", "schema", "strict"}``."""

    name: str
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: exactly one of json (a schema, or one as a JSON string), regex, choice,
    grammar (EBNF) and json_object (``structured.py``)."""

    json_: dict[str, Any] | bool | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None  # refused when set: xgrammar's JSON whitespace is fixed


class _OpenAISampling(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM, SGLang)
    min_p: float | None = None  # extension (vLLM, SGLang)
    n: int | None = 1  # null: 1, as vLLM and OpenAI read it
    stream: bool | None = False  # null: not streamed
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = None  # OpenAI's, in [-2, 2]
    frequency_penalty: float | None = None  # OpenAI's, in [-2, 2]
    repetition_penalty: float | None = None  # extension (vLLM), > 0
    logit_bias: dict[str, float] | None = None  # OpenAI's: token id -> [-100, 100]
    min_tokens: int = 0
    # accepted and ignored: they do not change the output
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # eyas/vLLM/SGLang extensions
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # vLLM's: the stop string (or stop token) that ended the output kept
    # vLLM's and SGLang's structured output spellings (structured.py): one constraint per request, all told
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None  # refused when set (as whitespace_pattern above)
    guided_decoding_backend: str | None = None  # accepted and ignored: xgrammar compiles every grammar here
    regex: str | None = None  # SGLang's
    ebnf: str | None = None
    json_schema: str | None = None  # SGLang's: a schema as a JSON string
    # vLLM's request extensions: add_special_tokens and request_id are served, cache_salt has nothing to salt (no
    # prefix cache is shared between requests); the rest are accepted with their neutral values only (neutral.py)
    add_special_tokens: bool | None = None  # null: true for a completion's prompt, false for chat (the template's)
    request_id: str | None = None  # the response's id is chatcmpl-<request_id> (cmpl-...), as vLLM's
    cache_salt: str | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    priority: int | None = None
    truncate_prompt_tokens: int | None = None
    spaces_between_special_tokens: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    logits_processors: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's, accepted with their neutral values only (neutral.py refuses the rest, naming the field)
    modalities: list[str] | None = None  # ["text"]
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # OpenAI's deprecated spelling of tools
    function_call: str | dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None  # accepted and ignored: by OpenAI's definition it never changes the output
    # vLLM's extensions (also accepted inside chat_template_kwargs, which wins): continue_final_message
    # continues the last (assistant) message instead of opening a new turn; null: not continuing
    add_generation_prompt: bool | None = None  # null: true, or false when continuing the final message
    continue_final_message: bool | None = None
    documents: list[dict[str, Any]] | None = None  # vLLM's: to the chat template, as Hugging Face's RAG templates read
    echo: bool | None = None  # vLLM's; neutral values only (neutral.py), as the two below
    prompt_logprobs: int | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False  # the prompt before the output (text, and with logprobs the prompt's logprobs first)
    prompt_logprobs: int | None = None  # vLLM's: per prompt token its logprob and the top N (not streamed)
    response_format: ResponseFormat | None = None  # vLLM's extension: structured output on completions too
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's output_text, sent back as history
    logprobs: list[Any] | None = None


class InputMessage(_Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(_Strict):
    """OpenAI's Responses API, for text (``responses_route.py``)."""

    model: str | None = None
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    text: TextConfig | None = None
    # accepted: they do not change the output
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    # refused unless neutral (``_refuse_unsupported``)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None


class GenerateSampling(_Strict):
    """SGLang's ``sampling_params``."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False  # the stop string (or stop token) that ended the output kept
    seed: int | None = None
    sampling_seed: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    json_schema: str | None = None  # SGLang's structured output: a JSON schema (as a string), a regex, an EBNF
    regex: str | None = None
    ebnf: str | None = None


class GenerateRequest(_Strict):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: GenerateSampling = Field(default_factory=GenerateSampling)
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool = False  # the output's logprobs in meta_info (serve/logprobs.py)
    model: str | None = None
    logprob_start_len: int | None = None  # -1 (or none): the output's alone; k >= 0: the prompt's from position k
    top_logprobs_num: int | None = None  # with return_logprob: alternatives per token, at most 20
    return_text_in_logprobs: bool | None = None
    # sent by SGLang clients (bench_serving, ...); neutral values only (inputs.py refuses the rest)
    lora_path: str | None = None
    image_data: Any = None
    custom_logit_processor: str | None = None


class TokenizeRequest(_Strict):
    """vLLM's ``/tokenize``: a ``prompt``, or chat ``messages`` rendered as ``/v1/chat/completions`` renders them
    (the same template fields), so ``count`` is what that request's ``usage.prompt_tokens`` would be."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None  # null: true for a prompt; false for messages (the template writes them)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool | None = False


class DetokenizeRequest(_Strict):
    """vLLM's ``/detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]

# What to say when a union-typed field gets the wrong type (pydantic lists every alternative).
EXPECTED = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of lists of token ids",
    "stop": "a string or a list of strings",
    "text": "a string or a list of strings",
    "input_ids": "a list of token ids or a list of lists of token ids",
    "messages": "a non-empty list of {role, content} objects",
    "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts, each with its text (text only: this "
               "server takes no image_url, input_audio or file parts)",
    "input": "a string or a list of messages {\"role\": \"user\", \"assistant\", \"system\" or \"developer\", "
             "\"content\": a string or input_text / output_text parts} (text only: this server takes no input_image "
             "or input_file parts, and no function_call items)",
    "rid": "a string or a list of strings",
    "role": "one of " + ", ".join(map(repr, get_args(Role))),
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
}
