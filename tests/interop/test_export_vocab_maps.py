"""Export and ``draft.init_from`` refuse the d2t/t2d maps ``eyas serve`` and the doctor refuse (one check:
``eyas.checks.check_vocab_maps``), rather than copying or training from them."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_target
from safetensors.torch import load_file, save_file

from eyas.cli import main
from eyas.errors import EyasError
from eyas.formats import load_draft
from eyas.models.draft import Eagle3Draft
from eyas.models.vocab import build_vocab


def _flip(t2d):
    t = t2d.clone()
    t[int(t.float().argmax())] = False  # one target id d2t defines, unmarked
    t[int((~t).nonzero()[-1])] = True  # and one it does not, marked
    return t


EDITS = {
    "d2t outside the vocabulary": (lambda s: s["d2t"].__setitem__(5, 10_000), "outside the target vocabulary 0..319"),
    "two draft ids on one target id": (lambda s: s["d2t"].__setitem__(1, s["d2t"][0] - 1), "same target id"),
    "t2d disagreeing": (lambda s: s.__setitem__("t2d", _flip(s["t2d"])), "the two maps disagree"),
    "no t2d, d2t one-to-many": (lambda s: (s.pop("t2d"), s["d2t"].__setitem__(1, s["d2t"][0] - 1)), "same target id"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("maps")
    target = tiny_target(dtype=torch.float32)
    draft = Eagle3Draft.for_target(target, 100)
    d2t, t2d = build_vocab(torch.arange(320).flip(0), 100)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    return target, draft.save_pretrained(root / "good")


def broken(good, tmp_path, edit):
    path = good[1]
    out = tmp_path / "broken"
    out.mkdir()
    (out / "config.json").write_text((path / "config.json").read_text())
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("case", list(EDITS))
def test_export_refuses_maps_that_serving_refuses(good, tmp_path, capsys, case):
    edit, needle = EDITS[case]
    src = broken(good, tmp_path, edit)
    assert main(["export", str(src), "--format", "sglang", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "vocabulary maps" in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "model.safetensors").exists()
    with pytest.raises(EyasError, match=needle):  # what serving (and draft.init_from) loads
        load_draft(src, embed_weight=good[0].embed_tokens.weight.float())


def test_export_of_good_maps_still_works(good, tmp_path):
    assert main(["export", str(good[1]), "--format", "sglang", "--out", str(tmp_path / "out")]) == 0
