"""Deduplication and the held-out split.

Records are keyed by their normalised prompt (every turn before the last assistant turn, with
case and whitespace folded), so the same question from two sources counts once: the first one read
keeps it. The split is a function of that key alone (a hash), so it never changes when sources are
added or reordered, and a prompt in the held-out split can never reach training, however the data
is regenerated. ``rank`` orders prompts by a salted hash of the same key: what the per-source mix
and the chat holdout sample by, so a choice depends on the seed and the prompt, never on file order.
"""

from __future__ import annotations

import hashlib

from .chat import prompt_messages


def fold(text: str) -> str:
    """Lowercased, whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.lower().split())


def prompt_key(messages: list[dict]) -> str:
    return "\x1e".join(f"{m['role']}:{fold(m['content'])}" for m in prompt_messages(messages))


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def is_held_out(key: str, fraction: float) -> bool:
    return _unit(key) < fraction


def rank(record: dict, salt: str) -> float:
    """A number in [0, 1) fixed by ``salt`` and the record's prompt: sort by it to sample."""
    return _unit(f"{salt}\x1f{prompt_key(record['messages'])}")


def has_user_text(messages: list[dict]) -> bool:
    """Whether the prompt holds a user turn that is not blank: one without is empty, nothing to answer."""
    return any(m["role"] == "user" and m["content"].strip() for m in prompt_messages(messages))


def dedup(records) -> tuple[list[dict], list[dict]]:
    """(records with a prompt not seen before, the repeats and the empty ones: no user text)."""
    seen, kept, dropped = set(), [], []
    for r in records:
        key = prompt_key(r["messages"])
        if key in seen or not has_user_text(r["messages"]):
            dropped.append(r)
            continue
        seen.add(key)
        kept.append(r)
    return kept, dropped


def split(records, held_out: float) -> tuple[list[dict], list[dict]]:
    """(train, held out): a prompt is held out when its key hashes below ``held_out``."""
    train, test = [], []
    for r in records:
        (test if is_held_out(prompt_key(r["messages"]), held_out) else train).append(r)
    return train, test
