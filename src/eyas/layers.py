"""The one place where captured-layer indices are defined and converted.

eyas convention: a captured layer id ``i`` is the hidden state that *enters* decoder layer ``i``
(equivalently, the output of layer ``i - 1``; id 0 is the token embedding). This is the index of
Hugging Face's ``output_hidden_states`` tuple, where ``hidden_states[0]`` is the embedding output.
Valid ids are ``0 .. N - 1`` for a target with ``N`` decoder layers.

The reference EAGLE-3 choice is ``[2, N // 2, N - 3]``: ``[2, 15, 27]`` for a 30-layer target,
``[2, 30, 58]`` for a 61-layer one.

SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids`` index the *output* of a layer and SGLang
adds 1 when it captures, so ``sglang_id = eyas_id - 1``. SpecForge writes ``[1, N//2 - 1, N - 4]``
there by default, which is the same three states.
"""

from __future__ import annotations

from .errors import EyasError


def default_aux_layers(num_layers: int) -> list[int]:
    """The reference ``[2, N // 2, N - 3]`` in eyas's convention (inputs of those layers). Below 7 layers (test
    models) those collide, so three distinct layers spread over the depth stand in: ``[1, N // 2, N - 1]``,
    ``[0, 1, 2]`` for 3."""
    if num_layers < 3:
        raise EyasError(f"the target has {num_layers} decoder layers; an EAGLE-3 draft captures three",
                        "use a target of at least 3 decoder layers")
    if num_layers < 7:
        return [0, 1, 2] if num_layers == 3 else [1, num_layers // 2, num_layers - 1]
    return [2, num_layers // 2, num_layers - 3]


def from_sglang(ids: list[int]) -> list[int]:
    """SGLang/SpecForge ``eagle_aux_hidden_state_layer_ids`` (output of layer) -> eyas ids."""
    return [int(i) + 1 for i in ids]


def to_sglang(ids: list[int]) -> list[int]:
    """eyas ids (input of layer) -> SGLang/SpecForge ``eagle_aux_hidden_state_layer_ids``."""
    return [int(i) - 1 for i in ids]


def check_aux_layers(ids: list[int], num_layers: int) -> list[int]:
    """Refuse ids the target cannot provide; return them as plain ints."""
    ids = [int(i) for i in ids]
    if len(set(ids)) != len(ids):
        example = f", e.g. the default {default_aux_layers(num_layers)}" if num_layers >= 3 else \
            f" (a target of {num_layers} layers has too few: use one of at least 3)"
        raise EyasError(f"captured layer ids {ids} repeat a layer: each captured state must be another layer's",
                        f"list distinct ids{example}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise EyasError(
            f"captured layer ids {ids} include {bad}, outside the target's 0..{num_layers - 1} "
            f"(it has {num_layers} decoder layers; eyas ids are inputs of decoder layers)",
            f"use ids within range, e.g. the default {default_aux_layers(num_layers)}; a draft "
            "with such ids was probably trained for a deeper target",
        )
    return ids


def check_trained_depth(record: dict | None, num_layers: int) -> None:
    """Refuse a draft whose training record (``config.eyas``, written by eyas train) names a target of another
    depth: its layer ids then name other states than it learnt from, and nothing else would say so."""
    depth = ((record or {}).get("target") or {}).get("num_hidden_layers")
    if depth is not None and int(depth) != num_layers:
        raise EyasError(f"the draft was trained on a {depth}-layer target; this one has {num_layers} layers, so "
                        "the captured states are different ones and the draft would accept little, silently",
                        "use the draft trained for this target, or this draft's own target")


# -- the serving systems' conventions, each checked against that project's source ---------------
#
# SGLang: ``set_eagle3_layers_to_capture`` stores ``[val + 1 for val in layer_ids]`` and its decoder
# loops capture ``hidden_states + residual`` *before* layer ``i`` runs (sgl-project/sglang
# python/sglang/srt/models/llama.py), so an SGLang id names the output of a layer: eyas id - 1.
# SpecForge: ``resolve_capture_layers`` defaults to ``[1, N // 2 - 1, N - 4]`` in that key
# (sgl-project/SpecForge specforge/modeling/target/eagle3_target_model.py).
# vLLM / speculators: top-level ``eagle_aux_hidden_state_layer_ids`` is used as is; vLLM's Llama
# captures ``hidden_states + residual`` before layer ``idx`` runs (vllm-project/vllm
# vllm/model_executor/models/llama.py) and speculators defaults to ``[2, N // 2, N - 3]``
# (vllm-project/speculators src/speculators/models/utils.py ``resolve_target_layer_ids``), so a
# speculators id is an eyas id. The official EAGLE-3 release writes no ids: it always captures the
# inputs of layers 2, N // 2, N - 3, i.e. eyas's default.


def specforge_default_aux_layers(num_layers: int) -> list[int]:
    """SpecForge's default ``eagle_aux_hidden_state_layer_ids`` (SGLang indexing): ``[1, N//2 - 1, N - 4]``."""
    return to_sglang(default_aux_layers(num_layers))


def from_speculators(ids: list[int]) -> list[int]:
    """speculators/vLLM ``eagle_aux_hidden_state_layer_ids`` (input of layer) -> eyas ids: the same."""
    return [int(i) for i in ids]


def to_speculators(ids: list[int]) -> list[int]:
    """eyas ids -> speculators/vLLM ``eagle_aux_hidden_state_layer_ids``: the same numbers."""
    return [int(i) for i in ids]
