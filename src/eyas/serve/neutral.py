"""Fields other servers' clients send for features eyas has not got: accepted at their neutral values, refused
otherwise, naming the field and the way out (``protocol`` declares them; a field no one declared is refused
there, as OpenAI refuses one).

- OpenAI's chat fields for audio, reasoning effort, verbosity, web search and the deprecated ``functions``;
- vLLM's sampling and request extensions a client built for vLLM sends whole (``use_beam_search: false``,
  ``priority: 0``, ``truncate_prompt_tokens: null``, ...): a full vLLM request body runs here unchanged as long
  as it asks for nothing eyas would ignore. (``add_special_tokens``, ``documents`` and ``request_id`` are
  served: ``inputs.py`` and the routes read them.)
"""

from __future__ import annotations

from .api_errors import bad_request, short


def refuse(param: str, value, neutral, what: str) -> None:
    """A 400 for ``value`` other than null, empty or ``neutral``."""
    if value is not None and value != neutral and value not in ((), [], {}):
        raise bad_request(f"{param}={short(value)} is not supported by eyas ({what}); leave it out", param=param)


def refuse_openai_only(req) -> None:
    """OpenAI chat fields for what eyas has not got (audio, reasoning, web search): null or their default passes."""
    if req.modalities is not None and req.modalities != ["text"]:
        raise bad_request(f"modalities={short(req.modalities)} is not supported by eyas (text only); send "
                          '["text"] or leave it out', param="modalities")
    refuse("audio", req.audio, None, "text only")
    refuse("reasoning_effort", req.reasoning_effort, None, "this server has no reasoning-effort control; a chat "
            "template that reads one takes it in chat_template_kwargs")
    refuse("verbosity", req.verbosity, None, "no verbosity control")
    if req.web_search_options is not None:  # even {}: it turns web search on
        refuse("web_search_options", req.web_search_options or "{}", None, "no web search")
    refuse("functions", req.functions, None, "the deprecated spelling: send the functions as 'tools'")
    refuse("function_call", req.function_call, None, "the deprecated spelling: send 'tool_choice'")


def refuse_vllm_only(req, chat: bool) -> None:
    """vLLM's extensions eyas does not implement: their neutral values pass (what vLLM itself does with them)."""
    refuse("use_beam_search", req.use_beam_search, False, "no beam search")
    refuse("length_penalty", req.length_penalty, 1.0, "beam search's, and there is no beam search")
    refuse("priority", req.priority, 0, "requests are served in the order they come")
    refuse("truncate_prompt_tokens", req.truncate_prompt_tokens, None,
           "a prompt is never cut: one too long is refused with its length")
    refuse("spaces_between_special_tokens", req.spaces_between_special_tokens, True,
           "special tokens decode as the tokenizer joins them")
    refuse("return_tokens_as_token_ids", req.return_tokens_as_token_ids, False,
           "logprobs name tokens by their text; /tokenize gives the ids")
    refuse("bad_words", req.bad_words, None, "no banned words: logit_bias -100 on their token ids keeps them out")
    refuse("allowed_token_ids", req.allowed_token_ids, None,
           "no allow-list of tokens: a structured-output constraint (guided_choice, guided_regex) keeps the "
           "output to what it allows")
    refuse("logits_processors", req.logits_processors, None, "no custom logits processors")
    refuse("kv_transfer_params", req.kv_transfer_params, None, "no disaggregated prefill")
    refuse("vllm_xargs", req.vllm_xargs, None, "no custom extra arguments")
    if chat:
        refuse("echo", req.echo, False, "on chat: /v1/completions echoes a prompt")
        refuse("prompt_logprobs", req.prompt_logprobs, None,
               "on chat: /v1/completions gives a prompt's logprobs (the prompt as /tokenize renders these messages)")
        refuse("mm_processor_kwargs", req.mm_processor_kwargs, None, "text only")

