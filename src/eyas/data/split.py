"""Deduplication and the held-out split.

Records are keyed by their normalised prompt (every turn before the last assistant turn, with
case and whitespace folded), so the same question from two sources counts once. The split is a
function of that key alone (a hash), so it never changes when sources are added or reordered, and
a prompt in the held-out split can never reach training, however the data is regenerated.
"""

from __future__ import annotations

import hashlib
import re

from .chat import prompt_messages


def fold(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def prompt_key(messages: list[dict]) -> str:
    return "\x1e".join(f"{m['role']}:{fold(m['content'])}" for m in prompt_messages(messages))


def is_held_out(key: str, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def drop_excluded(records, texts) -> tuple[list[dict], int]:
    """(records none of whose user turns is one of ``texts``, how many were dropped), case and
    whitespace folded: keeps benchmark prompts out of the data."""
    banned = {fold(t) for t in texts}
    kept = [r for r in records
            if not any(m["role"] == "user" and fold(m["content"]) in banned for m in prompt_messages(r["messages"]))]
    return kept, len(records) - len(kept)


def dedup_split(records, held_out: float) -> tuple[list[dict], list[dict], int]:
    """(train, held_out, duplicates dropped)."""
    seen, train, test, dups = set(), [], [], 0
    for r in records:
        key = prompt_key(r["messages"])
        if not key or key in seen:
            dups += 1
            continue
        seen.add(key)
        (test if is_held_out(key, held_out) else train).append(r)
    return train, test, dups
