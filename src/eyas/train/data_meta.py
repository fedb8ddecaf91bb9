"""What a prepared data folder says of its target (``meta.json``), checked against the target a run trains for.

``eyas prepare`` records the target's name, depth, width and vocabulary and the digest of its chat template. Rows
rendered with another model's template, or answers another model wrote, train a draft for that other model: the
vocabulary and width alone let a fine-tune, a base model or a sibling of another depth through, so the depth and
the template are compared too. The name is not (one model loads from a folder, a GGUF or a hub id).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..common.training_record import template_sha
from ..errors import EyasError


def check_data_meta(data: Path, target) -> dict:
    """``data``'s ``meta.json`` (empty without one), refused where it was prepared for another target."""
    meta_file = data / "meta.json"
    if not meta_file.is_file():
        return {}
    try:
        meta = json.loads(meta_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise EyasError(f"{meta_file} is not valid JSON ({e}): the folder's preparation did not finish",
                        "prepare the data again with eyas prepare") from None
    want, info = meta.get("target", {}), target.info
    fix = f"prepare the data with the target you train for (eyas prepare --model {info.name})"
    mine = {"vocab_size": info.vocab_size, "hidden_size": info.hidden_size, "num_layers": info.num_layers}
    differ = [k for k, v in mine.items() if want.get(k) not in (None, v)]
    if differ:
        theirs = ", ".join(f"{k} {want[k]}" for k in differ)
        raise EyasError(f"the data in {data} was prepared for target {want.get('name')!r} ({theirs}); this target "
                        f"has {', '.join(f'{k} {mine[k]}' for k in differ)}", fix)
    sha, here = (meta.get("chat") or {}).get("template_sha256_16"), template_sha(target.tokenizer.chat_template)
    if sha is not None and sha != here:
        answers = " and its answers written by that model" if (meta.get("regeneration") or {}).get("enabled") else ""
        raise EyasError(f"the data in {data} was rendered with another chat template (sha256 {sha}) than this "
                        f"target's ({here}), prepared for {want.get('name')!r}{answers}: a draft trained on it learns "
                        "another model's prompts", fix)
    return meta
