"""Run in a subprocess by test_interop_speculators.py: load an export with the PyPI ``speculators``
package and compute its draft logits with its own modules.

    python speculators_probe.py EXPORT_DIR INPUTS.pt OUTPUT.pt [RESAVE_DIR]

With RESAVE_DIR, the loaded model is also written back by speculators' own ``save_pretrained``
(the other direction: eyas must read what speculators writes).

Two paths through speculators' ``Eagle3DraftModel`` (src/speculators/models/eagle3/core.py):
``logits``: its fc, embed_tokens, rotary_emb, layers[0] (the Eagle3 first layer), norm and lm_head
composed exactly as its ``forward`` does for the first TTT step; ``tokens``: its ``forward`` itself
with ``ttt_steps=1`` (it returns the argmax draft tokens, not logits). Attention is "sdpa" (its
default, flex attention, is a training kernel and not what is compared here).

eyas's export ships no ``embed_tokens.weight`` (both engines share the target's). speculators fills
it from the verifier only when it is still NaN after loading; under transformers 5.24 (outside
speculators 0.9.0's pin, <= 5.19) a missing tensor comes back uninitialised instead, so the probe
reloads it with speculators' own ``_load_verifier_weights(overwrite_embed_tokens=True)`` and
reports whether that was needed.
"""

from __future__ import annotations

import sys

import torch
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def main(export_dir: str, inputs_file: str, out_file: str, resave_dir: str | None = None) -> None:
    config = Eagle3SpeculatorConfig.from_pretrained(export_dir)
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = Eagle3DraftModel.from_pretrained(export_dir, config=config).eval()
    from speculators.utils.loading import load_model_layers

    verifier_embed = load_model_layers(["embed_tokens.weight"], model.config.speculators_config.verifier.name_or_path)
    embed_from_verifier = torch.equal(model.embed_tokens.weight, verifier_embed["embed_tokens.weight"].to(
        model.embed_tokens.weight.dtype))
    if not embed_from_verifier:
        model._load_verifier_weights(overwrite_embed_tokens=True)
    if resave_dir:
        model.save_pretrained(resave_dir)
    model = model.to(torch.float64)
    inputs = torch.load(inputs_file)
    ids, aux, pos = inputs["input_ids"], inputs["aux"], inputs["position_ids"]  # [1, T], [1, T, 3H], [1, T]
    t = ids.shape[1]
    with torch.no_grad():
        hidden = model.fc(aux)
        x = torch.cat([model.embed_tokens(ids), hidden], dim=-1)  # [1, T, 2H]
        position_embeddings = model.rotary_emb(x, pos)
        causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out = model.layers[0](x, attention_mask=causal, position_ids=pos, position_embeddings=position_embeddings)
        logits = model.lm_head(model.norm(out))  # [1, T, draft_vocab]
        tokens = model(hidden_states=aux, input_ids=ids, document_ids=torch.zeros_like(ids),
                       position_ids=pos, ttt_steps=1)[0]  # [1, T] draft-vocabulary ids
    torch.save({"logits": logits, "tokens": tokens, "d2t": model.d2t, "t2d": model.t2d,
                "aux_layer_ids": list(model.config.eagle_aux_hidden_state_layer_ids),
                "embed_from_verifier_on_load": embed_from_verifier,
                "verifier": model.config.speculators_config.verifier.name_or_path}, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:5])
