"""Weights load from safetensors or GGUF; pickle checkpoints only when the user says so.

Unpickling a file can run arbitrary code, so a ``.bin``/``.pt``/``.pth`` checkpoint is refused
*before it is opened*, with the command that converts it, unless ``--allow-pickle`` is given (and
even then it is read with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EyasError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

CONVERT = (
    "python -c \"import torch, safetensors.torch as st; "
    "st.save_file({{k: v.contiguous() for k, v in torch.load('{src}', weights_only=True).items()}}, "
    "'{dst}')\""
)


def is_pickle(path: Path) -> bool:
    return path.suffix.lower() in PICKLE_SUFFIXES


def refuse_pickle(files, allow_pickle: bool) -> None:
    pickled = [Path(f) for f in files if is_pickle(Path(f))]
    if pickled and not allow_pickle:
        f = pickled[0]
        raise EyasError(
            f"{f} is a pickle checkpoint; eyas does not unpickle files unless asked, since loading "
            "one can run arbitrary code",
            "convert it to safetensors (" + CONVERT.format(src=f, dst=f.with_suffix(".safetensors"))
            + ") or, if you trust the file, pass --allow-pickle",
        )
