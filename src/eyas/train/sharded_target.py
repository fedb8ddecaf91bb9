"""A target FSDP2-sharded as it loads (``train.shard_target`` under torchrun), so no GPU ever holds it whole.

Every rank builds the architecture on the ``meta`` device, shards it (each decoder layer, then the root)
and allocates only its shard; rank 0 alone reads the weights, into host memory, and
``set_model_state_dict(broadcast_from_rank0=True)`` sends each rank its part. Buffers outside the state
dict (rotary ``inv_freq``) and the draft, whose initialisation copies the target's embeddings and head,
are made on rank 0 from the whole weights and broadcast. Rank 0's host holds the whole target once.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

from ..common.dist import DistContext


def shard_target(target) -> None:
    """FSDP2-shard a frozen target across the ranks, for targets that do not fit one GPU: each decoder
    layer (experts included), an untied embedding and head each on its own, then the root, so a rank
    gathers one part at a time. Aux capture still works: its pre-hooks see each layer's input. The root
    reshards after forward too: FSDP2 keeps a root gathered for the backward that follows, but a frozen
    target has none, and a tied embedding (which stays with the root) would stay whole on every rank."""
    from torch.distributed.fsdp import fully_shard

    for p in target.model.parameters():
        p.requires_grad_(False)
    for layer in target.layers:
        fully_shard(layer)
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    if head is None or head.weight is not embed.weight:  # tied: both uses must share the root's gather
        for part in (embed, head):
            if part is not None:
                fully_shard(part)
    fully_shard(target.model, reshard_after_forward=True)


def broadcast_module(module: nn.Module, names=None) -> None:
    """Rank 0's values of ``module``'s (plain, unsharded) parameters and buffers on every rank, in place."""
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    with torch.no_grad():
        for name in sorted(tensors if names is None else names):
            tdist.broadcast(tensors[name].data, src=0)


def load_sharded_target(path: str, ctx: DistContext, dtype: torch.dtype, aux_layer_ids=None,
                        trust_remote_code: bool = False, allow_pickle: bool = False):
    """(the sharded target on every rank, the whole target in rank 0's host memory or None elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from ..models.loading import build_target_on_meta, load_target

    whole = load_target(path, device="cpu", dtype=dtype, aux_layer_ids=aux_layer_ids,
                        trust_remote_code=trust_remote_code, allow_pickle=allow_pickle) if ctx.main else None
    target = build_target_on_meta(path, dtype, aux_layer_ids, trust_remote_code)
    shard_target(target)
    target.model.to_empty(device=ctx.device)
    full = whole.model.state_dict() if whole is not None else {}
    set_model_state_dict(target.model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    saved = set(target.model.state_dict())
    extra = sorted(n for n, _ in target.model.named_buffers() if n not in saved)  # inv_freq and the like
    if whole is not None:
        theirs = dict(whole.model.named_buffers())
        with torch.no_grad():
            for n, b in target.model.named_buffers():
                if n in extra:
                    b.copy_(theirs[n])
    broadcast_module(target.model, extra)
    return target, whole
