"""A prepared data folder is read without unpickling: object arrays, missing files and arrays that do not
hold together are eyas errors naming the file, not tracebacks (and never code run)."""

import numpy as np
import pytest

from eyas.data.tokenized import TokenizedSplit, load_array, write_split
from eyas.errors import EyasError

ROWS = [([1, 2, 3, 4], [0, 1, 1, 0]), ([5, 6, 7], [0, 1, 0])]


class Payload:
    """Unpickling this writes a marker file: proof that a loader executed pickle code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def folder(tmp_path):
    write_split(tmp_path, "train", ROWS)
    return tmp_path


def test_a_good_split_reads(folder):
    split = TokenizedSplit(folder, "train")
    assert len(split) == 2 and split.loss_tokens == 3


@pytest.mark.parametrize("name", ["tokens", "mask", "offsets"])
def test_object_arrays_are_refused_without_unpickling(folder, name):
    marker = folder / "ran"
    np.save(folder / f"train.{name}.npy", np.array([[1, 2, 3], [4, Payload(str(marker))]], dtype=object),
            allow_pickle=True)
    with pytest.raises(EyasError, match=f"train.{name}.npy holds Python objects") as e:
        TokenizedSplit(folder, "train")
    assert "could run code" in e.value.problem and "eyas prepare" in e.value.fix
    assert not marker.exists()


def test_a_missing_mask_is_named(folder):
    (folder / "train.mask.npy").unlink()
    with pytest.raises(EyasError, match="has no train.mask.npy") as e:
        TokenizedSplit(folder, "train")
    assert "eyas prepare" in e.value.fix


def test_arrays_that_do_not_hold_together_are_refused(folder):
    np.save(folder / "train.mask.npy", np.ones(5, dtype=np.uint8))
    with pytest.raises(EyasError, match="does not hold together: 7 tokens, 5 mask values"):
        TokenizedSplit(folder, "train")
    np.save(folder / "train.mask.npy", np.ones((7, 1), dtype=np.uint8))
    with pytest.raises(EyasError, match="expected a flat"):
        TokenizedSplit(folder, "train")


def test_vocab_counts_object_array_is_refused(tmp_path):
    np.save(tmp_path / "vocab_counts.npy", np.array([[1, 2], [3]], dtype=object), allow_pickle=True)
    with pytest.raises(EyasError, match="vocab_counts.npy holds Python objects"):
        load_array(tmp_path / "vocab_counts.npy", "integer")
