"""``POST /tokenize`` and ``POST /detokenize``: vLLM's token-counting endpoints, on the served tokenizer.

``/tokenize`` takes a ``prompt`` (special tokens added unless ``add_special_tokens`` is false) or chat
``messages`` (with ``tools``, ``chat_template_kwargs``, ``add_generation_prompt``,
``continue_final_message``), rendered by the code that renders ``/v1/chat/completions``, so ``count`` is
the ``usage.prompt_tokens`` that request would report. It answers ``{"count", "max_model_len", "tokens"}``
and, with ``return_token_strs``, ``token_strs``. ``/detokenize`` takes ``{"tokens"}`` and answers
``{"prompt"}``. Both run on the request preparer's threads (each with its own tokenizer copy), never on the
event loop or the engine thread; a text too long for the server's prompts is a 400, as on the other routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from .api_errors import bad_request
from .inputs import chat_prompt, check_model, encode, parse_body
from .prepare import Preparer
from .protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter()


def _tokenize(p: Preparer, raw: bytes) -> dict:  # on the preparer's thread
    req = parse_body(raw, TokenizeRequest, max_messages=p.max_tokens)
    check_model(req.model, p.served_names)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send either 'prompt' (a string) or 'messages' (chat messages), not both and not neither",
                          param="prompt" if req.prompt is not None else "messages")
    if req.prompt is not None:
        chat_only = [f for f in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")
                     if getattr(req, f) is not None]
        if chat_only:
            raise bad_request(f"'{chat_only[0]}' applies to 'messages' only; a prompt is tokenized as it is",
                              param=chat_only[0])
        special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = encode(p.tokenizer, req.prompt, "prompt", p.max_chars, add_special_tokens=special)
    else:
        if not req.messages:
            raise bad_request("'messages' is empty: send at least one {role, content} message", param="messages")
        chat = ChatCompletionRequest(messages=req.messages, tools=req.tools, tool_choice="none",  # rendered, no call
                                     chat_template_kwargs=req.chat_template_kwargs,
                                     add_generation_prompt=req.add_generation_prompt,
                                     continue_final_message=req.continue_final_message,
                                     add_special_tokens=req.add_special_tokens)
        ids = chat_prompt(p.tokenizer, chat, p.max_chars)
    body = {"count": len(ids), "max_model_len": p.max_context, "tokens": ids}
    if req.return_token_strs:
        body["token_strs"] = p.tokenizer.convert_ids_to_tokens(ids)
    return body


def _detokenize(p: Preparer, raw: bytes) -> dict:  # on the preparer's thread
    req = parse_body(raw, DetokenizeRequest)
    check_model(req.model, p.served_names)
    vocab = len(p.tokenizer)
    bad = next((i for i, t in enumerate(req.tokens) if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"'tokens.{bad}' is {req.tokens[bad]}, not a token id of this model's vocabulary "
                          f"(0 to {vocab - 1})", param=f"tokens.{bad}", code="invalid_value")
    return {"prompt": p.tokenizer.decode(req.tokens)}


@router.post("/tokenize")
async def tokenize(request: Request):
    return await request.app.state.eyas.prepare(_tokenize, await request.body())


@router.post("/detokenize")
async def detokenize(request: Request):
    return await request.app.state.eyas.prepare(_detokenize, await request.body())
