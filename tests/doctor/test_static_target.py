"""Static doctor: a draft folder given as the target is named as what it is, with the flag it belongs to."""

from __future__ import annotations

from eyas.cli import main
from eyas.doctor.static import diagnose


def test_a_draft_folder_given_as_the_target_is_called_a_draft_not_a_1_layer_target(saved):
    _, draft = saved
    report = diagnose(draft, str(draft))
    assert report.exit_code == 1
    assert [(c.name, c.status) for c in report.checks] == [("format", "ok"), ("target", "problem")]
    row = report.checks[1]
    assert "is an EAGLE-3 draft folder (eyas layout), not a target model" in row.message
    assert f"--draft {draft}" in row.fix and "1-layer" not in report.verdict


def test_only_a_target_that_is_a_draft_folder_is_refused_with_the_draft_flag(saved, capsys):
    _, draft = saved
    assert main(["doctor", "--target", str(draft)]) == 2
    err = capsys.readouterr().err
    assert "is an EAGLE-3 draft folder" in err and f"pass it as --draft {draft}" in err


def test_a_real_target_is_not_taken_for_a_draft(saved):
    target, draft = saved
    assert diagnose(draft, str(target)).checks[1].name != "target"
