"""The target model: any Hugging Face decoder LM, with EAGLE-3 aux-state capture and tree forwards.

Capture uses forward pre-hooks on the chosen decoder layers, installed for one forward and removed
in ``finally``: the hook reads the hidden state entering layer ``i`` (eyas's convention, see
``eyas.layers``), so no ``output_hidden_states=True`` over all layers is needed. Decoder layers are
found structurally (the ``nn.ModuleList`` of ``num_hidden_layers`` identical blocks beside the token
embedding), so wrappers that nest the language model (``model.language_model`` in multimodal
models) work unchanged.

Every forward takes explicit positions and an explicit additive mask ``[B, 1, T, S + T]`` on top of
the KV cache (a ``DynamicKV``, whose ``DynamicCache`` the model gets), which is how a token tree is verified in
one pass (see ``eyas.models.kv_cache``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import EyasError
from ..layers import check_aux_layers, default_aux_layers


@dataclass(frozen=True)
class TargetInfo:
    """What the checks need to know about a target, without its weights."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    embed_width: int
    max_context: int
    architecture: str = ""


def find_decoder_layers(model: nn.Module, num_layers: int) -> tuple[str, nn.ModuleList]:
    """The ModuleList of the language model's decoder blocks, found by structure, not by name.

    Candidates are ModuleLists of ``num_layers`` modules of one class; among them the one whose
    parent also holds the token embedding wins (a vision tower may have as many layers).
    """
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    candidates = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) != num_layers or num_layers == 0:
            continue
        if len({type(m) for m in module}) != 1:
            continue
        parent_name = name.rsplit(".", 1)[0] if "." in name else ""
        parent = model.get_submodule(parent_name) if parent_name else model
        has_embed = embed is not None and any(child is embed for child in parent.children())
        candidates.append((not has_embed, name.count("."), name, module))
    if not candidates:
        raise EyasError(
            f"could not find {num_layers} decoder layers in {type(model).__name__}",
            "eyas needs a decoder-only language model (or a wrapper holding one) whose blocks sit "
            "in an nn.ModuleList of num_hidden_layers entries",
        )
    candidates.sort(key=lambda c: c[:3])
    _, _, name, module = candidates[0]
    return name, module


class Target:
    """A loaded target model plus its tokenizer, capture settings and info."""

    def __init__(self, model: nn.Module, tokenizer=None, name: str = "target", aux_layer_ids=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        self.text_config = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        n = int(self.text_config.num_hidden_layers)
        self.layers_name, self.layers = find_decoder_layers(model, n)
        embed = model.get_input_embeddings()
        self.info = TargetInfo(
            name=name,
            num_layers=n,
            hidden_size=int(self.text_config.hidden_size),
            vocab_size=int(embed.weight.shape[0]),
            embed_width=int(embed.weight.shape[1]),
            max_context=int(getattr(self.text_config, "max_position_embeddings", 0) or 0),
            architecture=(getattr(cfg, "architectures", None) or [type(model).__name__])[0],
        )
        # A target too shallow for the reference capture has none until a draft or recipe names its layers:
        # it still serves and generates without speculation (``set_aux_layers(None)`` says why it can't capture).
        self.aux_layer_ids = None
        if aux_layer_ids is not None or n >= 4:
            self.set_aux_layers(aux_layer_ids)
        # transformers renamed ``past_key_values`` to ``cache`` in 5.2x; pass whichever it takes.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def set_aux_layers(self, ids) -> None:
        n = self.info.num_layers
        self.aux_layer_ids = check_aux_layers(default_aux_layers(n) if ids is None else ids, n)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def eos_token_ids(self) -> list[int]:
        ids = []
        for source in (getattr(self.model, "generation_config", None), self.text_config, self.model.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if eos is None:
                continue
            for e in eos if isinstance(eos, (list, tuple)) else [eos]:
                if e is not None and int(e) not in ids:
                    ids.append(int(e))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            if int(self.tokenizer.eos_token_id) not in ids:
                ids.append(int(self.tokenizer.eos_token_id))
        return ids

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        position_ids: torch.Tensor,  # [B, T]
        mask: torch.Tensor,  # [B, 1, T, S + T] additive
        cache,  # DynamicKV with S slots; T are appended. None: no cache (S = 0, nothing kept)
        capture: bool = True,
        logits_at: torch.Tensor | None = None,  # [K] sequence indices whose logits are needed
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T or K, vocab]`` and, if ``capture``, aux states ``[B, T, n_aux * hidden]``."""
        captured: dict[int, torch.Tensor] = {}
        handles = []
        if capture:
            for i in self.aux_layer_ids:
                def hook(module, args, kwargs, i=i):
                    captured[i] = args[0] if args else kwargs["hidden_states"]
                handles.append(self.layers[i].register_forward_pre_hook(hook, with_kwargs=True))
        try:
            kwargs = {}
            if logits_at is not None:
                kwargs["logits_to_keep"] = logits_at
            if cache is not None:
                kwargs[self._cache_kw] = cache.hf  # the model takes the DynamicCache itself
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=cache is not None,
                **kwargs,
            )
        finally:
            for h in handles:
                h.remove()
        aux = None
        if capture:
            missing = [i for i in self.aux_layer_ids if i not in captured]
            if missing:
                raise RuntimeError(f"aux capture saw no input for layers {missing}")
            aux = torch.cat([captured[i] for i in self.aux_layer_ids], dim=-1)
        return out.logits, aux
