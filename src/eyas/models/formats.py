"""EAGLE-3 draft folders in the formats the field uses: recognise them, load them, write them.

    eyas         config.json ``LlamaForCausalLMEagle3`` plus an ``eyas`` dict; SGLang's tensor names
    sglang       the same layout without ``eyas``: SGLang and SpecForge checkpoints
    speculators  ``speculators_model_type: "eagle3"`` (vLLM); ``layers.0.*`` instead of ``midlayer.*``
    eagle3       the official EAGLE-3 release: config says ``LlamaForCausalLM``; it is recognised by
                 its tensors (``fc.weight`` 3 x hidden wide, ``midlayer.*``), weights often a ``.bin``

Every format is read into one internal shape, ``DraftFolder``: an eyas/SGLang ``LlamaConfig``
(``draft_vocab_size``, ``target_hidden_size``, ``eagle_config`` with SGLang-indexed layer ids) and
a state dict in SGLang's tensor names. ``Eagle3Draft`` is built from that, and the exports write
it back out. Each name and key below cites the file of the project it was checked against; the
layer-id conventions live in ``eyas.layers``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from ..errors import EyasError
from ..layers import from_sglang, from_speculators, to_sglang, to_speculators
from .bounds import check_config
from .draft import ARCHITECTURE, HF_NOISE, Eagle3Draft
from .safety import checked_file, load_torch_file, refuse_pickle

EYAS, SGLANG, SPECULATORS, OFFICIAL = "eyas", "sglang", "speculators", "eagle3"
FORMATS = (EYAS, SGLANG, SPECULATORS, OFFICIAL)
LOOKS_LIKE = {
    EYAS: "an eyas EAGLE-3 draft",
    SGLANG: "an SGLang/SpecForge EAGLE-3 draft (LlamaForCausalLMEagle3)",
    SPECULATORS: "a speculators (vLLM) EAGLE-3 draft",
    OFFICIAL: "an official EAGLE-3 release (LlamaForCausalLM with a 3 x hidden fc)",
}

# speculators: ``Eagle3SpeculatorConfig.architectures`` defaults to ["Eagle3Speculator"]; a model
# saved by ``Eagle3DraftModel.save_pretrained`` records its class name instead
# (vllm-project/speculators src/speculators/models/eagle3/config.py and core.py).
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")
# Official release: SafeAILab/EAGLE eagle/traineagle3/config.json declares ["LlamaForCausalLM"].
OFFICIAL_ARCHITECTURE = "LlamaForCausalLM"

# Tensor names. SGLang's ``LlamaForCausalLMEagle3`` (sgl-project/sglang
# python/sglang/srt/models/llama_eagle3.py): ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``
# (turned into hot token ids), ``t2d`` (skipped), ``embed_tokens`` optional, a ``model.`` prefix
# optional. SpecForge's draft of the same class name (sgl-project/SpecForge
# specforge/modeling/draft/llama3_eagle.py) and the official ``Model`` (SafeAILab/EAGLE
# eagle/model/cnets.py) use the same names; SpecForge registers d2t/t2d only when the draft
# vocabulary is smaller than the target's, and saves its (frozen) embed_tokens.
LAYER_TENSORS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
)
REQUIRED = ("fc.weight", *(f"midlayer.{n}" for n in LAYER_TENSORS), "norm.weight", "lm_head.weight")
# speculators' ``Eagle3DraftModel`` names the one decoder layer ``layers.0`` (its converter maps
# ``midlayer.`` -> ``layers.0.``: src/speculators/convert/eagle/eagle3_converter.py), and vLLM's
# loader maps it back (vllm-project/vllm vllm/model_executor/models/llama_eagle3.py, load_weights).
SGLANG_LAYER, SPECULATORS_LAYER = "midlayer.", "layers.0."
# speculators keeps frozen copies of the verifier's head and norm that it never saves
# (``_keys_to_ignore_on_save`` in src/speculators/models/eagle3/core.py); drop them if present.
SPECULATORS_IGNORED = ("verifier_lm_head.weight", "verifier_norm.weight")


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
        raise EyasError(f"draft folder {path} does not exist", "pass the folder that holds the draft's config.json")
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
    if not isinstance(data, dict):
        raise EyasError(f"{config_file} holds a {type(data).__name__}, not a JSON object",
                        "restore the draft's config.json")
    return data


def _weight_files(path: Path, looks_like: str, allow_pickle: bool = False) -> list[Path]:
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin")) or sorted(path.glob("*.pt"))
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
    if ARCHITECTURE in arch:
        return EYAS if isinstance(data.get("eyas"), dict) else SGLANG
    if OFFICIAL_ARCHITECTURE in arch:
        shapes = _read_tensors(path, "an official EAGLE-3 release or a plain Llama model", shapes_only=True,
                               allow_pickle=allow_pickle)
        _check_official_shapes(path, data, shapes)
        return OFFICIAL
    known = f"{ARCHITECTURE} (SGLang/SpecForge/eyas), Eagle3Speculator (speculators/vLLM) or " \
            f"{OFFICIAL_ARCHITECTURE} with a 3 x hidden fc (official EAGLE-3)"
    raise EyasError(
        f"{path}: config.json declares architectures {arch or 'none'}, which is no EAGLE-3 draft layout eyas "
        f"knows; expected {known}",
        "point at an EAGLE-3 draft folder in one of those layouts; if it is one, its config.json "
        "architectures entry is wrong",
    )


def _check_official_shapes(path: Path, data: dict, shapes: dict) -> None:
    """A LlamaForCausalLM folder is an EAGLE-3 draft only if its fc fuses 3 target states."""
    hidden = int(data.get("hidden_size") or 0)
    target_hidden = int(data.get("target_hidden_size") or hidden)
    if "fc.weight" not in shapes:
        layered = any(k.startswith("layers.") for k in shapes)
        raise EyasError(
            f"{path}: config.json says {OFFICIAL_ARCHITECTURE} and there is no fc.weight"
            + (" but full decoder layers: this is a plain Llama model, not a draft" if layered else "")
            + "; an official EAGLE-3 draft has fc.weight of width 3 x hidden and midlayer.* tensors",
            "pass an EAGLE-3 draft folder as the draft (the target goes in --model-path)",
        )
    if len(shapes["fc.weight"]) != 2:
        raise EyasError(f"{path} looks like {LOOKS_LIKE[OFFICIAL]}, but fc.weight has shape {shapes['fc.weight']}, "
                        "not a matrix", "download the draft again")
    out_dim, in_dim = shapes["fc.weight"]
    if in_dim == 2 * target_hidden:
        raise EyasError(
            f"{path}: fc.weight is {in_dim} = 2 x hidden {target_hidden} wide, cat(embed, hidden): this is an "
            "EAGLE-1/2 draft, not EAGLE-3 (whose fc fuses 3 captured target states, 3 x hidden)",
            "serve it with SGLang --speculative-algorithm EAGLE, or train an EAGLE-3 draft with eyas train",
        )
    if in_dim != 3 * target_hidden or out_dim != hidden:
        raise EyasError(
            f"{path} looks like {LOOKS_LIKE[OFFICIAL]}, but fc.weight is {out_dim} x {in_dim}; with hidden_size "
            f"{hidden} and target_hidden_size {target_hidden} it must be {hidden} x {3 * target_hidden}",
            "the weights and config.json do not belong together; download the draft again",
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
        state = _from_speculators_names(state)
    _check_state(path, fmt, config, state)
    return DraftFolder(path, fmt, config, state)


def _normalise_config(path: Path, fmt: str, data: dict) -> LlamaConfig:
    looks = LOOKS_LIKE[fmt]
    if fmt == SPECULATORS:
        data = _speculators_to_sglang_config(path, data)
    else:
        data = dict(data)
        data["architectures"] = [ARCHITECTURE]
    layers = int(data.get("num_hidden_layers") or 1)
    if layers != 1:
        raise EyasError(f"{path} looks like {looks} with {layers} decoder layers; eyas's draft has exactly one",
                        "use a one-layer EAGLE-3 draft (SGLang's and SpecForge's default)")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(data.get(key), int):
            raise EyasError(f"{path} looks like {looks}, but its config has no integer {key!r}",
                            "restore the draft's complete config.json")
    check_config(data, f"{path}/config.json ({looks})", dtype_bytes=4)  # before anything is allocated
    try:
        config = LlamaConfig.from_dict(data)
    except (ValueError, TypeError, KeyError) as e:
        raise EyasError(f"{path} looks like {looks}, but its config cannot be read as a Llama config: {e}",
                        "restore the draft's complete config.json") from None
    top = data.get("eagle_aux_hidden_state_layer_ids")
    sgl = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if fmt in (EYAS, SGLANG) and top is not None and sgl is not None and list(top) != from_sglang(sgl):
        raise EyasError(
            f"{path} looks like {looks} but names two different captured layer sets: eagle_config's "
            f"{sgl} (SGLang indexing, = inputs of layers {from_sglang(sgl)}) and a top-level {top} (vLLM indexing)",
            "keep the set the draft was trained with; eyas export writes both consistently",
        )
    if getattr(config, "draft_vocab_size", None) is None:  # SGLang: absent means the full vocabulary
        config.draft_vocab_size = config.vocab_size
    if fmt == OFFICIAL:  # no ids written: it always captures the inputs of layers 2, N//2, N-3
        config.eagle_config = dict(getattr(config, "eagle_config", None) or {}, use_aux_hidden_state=True)
    if fmt != EYAS:  # remember where it came from (and speculators' verifier) for a later export
        extra = data.get("eyas") if fmt == SPECULATORS else None
        config.eyas = {**(extra or {}), "imported_from": fmt}
    return config


def _speculators_to_sglang_config(path: Path, data: dict) -> dict:
    """speculators' Eagle3SpeculatorConfig -> eyas/SGLang config (src/speculators/models/eagle3/config.py)."""
    looks = LOOKS_LIKE[SPECULATORS]
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise EyasError(f"{path} looks like {looks} but has no transformer_layer_config object",
                        "restore the speculator's complete config.json")
    # speculators builds a Qwen3Config when model_type is absent (``validate_transformer_config``).
    model_type = layer.get("model_type", "qwen3")
    if model_type != "llama":
        raise EyasError(f"{path} looks like {looks} with a {model_type!r} decoder layer; eyas's draft is Llama-shaped",
                        "use a speculator whose transformer_layer_config has model_type 'llama'")
    # Variants that change the maths: eyas (like SGLang) keeps the un-normed fused state as the
    # residual. vLLM's speculators loader assumes norm_before_residual=True when the key is absent
    # (vllm/transformers_utils/configs/speculators/algos.py), speculators itself False.
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        if data.get(flag):
            raise EyasError(
                f"{path} looks like {looks} trained with {flag}=true, a variant eyas's draft (SGLang's layout) "
                "does not compute; loading it would give wrong logits",
                "serve it with vLLM, or retrain without that option",
            )
    out = dict(layer)
    out["architectures"] = [ARCHITECTURE]
    if data.get("draft_vocab_size") is None:
        raise EyasError(f"{path} looks like {looks} but its config has no draft_vocab_size",
                        "restore the speculator's complete config.json")
    out["draft_vocab_size"] = int(data["draft_vocab_size"])
    out["target_hidden_size"] = int(data.get("target_hidden_size") or layer.get("hidden_size") or 0)
    ids = data.get("eagle_aux_hidden_state_layer_ids")
    eagle = {"use_aux_hidden_state": True}
    if ids:
        eagle["eagle_aux_hidden_state_layer_ids"] = to_sglang(from_speculators(ids))
    out["eagle_config"] = eagle
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    out["eyas"] = {"verifier": {"name_or_path": verifier.get("name_or_path"),
                                "architectures": verifier.get("architectures")}}
    return out


