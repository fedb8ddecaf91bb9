"""Does the server at a URL serve the target the data is for? Checked before any prompt is sent.

What servers tell, each read where it answers:

    /v1/models            every OpenAI-compatible server: the ids requests send; eyas and vLLM add
                          ``root`` (the model path) and ``max_model_len``
    /get_model_info       SGLang: ``model_path``, ``tokenizer_path``
    /get_server_info      eyas (also ``/server_info``): ``vocab_size``, ``chat_template_sha256_16``;
                          SGLang: its ServerArgs (``model_path``, ``tokenizer_path``, ``chat_template``)
    a one-token probe     every server: ``usage.prompt_tokens`` of a chat it rendered, which equals the
                          local rendering's length when both use the same template and tokenizer

The name check compares the last path component (case folded, ``.gguf`` dropped) of ``--model-path``
with every name the server gives, so ``/data/Kimi-K2.5`` matches ``moonshotai/Kimi-K2.5``; when the
names differ legitimately, ``--served-model-name`` picks the model and the vocabulary, template and
probe checks still run. Every request body is built here (``request_body``), the probe's too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

import httpx

from ..errors import EyasError
from .prepare import template_hash
from .regenerate import RegenConfig, prompt_ids, with_system

PROBE = [{"role": "user", "content": "Hello! In one sentence, what can you help me with?"}]


def request_body(model: str, messages: list[dict], cfg: RegenConfig, max_tokens: int, seed: int | None) -> dict:
    """A ``/v1/chat/completions`` body answering ``messages`` as ``cfg`` says (greedy at temperature 0)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": cfg.temperature}
    if cfg.temperature > 0:
        body["top_p"] = cfg.top_p
    if seed is not None:
        body["seed"] = seed
    if cfg.template_kwargs:
        body["chat_template_kwargs"] = cfg.template_kwargs
    return body


@dataclass
class Served:
    """What was found and checked at ``url`` (``meta.json``'s ``regeneration.server``)."""

    url: str
    model: str  # the id requests send
    names: list[str]  # every name the server gave for what it serves
    max_model_len: int | None = None
    checked: list[str] = field(default_factory=list)  # name, vocab, template, prompt tokens
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def stem(name: str) -> str:
    """``/data/Kimi-K2.5/`` and ``moonshotai/kimi-k2.5`` -> ``kimi-k2.5``."""
    last = PurePosixPath(str(name).replace("\\", "/").rstrip("/")).name.lower()
    return last.removesuffix(".gguf")


def _get(client: httpx.Client, path: str) -> dict | None:
    """JSON of a GET where the server answers it, else None."""
    try:
        r = client.get(path)
        data = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _models(client: httpx.Client, url: str) -> list[dict]:
    try:
        r = client.get("/v1/models")
    except httpx.HTTPError as e:
        raise EyasError(f"cannot reach {url}: {type(e).__name__}: {e}",
                        "start the server first, or fix --regenerate-url (e.g. http://127.0.0.1:30000)") from None
    if r.status_code in (401, 403):
        raise EyasError(f"{url} refused /v1/models with HTTP {r.status_code}: it needs an API key",
                        "pass the server's key with --api-key")
    cards = None
    try:
        cards = r.json().get("data") if r.status_code == 200 else None
    except ValueError:
        pass
    if not cards or not all(isinstance(c, dict) and c.get("id") for c in cards):
        raise EyasError(f"{url}/v1/models answered HTTP {r.status_code} without a model list ({r.text[:200]!r})",
                        "point --regenerate-url at an OpenAI-compatible server (SGLang, vLLM, eyas serve)")
    return cards


def _pick(cards: list[dict], wide: list[str], model_path: str, served_model_name: str | None, url: str):
    """(the card to use, every name the server gave)."""
    ids = [c["id"] for c in cards]
    names = list(dict.fromkeys(ids + [c["root"] for c in cards if c.get("root")] + wide))
    if served_model_name is not None:
        card = next((c for c in cards if c["id"] == served_model_name), None)
        if card is None:
            raise EyasError(f"--served-model-name {served_model_name!r} is not served at {url}, which serves "
                            f"{', '.join(map(repr, ids))}", f"use one of those: --served-model-name {ids[0]}")
        return card, names
    want = stem(model_path)
    for c in cards:
        if want in {stem(n) for n in [c["id"], c.get("root") or ""] + wide if n}:
            return c, names
    raise EyasError(f"the server at {url} serves {' / '.join(map(repr, names))}, but the data is for "
                    f"{model_path!r} (--model-path): answers from another model would teach the draft the wrong "
                    "distribution",
                    f"point --regenerate-url at a server of {model_path!r}; if {ids[0]!r} is that same model under "
                    f"another name, pass --served-model-name {ids[0]}")


