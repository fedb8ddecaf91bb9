"""Startup warnings from the draft's training record, and --chat-template."""

from __future__ import annotations

import json
import shutil

import pytest

from eyas.errors import EyasError
from eyas.pipeline import EngineArgs, build_engine
from eyas.serve.banner import banner_lines, template_sha
from eyas.serve.cli import set_chat_template


def test_a_mismatched_template_is_a_warning_a_longer_context_a_note(models, tmp_path):
    tiny, draft = models
    shutil.copytree(draft, tmp_path / "draft")
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    cfg.setdefault("eyas", {})["training"] = {"max_length": 256, "chat_template_sha256_16": "0123456789abcdef"}
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(tmp_path / "draft")))
    lines = banner_lines(engine, 4, 8)
    assert any("WARNING" in x and "0123456789abcdef" in x and "--chat-template" in x for x in lines), lines
    longer = [x for x in lines if "trained on sequences of at most 256" in x]  # a limit, not a fault: a note
    assert len(longer) == 1 and longer[0].startswith("note:") and "data.max_length" in longer[0], lines
    assert "--context-length 256 would refuse longer requests" in longer[0]
    have = template_sha(engine.target.tokenizer.chat_template)
    assert f"chat template: sha256 {have}" in lines

    cfg["eyas"]["training"] = {"max_length": 4096, "chat_template_sha256_16": have}
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(tmp_path / "draft")))
    assert not [x for x in banner_lines(engine, 4, 8) if "WARNING" in x or x.startswith("note:")]



def test_an_unreadable_record_field_is_a_note_and_the_server_starts(models, tmp_path):
    tiny, draft = models
    shutil.copytree(draft, tmp_path / "draft")
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    cfg.setdefault("eyas", {})["training"] = {"max_length": "2048", "chat_template_sha256_16": ["not", "a", "sha"]}
    (tmp_path / "draft" / "config.json").write_text(json.dumps(cfg))
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(tmp_path / "draft")))
    notes = [x for x in banner_lines(engine, 4, 8) if x.startswith("note: the draft's config.json eyas.training.")]
    assert len(notes) == 2 and "max_length is '2048', expected a positive whole number" in notes[0], notes

def test_a_context_past_the_drafts_positions_is_warned_as_the_doctor_says(models, tmp_path, capsys):
    from eyas.cli import main
    from eyas.common.training_record import past_draft_positions

    tiny, draft = models
    shutil.copytree(draft, tmp_path / "draft")
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    (tmp_path / "draft" / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 512}))
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(tmp_path / "draft")))
    problem, fix = past_draft_positions(1024, engine.draft.config)  # the doctor's words for the context row
    assert f"WARNING: {problem}; {fix}" in banner_lines(engine, 4, 8)
    assert "--context-length 512" in fix
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(tmp_path / "draft"),
                                     context_length=512))
    assert not [x for x in banner_lines(engine, 4, 8) if "max_position_embeddings" in x]
    rc = main(["generate", "--model-path", str(tiny), "--speculative-draft-model-path", str(tmp_path / "draft"),
               "--device", "cpu", "--prompt", "hi", "--max-new-tokens", "2", "--no-baseline"])
    err = capsys.readouterr().err
    assert rc == 0 and f"WARNING: {problem}; {fix}" in err, err  # a warning, not a refusal


def test_chat_template_from_a_file_or_text(engine, tmp_path):
    tok = engine.target.tokenizer
    original = tok.chat_template
    try:
        f = tmp_path / "t.jinja"
        f.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
        set_chat_template(tok, str(f))
        assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
        set_chat_template(tok, "{{ messages[0]['content'] }}!")
        assert tok.apply_chat_template([{"role": "user", "content": "y"}], tokenize=False) == "y!"
        with pytest.raises(EyasError, match="neither a file nor a Jinja template"):
            set_chat_template(tok, "no-such-file.jinja")
    finally:
        tok.chat_template = original


def test_batch_schedule_flag_reaches_the_engine_banner_and_metrics_labels(models, capsys):
    from eyas.cli import main
    from eyas.serve.banner import info_labels

    tiny, draft = models
    schedule = "1:3,2,6;4:2,1,3;8:0"
    engine = build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft), engine="native",
                                     speculative_batch_schedule=schedule, cuda_graph_max_bs=2, max_batch=8))
    assert "CUDA graphs: n/a on the CPU" in capsys.readouterr().err  # the startup capture's line
    assert engine.spec.for_batch(3).num_draft_tokens == 3 and engine.target_runner.rows == [1, 2]
    assert any(x.startswith(f"tree per batch size: {schedule} ") for x in banner_lines(engine, 8, 8))
    assert info_labels(engine)["batch_schedule"] == schedule and info_labels(engine)["num_draft_tokens"] == "6"
    with pytest.raises(EyasError, match="(?s)entry '4:2,1,9'.*larger than the tree"):
        build_engine(EngineArgs(model_path=str(tiny), speculative_draft_model_path=str(draft),
                                speculative_batch_schedule="1:3,2,6;4:2,1,9"))
    assert main(["generate", "--model-path", str(tiny), "--speculative-algorithm", "NONE",
                 "--speculative-batch-schedule", "1:3,1,4", "--prompt", "hi"]) == 2
    assert "needs speculation" in capsys.readouterr().err
