"""EAGLE-3 draft folders in the formats the field uses: recognise them, read them, load them.

    eyas         config.json ``LlamaForCausalLMEagle3`` plus an ``eyas`` dict; SGLang's tensor names
    sglang       the same layout without ``eyas``: SGLang and SpecForge checkpoints
    speculators  ``speculators_model_type: "eagle3"`` (vLLM); ``layers.0.*`` instead of ``midlayer.*``
    eagle3       the official EAGLE-3 release: config says ``LlamaForCausalLM``; it is recognised by
                 its tensors (``fc.weight`` 3 x hidden wide, ``midlayer.*``), weights often a ``.bin``

Every format is read into one internal shape, ``DraftFolder``: an eyas/SGLang ``LlamaConfig``
(``draft_vocab_size``, ``target_hidden_size``, ``eagle_config`` with SGLang-indexed layer ids) and
a state dict in SGLang's tensor names. ``Eagle3Draft`` is built from that (``load_draft``,
``build_draft``), and ``write`` writes it back out. The names each ecosystem uses, and the
maps between them, are in ``names``; the checks of a folder's tensors in ``checks``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.activations import ACT2FN

from ..errors import EyasError
from ..layers import from_sglang, to_sglang
from ..models.bounds import check_config, check_rope_types
from ..models.draft import ARCHITECTURE, Eagle3Draft
from ..models.safety import checked_file, load_torch_file, refuse_pickle
from .checks import check_fits, check_layer_ids, check_maps, check_official_shapes, check_state
from .names import (
    EYAS,
    LOOKS_LIKE,
    OFFICIAL,
    OFFICIAL_ARCHITECTURE,
    SGLANG,
    SGLANG_ARCHITECTURES,
    SPECULATORS,
    SPECULATORS_ARCHITECTURES,
    from_speculators_names,
    speculators_to_sglang_config,
)


@dataclass
class DraftFolder:
    """A draft folder read into eyas's internal shape."""

    path: Path
    format: str
    config: LlamaConfig  # eyas/SGLang shape: architectures [LlamaForCausalLMEagle3], eagle_config, ...
    state: dict[str, torch.Tensor]  # SGLang tensor names, no ``model.`` prefix

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Captured layers in eyas's convention; None = the target's default ``[2, N//2, N-3]``."""
        ids = (getattr(self.config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
        return from_sglang(ids) if ids is not None else None


# -- reading ---------------------------------------------------------------------------------------
def _config_dict(path: Path) -> dict:
    config_file = path / "config.json"
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise EyasError(f"draft folder {path} {what}", "pass the folder that holds the draft's config.json")
    if not config_file.exists() and not config_file.is_symlink():
        if (path / "state.pt").exists() or (path / "checkpoint.json").exists():
            raise EyasError(f"{path} is a training checkpoint of an older eyas: its draft is inside state.pt, not "
                            "a servable folder (config.json + model.safetensors)",
                            "use the run's draft/ folder, or resume the run (eyas train --resume RUN): every "
                            "checkpoint it writes from then on is a servable draft")
        if (path / "checkpoints").is_dir() or (path / "draft" / "config.json").is_file():
            raise EyasError(f"{path} is an eyas training run, not a draft folder",
                            f"pass {path / 'draft'} (the finished draft) or one of {path / 'checkpoints'}/step-N")
        raise EyasError(f"no config.json in draft folder {path}: cannot tell which draft format it is",
                        "point at the folder of a saved EAGLE-3 draft (config.json + weights)")
    try:
        data = json.loads(checked_file(config_file, "the draft's config").read_text())
    except ValueError as e:
        raise EyasError(f"cannot read {config_file}: {e}", "the draft's config.json is not valid JSON") from e
    except RecursionError:  # json gives up on objects nested thousands deep
        raise EyasError(f"cannot read {config_file}: it nests objects or lists too deeply to parse (a corrupted or "
                        "crafted file; a draft's config is a few levels deep)",
                        "restore the draft's config.json") from None
    if not isinstance(data, dict):
        raise EyasError(f"{config_file} holds a {type(data).__name__}, not a JSON object",
                        "restore the draft's config.json")
    return data


def _weight_files(path: Path, looks_like: str, allow_pickle: bool = False) -> list[Path]:
    files = (sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
             or sorted(f for ext in ("pt", "pth", "ckpt") for f in path.glob(f"*.{ext}")))  # named by refuse_pickle
    if not files:
        raise EyasError(f"{path} looks like {looks_like} but holds no weights (no *.safetensors, pytorch_model.bin)",
                        "copy the draft's weight files next to its config.json")
    refuse_pickle(files, allow_pickle)
    return [checked_file(f, "weight file") for f in files]


def _read_tensors(path: Path, looks_like: str, shapes_only: bool = False, allow_pickle: bool = False) -> dict:
    """All tensors (or only their shapes) with a ``model.`` prefix dropped; specific errors for broken files."""
    out: dict = {}
    for f in _weight_files(path, looks_like, allow_pickle):
        try:
            if f.suffix == ".safetensors":
                if shapes_only:
                    with safe_open(str(f), framework="pt") as st:
                        part = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
                else:
                    part = load_file(str(f))
            else:
                part = load_torch_file(f)
                if shapes_only:
                    part = {k: tuple(v.shape) for k, v in part.items()}
        except EyasError:  # a pickle that would run code (load_torch_file): its own message
            raise
        except Exception as e:  # safetensors and torch raise many types for a truncated file
            size = f.stat().st_size
            raise EyasError(
                f"{path} looks like {looks_like}, but its weight file {f.name} ({size} bytes) cannot be read: "
                f"{type(e).__name__}: {e}. The file is truncated or not a weight file",
                "download or export the draft again (an interrupted copy leaves a truncated file)",
            ) from None
        for k, v in part.items():
            out[k[len("model."):] if k.startswith("model.") else k] = v
    return out


def _architectures(data: dict) -> list[str]:
    arch = data.get("architectures") or []
    return [arch] if isinstance(arch, str) else [str(a) for a in arch]


def detect_format(path) -> str:
    """Which format a draft folder is in (reads config.json, and tensor shapes only when it must)."""
    path = Path(path)
    data = _config_dict(path)
    return _detect(path, data)


def _detect(path: Path, data: dict, allow_pickle: bool = False) -> str:
    arch = _architectures(data)
    if "speculators_model_type" in data or any(a in SPECULATORS_ARCHITECTURES for a in arch):
        kind = data.get("speculators_model_type")
        if kind != "eagle3":
            raise EyasError(
                f"{path} is a speculators checkpoint of type {kind!r} (architectures {arch}); eyas loads "
                "speculators_model_type 'eagle3' only",
                "use an EAGLE-3 speculator, or serve this one with vLLM",
            )
        return SPECULATORS
    if any(a in SGLANG_ARCHITECTURES for a in arch):
        return EYAS if isinstance(data.get("eyas"), dict) else SGLANG
    if OFFICIAL_ARCHITECTURE in arch:
        shapes = _read_tensors(path, "an official EAGLE-3 release or a plain Llama model", shapes_only=True,
                               allow_pickle=allow_pickle)
        check_official_shapes(path, data, shapes)
        return OFFICIAL
    known = f"{ARCHITECTURE} or Eagle3LlamaForCausalLM (SGLang/SpecForge/eyas/vLLM), Eagle3Speculator " \
            "(speculators/vLLM) or " \
            f"{OFFICIAL_ARCHITECTURE} with a 3 x hidden fc (official EAGLE-3)"
    raise EyasError(
        f"{path}: config.json declares architectures {arch or 'none'}, which is no EAGLE-3 draft layout eyas "
        f"knows; expected {known}",
        "point at an EAGLE-3 draft folder in one of those layouts; if it is one, its config.json "
        "architectures entry is wrong",
    )


def read_config(path, allow_pickle: bool = False) -> LlamaConfig:
    """The draft's config in eyas's shape, whatever the format (cheap: no weights read except shapes)."""
    path = Path(path)
    data = _config_dict(path)
    fmt = _detect(path, data, allow_pickle)
    return _normalise_config(path, fmt, data)


def read_draft(path, allow_pickle: bool = False) -> DraftFolder:
    """Config and tensors of a draft folder in any known format, checked for completeness."""
    path = Path(path)
    data = _config_dict(path)
    fmt = _detect(path, data, allow_pickle)
    config = _normalise_config(path, fmt, data)
    state = _read_tensors(path, LOOKS_LIKE[fmt], allow_pickle=allow_pickle)
    if fmt == SPECULATORS:
        state = from_speculators_names(state)
    check_state(path, fmt, config, state)
    check_fits(path, fmt, state, _expected(config))  # here, so the doctor and export see what loading would refuse
    return DraftFolder(path, fmt, config, state)


def _expected(config: LlamaConfig) -> dict[str, torch.Tensor]:
    """The tensors of eyas's draft built from ``config``, on ``meta`` (shapes and dtypes, no memory)."""
    with torch.device("meta"):
        draft = Eagle3Draft(config)
    return {k: v for k, v in draft.state_dict().items() if not k.startswith("rotary_emb.")}


def _normalise_config(path: Path, fmt: str, data: dict) -> LlamaConfig:
    looks = LOOKS_LIKE[fmt]
    if data.get("eagle_aux_hidden_state_layer_ids"):  # vLLM reads an empty list as "not given"
        check_layer_ids(path, looks, "eagle_aux_hidden_state_layer_ids", data["eagle_aux_hidden_state_layer_ids"])
    if fmt == SPECULATORS:
        data = speculators_to_sglang_config(path, data)
    else:
        data = dict(data)
        data["architectures"] = [ARCHITECTURE]
    record = data.pop("eyas_record", None)  # what an eyas export kept of its target and training (write._record)
    if isinstance(record, dict) and fmt != EYAS:
        data["eyas"] = {**record, **(data["eyas"] if isinstance(data.get("eyas"), dict) else {})}
    eagle = data.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        raise EyasError(f"{path} looks like {looks}, but its eagle_config is {eagle!r}, not an object",
                        "restore the draft's config.json, or re-export the draft with eyas export")
    sgl_ids = (eagle or {}).get("eagle_aux_hidden_state_layer_ids")
    if sgl_ids is not None:  # SGLang captures exactly these: an empty list captures nothing
        check_layer_ids(path, looks, "eagle_config.eagle_aux_hidden_state_layer_ids", sgl_ids)
    if data.get("hidden_act", "silu") not in ACT2FN:
        raise EyasError(f"{path} looks like {looks}, but its hidden_act {data.get('hidden_act')!r} is no activation "
                        "transformers knows", "restore the draft's config.json (EAGLE-3 drafts use silu)")
    check_config(data, f"{path}/config.json ({looks})", dtype_bytes=4)  # before anything is allocated
    layers = int(data.get("num_hidden_layers") or 1)
    if layers != 1:
        raise EyasError(f"{path} looks like {looks} with {layers} decoder layers; eyas's draft has exactly one",
                        "use a one-layer EAGLE-3 draft (SGLang's and SpecForge's default)")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(data.get(key), int):
            raise EyasError(f"{path} looks like {looks}, but its config has no integer {key!r}",
                            "restore the draft's complete config.json")
    try:
        config = LlamaConfig.from_dict(data)
    except Exception as e:  # noqa: BLE001 - transformers' strict config checks raise huggingface_hub's own types
        raise EyasError(f"{path} looks like {looks}, but its config cannot be read as a Llama config: "
                        f"{type(e).__name__}: {e}", "restore the draft's complete config.json") from None
    check_rope_types(config, f"{path}/config.json ({looks})")
    top = data.get("eagle_aux_hidden_state_layer_ids")
    sgl = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if fmt in (EYAS, SGLANG) and top and sgl is None:  # vLLM captures the top-level ids; SGLang would its default
        sgl = to_sglang(list(top))
        config.eagle_config = {**(getattr(config, "eagle_config", None) or {}), "eagle_aux_hidden_state_layer_ids": sgl}
    if fmt in (EYAS, SGLANG) and top is not None and sgl is not None and list(top) != from_sglang(sgl):
        raise EyasError(
            f"{path} looks like {looks} but names two different captured layer sets: eagle_config's "
            f"{sgl} (SGLang indexing, = inputs of layers {from_sglang(sgl)}) and a top-level {top} (vLLM indexing)",
            "keep the set the draft was trained with; eyas export writes both consistently",
        )
    trained = (data.get("eyas") or {}).get("aux_layer_ids") if fmt == EYAS else None
    if trained is not None and sgl is not None:  # what eyas train recorded against what servers will capture
        check_layer_ids(path, looks, "eyas.aux_layer_ids", trained)
        if list(trained) != from_sglang(sgl):
            raise EyasError(
                f"{path} looks like {looks} trained on the inputs of target layers {list(trained)}, but its "
                f"eagle_config makes servers (and eyas) capture {from_sglang(sgl)} (SGLang ids {list(sgl)}): the "
                "draft would be fed other states than it learnt from, and accept little, silently",
                f"set eagle_config.eagle_aux_hidden_state_layer_ids to {to_sglang(trained)} in {path}/config.json "
                "(SGLang indexing of the layers it was trained on; eyas.aux_layer_ids is the training record)")
    if getattr(config, "draft_vocab_size", None) is None:  # SGLang: absent means the full vocabulary
        config.draft_vocab_size = config.vocab_size
    if fmt == OFFICIAL:  # no ids written: it always captures the inputs of layers 2, N//2, N-3
        config.eagle_config = dict(getattr(config, "eagle_config", None) or {}, use_aux_hidden_state=True)
    if fmt != EYAS:  # remember where it came from (and speculators' verifier) for a later export
        extra = data.get("eyas")  # speculators' verifier, an export's record
        config.eyas = {**(extra if isinstance(extra, dict) else {}), "imported_from": fmt}
    return config


def load_draft(path, embed_weight: torch.Tensor | None = None, device="cpu", dtype=None,
               allow_pickle: bool = False) -> Eagle3Draft:
    """An ``Eagle3Draft`` from a folder in any known format (see ``read_draft``)."""
    return build_draft(read_draft(path, allow_pickle), embed_weight, device, dtype)


def build_draft(folder: DraftFolder, embed_weight: torch.Tensor | None = None, device="cpu", dtype=None) -> Eagle3Draft:
    config, state, looks = folder.config, dict(folder.state), LOOKS_LIKE[folder.format]
    check_maps(folder.path, folder.format, config, state)  # what serving refuses, before anything is built
    if "t2d" not in state and "d2t" in state:  # SGLang ignores t2d; rebuild it from d2t
        t2d = torch.zeros(int(config.vocab_size), dtype=torch.bool)
        t2d[state["d2t"].long() + torch.arange(state["d2t"].numel())] = True
        state["t2d"] = t2d
    draft = Eagle3Draft(config)
    if "d2t" not in state:  # full vocabulary: the identity maps the draft was built with
        state["d2t"], state["t2d"] = draft.d2t.clone(), draft.t2d.clone()
    if "embed_tokens.weight" not in state:
        if embed_weight is None:
            raise EyasError(f"the draft in {folder.path} ({looks}) has no embed_tokens.weight and no target "
                            "embedding was given", "load it together with its target")
        want = (int(config.vocab_size), int(config.hidden_size))
        if tuple(embed_weight.shape) != want:
            raise EyasError(
                f"the draft in {folder.path} expects {want[0]} x {want[1]} token embeddings from its target, this "
                f"target's are {embed_weight.shape[0]} x {embed_weight.shape[1]}: it was built for another target",
                "use a draft trained for this target, or the target it was trained for",
            )
        state["embed_tokens.weight"] = embed_weight.detach().cpu()
    check_fits(folder.path, folder.format, state, _expected(config))
    float_dtype = dtype or (embed_weight.dtype if embed_weight is not None else state["fc.weight"].dtype)
    draft = draft.to(float_dtype)
    draft.load_state_dict(state, strict=False)
    draft.name_or_path = str(folder.path)
    draft.source_format = folder.format
    return draft.to(device)