def check(client: httpx.Client, url: str, target, cfg: RegenConfig, model_path: str,
          served_model_name: str | None = None) -> Served:
    """The checks above, in order; the first that fails raises an ``EyasError`` naming both sides."""
    cards = _models(client, url)
    model_info = _get(client, "/get_model_info") or {}  # SGLang
    info = _get(client, "/get_server_info") or _get(client, "/server_info") or {}  # eyas, SGLang
    wide = [str(v) for d, k in ((model_info, "model_path"), (model_info, "tokenizer_path"), (info, "model_path"),
                                (info, "tokenizer_path")) if (v := d.get(k))]
    card, names = _pick(cards, wide, model_path, served_model_name, url)
    served = Served(url, card["id"], names, card.get("max_model_len") or info.get("context_length"),
                    ["name" if served_model_name is None else "name (given by --served-model-name)"])
    vocab = info.get("vocab_size")
    if isinstance(vocab, int):
        if vocab != target.info.vocab_size:
            raise EyasError(f"the server at {url} serves {card['id']!r} with a vocabulary of {vocab} tokens, but "
                            f"{model_path!r} (--model-path) has {target.info.vocab_size}: another model",
                            f"point --regenerate-url at a server of {model_path!r}")
        served.checked.append("vocab")
    sha = info.get("chat_template_sha256_16")
    if isinstance(sha, str):
        mine = template_hash(target.tokenizer)
        if sha != mine:
            raise EyasError(f"the server at {url} renders chats with another template (sha256 {sha}) than "
                            f"{model_path!r} (--model-path, sha256 {mine}): the answers would follow prompts "
                            "the training rows do not hold",
                            "serve the target with its own chat template, or give --model-path the tokenizer "
                            "folder the server uses")
        served.checked.append("template")
    elif info.get("chat_template"):  # SGLang --chat-template: a file or a name, not comparable here
        served.notes.append(f"the server renders with --chat-template {info['chat_template']}; only the probe's "
                            "token count compares it with the local template")
    _probe(client, url, target, cfg, served, model_path)
    return served


def _probe(client: httpx.Client, url: str, target, cfg: RegenConfig, served: Served, model_path: str) -> None:
    """One answer token for a fixed chat: the server's prompt length against the local rendering's."""
    messages = with_system(PROBE, cfg.system_prompt)
    try:
        r = client.post("/v1/chat/completions", json=request_body(served.model, messages, cfg, 1, 0))
    except httpx.HTTPError as e:
        raise EyasError(f"{url} did not answer a one-token probe chat: {type(e).__name__}: {e}",
                        "check that the server is up and serves chat completions") from None
    if r.status_code != 200:
        raise EyasError(f"{url} refused a one-token probe chat with HTTP {r.status_code}: {r.text[:300]}",
                        "check the server's log; --api-key if it needs one, --served-model-name if it serves "
                        "several models")
    try:
        theirs = (r.json().get("usage") or {}).get("prompt_tokens")
    except (ValueError, AttributeError):
        theirs = None
    if not isinstance(theirs, int):
        served.notes.append("the server reports no usage.prompt_tokens, so its template was not compared")
        return
    mine = len(prompt_ids(target.tokenizer, PROBE, cfg))
    if theirs != mine:
        raise EyasError(f"the server at {url} renders a probe chat as {theirs} tokens, but {model_path!r} "
                        f"(--model-path) renders it as {mine}: the server uses another chat template, tokenizer or "
                        "template options",
                        "serve the target with its own template and tokenizer, pass the same --system-prompt, "
                        "--thinking and --template-kwargs the server applies, or give --model-path the "
                        "server's tokenizer")
    served.checked.append("prompt tokens")
