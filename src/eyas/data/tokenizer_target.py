"""The target without its weights: what ``eyas prepare`` needs when a server writes the answers.

Prompts are rendered and the training rows tokenized here, with the target's own tokenizer and chat
template, so ``--model-path`` still names the target; with ``--regenerate-url`` it may be a folder
holding only ``config.json`` and the tokenizer files (a 1 TB target's config and tokenizer fit on a
laptop). A GGUF file holds its config inside the weights, so it is loaded as ``eyas doctor`` loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EyasError
from ..models.target import TargetInfo


@dataclass
class TokenizerTarget:
    """``tokenizer`` and ``info`` as a loaded ``Target`` has them; no model."""

    tokenizer: object
    info: TargetInfo


def load_tokenizer_target(path_or_name: str, trust_remote_code: bool = False) -> TokenizerTarget:
    from ..common.target_facts import read_target
    from ..models.loading import resolve

    folder, gguf = resolve(path_or_name)
    if gguf:
        from ..models.loading import load_target

        t = load_target(path_or_name, trust_remote_code=trust_remote_code)
        return TokenizerTarget(t.tokenizer, t.info)
    facts = read_target(path_or_name, trust_remote_code)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        from ..models.safety import remote_code_refusal

        if remote_code_refusal(e, folder):
            raise remote_code_refusal(e, folder) from None
        raise EyasError(f"cannot read the tokenizer in {folder}: {type(e).__name__}: {str(e)[:300]}",
                        "--model-path needs the target's tokenizer files (tokenizer.json or its sentencepiece "
                        "model, tokenizer_config.json with the chat template) beside config.json") from None
    info = TargetInfo(name=facts.name, num_layers=facts.num_layers, hidden_size=facts.hidden_size,
                      vocab_size=facts.vocab_size, embed_width=facts.embed_width, max_context=facts.max_context,
                      architecture=facts.architecture)
    return TokenizerTarget(tokenizer, info)
