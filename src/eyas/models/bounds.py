"""Model configs that are valid JSON but absurd are refused before anything is allocated.

Every ``config.json`` eyas builds a model from (a target folder, a draft in any format) passes
``check_config`` first: each size within bounds that no real model comes near (Llama 3.1 405B has
126 layers, hidden 16,384 and 128 heads; the largest vocabularies are about 262,000 tokens) but that
catch a typo or a crafted file, heads that divide the width, and then the parameter count the
config implies, in bytes at the load dtype, against the memory this machine has. Without this a
``num_hidden_layers`` of 10^6 spent minutes and gigabytes building a model before failing, and a
``num_attention_heads`` of 0 or a ``vocab_size`` of 10^12 ended in a traceback.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import EyasError
from .safety import checked_file

GiB = 1 << 30

BOUNDS = {  # key: (lowest, highest) a config may say
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "draft_vocab_size": (1, 1 << 22),
    "target_hidden_size": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 26),
}


def read_config_file(folder, what: str = "model", dtype_bytes: int | None = None) -> dict:
    """``folder/config.json`` as a dict, read safely and checked (``check_config``)."""
    path = checked_file(Path(folder) / "config.json", f"the {what}'s config")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise EyasError(f"{path} is not valid JSON: {e}", "restore the model's config.json") from None
    if not isinstance(data, dict):
        raise EyasError(f"{path} holds a {type(data).__name__}, not a JSON object", "restore the model's config.json")
    check_config(data, str(path), dtype_bytes)
    return data


def check_config(data: dict, where: str, dtype_bytes: int | None = None) -> None:
    """Refuse sizes no model has and models larger than this machine's memory (``dtype_bytes`` a
    parameter; None: sizes only). Multimodal configs are checked in their ``text_config`` too."""
    fix = f"correct the value in {where}, or restore the model's original config.json"
    for part, label in ((data, ""), (data.get("text_config"), "text_config.")):
        if not isinstance(part, dict):
            continue
        for key, (low, high) in BOUNDS.items():
            v = part.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise EyasError(f"{where}: {label}{key} = {v!r}; a model has a whole number from {low:,} to "
                                f"{high:,} there", fix)
        heads, hidden, kv = part.get("num_attention_heads"), part.get("hidden_size"), part.get("num_key_value_heads")
        if heads and hidden and part.get("head_dim") is None and hidden % heads:
            raise EyasError(f"{where}: {label}hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
                            fix)
        if heads and kv and heads % kv:
            raise EyasError(f"{where}: {label}num_attention_heads {heads} is not a multiple of num_key_value_heads "
                            f"{kv}", fix)
        _check_floats(part, f"{where}: {label}", fix)
    draft, vocab = data.get("draft_vocab_size"), data.get("vocab_size")
    if draft and vocab and draft > vocab:
        raise EyasError(f"{where}: draft_vocab_size {draft:,} is larger than vocab_size {vocab:,}", fix)
    if dtype_bytes:
        need, have = estimate_parameters(data) * dtype_bytes, memory_bytes()
        if have and need > have:
            raise EyasError(f"{where} describes a model of about {need / dtype_bytes / 1e9:,.1f} B parameters, "
                            f"{need / GiB:,.1f} GiB at {dtype_bytes} bytes each: more than this machine's "
                            f"{have / GiB:,.1f} GiB of memory", f"{fix}; or load it on a machine that can hold it")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_floats(part: dict, where: str, fix: str) -> None:
    """The norm's epsilon and the rotary embedding: values a forward can compute with. A negative or NaN
    ``rms_norm_eps`` gives NaN logits (every row ends before its first token); a string ``rope_theta`` ends in a
    traceback inside the first forward. A ``rope_type`` is only checked to be a name: configs spell aliases
    (``mrope``, ``type``) that transformers maps."""
    eps = part.get("rms_norm_eps")
    if eps is not None and not (_number(eps) and 0 < eps <= 1):
        raise EyasError(f"{where}rms_norm_eps = {eps!r}; a model's is a small positive number (1e-5, 1e-6)", fix)
    ropes = _rope_sets(part.get("rope_parameters") or part.get("rope_scaling"))
    for theta in [part.get("rope_theta")] + [r.get("rope_theta") for r in ropes]:
        if theta is not None and not (_number(theta) and theta > 0):
            raise EyasError(f"{where}rope_theta = {theta!r}; a model's is a positive number (10000, 500000)", fix)
    for kind in (r.get("rope_type", r.get("type")) for r in ropes):
        if kind is not None and not isinstance(kind, str):  # a name transformers maps; its own check reads it
            raise EyasError(f"{where}rope_type = {kind!r}; a model's is a name (default, llama3, yarn, ...)", fix)


def check_rope_types(config, where: str) -> None:
    """A parsed config's rotary types (aliases such as ``mrope`` already mapped by transformers) are ones this
    transformers builds: another name is a ``KeyError`` inside the model's constructor."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    known = ["default", *ROPE_INIT_FUNCTIONS]
    for kind in (r.get("rope_type", "default") for r in _rope_sets(getattr(text, "rope_parameters", None))):
        if kind not in known:
            import transformers

            raise EyasError(f"{where}: rope_type {kind!r} is not one transformers {transformers.__version__} "
                            f"builds ({', '.join(known)})",
                            "correct rope_parameters (rope_scaling) in config.json, or use the transformers "
                            "release the model was published for")


def _rope_sets(rope) -> list[dict]:
    """A config's rotary parameters as a list: the one set, or one per layer type ({"full_attention": {...}, ...})."""
    if not isinstance(rope, dict):
        return []
    return [r for r in rope.values() if isinstance(r, dict)] or [rope]


def estimate_parameters(data: dict) -> int:
    """A lower bound on the parameters a decoder config implies (dense layers, embeddings, head)."""
    c = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    h, layers = c.get("hidden_size") or 0, c.get("num_hidden_layers") or 0
    heads = c.get("num_attention_heads") or 1
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    mlp = 3 * h * (c.get("intermediate_size") or 0)
    vocab = c.get("vocab_size") or 0
    tied = c.get("tie_word_embeddings", data.get("tie_word_embeddings", False))
    return layers * (attention + mlp) + vocab * h * (1 if tied else 2)


def memory_bytes() -> int:
    """What this machine can hold a model in: its RAM, plus the first GPU's memory when there is one."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
    import torch

    if torch.cuda.is_available():
        total += torch.cuda.get_device_properties(0).total_memory
    return total
