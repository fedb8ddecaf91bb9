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

    def __init__(self, folder, split: str):
        folder = Path(folder)
        path = folder / f"{split}.tokens.npy"
        if not path.is_file() and (folder / "selection.json").is_file():
            raise EyasError(f"{folder} was written by `eyas prepare --select-only`: prompts, no answers or tokens",
                            "run the same prepare without --select-only (with --regenerate, or "
                            "--regenerate-url URL) to answer and tokenize them")
        if not path.is_file():
            raise EyasError(f"no {split} split in {folder} (looked for {path.name})",
                            "run `eyas prepare --out FOLDER ...` first and pass that folder as data.path")
        self.tokens = np.load(path, mmap_mode="r")
        self.mask = np.load(folder / f"{split}.mask.npy", mmap_mode="r")
        self.offsets = np.load(folder / f"{split}.offsets.npy")
        if len(self.offsets) < 2:
            raise EyasError(f"the {split} split in {folder} is empty",
                            "prepare more data (check the sources and filters)")

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
