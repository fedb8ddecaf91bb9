"""The tokenized dataset on disk: flat, memory-mapped arrays that ``eyas train`` streams.

    <split>.tokens.npy   int32  [total_tokens]    every conversation's ids, back to back
    <split>.mask.npy     uint8  [total_tokens]    loss mask, aligned as ``ttt_loss`` expects
    <split>.offsets.npy  int64  [rows + 1]        row i is tokens[offsets[i]:offsets[i+1]]

Memory mapping keeps a 10M-token dataset off the heap of every rank.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EyasError

REPREPARE = "prepare the folder again with `eyas prepare --out FOLDER ...`"


def load_array(path: Path, kind: str, mmap: bool = False) -> np.ndarray:
    """A prepared folder's 1-D ``kind`` ("integer") array, never unpickled: a missing file, an object-dtype
    array (a pickle: loading it could run code) or another shape is an eyas error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise EyasError(f"{path.parent} has no {path.name} (a prepared data folder holds <split>.tokens.npy, "
                        "<split>.mask.npy and <split>.offsets.npy)", f"{REPREPARE}, or pass the folder it wrote")
    try:
        a = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as e:  # object arrays: "Object arrays cannot be loaded" / "Array can't be memory-mapped"
        if "object" not in str(e).lower() and "memory-mapped" not in str(e):
            raise EyasError(f"{path} is not a NumPy array file ({e})", REPREPARE) from None
        raise EyasError(f"{path} holds Python objects (a pickled array, e.g. np.save of a list of lists): loading "
                        f"it could run code, so eyas does not; expected a flat {kind} array",
                        f"{REPREPARE}; it writes flat arrays") from None
    except (OSError, EOFError) as e:
        raise EyasError(f"{path} is not a NumPy array file ({type(e).__name__}: {e})", REPREPARE) from None
    if a.ndim != 1 or a.dtype.kind not in ("i", "u", "b"):
        raise EyasError(f"{path} holds a {a.dtype} array of shape {a.shape}; expected a flat (1-D) {kind} array",
                        f"{REPREPARE}; it writes flat arrays")
    return a


def write_split(folder: Path, split: str, rows: list[tuple[list[int], list[int]]]) -> None:
    lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.fromiter((t for ids, _ in rows for t in ids), dtype=np.int32, count=int(offsets[-1]))
    mask = np.fromiter((m for _, ms in rows for m in ms), dtype=np.uint8, count=int(offsets[-1]))
    np.save(folder / f"{split}.tokens.npy", tokens)
    np.save(folder / f"{split}.mask.npy", mask)
    np.save(folder / f"{split}.offsets.npy", offsets)


class TokenizedSplit:
    """Row access over the memory-mapped arrays of one split."""

    def __init__(self, folder, split: str, allow_empty: bool = False):
        folder = Path(folder)
        path = folder / f"{split}.tokens.npy"
        if not path.is_file() and (folder / "selection.json").is_file():
            raise EyasError(f"{folder} was written by `eyas prepare --select-only`: prompts, no answers or tokens",
                            "run the same prepare without --select-only (with --regenerate, or "
                            "--regenerate-url URL) to answer and tokenize them")
        if not path.is_file():
            raise EyasError(f"no {split} split in {folder} (looked for {path.name})",
                            "run `eyas prepare --out FOLDER ...` first and pass that folder as data.path")
        self.tokens = load_array(path, "integer", mmap=True)
        self.mask = load_array(folder / f"{split}.mask.npy", "integer", mmap=True)
        self.offsets = load_array(folder / f"{split}.offsets.npy", "integer")
        if len(self.offsets) < 2 and not (allow_empty and len(self.offsets) == 1):
            raise EyasError(f"the {split} split in {folder} is empty",
                            "prepare more data (check the sources and filters)")
        o = self.offsets
        if o[0] != 0 or (np.diff(o) < 0).any() or o[-1] != len(self.tokens) or len(self.mask) != len(self.tokens):
            raise EyasError(f"the {split} split in {folder} does not hold together: {len(self.tokens)} tokens, "
                            f"{len(self.mask)} mask values, offsets from {o[0]} to {o[-1]} (expected one mask value a "
                            "token and offsets rising from 0 to the token count)", f"{REPREPARE} (into a new folder)")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.tokens[a:b]), np.asarray(self.mask[a:b])

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def loss_tokens(self) -> int:
        return int(np.asarray(self.mask).sum())


def vocab_counts(rows, vocab_size: int) -> np.ndarray:
    """How often each target id is a *learned* token (the token after a loss-masked position)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in rows:
        ids, mask = np.asarray(ids), np.asarray(mask, dtype=bool)
        if len(ids) > 1:
            np.add.at(counts, ids[1:][mask[:-1]], 1)
    return counts
