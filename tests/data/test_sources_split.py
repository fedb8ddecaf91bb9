"""Offline prompt sources, deduplication and the held-out split."""

import json

import pytest

from eyas.data import sources
from eyas.data.files import read_records
from eyas.data.split import dedup, is_held_out, prompt_key, split
from eyas.errors import EyasError


def test_builtin_sources_give_user_prompts():
    chat = list(sources.chatterbot(limit=20))
    docs = list(sources.pydoc(limit=20))
    assert len(chat) == 20 and len(docs) == 20
    for r in chat + docs:
        assert r["messages"][0]["role"] == "user" and r["messages"][0]["content"]
    assert any("`" in r["messages"][0]["content"] for r in docs)
    assert len(sources.self_instruct_requests(2)) == 2 * len(sources.TOPICS)


def test_dedup_and_split_are_stable_and_disjoint():
    recs = [{"messages": [{"role": "user", "content": f"question {i % 50}"}]} for i in range(100)]
    recs.append({"messages": [{"role": "user", "content": "  QUESTION   3 "}]})  # same prompt, other spacing
    kept, dups = dedup(recs)
    train, held = split(kept, 0.2)
    assert len(dups) == 51 and len(train) + len(held) == 50
    keys_t = {prompt_key(r["messages"]) for r in train}
    keys_h = {prompt_key(r["messages"]) for r in held}
    assert not keys_t & keys_h and 3 <= len(held) <= 20
    _, again_h = split(dedup(list(reversed(recs)))[0], 0.2)
    assert {prompt_key(r["messages"]) for r in again_h} == keys_h  # a prompt's split never changes
    assert all(is_held_out(k, 0.2) for k in keys_h)


def test_prompts_without_user_text_are_dropped_as_empty():
    """Only a record with no prompt turns at all counted as empty: a blank or whitespace user turn
    ({"prompt": "   "}), or a system turn alone, was kept, answered by --regenerate and trained on."""
    recs = [{"messages": [{"role": "user", "content": c}]} for c in ("", "   ", "\n\t", "real question")]
    recs.append({"messages": [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": "ok"}]})
    recs.append({"messages": [{"role": "assistant", "content": "no prompt at all"}]})
    kept, dropped = dedup(recs)
    assert [r["messages"][0]["content"] for r in kept] == ["real question"] and len(dropped) == 5


def test_jsonl_errors_name_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n{broken\n")
    with pytest.raises(EyasError, match="d.jsonl:2"):
        list(read_records(p))
