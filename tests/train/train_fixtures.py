"""A tiny tokenized dataset sampled from the tiny target, and a recipe that trains on it in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from eyas.data.tokenized import vocab_counts, write_split
from eyas.train.recipe import load_recipe


def make_data(target, folder, rows: int = 64, prompt: int = 4, new: int = 44, seed: int = 0) -> Path:
    """Rows of ``prompt`` random bytes + ``new`` tokens sampled from the target; loss on the sampled part."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    prompts = torch.randint(0, 256, (rows, prompt), generator=gen)
    data = target.model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=0.6,
                                 pad_token_id=0, eos_token_id=None)
    out = []
    for ids in data.tolist():
        mask = [0] * (prompt - 1) + [1] * (len(ids) - prompt) + [0]
        out.append((ids, mask))
    n_held = rows // 8
    write_split(folder, "train", out[n_held:])
    write_split(folder, "heldout", out[:n_held])
    np.save(folder / "vocab_counts.npy", vocab_counts(out[n_held:], target.info.vocab_size))
    return folder


def tiny_recipe(data, output, **sets):
    base = {"data.path": str(data), "output": str(output), "data.max_length": 64, "data.tokens_per_batch": 512,
            "data.eval_rows": 8, "draft.vocab_size": 300, "draft.save_dtype": "float32", "optim.lr": 3e-3,
            "optim.warmup_ratio": 0.0, "train.ttt_steps": 3, "train.max_steps": 20, "train.device": "cpu",
            "log.every": 5, "log.eval_every": 0, "log.checkpoint_every": 0, "log.progress": False,
            "log.tensorboard": False}
    base.update(sets)
    return load_recipe(None, [f"{k}={v}" for k, v in base.items()])
