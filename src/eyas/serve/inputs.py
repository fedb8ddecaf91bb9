"""Turn a request body into prompt ids and sampling parameters, or a 4xx that says what was wrong.

Everything a client can get wrong is caught here, before the request reaches the engine thread: the bytes
(UTF-8, JSON, an object), the shape and types (``protocol``), the model name, values (``SamplingParams``
validates itself, OpenAI's ranges), the prompt against the context length, and knobs eyas does not implement
(``suffix``, ``best_of``), refused rather than silently ignored; structured output and tools are read by
``structured.py`` and ``tools.py``. A ``logit_bias`` token outside the vocabulary is refused where the
sequence is made (``sequences_for``). An OpenAI request's sampling fields left out take the server's
defaults (``sampling_defaults.py``: the model's generation config, as vLLM).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from ..errors import EyasError
from ..sample.sampling import SamplingParams
from .api_errors import ApiError, bad_request, short
from .json_body import INT64, load_object
from .logprobs import chat_logprobs, completion_logprobs, generate_logprobs
from .neutral import refuse, refuse_openai_only, refuse_vllm_only
from .protocol import EXPECTED, ChatCompletionRequest, CompletionRequest, GenerateRequest
from .sampling_defaults import OPENAI, OPENAI_MAX_TEMPERATURE, SAMPLING_FIELDS, SamplingDefaults
from .tools import ToolPlan, template_message, template_tools

log = logging.getLogger("eyas.serve")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GENERATE_NAMES = {"min_tokens": "min_new_tokens"}  # SamplingParams' names that SGLang's sampling_params spell otherwise


@dataclass
class Job:
    """What the scheduler needs for one request: prompts x n choices with one sampling setting."""

    prompts: list[list[int]]
    params: SamplingParams
    n: int = 1
    stop: list[str] | None = None
    skip_special_tokens: bool = True
    max_tokens_given: bool = True  # False: fill the context (chat without max_tokens), up to max_tokens_cap
    max_tokens_param: str = "max_tokens"
    n_param: str = "n"  # how the request named n (limits.Limits.check_job names it back)
    tools: ToolPlan | None = None  # chat with tools: how calls are constrained and read back (``tools.py``)
    prompt_param: str = "prompt"  # the field that held the prompt, named when it cannot fit
    max_tokens_cap: int | None = None  # the served default max_tokens (the model's max_new_tokens), if any
    keep_stop: bool = False  # the stop string or token's text ends the output (vLLM's include_stop_str_in_output)
    max_tokens_set: bool = True  # the request set max_tokens (else a default applies: the 400s say which)
    echo: list[str] | None = None  # completions' echo: each prompt's text, put before its choices' output
    compiled: object = None  # params.grammar as the preparer compiled it (``prepare.py``), handed to the engine
    arrived: float = field(default_factory=time.monotonic)  # when it was read: --request-timeout counts from here


# -- bytes -> model ---------------------------------------------------------------------------------
def parse_body(raw: bytes, model: type[BaseModel], max_messages: int | None = None):
    data = load_object(raw)  # UTF-8, JSON, depth, 64-bit integers, finite numbers, no lone surrogates
    messages = data.get("messages")
    if max_messages is not None and isinstance(messages, list) and len(messages) > max_messages:
        # checked before validating and rendering them, which takes seconds for ~100k messages
        raise bad_request(f"'messages' has {len(messages)} messages, more than the {max_messages} prompt tokens this "
                          "server accepts (every message takes at least one token of the chat template); send fewer "
                          "messages", param="messages", code="context_length_exceeded")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


def validation_error(e: ValidationError) -> ApiError:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"] if isinstance(x, int) or not _is_type_tag(str(x))]
    param = ".".join(loc) or None
    names = [str(x) for x in err["loc"] if not isinstance(x, int) and not _is_type_tag(str(x))]
    field = names[-1] if names and names[-1] in EXPECTED else None  # the innermost field, not its container
    if err["type"] == "extra_forbidden":
        msg = f"unknown field {param!r}: eyas does not implement it and will not ignore it silently"
    elif err["type"] == "missing":
        msg = f"{param!r} is required"
    elif err["type"] == "too_short" and isinstance(err.get("input"), list) and not err["input"]:
        msg = f"{param!r} is empty: send at least one item"
    elif field is not None and err["type"] not in ("too_short",):
        msg = f"{param!r} must be {EXPECTED[field]}, got {short(err.get('input'))}"
    else:
        msg = f"{param!r}: {err['msg']}, got {short(err.get('input'))}"
    return bad_request(msg, param=param, code="invalid_value")


def _is_type_tag(x: str) -> bool:
    """pydantic names union alternatives in ``loc`` ('str', 'list[int]', 'TextPart', ...)."""
    return x in ("str", "int", "float", "bool", "TextPart") or "[" in x or x.startswith("function-")


def check_model(requested: str | None, served: list[str]) -> None:
    if requested is not None and requested not in served:
        raise ApiError(404, f"the model {requested!r} does not exist; this server serves {served[0]!r} "
                            "(see GET /v1/models)", param="model", code="model_not_found")


# -- prompts ----------------------------------------------------------------------------------------
def encode(tokenizer, text: str, param: str, max_chars: int | None, **kw) -> list[int]:
    """Token ids of ``text``; a text too long to fit is refused by its length, before tokenizing."""
    if max_chars is not None and len(text) > max_chars:
        raise _too_long(param, len(text), max_chars)
    return list(tokenizer(text, **kw).input_ids)


def _too_long(param: str, chars: int, max_chars: int) -> ApiError:
    return bad_request(f"{param!r} has {chars} characters, more than the {max_chars} that the most prompt "
                       "tokens this server accepts could hold (the context length, or --max-prompt-tokens, "
                       "times the longest token's characters); shorten the prompt", param=param,
                       code="context_length_exceeded")


def chat_prompt(tokenizer, req: ChatCompletionRequest, max_chars: int | None = None) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model's tokenizer has no chat template, so chat messages cannot be rendered; "
                          "use /v1/completions with a prompt", param="messages")
    kwargs = _template_kwargs(req)
    if req.documents:  # vLLM's: Hugging Face's templates for retrieval-augmented chat read them
        kwargs["documents"] = req.documents
    chars = sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text) for p in m.content or ())
                for m in req.messages)
    if max_chars is not None and chars > max_chars:  # the rendered text holds them all: refused before rendering
        raise _too_long("messages", chars, max_chars)
    template = str(tokenizer.chat_template)
    messages, knows_calls, knows_developer = [], "tool_calls" in template, "developer" in template
    for i, m in enumerate(req.messages):
        if m.content is None and not (m.role == "assistant" and (m.model_extra or {}).get("tool_calls")):
            raise bad_request(f"'messages.{i}.content' is required: a message with role {m.role!r} needs its text "
                              "(only an assistant message with tool_calls may leave it out)",
                              param=f"messages.{i}.content")
        d = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            d["content"] = "\n".join(p.text for p in m.content)
        if d["role"] == "developer" and not knows_developer:  # OpenAI's newer name for system instructions
            d["role"] = "system"
        messages.append(template_message(d, knows_calls))
    tools = template_tools(req)
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - jinja raises its own types; its text stays in the server's log
        log.warning("the chat template could not render a request's messages: %s: %s", type(e).__name__, e)
        which = ("these messages with their tools, tool calls or tool results (this model's template may not "
                 "support tools)" if tools or any("tool_calls" in m or m["role"] == "tool" for m in messages)
                 else "these messages (roles or contents this model's template does not accept)")
        raise bad_request(f"the chat template of this model could not render {which}; the template's error is in "
                          "the server's log", param="tools" if tools else "messages") from None
    if tools and req.tool_choice in (None, "auto") and text == tokenizer.apply_chat_template(
            messages, tokenize=False, **kwargs):
        raise bad_request(
            "this model's chat template does not show 'tools' to the model (the prompt renders the same without "
            "them), so with tool_choice 'auto' it would answer in prose and never call one; send tool_choice "
            "'required' or a named function (the output is then constrained to a call of your tools), or serve "
            "with a --chat-template that renders tools", param="tools")
    # vLLM's add_special_tokens for chat: the tokenizer's special tokens on top of what the template wrote, if true
    return encode(tokenizer, text, "messages", max_chars, add_special_tokens=bool(req.add_special_tokens))


# apply_chat_template's own arguments, which the server sets: a request's chat_template_kwargs cannot replace them
SERVER_TEMPLATE_ARGS = ("conversation", "messages", "tools", "documents", "tokenize", "padding", "truncation",
                        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                        "tokenizer_kwargs")


def _template_kwargs(req: ChatCompletionRequest) -> dict:
    """``chat_template_kwargs`` with ``add_generation_prompt`` and ``continue_final_message`` settled (vLLM's
    fields, top-level or inside ``chat_template_kwargs``, which wins), or a 400 naming the key."""
    kwargs = dict(req.chat_template_kwargs or {})
    if "chat_template" in kwargs:  # vLLM refuses it too unless trusted
        raise bad_request("a request cannot bring its own chat template: it would run the client's template code "
                          "on the server, and no draft was trained with it; the server's template is set with "
                          "--chat-template", param="chat_template_kwargs.chat_template")
    owned = [k for k in SERVER_TEMPLATE_ARGS if k in kwargs]
    if owned:
        raise bad_request(f"chat_template_kwargs.{owned[0]} is set by the server (it renders the messages, the tools "
                          "and the text the model continues); leave it out", param=f"chat_template_kwargs.{owned[0]}")
    flags = {}
    for name in ("add_generation_prompt", "continue_final_message"):
        inner = name in kwargs
        value = kwargs.pop(name) if inner else getattr(req, name)
        if value is not None and not isinstance(value, bool):
            raise bad_request(f"chat_template_kwargs.{name} must be true or false, got {short(value)}",
                              param=f"chat_template_kwargs.{name}", code="invalid_value")
        flags[name] = (value, f"chat_template_kwargs.{name}" if inner else name)
    (add, add_param), (cont, cont_param) = flags["add_generation_prompt"], flags["continue_final_message"]
    if cont:
        if add:
            raise bad_request("continue_final_message continues the last message, add_generation_prompt opens a new "
                              "assistant turn: send one of them (add_generation_prompt: false)", param=add_param)
        last = req.messages[-1]
        if last.role != "assistant" or not isinstance(last.content, (str, list)):
            raise bad_request("continue_final_message needs the last message to be the assistant's text to continue, "
                              f"got a {last.role!r} message; end messages with {{\"role\": \"assistant\", \"content\": "
                              "...} or leave continue_final_message out", param=cont_param)
    kwargs["add_generation_prompt"] = not cont if add is None else add
    return {**kwargs, "continue_final_message": True} if cont else kwargs


def text_prompts(tokenizer, value, param: str, max_chars: int | None = None,
                 add_special_tokens: bool | None = None) -> list[list[int]]:
    """str | list[str] | list[int] | list[list[int]] -> list of token-id prompts (texts with the tokenizer's special
    tokens unless ``add_special_tokens`` is false; token ids as they are)."""
    if isinstance(value, str) or value and isinstance(value[0], int):
        value = [value]
    if not value:
        raise bad_request(f"{param!r} is empty; send at least one prompt", param=param)
    prompts = []
    for p in value:
        ids = (encode(tokenizer, p, param, max_chars, add_special_tokens=add_special_tokens is not False)
               if isinstance(p, str) else list(p))
        if not ids:
            raise bad_request(f"{param!r} holds an empty prompt; send at least one token", param=param)
        prompts.append(ids)
    return prompts


def echo_texts(tokenizer, value, prompts: list[list[int]]) -> list[str]:
    """Each prompt's text for ``echo``: as sent, or its token ids decoded (as vLLM)."""
    if isinstance(value, str) or value and isinstance(value[0], int):
        value = [value]
    return [p if isinstance(p, str) else tokenizer.decode(ids) for p, ids in zip(value, prompts)]


