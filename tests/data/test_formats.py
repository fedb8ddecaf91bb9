"""Every published conversation format prepares to the same tokens and loss mask as its plain-text
twin (OpenAI messages with string contents), read from JSONL, JSON arrays and gzip alike."""

import gzip
import json

import numpy as np
import pytest
from helpers import byte_tokenizer

from eyas.data.files import read_inputs, read_records
from eyas.data.prepare import PrepareConfig, prepare
from eyas.errors import EyasError

CONVS = [  # (user, assistant, user, assistant); the second user turn has two lines
    ("Hi there", "Hello! How can I help?", "Name a colour.\nJust one, please.", "Blue."),
    ("What is 2+2?", "It is 4.", "And 3+3?\nShow it.", "3+3 = 6."),
]
ROLES = ("user", "assistant", "user", "assistant")


def _twin(c):
    return {"messages": [{"role": r, "content": t} for r, t in zip(ROLES, c)]}


def _sharegpt(c):
    return {"conversations": [{"from": {"user": "human", "assistant": "gpt"}[r], "value": t} for r, t in zip(ROLES, c)]}


def _openai_parts(c):  # every turn as content parts; a two-line turn as two text parts
    return {"messages": [{"role": r, "content": [{"type": "text", "text": line} for line in t.split("\n")]}
                         for r, t in zip(ROLES, c)]}


def _specforge(c):
    return {"id": "x", "conversations": [{"role": r, "content": t} for r, t in zip(ROLES, c)]}


def _ultrachat(c):
    return {"id": "0", "data": list(c)}


def _write(path, records, array=False):
    text = json.dumps(records, indent=1) if array else "".join(json.dumps(r) + "\n\n" for r in records)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


FORMATS = {  # name: (file name, record maker, one JSON array)
    "sharegpt-jsonl": ("sharegpt.jsonl", _sharegpt, False),
    "sharegpt-array": ("sharegpt.json", _sharegpt, True),
    "sharegpt-array-gz": ("sharegpt.json.gz", _sharegpt, True),
    "openai-parts": ("openai.jsonl", _openai_parts, False),
    "openai-parts-gz": ("openai.jsonl.gz", _openai_parts, False),
    "specforge": ("specforge.jsonl", _specforge, False),
    "ultrachat": ("ultrachat.jsonl", _ultrachat, False),
}


def _prepared(target, path, out):
    prepare(target, PrepareConfig(inputs=[str(path)], held_out=0.0, max_length=256), out, log=lambda *a: None)
    return [np.load(out / f"train.{k}.npy") for k in ("tokens", "mask", "offsets")]


@pytest.fixture(scope="module")
def twin(target, tmp_path_factory):
    d = tmp_path_factory.mktemp("twin")
    return _prepared(target, _write(d / "twin.jsonl", [_twin(c) for c in CONVS]), d / "out")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_prepares_like_its_plain_text_twin(fmt, target, twin, tmp_path):
    name, make, array = FORMATS[fmt]
    got = _prepared(target, _write(tmp_path / name, [make(c) for c in CONVS], array), tmp_path / "out")
    for a, b in zip(got, twin):
        np.testing.assert_array_equal(a, b)


def test_content_parts_become_their_text_not_their_repr(target, tmp_path):
    _prepared(target, _write(tmp_path / "p.jsonl", [_openai_parts(CONVS[0])]), tmp_path / "out")
    text = byte_tokenizer().decode(np.load(tmp_path / "out" / "train.tokens.npy"))
    assert "Name a colour.\nJust one, please." in text and "'type'" not in text and "[{" not in text


def test_media_parts_are_refused_naming_the_record(tmp_path):
    bad = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                     {"type": "image_url", "image_url": {"url": "x.png"}}]}]}
    p = _write(tmp_path / "mm.jsonl", [_twin(CONVS[0]), bad])
    with pytest.raises(EyasError, match=r"mm\.jsonl:3: a turn holds a 'image_url' part; .* text only"):
        list(read_records(p))
    audio = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}
    with pytest.raises(EyasError, match=r"mm\.json\[1\]: a turn holds a 'input_audio' part"):
        list(read_records(_write(tmp_path / "mm.json", [_twin(CONVS[0]), audio], array=True)))


