"""Where a batch's target signal comes from: the target itself (online) or a disk cache (offline).

Both return ``(aux [B, L, n_aux * H], logits [B, L, vocab])`` for a ``Batch``. Offline mode stores,
per token, the three captured states and the state that enters the target's ``lm_head`` (the
final-normed hidden, ``H`` wide), in memory-mapped shards; logits are recomputed with the target's
``lm_head`` weight (saved beside the shards), so a cache holds ``4 * H`` numbers a token, not
``vocab``. With ``float32`` storage the two modes give the same loss on the same batch (tested).

    <dir>/meta.json                {target, aux_layer_ids, hidden, dtype, rows_per_shard, rows}
    <dir>/lm_head.safetensors      the target's output projection [vocab, H]
    <dir>/shard-<k>.aux.npy        [tokens in shard, n_aux * H]
    <dir>/shard-<k>.final.npy      [tokens in shard, H]
    <dir>/shard-<k>.offsets.npy    [rows in shard + 1]
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..errors import EyasError
from .batches import collate, to_device
from .ttt import target_states


class OnlineStates:
    def __init__(self, target):
        self.target = target

    def __call__(self, batch):
        dev = self.target.device
        lengths = batch.valid.sum(1)
        aux, logits = target_states(self.target, to_device(batch.input_ids, dev), to_device(lengths, dev))
        return aux, logits


@torch.no_grad()
def capture_with_final(target, input_ids, lengths):
    """(aux, final-normed hidden [B, L, H], logits) from one target forward."""
    head = target.model.get_output_embeddings()
    seen = {}
    handle = head.register_forward_pre_hook(lambda m, args: seen.__setitem__("h", args[0]))
    try:
        aux, logits = target_states(target, input_ids, lengths)
    finally:
        handle.remove()
    return aux, seen["h"], logits


def build_cache(target, split, folder, max_length: int, dtype: str = "float16", rows_per_shard: int = 2048,
                rank: int = 0, world: int = 1, batch_rows: int = 8, progress: bool = True,
                fp: dict | None = None) -> Path:
    """Write the offline cache for ``split``; rank r writes shards r, r + world, ... ."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    n = len(split)
    shards = list(range((n + rows_per_shard - 1) // rows_per_shard))
    width = target.info.hidden_size
    need = sum(min(split.length(i), max_length) for i in range(n)) * (len(target.aux_layer_ids) + 1) * width \
        * np.dtype(np_dtype).itemsize
    if need > shutil.disk_usage(folder).free:  # memory-mapped shards on a full disk die of SIGBUS, not an error
        raise _no_space(folder, need)
    dev = target.device
    for k in tqdm(shards[rank::world], desc="cache states", disable=not progress):
        rows = list(range(k * rows_per_shard, min(n, (k + 1) * rows_per_shard)))
        lens = [min(split.length(i), max_length) for i in rows]
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        aux_out = np.lib.format.open_memmap(folder / f"shard-{k}.aux.tmp.npy", "w+", np_dtype,
                                            (int(offsets[-1]), len(target.aux_layer_ids) * width))
        fin_out = np.lib.format.open_memmap(folder / f"shard-{k}.final.tmp.npy", "w+", np_dtype,
                                            (int(offsets[-1]), width))
        tmps = [folder / f"shard-{k}.{name}.tmp.npy" for name in ("aux", "final")]
        if not all(_reserve(t) for t in tmps):  # the space taken now: a sparse file filled later can SIGBUS
            del aux_out, fin_out
            for t in tmps:
                t.unlink()
            raise _no_space(folder, need)
        for s in range(0, len(rows), batch_rows):
            part = rows[s: s + batch_rows]
            b = collate(split, part, max_length)
            aux, fin, _ = capture_with_final(target, b.input_ids.to(dev), b.valid.sum(1).to(dev))
            for r, _ in enumerate(part):
                a, z = int(offsets[s + r]), int(offsets[s + r + 1])
                aux_out[a:z] = aux[r, : z - a].float().cpu().numpy().astype(np_dtype)
                fin_out[a:z] = fin[r, : z - a].float().cpu().numpy().astype(np_dtype)
        aux_out.flush()
        fin_out.flush()
        del aux_out, fin_out
        np.save(folder / f"shard-{k}.offsets.npy", offsets)
        for name in ("aux", "final"):  # complete shards only: a killed run never leaves half a shard
            (folder / f"shard-{k}.{name}.tmp.npy").rename(folder / f"shard-{k}.{name}.npy")
    if rank == 0:
        head = target.model.get_output_embeddings().weight.detach().float().cpu().contiguous()
        save_file({"weight": head}, str(folder / "lm_head.safetensors"))
        meta = {"target": target.info.name, "aux_layer_ids": list(target.aux_layer_ids),
                "hidden_size": target.info.hidden_size, "vocab_size": target.info.vocab_size, "dtype": dtype,
                "rows_per_shard": rows_per_shard, "rows": n, "max_length": max_length,
                **(fp or fingerprint(target, split, dtype))}
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def _no_space(folder: Path, need: int) -> EyasError:
    def size(b):
        return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
    return EyasError(f"the offline state cache needs about {size(need)} and {folder} has "
                     f"{size(shutil.disk_usage(folder).free)} free",
                     "free space there, point train.offline_dir at a larger disk, use train.offline_dtype float16, "
                     "or train with train.mode online (no cache)")


def _reserve(path: Path) -> bool:
    """Allocate the file's blocks; False when the disk is full."""
    with path.open("r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, path.stat().st_size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                return False
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # filesystems without fallocate: as before
                raise
    return True


def split_sha(split) -> str:
    """The first 16 hex digits of the sha256 of a split's rows (their offsets and tokens)."""
    data = hashlib.sha256(np.ascontiguousarray(split.offsets).tobytes())
    data.update(np.ascontiguousarray(split.tokens).tobytes())
    return data.hexdigest()[:16]


def fingerprint(target, split, dtype: str, data_sha: str | None = None) -> dict:
    """What a cache's states depend on beyond its shape: the tokens (a re-prepared split of the same size),
    the target's weights (another target of the same shapes; its lm_head, every 1024th row or so) and the
    storage dtype. Recorded in the cache's meta.json and compared before it is reused. ``data_sha``: the split's
    ``split_sha`` where the caller has it already."""
    head = target.model.get_output_embeddings().weight
    rows = head[:: max(1, head.shape[0] // 1024)].detach().float().cpu().contiguous()
    return {"data_sha256_16": data_sha or split_sha(split), "dtype": dtype,
            "head_sha256_16": hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]}


def cache_complete(folder, rows: int, max_length: int, aux_layer_ids, fp: dict | None = None) -> bool:
    folder = Path(folder)
    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        return False
    meta = json.loads(meta_file.read_text())
    if meta["rows"] != rows or meta["max_length"] != max_length or list(meta["aux_layer_ids"]) != list(aux_layer_ids):
        raise EyasError(f"the offline state cache in {folder} was built for other data or layers "
                        f"(rows {meta['rows']}, max_length {meta['max_length']}, layers {meta['aux_layer_ids']})",
                        "delete that folder or point train.offline_dir somewhere new")
    what = {"data_sha256_16": "other data (the tokens differ)", "head_sha256_16": "another target (the weights "
            "differ)", "dtype": f"train.offline_dtype {meta.get('dtype')}"}
    stale = [why for key, why in what.items() if fp and key in meta and meta[key] != fp[key]]
    if stale:  # caches of older eyas versions record no fingerprint and are taken as they are
        raise EyasError(f"the offline state cache in {folder} was built for {' and '.join(stale)}",
                        "delete that folder or point train.offline_dir somewhere new")
    shards = (rows + meta["rows_per_shard"] - 1) // meta["rows_per_shard"]
    return all((folder / f"shard-{k}.final.npy").is_file() for k in range(shards))


class OfflineStates:
    """Streams cached states; logits = lm_head(final) on the fly."""

    def __init__(self, folder, device, dtype=torch.float32):
        self.folder = Path(folder)
        self.meta = json.loads((self.folder / "meta.json").read_text())
        self.per = self.meta["rows_per_shard"]
        self.head = load_file(str(self.folder / "lm_head.safetensors"))["weight"].to(device=device, dtype=dtype)
        self.device, self.dtype = device, dtype
        self._shards: dict[int, tuple] = {}

    def _shard(self, k: int):
        if k not in self._shards:
            f = self.folder
            self._shards[k] = (np.load(f / f"shard-{k}.aux.npy", mmap_mode="r"),
                               np.load(f / f"shard-{k}.final.npy", mmap_mode="r"),
                               np.load(f / f"shard-{k}.offsets.npy"))
        return self._shards[k]

    def __call__(self, batch):
        bsz, width = batch.input_ids.shape
        n_aux = len(self.meta["aux_layer_ids"]) * self.meta["hidden_size"]
        aux = torch.zeros((bsz, width, n_aux), dtype=torch.float32)
        fin = torch.zeros((bsz, width, self.meta["hidden_size"]), dtype=torch.float32)
        for r, i in enumerate(batch.rows):
            a_arr, f_arr, off = self._shard(i // self.per)
            j = i % self.per
            a, z = int(off[j]), int(off[j + 1])
            n = min(z - a, width)
            aux[r, :n] = torch.from_numpy(np.array(a_arr[a: a + n], dtype=np.float32))
            fin[r, :n] = torch.from_numpy(np.array(f_arr[a: a + n], dtype=np.float32))
        fin = fin.to(self.device, self.dtype)
        return aux.to(self.device, self.dtype), fin @ self.head.T
