"""Weights load from safetensors or GGUF; pickle checkpoints only when the user says so.

Unpickling a file can run arbitrary code, so a ``.bin``/``.pt``/``.pth`` checkpoint is refused
*before it is opened*, with the command that converts it, unless ``--allow-pickle`` is given (and
even then it is read with ``torch.load(weights_only=True)``). ``load_torch_file`` is the one place
eyas calls ``torch.load``: draft weights and training checkpoints alike go through it, so nothing
eyas reads can run code. ``checked_file`` resolves a file that is about to be opened, so a symlink
loop, a dangling link or a directory in a file's place is an error naming the path.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import EyasError

CONVERT = (
    "python -c \"import torch, safetensors.torch as st; "
    "st.save_file({{k: v.contiguous() for k, v in torch.load('{src}', weights_only=True).items()}}, "
    "'{dst}')\""
)


def weight_pickles(folder) -> list[Path]:
    """What transformers would ``torch.load`` from a target folder without safetensors: its ``*.bin``, ``*.pt``,
    ``*.pth``, and any other file a ``*.index.json`` (a sharded checkpoint's ``weight_map``) names."""
    import json

    folder = Path(folder)
    files = {f for ext in ("bin", "pt", "pth") for f in folder.glob(f"*.{ext}")}
    for index in folder.glob("*.index.json"):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            continue  # transformers' own error names a broken index
        if isinstance(weight_map, dict):
            files |= {folder / str(v) for v in weight_map.values()}
    return sorted(f for f in files if f.suffix != ".safetensors")


def refuse_pickle(files, allow_pickle: bool) -> None:
    """An error for the first pickle (any file but a ``.safetensors`` one) among ``files`` unless ``allow_pickle``."""
    pickled = [Path(f) for f in files if Path(f).suffix != ".safetensors"]
    if pickled and not allow_pickle:
        f = pickled[0]  # transformers reads one unsharded safetensors file only as model.safetensors
        dst = f.with_name("model.safetensors") if f.name == "pytorch_model.bin" else f.with_suffix(".safetensors")
        raise EyasError(
            f"{f} is a pickle checkpoint; eyas does not unpickle files unless asked, since loading "
            "one can run arbitrary code",
            "convert it to safetensors (" + CONVERT.format(src=f, dst=dst) + ") or, if you trust the file, pass "
            "--allow-pickle",
        )


def remote_code_refusal(error: Exception, folder) -> EyasError | None:
    """transformers' refusal to run the Python files a model folder ships (an ``auto_map`` in its
    config.json or tokenizer_config.json) as eyas's own, naming the flag that allows it; None for
    any other error. eyas passes ``trust_remote_code=False`` unless the user gives the flag."""
    if "trust_remote_code" not in str(error):
        return None
    return EyasError(
        f"{folder} needs Python code shipped inside the folder to be loaded (an auto_map in its config.json or "
        "tokenizer_config.json, for a model or tokenizer transformers does not know); eyas does not run a "
        "checkpoint's code unless asked",
        "read that code first; if you trust it, pass --trust-remote-code. Otherwise use a model whose "
        "architecture and tokenizer transformers supports natively",
    )


def _numpy_globals() -> list:
    """What ``np.random.get_state()`` pickles as (older eyas training checkpoints hold it), under
    both module spellings numpy has written (``numpy.core`` before 2.0, ``numpy._core`` since)."""
    import numpy as np

    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), reconstruct,
            (reconstruct, "numpy.core.multiarray._reconstruct")]


def load_torch_file(path, numpy_arrays: bool = False):
    """The one way eyas reads a ``torch.save`` file: on the CPU, with ``weights_only=True``, so only
    tensors and plain Python values come back and a crafted file raises instead of running code.
    ``numpy_arrays`` also admits plain numpy arrays (what older training checkpoints stored)."""
    import pickle

    import torch

    path = checked_file(path, "checkpoint file")
    try:
        with torch.serialization.safe_globals(_numpy_globals() if numpy_arrays else []):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise unpickling_refusal(path, e) from None


def unpickling_refusal(path, e: Exception) -> EyasError:
    """What a pickle that ``weights_only`` refused gets (torch's own text advises ``weights_only=False``: never
    here), for ``load_torch_file`` and for the pickled targets transformers opens."""
    import re

    found = re.search(r"GLOBAL ([\w.]+)", str(e))
    return EyasError(f"{path} holds objects other than tensors and plain values "
                     f"({found.group(1) if found else 'or is damaged'}), so it was not loaded, --allow-pickle or "
                     "not: unpickling it could run code",
                     "get the weights as safetensors from a source you trust; never load this file with "
                     "weights_only=False")


def checked_file(path, what: str = "file") -> Path:
    """``path`` when it names a regular file (links followed); else an error that names it and says why."""
    p = Path(path)
    fix = f"replace {p} with the real file (copy or download it again), or point at the right path"
    try:
        real = p.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop this way
        raise EyasError(f"{what} {p} is a symbolic link that loops back on itself", fix) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise EyasError(f"{what} {p} is a symbolic link that loops back on itself", fix) from None
        if p.is_symlink():
            raise EyasError(f"{what} {p} is a symbolic link to {os.readlink(p)}, which does not exist", fix) from None
        if e.errno == errno.ENOENT:
            raise EyasError(f"{what} {p} does not exist", fix) from None
        raise EyasError(f"{what} {p} cannot be opened: {e.strerror}", fix) from None
    if real.is_dir():
        raise EyasError(f"{what} {p} is a directory; a file was expected there", fix)
    if not real.is_file():
        raise EyasError(f"{what} {p} is not a regular file (a device, socket or pipe)", fix)
    return p


def check_safetensors(folder: Path, config) -> None:
    """Every ``*.safetensors`` file is complete and its tensors have the shapes the config implies.

    Reads only headers (safetensors checks that the data the header promises is in the file) and
    builds the model on the meta device, so a crafted or truncated file fails here with a message
    instead of deep inside a matmul. Tensors whose names the model does not have are left to the
    loader's own report.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    headers: dict[str, tuple[tuple[int, ...], str, Path]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        checked_file(f, "weight file")
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    sl = st.get_slice(k)
                    headers[k] = (tuple(sl.get_shape()), str(sl.get_dtype()), f)
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for broken files
            raise EyasError(
                f"{f} ({f.stat().st_size} bytes) is truncated or not a safetensors file: {e}",
                "copy or download the model again (an interrupted copy leaves a truncated file)",
            ) from None
    if not headers:
        return
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - an architecture that cannot be built on meta: leave it to the loader
        return
    expected = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    for name, (shape, dtype, f) in headers.items():
        want = expected.get(name)
        if want is None:
            continue
        if shape != want[0]:
            raise EyasError(
                f"tensor {name} in {f.name} has shape {shape}, but config.json implies {want[0]}",
                "the weights and config.json do not belong together; use the config the weights were saved with",
            )
        if want[1].is_floating_point and not dtype.startswith(("F", "BF")):
            raise EyasError(f"tensor {name} in {f.name} is stored as {dtype}, a floating-point tensor was expected",
                            "the file is not a plain (unquantised) checkpoint of this model")
