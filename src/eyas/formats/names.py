"""What each ecosystem calls an EAGLE-3 draft's parts, and the maps between them and eyas's shape.

The format ids and how each is described in messages; the architectures that mark a format; the
tensor names (SGLang's, which are eyas's, and speculators' ``layers.0.*``); speculators' config
mapped to eyas's (SGLang's) config; and the target a draft's config records. Each name and key
cites the file of the project it was checked against; the layer-id conventions live in
``eyas.layers``. Reading (``read``), checking (``checks``) and writing
(``write``) all take their names from here.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EyasError
from ..layers import from_speculators, to_sglang
from ..models.draft import ARCHITECTURE

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
# vLLM registers its EAGLE-3 Llama draft as ``Eagle3LlamaForCausalLM`` beside SGLang's name, one loader for both
# (vllm/model_executor/models/registry.py): folders written for vLLM carry either, with SGLang's tensor names.
SGLANG_ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")
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


def speculators_to_sglang_config(path: Path, data: dict) -> dict:
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
    if ids:  # vLLM reads an empty list as "not given": the default layers (checked by formats first)
        eagle["eagle_aux_hidden_state_layer_ids"] = to_sglang(from_speculators(ids))
    out["eagle_config"] = eagle
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    out["eyas"] = {"verifier": {"name_or_path": verifier.get("name_or_path"),
                                "architectures": verifier.get("architectures")}}
    return out


def from_speculators_names(state: dict) -> dict:
    """speculators' tensor names -> SGLang's (``layers.0.*`` -> ``midlayer.*``), its unsaved verifier copies dropped."""
    out = {}
    for k, v in state.items():
        if k in SPECULATORS_IGNORED:
            continue
        out[SGLANG_LAYER + k[len(SPECULATORS_LAYER):] if k.startswith(SPECULATORS_LAYER) else k] = v
    return out


def shown(fmt: str, name: str) -> str:
    """A tensor name as that format spells it, for messages."""
    if fmt == SPECULATORS and name.startswith(SGLANG_LAYER):
        return SPECULATORS_LAYER + name[len(SGLANG_LAYER):]
    return name


def to_speculators_names(state: dict) -> dict:
    """SGLang tensor names -> speculators' (``midlayer.*`` -> ``layers.0.*``)."""
    return {(SPECULATORS_LAYER + k[len(SGLANG_LAYER):] if k.startswith(SGLANG_LAYER) else k): v
            for k, v in state.items()}


def recorded_target(config) -> str | None:
    """The target (verifier) name or path a draft's config records, if any."""
    return eyas_target(config)[0]


def eyas_target(config) -> tuple[str | None, list[str]]:
    """(verifier name, architectures) recorded by eyas training or by a speculators import."""
    from ..common.training_record import record_of

    meta = record_of(config)[0]  # fields of another type than eyas writes are dropped
    if meta.get("verifier"):
        v = meta["verifier"]
        return v.get("name_or_path"), list(v.get("architectures") or ["LlamaForCausalLM"])
    target = meta.get("target") or {}
    return target.get("name"), [target["architecture"]] if target.get("architecture") else ["LlamaForCausalLM"]
