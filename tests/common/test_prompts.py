from __future__ import annotations

import json

import pytest

from eyas.common.categories import tally
from eyas.common.prompts import SETS, prompt_records, prompt_set, read_jsonl
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
    f.write_text("\ufeff" + json.dumps({"prompt": "one"}) + "\n", encoding="utf-8")  # a BOM, as Windows tools write
    assert prompt_set(str(f)) == ["one"]


def test_records_carry_the_category_acceptance_is_grouped_by(tmp_path):
    assert prompt_records("all")[:3] == [(SETS["chat"][0], "chat"), (SETS["code"][0], "code"),
                                         (SETS["reasoning"][0], "reasoning")]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in [
        {"prompt": "a", "category": "math/gsm8k"}, {"prompt": "b", "source": "pydoc:os"}, {"prompt": "c"}]))
    assert prompt_records(str(f)) == [("a", "math"), ("b", "pydoc"), ("c", None)]


def test_tally_sums_steps_per_category_so_the_weighted_tau_is_the_overall():
    rows = tally([("code", 10, 15), (None, 4, 2), ("code", 6, 1), ("chat", 5, 5)])
    assert rows == {"(none)": {"prompts": 1, "drafts": 4, "accepted_tokens": 2, "accept_length": 1.5},
                    "chat": {"prompts": 1, "drafts": 5, "accepted_tokens": 5, "accept_length": 2.0},
                    "code": {"prompts": 2, "drafts": 16, "accepted_tokens": 16, "accept_length": 2.0}}
    overall = 1 + (15 + 2 + 1 + 5) / (10 + 4 + 6 + 5)
    assert sum(r["accept_length"] * r["drafts"] for r in rows.values()) / 25 == pytest.approx(overall)
    assert tally([("x", 0, 0)])["x"]["accept_length"] == 1.0  # no verify step: nothing drafted, tau 1


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