def _from_speculators_names(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        if k in SPECULATORS_IGNORED:
            continue
        out[SGLANG_LAYER + k[len(SPECULATORS_LAYER):] if k.startswith(SPECULATORS_LAYER) else k] = v
    return out


def _shown(fmt: str, name: str) -> str:
    """A tensor name as that format spells it, for messages."""
    if fmt == SPECULATORS and name.startswith(SGLANG_LAYER):
        return SPECULATORS_LAYER + name[len(SGLANG_LAYER):]
    return name


def _check_state(path: Path, fmt: str, config: LlamaConfig, state: dict) -> None:
    looks = LOOKS_LIKE[fmt]
    missing = [n for n in REQUIRED if n not in state]
    vocab, draft_vocab = int(config.vocab_size), int(config.draft_vocab_size)
    if draft_vocab != vocab and "d2t" not in state:
        missing.append("d2t")
    if missing:
        shown = ", ".join(_shown(fmt, n) for n in missing)
        extra = (f" (its draft vocabulary of {draft_vocab} tokens is smaller than the target's {vocab}, so d2t, "
                 "the draft-to-target id map, is required)") if "d2t" in missing else ""
        raise EyasError(f"{path} looks like {looks} but is missing {shown}{extra}",
                        "download or export the draft again; a complete folder has all of "
                        + ", ".join(_shown(fmt, n) for n in (*REQUIRED, "d2t")))
    hidden = int(config.hidden_size)
    target_hidden = int(getattr(config, "target_hidden_size", None) or hidden)
    ids = (getattr(config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    n_aux = len(ids) if ids is not None else 3
    fc = tuple(state["fc.weight"].shape)
    if fc != (hidden, n_aux * target_hidden):
        raise EyasError(
            f"{path} looks like {looks}, but fc.weight is {' x '.join(map(str, fc)) or 'a scalar'}; "
            f"it must fuse {n_aux} captured "
            f"layers x target_hidden_size {target_hidden} = {n_aux * target_hidden} into hidden {hidden}"
            + (" (2 x hidden: an EAGLE-1/2 draft)" if fc[-1] == 2 * target_hidden else ""),
            "the weights and config.json do not belong together; re-export the draft from its source",
        )
    lm_head = tuple(state["lm_head.weight"].shape)
    if lm_head != (draft_vocab, hidden):
        raise EyasError(f"{path} looks like {looks}, but lm_head.weight is {lm_head}, its config implies "
                        f"({draft_vocab}, {hidden}) = (draft_vocab_size, hidden_size)",
                        "the weights and config.json do not belong together")


def load_draft(path, embed_weight: torch.Tensor | None = None, device="cpu", dtype=None,
               allow_pickle: bool = False) -> Eagle3Draft:
    """An ``Eagle3Draft`` from a folder in any known format (see ``read_draft``)."""
    return build_draft(read_draft(path, allow_pickle), embed_weight, device, dtype)


def build_draft(folder: DraftFolder, embed_weight: torch.Tensor | None = None, device="cpu", dtype=None) -> Eagle3Draft:
    config, state, looks = folder.config, dict(folder.state), LOOKS_LIKE[folder.format]
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
    expected = {k: tuple(v.shape) for k, v in draft.state_dict().items() if not k.startswith("rotary_emb.")}
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise EyasError(f"{folder.path} looks like {looks} but holds tensors eyas's draft does not have: "
                        f"{', '.join(_shown(folder.format, k) for k in unexpected)}",
                        "this is a variant of EAGLE-3 eyas cannot run (e.g. extra layers or biases)")
    for k, shape in expected.items():
        if tuple(state[k].shape) != shape:
            raise EyasError(f"{folder.path} looks like {looks}, but {_shown(folder.format, k)} has shape "
                            f"{tuple(state[k].shape)}, its config implies {shape}",
                            "the weights and config.json do not belong together")
    float_dtype = dtype or (embed_weight.dtype if embed_weight is not None else state["fc.weight"].dtype)
    draft = draft.to(float_dtype)
    draft.load_state_dict(state, strict=False)
    draft.name_or_path = str(folder.path)
    draft.source_format = folder.format
    return draft.to(device)


# -- writing ---------------------------------------------------------------------------------------
def _legacy_rope(config: dict) -> dict:
    """transformers 4 readers (SGLang, vLLM) take ``rope_theta``/``rope_scaling``, 5 ``rope_parameters``."""
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if scaling.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", scaling)
    return config


# PretrainedConfig bookkeeping that no serving engine reads; left out of exported configs.
CONFIG_NOISE = ("eyas", "transformers_version") + HF_NOISE


def _export_state(folder: DraftFolder, include_embeddings: bool, dtype) -> dict[str, torch.Tensor]:
    state = {k: v for k, v in folder.state.items() if include_embeddings or k != "embed_tokens.weight"}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    if "d2t" in state:  # SGLang reads d2t (int64 offsets); t2d is bool in every format
        state["d2t"] = state["d2t"].long()
        if "t2d" in state:
            state["t2d"] = state["t2d"].bool()
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def _dtype_name(state: dict) -> str:
    return str(state["fc.weight"].dtype).replace("torch.", "")


def write_sglang(folder: DraftFolder, out, include_embeddings: bool = False, dtype=None) -> Path:
    """SGLang/SpecForge layout: ``LlamaForCausalLMEagle3`` config, SGLang tensor names (llama_eagle3.py)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = _export_state(folder, include_embeddings, dtype)
    config = {k: v for k, v in folder.config.to_dict().items() if k not in CONFIG_NOISE}
    config.update(architectures=[ARCHITECTURE], num_hidden_layers=1, tie_word_embeddings=False,
                  draft_vocab_size=int(folder.config.draft_vocab_size),
                  target_hidden_size=_target_hidden(folder.config),
                  torch_dtype=_dtype_name(state), dtype=_dtype_name(state), model_type="llama")
    # SGLang reads eagle_config.{use_aux_hidden_state, eagle_aux_hidden_state_layer_ids} (SGLang
    # indexing; python/sglang/srt/model_executor/model_runner.py). vLLM reads a top-level
    # eagle_aux_hidden_state_layer_ids first, in its own (= eyas's) indexing
    # (vllm/v1/worker/gpu_model_runner.py, _get_eagle3_aux_layers_from_config): written too, so the
    # same folder captures the same states in both engines.
    eagle = dict(config.get("eagle_config") or {})
    eagle["use_aux_hidden_state"] = True
    config["eagle_config"] = eagle
    if folder.aux_layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = to_speculators(folder.aux_layer_ids)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(_legacy_rope(config), indent=2, sort_keys=True) + "\n")
    return out


def write_speculators(folder: DraftFolder, out, verifier: str | None = None, verifier_architectures=None,
                      include_embeddings: bool = False, dtype=None, speculative_tokens: int = 3) -> Path:
    """speculators' ``Eagle3SpeculatorConfig`` layout, as vLLM reads it.

    Keys checked in vllm-project/speculators src/speculators/models/eagle3/config.py (fields),
    src/speculators/config.py (``speculators_config``: algorithm, proposal_methods,
    default_proposal_method, verifier{name_or_path, architectures}) and vllm-project/vllm
    vllm/transformers_utils/configs/speculators/base.py + algos.py (what vLLM reads).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = _export_state(folder, include_embeddings, dtype)
    vocab, draft_vocab = int(folder.config.vocab_size), int(folder.config.draft_vocab_size)
    if draft_vocab == vocab:  # speculators registers no d2t/t2d buffers for a full vocabulary
        state.pop("d2t", None)
        state.pop("t2d", None)
    state = {(SPECULATORS_LAYER + k[len(SGLANG_LAYER):] if k.startswith(SGLANG_LAYER) else k): v
             for k, v in state.items()}
    drop = CONFIG_NOISE + ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
                           "eagle_aux_hidden_state_layer_ids", "torch_dtype", "dtype")
    layer = {k: v for k, v in folder.config.to_dict().items() if k not in drop}
    layer.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    ids = folder.aux_layer_ids
    verifier = verifier or _eyas_target(folder.config)[0]
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            # speculators' GreedyTokenProposalConfig (src/speculators/proposals/greedy.py); vLLM reads
            # proposal_methods[0].speculative_tokens as the default num_speculative_tokens.
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier,
                         "architectures": list(verifier_architectures or _eyas_target(folder.config)[1])},
        },
        "transformer_layer_config": _legacy_rope(layer),
        "draft_vocab_size": draft_vocab,
        # Written explicitly: vLLM assumes True when it is absent, and eyas computes False.
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "target_hidden_size": _target_hidden(folder.config),
        "eagle_aux_hidden_state_layer_ids": to_speculators(ids) if ids is not None else None,
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(state),
        "dtype": _dtype_name(state),
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def _target_hidden(config) -> int:
    return int(getattr(config, "target_hidden_size", None) or config.hidden_size)


def recorded_target(config) -> str | None:
    """The target (verifier) name or path a draft's config records, if any."""
    return _eyas_target(config)[0]


def _eyas_target(config) -> tuple[str | None, list[str]]:
    """(verifier name, architectures) recorded by eyas training or by a speculators import."""
    meta = getattr(config, "eyas", None) or {}
    if meta.get("verifier"):
        v = meta["verifier"]
        return v.get("name_or_path"), list(v.get("architectures") or ["LlamaForCausalLM"])
    target = meta.get("target") or {}
    return target.get("name"), [target["architecture"]] if target.get("architecture") else ["LlamaForCausalLM"]


WRITERS = {SGLANG: write_sglang, SPECULATORS: write_speculators}
