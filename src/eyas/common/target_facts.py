"""What the static doctor needs to know about a target, read from its config and tokenizer.

A Hugging Face folder is read without its weights (``config.json`` + tokenizer files). A GGUF file
(the built-in ``smollm2-135m-instruct`` is one) holds its config inside the weights, so it is loaded
with ``load_target``: about a second once eyas has cached its conversion.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EyasError
from ..models.loading import resolve
from ..models.safety import remote_code_refusal


@dataclass(frozen=True)
class TargetFacts:
    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int  # rows of the token embedding
    embed_width: int
    max_context: int
    architecture: str
    chat_template: str | None
    loaded_weights: bool = False


def read_target(path_or_name: str, trust_remote_code: bool = False, weights: bool = False,
                allow_pickle: bool = False) -> TargetFacts:
    """The facts; with ``weights`` (the doctor, which speaks for ``eyas serve``) an error for a folder whose weights
    are pickles only (without ``allow_pickle``)."""
    folder, gguf = resolve(path_or_name)
    if gguf:
        return _from_loaded(path_or_name, trust_remote_code)
    from transformers import AutoConfig, AutoTokenizer

    from ..models.bounds import read_config_file

    read_config_file(folder, "target")  # absurd sizes: an error naming the key, not a traceback
    try:
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers' config validation raises many types
        if remote_code_refusal(e, folder):
            raise remote_code_refusal(e, folder) from None
        raise EyasError(f"cannot read the target's config in {folder}: {type(e).__name__}: {e}",
                        "point --target at a Hugging Face model folder (config.json, tokenizer, weights)") from None
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    template = None
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
        template = getattr(tok, "chat_template", None)
    except (OSError, ValueError) as e:
        refusal = remote_code_refusal(e, folder)  # not "no template": a tokenizer that wants to run code
        if refusal is not None:
            raise refusal from None
        # otherwise reported by the chat-template check (a config-only folder of a large target may lack one)
    if weights and not any(folder.glob("*.safetensors")):  # what eyas serve would refuse; no weights: config only
        from ..models.safety import refuse_pickle, weight_pickles

        refuse_pickle(weight_pickles(folder), allow_pickle)
    hidden = int(text.hidden_size)
    return TargetFacts(
        name=path_or_name, num_layers=int(text.num_hidden_layers), hidden_size=hidden,
        vocab_size=int(text.vocab_size), embed_width=hidden,
        max_context=int(getattr(text, "max_position_embeddings", 0) or 0),
        architecture=(getattr(cfg, "architectures", None) or [""])[0], chat_template=template,
    )


def _from_loaded(path_or_name: str, trust_remote_code: bool) -> TargetFacts:
    from ..models.loading import load_target

    t = load_target(path_or_name, trust_remote_code=trust_remote_code)
    i = t.info
    return TargetFacts(name=i.name, num_layers=i.num_layers, hidden_size=i.hidden_size, vocab_size=i.vocab_size,
                       embed_width=i.embed_width, max_context=i.max_context, architecture=i.architecture,
                       chat_template=getattr(t.tokenizer, "chat_template", None), loaded_weights=True)
