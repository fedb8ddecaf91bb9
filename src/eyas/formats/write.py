"""A draft written out in the layouts serving engines load: SGLang/SpecForge's and speculators' (vLLM).

``WRITERS`` maps a format id to its writer; each takes a ``formats.DraftFolder`` (any format read
into eyas's shape) and writes a complete folder: ``config.json`` + ``model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import EyasError
from ..layers import to_speculators
from ..models.draft import ARCHITECTURE, HF_NOISE
from .names import SGLANG, SPECULATORS, eyas_target, to_speculators_names
from .read import DraftFolder


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
    # A draft of another width than its target keeps its own embeddings: SGLang's set_embed does not share the
    # target's then (llama_eagle3.py: target_hidden_size != hidden_size), so leaving them out would serve an
    # uninitialised table and reject every proposal, silently.
    include_embeddings = include_embeddings or _target_hidden(folder.config) != int(folder.config.hidden_size)
    state = {k: v for k, v in folder.state.items() if include_embeddings or k != "embed_tokens.weight"}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        # the folder read was finite (checks.check_finite): a value that is not now overflowed the cast
        over = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if over:
            raise EyasError(f"{over[0]} holds values beyond {str(dtype).replace('torch.', '')}'s range: cast, they "
                            "become infinite and the exported draft would reject every proposal",
                            "export with --dtype bfloat16 (float32's range) or keep the draft's dtype")
    if "d2t" in state:  # SGLang reads d2t (int64 offsets); t2d is bool in every format
        state["d2t"] = state["d2t"].long()
        if "t2d" in state:
            state["t2d"] = state["t2d"].bool()
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def _record(config) -> dict:
    """What eyas recorded of the draft's target and training (``config.eyas``), kept in an exported config as
    ``eyas_record`` (a key SGLang and vLLM ignore): ``eyas doctor`` compares it with the target it is pointed
    at, on the folder that is deployed. Not ``eyas``: that key marks eyas's own format."""
    meta = getattr(config, "eyas", None) or {}
    keep = {k: meta[k] for k in ("target", "training") if isinstance(meta.get(k), dict)}
    if isinstance(meta.get("aux_layer_ids"), list):  # the layers it was trained on: a later edit of the ids shows
        keep["aux_layer_ids"] = list(meta["aux_layer_ids"])
    return {"eyas_record": keep} if keep else {}


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
    config.update(_record(folder.config))
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
    state = to_speculators_names(state)
    drop = CONFIG_NOISE + ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
                           "eagle_aux_hidden_state_layer_ids", "torch_dtype", "dtype")
    layer = {k: v for k, v in folder.config.to_dict().items() if k not in drop}
    layer.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False, **_record(folder.config))
    ids = folder.aux_layer_ids
    verifier = verifier or eyas_target(folder.config)[0]
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
                         "architectures": list(verifier_architectures or eyas_target(folder.config)[1])},
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



WRITERS = {SGLANG: write_sglang, SPECULATORS: write_speculators}
