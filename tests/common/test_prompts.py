from __future__ import annotations

import json

import pytest

from eyas.common.prompts import SETS, prompt_set, read_jsonl
from eyas.errors import EyasError


def test_builtin_sets_are_a_few_dozen_distinct_prompts():
    for name, prompts in SETS.items():
        assert 24 <= len(prompts) <= 60, name
        assert len(set(prompts)) == len(prompts) and all(p.strip() for p in prompts)
    everything = prompt_set("all")
    assert len(everything) == sum(len(p) for p in SETS.values()) and everything[:3] == [
        SETS["chat"][0], SETS["code"][0], SETS["reasoning"][0]]


def test_jsonl_prompt_and_messages(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "one"}) + "\n\n" + json.dumps(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "two"}]}) + "\n")
    assert prompt_set(str(f)) == ["one", "two"]


@pytest.mark.parametrize("text,msg", [("not json\n", "is not JSON"), ('{"x": 1}\n', "has no prompt"),
                                      ("", "no prompts")])
def test_jsonl_errors(tmp_path, text, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(EyasError, match=msg):
        read_jsonl(f)


def test_unknown_set():
    with pytest.raises(EyasError, match="unknown prompt set"):
        prompt_set("poetry")
