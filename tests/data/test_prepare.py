"""eyas prepare on the tiny target: JSONL in, tokenized splits + vocab counts + meta out."""

import json

import numpy as np
import pytest
import torch

from eyas.cli import main
from eyas.data.prepare import PrepareConfig, prepare
from eyas.data.regenerate import RegenConfig
from eyas.data.tokenized import TokenizedSplit
from eyas.errors import EyasError
from helpers import byte_tokenizer, save_tiny_model, tiny_target


def _jsonl(path, n=30, answers=True):
    with path.open("w") as f:
        for i in range(n):
            turns = [{"from": "human", "value": f"question number {i}"}]
            if answers:
                turns.append({"from": "gpt", "value": f"answer {i}"})
            f.write(json.dumps({"conversations": turns}) + "\n")
    return path


def test_prepare_from_jsonl(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl")
    meta = prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.2, max_length=64), tmp_path / "out", log=lambda *a: None)
    train = TokenizedSplit(tmp_path / "out", "train")
    assert len(train) == meta["splits"]["train"]["rows"] and len(train) + meta["splits"]["heldout"]["rows"] == 30
    ids, mask = train.row(0)
    tok = byte_tokenizer()
    learned = tok.decode(ids[1:][mask[:-1].astype(bool)])
    assert learned.startswith("answer ") and learned.endswith("<|im_end|>\n")
    counts = np.load(tmp_path / "out" / "vocab_counts.npy")
    assert counts.sum() == train.loss_tokens and meta["chat"]["template_sha256_16"]


def test_prepare_regenerates_with_the_target(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=6, answers=False)
    cfg = PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=128, regenerate=True,
                        regen=RegenConfig(max_new_tokens=8, batch_size=4, temperature=0.8))
    meta = prepare(target, cfg, tmp_path / "out", log=lambda *a: None)
    stats = meta["regeneration"]["stats"]["train"]
    assert stats["prompts"] == 6 and stats["answer_tokens"] > 0 and meta["regeneration"]["temperature"] == 0.8
    rows = [json.loads(l) for l in (tmp_path / "out" / "train.jsonl").open()]
    assert all(r["regenerated"] and r["messages"][-1]["role"] == "assistant" for r in rows)


def test_prepare_refuses_conversations_without_answers(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=5, answers=False)
    with pytest.raises(EyasError, match="no conversation has an assistant turn"):
        prepare(target, PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=64), tmp_path / "o", log=lambda *a: None)


def test_prepare_cli_errors_cleanly(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    rc = main(["prepare", "--model", str(model), "--out", str(tmp_path / "o"), "--device", "cpu",
               "--max-length", "4096", "--input", str(_jsonl(tmp_path / "in.jsonl", n=3))])
    assert rc == 2 and "longer than the target's context" in capsys.readouterr().err


def test_prepare_keeps_given_answers_beside_regenerated_ones(tmp_path):
    target = tiny_target(dtype=torch.float32)
    src = _jsonl(tmp_path / "in.jsonl", n=6, answers=True)
    cfg = PrepareConfig(inputs=[str(src)], held_out=0.0, max_length=128, regenerate=True, keep_answers=True,
                        regen=RegenConfig(max_new_tokens=8, batch_size=4, temperature=0.0))
    meta = prepare(target, cfg, tmp_path / "out", log=lambda *a: None)
    rows = [json.loads(l) for l in (tmp_path / "out" / "train.jsonl").open()]
    given = sorted(r["messages"][-1]["content"] for r in rows if not r.get("regenerated"))
    assert given == sorted(f"answer {i}" for i in range(6))
    assert sum(bool(r.get("regenerated")) for r in rows) == 6
    assert meta["splits"]["train"]["rows"] == 12 and meta["regeneration"]["keep_answers"]


def test_prepare_cli_refuses_keep_answers_without_regenerate(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    rc = main(["prepare", "--model", str(model), "--out", str(tmp_path / "o"), "--device", "cpu",
               "--keep-answers", "--input", str(_jsonl(tmp_path / "in.jsonl", n=3))])
    assert rc == 2 and "--keep-answers only means something with --regenerate" in capsys.readouterr().err
