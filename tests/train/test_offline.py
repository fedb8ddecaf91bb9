"""Offline mode (cached, memory-mapped states) gives the online loss on the same batch."""

import torch
from helpers import tiny_target
from train_fixtures import make_data, tiny_recipe

from eyas.data.tokenized import TokenizedSplit
from eyas.train.batches import collate
from eyas.train.states import OfflineStates, OnlineStates, build_cache
from eyas.train.trainer import Trainer
from eyas.train.ttt import ttt_loss


def test_offline_equals_online(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=24)
    split = TokenizedSplit(data, "train")
    build_cache(target, split, tmp_path / "states", max_length=64, dtype="float32", rows_per_shard=7, progress=False)
    batch = collate(split, [3, 9, 15, 20], 64)  # rows from three shards
    trainer = Trainer(tiny_recipe(data, tmp_path / "run"), target=target)
    draft = trainer.draft
    losses = []
    for states in (OnlineStates(target), OfflineStates(tmp_path / "states", "cpu")):
        aux, logits = states(batch)
        r = ttt_loss(draft, batch.input_ids, aux.float(), logits, batch.loss_mask, batch.valid, steps=3)
        losses.append((r.loss.item(), r.step_acc))
    assert abs(losses[0][0] - losses[1][0]) < 1e-4, losses
    assert losses[0][1] == losses[1][1]


def test_offline_training_runs(tmp_path):
    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=24)
    recipe = tiny_recipe(data, tmp_path / "run", **{"train.mode": "offline", "train.max_steps": 4,
                                                     "train.offline_dtype": "float16", "log.eval_every": 4})
    summary = Trainer(recipe, target=target).fit()
    assert summary["steps"] == 4 and summary["heldout"]["positions"] > 0
    assert (tmp_path / "run" / "states" / "train" / "meta.json").is_file()


def test_offline_cache_on_a_full_disk_is_an_error_not_a_sigbus(tmp_path, monkeypatch):
    """The shards are sparse memory-mapped files: on a full disk (a 1.5 MB tmpfs as train.offline_dir)
    filling them killed the process with SIGBUS (exit 135, no message). The space is checked first and
    taken when a shard is created."""
    import errno
    import os
    import shutil
    from collections import namedtuple

    import pytest

    from eyas.errors import EyasError

    target = tiny_target(dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=8)
    split = TokenizedSplit(data, "train")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6, 1000))
    with pytest.raises(EyasError, match="needs about .* MiB and .* has 0.0 MiB free"):
        build_cache(target, split, tmp_path / "s1", max_length=64, progress=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, 10**12))  # the disk fills later

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(EyasError, match="offline state cache needs about"):
        build_cache(target, split, tmp_path / "s2", max_length=64, progress=False)
    assert not list((tmp_path / "s2").glob("*.tmp.npy"))


def test_a_cache_of_another_target_data_or_dtype_is_refused(tmp_path):
    """Only rows, max_length and layers were compared: a cache built from another target of the same
    shapes, or from re-prepared data of the same size, was silently trained on."""
    import pytest

    from eyas.errors import EyasError
    from eyas.train.states import cache_complete, fingerprint

    target, other = tiny_target(dtype=torch.float32), tiny_target(seed=1, dtype=torch.float32)
    data = make_data(target, tmp_path / "data", rows=8)
    data2 = make_data(target, tmp_path / "data2", rows=8, seed=1)
    split, split2 = TokenizedSplit(data, "train"), TokenizedSplit(data2, "train")
    build_cache(target, split, tmp_path / "s", max_length=64, progress=False)
    ids = target.aux_layer_ids
    assert cache_complete(tmp_path / "s", len(split), 64, ids, fingerprint(target, split, "float16"))
    for fp, why in ((fingerprint(other, split, "float16"), "another target"),
                    (fingerprint(target, split2, "float16"), "other data"),
                    (fingerprint(target, split, "float32"), "train.offline_dtype float16")):
        with pytest.raises(EyasError, match=f"was built for {why}"):
            cache_complete(tmp_path / "s", len(split), 64, ids, fp)
