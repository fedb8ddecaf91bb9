"""Output paths (``--out``, ``--output``, ``--json-out``) checked before any model loads: a path under a file ended
in NotADirectoryError/FileExistsError, for ``eyas bench`` and ``eyas eval`` only after the whole run."""

from __future__ import annotations

import pytest

from eyas.cli import main
from eyas.common.outputs import check_output_file, check_output_folder
from eyas.errors import EyasError


def test_a_folder_under_a_file_or_in_place_of_one_is_refused_with_a_way_out(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(EyasError, match="notes.txt is a file, not a folder") as e:
        check_output_folder(tmp_path / "notes.txt" / "run", "--out")
    assert f"--out {tmp_path / 'notes-run'}" in e.value.fix
    with pytest.raises(EyasError, match="is a file, not a folder"):
        check_output_folder(tmp_path / "notes.txt", "--out")
    assert check_output_folder(tmp_path / "new" / "deep", "--out") == tmp_path / "new" / "deep"
    assert check_output_folder(tmp_path, "--out") == tmp_path  # an existing folder is written into
    assert not (tmp_path / "new").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_file_under_a_file_or_in_place_of_a_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(EyasError, match="notes.txt is a file, not a folder"):
        check_output_file(tmp_path / "notes.txt" / "a" / "e.json", "--json-out", "eval.json")
    with pytest.raises(EyasError, match="is a folder, not a file") as e:
        check_output_file(tmp_path, "--json-out", "eval.json")
    assert str(tmp_path / "eval.json") in e.value.fix
    assert check_output_file(tmp_path / "notes.txt", "--json-out", "eval.json")  # overwritten
    assert check_output_file(tmp_path / "sub" / "e.json", "--json-out", "eval.json")


def test_a_place_nothing_can_be_created_in_is_refused(tmp_path, monkeypatch):
    import eyas.common.outputs as outputs

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(EyasError, match="nothing can be created in .*Read-only file system"):
        check_output_folder(tmp_path / "run", "--out")


def _never(*a, **k):
    raise AssertionError("work started before the output path was checked")


@pytest.mark.parametrize("argv", [
    ["prepare", "--out", "{bad}", "--source", "chatterbot", "--limit", "2"],
    ["prepare", "--out", "{bad}", "--source", "chatterbot", "--limit", "2", "--select-only"],
    ["train", "--output", "{bad}", "--data", "data"],
    ["bench", "--out", "{bad}", "--no-plots"],
    ["bench", "--out", "{bad}", "--url", "http://127.0.0.1:9"],
    ["eval", "--prompts", "chat", "--json-out", "{bad}/e.json"],
    ["tune", "--json-out", "{bad}/t.json"],
    ["export", "smollm2-135m-instruct", "--format", "sglang", "--out", "{bad}"],
])
def test_every_command_refuses_an_output_under_a_file_before_any_work(argv, tmp_path, capsys, monkeypatch):
    import eyas.bench.online as online
    import eyas.data.prepare as prepare
    import eyas.formats as formats
    import eyas.models.loading as loading
    import eyas.pipeline as pipeline
    import eyas.train.trainer as trainer

    for module, name in ((pipeline, "build_engine"), (loading, "load_target"), (trainer, "Trainer"),
                         (formats, "read_draft"), (prepare, "select_only"), (prepare, "prepare"),
                         (online, "run_url")):
        monkeypatch.setattr(module, name, _never)
    (tmp_path / "notes.txt").write_text("a file")
    bad = str(tmp_path / "notes.txt" / "out")
    assert main([a.replace("{bad}", bad) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "notes.txt is a file, not a folder" in err and "fix: pass a path that does not go through notes.txt" in err