def generate_prompts(tokenizer, req: GenerateRequest, max_chars: int | None = None) -> list[list[int]]:
    if (req.text is None) == (req.input_ids is None):
        raise bad_request("send exactly one of 'text' or 'input_ids'", param="text")
    if req.text is not None:
        return text_prompts(tokenizer, req.text, "text", max_chars)
    return text_prompts(tokenizer, req.input_ids, "input_ids")


# -- sampling ---------------------------------------------------------------------------------------
def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        raise bad_request("stop strings must be non-empty", param="stop")
    return stops


def _logit_bias(value: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys) -> {token id: bias}."""
    bad = next((key for key in value or {} if not (key.isascii() and key.isdigit())), None)
    if bad is not None:
        raise bad_request(f"logit_bias keys must be token ids (non-negative integers), got {short(bad)}",
                          param="logit_bias", code="invalid_value")
    return None if value is None else {int(key): v for key, v in value.items()}


def openai_job(req: ChatCompletionRequest | CompletionRequest, prompts: list[list[int]], chat: bool,
               defaults: SamplingDefaults = OPENAI) -> Job:
    if chat:
        refuse_openai_only(req)
        logprobs, prompt_logprobs, zero = chat_logprobs(req), None, ""  # chat always generates
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    else:
        logprobs, prompt_logprobs = completion_logprobs(req)
        zero = (None if req.echo or req.prompt_logprobs is not None else
                " (or 0, nothing generated, to score the prompt: with echo or prompt_logprobs)")
        refuse("suffix", req.suffix, "", "no insertion mode")  # "" is no suffix (OpenAI takes it)
        refuse("best_of", req.best_of, 1, "no best-of sampling")
        max_tokens, param = req.max_tokens, "max_tokens"
    refuse_vllm_only(req, chat)
    n = 1 if req.n is None else req.n
    if n < 1:  # the most is --max-n (Limits.check_job)
        raise bad_request(f"n must be at least 1, got {n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
    if req.temperature is not None and not 0 <= req.temperature <= OPENAI_MAX_TEMPERATURE:
        raise bad_request(f"temperature must be in [0, {OPENAI_MAX_TEMPERATURE:g}] (OpenAI's range), got "
                          f"{req.temperature!r}; 0 is greedy", param="temperature", code="invalid_value")
    cap = defaults.max_tokens if max_tokens is None else None  # the model's max_new_tokens, within the context
    default = None if chat or cap is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    sampled = {k: getattr(defaults, k) if getattr(req, k) is None else getattr(req, k) for k in SAMPLING_FIELDS}
    params = _params(max_tokens, param, default, n, "seed", zero=zero, **sampled,
                     presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                     logit_bias=_logit_bias(req.logit_bias),
                     seed=req.seed, stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, logprobs=logprobs,
                     min_tokens=req.min_tokens, prompt_logprobs=prompt_logprobs)
    return Job(prompts, params, n, _stops(req.stop), req.skip_special_tokens,
               max_tokens is not None or default is not None, param, prompt_param="messages" if chat else "prompt",
               max_tokens_cap=cap, keep_stop=req.include_stop_str_in_output, max_tokens_set=max_tokens is not None)


def generate_job(req: GenerateRequest, prompts: list[list[int]]) -> Job:
    sp = req.sampling_params
    logprobs, prompt_logprobs = generate_logprobs(req, prompts)
    refuse("lora_path", req.lora_path, None, "no LoRA adapters")
    refuse("image_data", req.image_data, None, "text only")
    refuse("custom_logit_processor", req.custom_logit_processor, None, "no custom logit processors")
    if sp.n < 1:  # the most is --max-n (Limits.check_job)
        raise bad_request(f"sampling_params.n must be at least 1, got {sp.n}", param="sampling_params.n")
    param = "sampling_params.max_new_tokens"
    params = _params(sp.max_new_tokens, param, None, sp.n,
                     "sampling_params.seed" if sp.seed is not None else "sampling_params.sampling_seed",
                     field_prefix="sampling_params.", prompt_logprobs=prompt_logprobs,
                     zero=None if prompt_logprobs is not None else (" (or 0, nothing generated, to score the prompt: "
                                                                    "with return_logprob and logprob_start_len >= 0)"),
                     temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
                     presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
                     repetition_penalty=sp.repetition_penalty,
                     seed=sp.seed if sp.seed is not None else sp.sampling_seed,
                     stop_token_ids=sp.stop_token_ids, ignore_eos=sp.ignore_eos, logprobs=logprobs,
                     min_tokens=sp.min_new_tokens)
    return Job(prompts, params, sp.n, _stops(sp.stop), sp.skip_special_tokens, True, param, "sampling_params.n",
               prompt_param="text" if req.text is not None else "input_ids", keep_stop=sp.no_stop_trim,
               max_tokens_set="max_new_tokens" in sp.model_fields_set)


def _params(max_tokens, param: str, default, n: int, seed_param: str, field_prefix: str = "",
            zero: str | None = "", **kw) -> SamplingParams:
    """SamplingParams; max_new_tokens is a placeholder 1 when neither is given (sized later). ``zero``: None where
    0 tokens may be asked for (the prompt scored, nothing generated), else how a request could ("": it cannot).

    A value ``SamplingParams`` refuses is a 400 whose ``param`` names the request's field (its message
    starts with that field's name), as OpenAI's errors do: clients read ``error.param``."""
    least = 0 if zero is None else 1
    if max_tokens is not None and max_tokens < least:
        raise bad_request(f"{param} must be at least {least}{zero or ''}, got {max_tokens}", param=param)
    seed = kw.get("seed")
    if seed is not None and seed + n - 1 > INT64[1]:  # choice i samples with seed + i (sequences_for)
        raise bad_request(f"{seed_param}={seed} leaves no room for n={n} choices: choice i uses seed + i, which must "
                          f"fit in a signed 64-bit integer; send a seed of at most {INT64[1] - n + 1}",
                          param=seed_param, code="invalid_value")
    chosen = max_tokens if max_tokens is not None else default
    try:
        # not given: a placeholder, sized to the context later (sequences_for)
        size = chosen if chosen is not None else max(1, kw.get("min_tokens") or 0)
        params = SamplingParams(max_new_tokens=size, **{k: v for k, v in kw.items() if v is not None})
    except EyasError as e:
        name = e.problem.split(" ", 1)[0]
        field = GENERATE_NAMES.get(name, name) if field_prefix else name  # the request's spelling of the field
        raise bad_request(str(e.problem) + (f"; {e.fix}" if e.fix else ""),
                          param=field_prefix + field if name in kw else None, code="invalid_value") from None
    return params


def sequences_for(engine, job: Job) -> list:
    """Engine sequences for every prompt x choice, sized to the context; 400 when one cannot fit."""
    vocab = engine.target.info.vocab_size
    wrong = [t for t in job.params.stop_token_ids if not 0 <= t < vocab]
    if wrong:  # it could never match: the output would run on past where the client asked it to stop
        param = job.n_param.removesuffix("n") + "stop_token_ids"
        raise bad_request(f"{param} names token {wrong[0]}, outside the target's vocabulary (0..{vocab - 1}), which "
                          "no output can hold; use token ids of the target's own tokenizer", param=param,
                          code="invalid_value")
    seqs = []
    for prompt in job.prompts:
        budget = engine.max_context - len(prompt)
        given, param, asked = job.max_tokens_given, job.max_tokens_param, job.params.max_new_tokens
        if len(prompt) >= engine.max_context:  # too long whatever max_tokens says: the prompt is the field to fix
            raise bad_request(
                f"this model's maximum context length is {engine.max_context} tokens; the prompt has {len(prompt)}, "
                "which leaves no room for any output; shorten the prompt", param=job.prompt_param,
                code="context_length_exceeded")
        if given and len(prompt) + asked > engine.max_context:
            raise bad_request(
                f"this model's maximum context length is {engine.max_context} tokens; the prompt has "
                f"{len(prompt)} and {param} {'' if job.max_tokens_set else '(its default: the request left it out) '}"
                f"asks for {asked} more ({len(prompt) + asked} in all); {'lower' if job.max_tokens_set else 'set'} "
                f"{param} or shorten the prompt", param=param, code="context_length_exceeded")
        for i in range(job.n):
            params = job.params
            if not given or (job.n > 1 and params.seed is not None):
                changes = {}
                if not given:
                    size = changes["max_new_tokens"] = max(1, min(budget, job.max_tokens_cap or budget))
                    if size < params.min_tokens:
                        raise bad_request(f"min_tokens={params.min_tokens} is more than the {size} tokens the output "
                                          "may have here (the context left, or the model's max_new_tokens)",
                                          param="min_tokens", code="invalid_value")
                if job.n > 1 and params.seed is not None:
                    changes["seed"] = params.seed + i
                params = dataclasses.replace(params, **changes)
            try:
                seqs.append(engine.new_sequence(prompt, params, job.compiled))
            except EyasError as e:
                code = "context_length_exceeded" if "context" in e.problem else "invalid_value"
                raise bad_request(str(e.problem) + (f"; {e.fix}" if e.fix else ""),
                                  param="logit_bias" if "logit_bias" in e.problem else job.prompt_param,
                                  code=code) from None
    return seqs