def test_unreadable_files_say_where(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('[{"prompt": "a"},\n {"prompt": ')
    with pytest.raises(EyasError, match="broken.json starts like a JSON array but is not valid JSON"):
        list(read_records(p))
    with pytest.raises(EyasError, match=r"odd.jsonl:1: a record in none of the known shapes: keys \['text'\]"):
        list(read_records(_write(tmp_path / "odd.jsonl", [{"text": "x"}])))
    with pytest.raises(EyasError, match="no such data file or folder"):
        list(read_inputs([str(tmp_path / "missing.jsonl")]))
    with pytest.raises(EyasError, match="no file matches"):
        list(read_inputs([str(tmp_path / "nothing-*.jsonl.gz")]))



def test_non_utf8_and_cut_gzip_files_are_errors_not_tracebacks(tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(EyasError, match="latin.jsonl is not UTF-8 text"):
        list(read_records(latin))
    whole = gzip.compress(b"".join(json.dumps({"prompt": f"question {i}"}).encode() + b"\n" for i in range(5000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(EyasError, match="cut.jsonl.gz is a damaged gzip file after line"):
        list(read_records(cut))

def test_a_byte_order_mark_is_read_past(tmp_path):
    """Windows tools (Notepad, PowerShell's Out-File) start UTF-8 files with a BOM: such a JSONL file was
    refused as 'not valid JSON (Unexpected UTF-8 BOM)' with the fix 'one JSON object per line', and a JSON
    array with a BOM was read as JSON Lines."""
    bom = "\ufeff"
    lines = tmp_path / "bom.jsonl"
    lines.write_text(bom + json.dumps({"prompt": "p1"}) + "\n" + json.dumps({"prompt": "p2"}) + "\n", encoding="utf-8")
    array = tmp_path / "bom-array.json.gz"
    array.write_bytes(gzip.compress((bom + json.dumps([{"prompt": "p1"}, {"prompt": "p2"}])).encode()))
    for path in (lines, array):
        assert [r["messages"][0]["content"] for r in read_records(path)] == ["p1", "p2"]


def test_sources_are_file_stems_and_one_stem_twice_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write(tmp_path / "a" / "chat.jsonl.gz", [{"prompt": "p1", "source": "org/repo:file", "category": "chat"}])
    (tmp_path / "a" / "stats.json").write_text('{"not": "records"}')  # a folder's .json files are not read
    recs = list(read_inputs([str(tmp_path / "a")]))
    assert recs == [{"messages": [{"role": "user", "content": "p1"}], "source": "chat", "category": "chat",
                     "origin": "org/repo:file"}]
    _write(tmp_path / "b" / "chat.jsonl", [{"prompt": "p2"}])
    with pytest.raises(EyasError, match="two inputs have the source name 'chat'"):
        list(read_inputs([str(tmp_path / "a"), str(tmp_path / "b" / "chat.jsonl")]))


def test_an_unreadable_exclude_file_keeps_its_own_fix(tmp_path):
    """--exclude of a Latin-1 file told the user to 'name a prompt set or a file', which they had."""
    from eyas.data.exclude import excluded_prompts

    latin = tmp_path / "bench.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(EyasError, match="--exclude .*bench.jsonl is not UTF-8 text") as e:
        excluded_prompts([str(latin)])
    assert "re-encode" in e.value.fix


def test_exclude_reads_a_text_prompt_file_as_eval_does(tmp_path):
    """One prompt a line: what ``eyas eval --prompts`` takes, ``--exclude`` takes too (it said "not valid JSON")."""
    from eyas.data.exclude import excluded_prompts
    from eyas.data.files import prompt_file_records

    text = tmp_path / "mine.txt"
    text.write_text("\ufeffWhat is the capital of France?\n\n42\nWrite a haiku.\n")
    assert excluded_prompts([str(text)]) == ["What is the capital of France?", "42", "Write a haiku."]
    assert [m[0]["content"] for m, _ in prompt_file_records(text)] == excluded_prompts([str(text)])
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert excluded_prompts([str(jsonl)]) == ["a", "b"]


def test_a_turn_without_content_and_a_list_prompt_are_named():
    """A tool-calling turn (content null beside tool_calls) names its turn and role; a list where the prompt
    string goes says so (both were "none of the known shapes" or "a turn has no role/content")."""
    from eyas.data.formats import normalize

    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                                "tool_calls": [{"id": "c"}]}]}
    with pytest.raises(EyasError, match=r"in.jsonl:3: turn 1 \(role 'assistant'\) has no content \(a tool call\?\)"):
        normalize(record, "in.jsonl:3")
    with pytest.raises(EyasError, match="'prompt' is list, not a string"):
        normalize({"prompt": ["a", "b"]}, "in.jsonl:4")
