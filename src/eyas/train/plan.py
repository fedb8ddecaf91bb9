"""``eyas train --plan``: what a training run needs, from the target's config and the recipe alone.

No weights are read and no memory is allocated: the target and the draft are built on PyTorch's
``meta`` device, which gives exact parameter counts for any architecture transformers knows (MoE
experts, MLA projections, a vision tower beside the language model), and the draft comes from the
same ``Eagle3Draft.config_for_target`` the trainer uses. The rest follows from the recipe:

- target weights at the training dtype (bf16 on a GPU, fp32 on the CPU), whole on every GPU, or with
  ``train.shard_target`` a 1/N shard plus two whole decoder layers (FSDP2 gathers the layer that
  runs and the next one; an MoE layer is gathered with all its experts);
- loading, before any of that: without ``train.shard_target`` every rank loads the whole target onto its
  device beside the draft (on the CPU the checkpoint's mapped file pages count too); with it, under
  torchrun, each rank allocates only its shard and rank 0 alone reads the whole target into host memory
  (file pages included) and sends each rank its part, so loading costs rank 0's host, not any GPU;
- the draft in fp32 (its frozen copy of the embeddings included), its gradients, AdamW's two
  moments, and DDP's gradient buckets under torchrun (``train.parallel=fsdp``: all of it 1/N);
- activations at ``data.tokens_per_batch`` tokens a rank: the target's logits and captured states,
  and the TTT unroll's tensors kept for the backward pass (the draft-vocabulary logits dominate);
- offline mode's disk: per token, the captured states and the state entering ``lm_head``.

The figures are estimates written from what the code keeps alive; on the CPU, fp32, a tiny target's
figure is within 20% of the measured peak, in one process and sharded over two (``tests/train/test_plan.py``,
``tests/train/test_plan_sharded.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import EyasError
from .recipe import Recipe

GB = 10**9
GPU_OVERHEAD = 2 * GB  # CUDA context, kernels, NCCL buffers and allocator slack, per GPU
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float64": 8}


@dataclass
class Shapes:
    """The sizes the plan needs, read from configs."""

    name: str
    architecture: str
    layers: int
    hidden: int
    vocab: int
    target_params: int
    stored_bytes: int  # bytes per parameter in the checkpoint (its config's dtype)
    largest_layer: int  # parameters of the largest decoder layer (what FSDP2 gathers at once)
    tied: bool  # the head is the embedding (FSDP2 keeps it with the root, gathered for the whole forward)
    mlp_width: int  # widest MLP activation a token makes in one layer (dense, or experts x active)
    aux_layer_ids: list[int]
    fc_in: int
    draft_hidden: int
    draft_intermediate: int
    draft_attn_width: int  # q + k + v + o widths of the draft's attention
    draft_vocab: int
    draft_params: int
    draft_trainable: int


@dataclass
class Plan:
    shapes: Shapes
    device: str  # "cuda" or "cpu": what the dtypes were resolved for
    gpus: int
    gpu_memory: int
    tokens_per_batch: int
    ttt_steps: int
    parts: dict[str, int]  # bytes per GPU (or per process on the CPU) during a training step
    phases: dict[str, int]  # the activations part: the larger of the target's forward and the draft's step
    loading: dict[str, int]  # bytes per GPU (or process) while the target loads; sharded: rank 0's host
    min_gpus: int | None  # fewest GPUs the recipe runs on; None: no count does
    min_gpus_sharded: int | None  # the same with train.shard_target on
    min_gpus_step: int | None  # fewest GPUs the sharded training step alone needs (were the target loaded sharded)
    offline_per_token: int
    offline_fixed: int  # lm_head copy beside the shards
    offline_tokens: int | None  # tokens in the recipe's data, when it exists
    notes: list[str] = field(default_factory=list)
    sharded_load: bool = False  # train.shard_target over several ranks: ``loading`` is rank 0's host memory

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def load_total(self) -> int:
        return sum(self.loading.values())

    @property
    def peak(self) -> int:
        """What the run needs per GPU (or process), on rank 0 where ranks differ. A sharded load is host
        memory: on a GPU the training step alone; on the CPU rank 0 holds the whole target beside its shard."""
        if not self.sharded_load:
            return max(self.total, self.load_total)
        if self.device == "cuda":
            return self.total
        shard = next(v for k, v in self.parts.items() if k.startswith("target shard"))
        return max(self.total, self.load_total + shard + self.parts["draft weights (fp32)"])


def meta_target(path: str, trust_remote_code: bool = False):
    """The target as a ``Target`` on the meta device: its shapes and parameter counts, no memory."""
    from transformers import AutoConfig

    from ..models.bounds import read_config_file
    from ..models.loading import model_class, resolve
    from ..models.target import Target

    folder, gguf = resolve(path)
    kwargs = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if gguf:
        kwargs["gguf_file"] = gguf
    else:
        read_config_file(folder, "target")  # absurd sizes: an error naming the key
    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
        with torch.device("meta"):
            model = model_class(config.model_type).from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as e:
        from ..models.safety import remote_code_refusal

        if remote_code_refusal(e, folder):
            raise remote_code_refusal(e, folder) from None
        raise EyasError(f"cannot build the target described in {folder}: {type(e).__name__}: {str(e)[:300]}",
                        "point --model at a Hugging Face model folder (its config.json is all --plan reads)") from None
    return Target(model, None, name=path)


def _mlp_width(text_config) -> int:
    """Per token: the widest MLP activation of one layer (MoE: active experts, plus shared ones)."""
    dense = int(getattr(text_config, "intermediate_size", 0) or 0)
    moe = int(getattr(text_config, "moe_intermediate_size", 0) or 0)
    active = int(getattr(text_config, "num_experts_per_tok", 0) or 0)
    if moe and active:
        shared = int(getattr(text_config, "n_shared_experts", 0) or 0) + int(
            bool(getattr(text_config, "shared_expert_intermediate_size", 0)))
        return max(dense, moe * (active + shared))
    return dense if not active else dense * active


def read_shapes(recipe: Recipe, trust_remote_code: bool = False) -> Shapes:
    from ..models.draft import Eagle3Draft

    target = meta_target(recipe.target, trust_remote_code)
    if recipe.draft.aux_layer_ids is not None or target.aux_layer_ids is None:  # None: the error says why
        target.set_aux_layers(recipe.draft.aux_layer_ids)
    info = target.info
    draft_vocab = min(recipe.draft.vocab_size, info.vocab_size)
    config = Eagle3Draft.config_for_target(target, draft_vocab)
    with torch.device("meta"):
        draft = Eagle3Draft(config)
    attn = draft.midlayer.self_attn
    stored = getattr(target.model.config, "dtype", None) or getattr(target.model.config, "torch_dtype", None)
    stored_bytes = DTYPE_BYTES.get(str(stored).lower().removeprefix("torch."), 2)
    return Shapes(
        name=recipe.target, architecture=info.architecture, layers=info.num_layers, hidden=info.hidden_size,
        vocab=info.vocab_size, target_params=sum(p.numel() for p in target.model.parameters()),
        stored_bytes=stored_bytes,
        largest_layer=max(sum(p.numel() for p in layer.parameters()) for layer in target.layers),
        tied=target.model.get_output_embeddings() is not None
        and target.model.get_output_embeddings().weight is target.model.get_input_embeddings().weight,
        mlp_width=_mlp_width(target.text_config), aux_layer_ids=list(target.aux_layer_ids),
        fc_in=draft.fc.in_features, draft_hidden=config.hidden_size, draft_intermediate=config.intermediate_size,
        draft_attn_width=sum(p.out_features for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)),
        draft_vocab=draft_vocab, draft_params=sum(p.numel() for p in draft.parameters()),
        draft_trainable=sum(p.numel() for p in draft.parameters() if p.requires_grad),
    )


def _dtypes(recipe: Recipe) -> tuple[str, int, int]:
    """(device, target bytes per parameter, activation bytes per matmul output)."""
    t = recipe.train
    device = "cpu" if t.device == "cpu" else "cuda"
    if t.target_dtype == "auto":
        target_bytes = 2 if device == "cuda" else 4
    else:
        target_bytes = DTYPE_BYTES.get(str(t.target_dtype).lower(), 2)
    autocast = t.autocast == "bf16" or (t.autocast == "auto" and device == "cuda")
    return device, target_bytes, 2 if autocast else 4


def step_phases(s: Shapes, tokens: int, steps: int, target_bytes: int, act_bytes: int,
                gathered: int = 0) -> dict[str, int]:
    """Bytes of activations a rank holds in each phase of a training step, for ``tokens`` tokens a rank:
    the target's forward (with ``gathered`` bytes of whole layers FSDP2 holds while it runs, freed after
    each layer's forward), then the draft's TTT unroll and its backward. The step needs the larger."""
    n = tokens
    # The target's forward: one layer's hidden, norm, attention and MLP tensors at a time.
    target_forward = n * (8 * s.hidden + 3 * s.mlp_width) * target_bytes
    # What the step keeps from it: logits [n, vocab], captured states (and their fp32 copy).
    kept = n * (s.vocab + len(s.aux_layer_ids) * s.hidden) * target_bytes
    if target_bytes != 4:
        kept += n * len(s.aux_layer_ids) * s.hidden * 4
    kept += n * s.draft_vocab * 4  # the target's distribution over the draft vocabulary, fp32
    # Each TTT step keeps for the backward pass: its draft-vocabulary logits (the lm_head output, its
    # fp32 copy when autocast, the log-softmax), and the layer's norms, cat, q/k/v/o and MLP tensors.
    vocab_step = n * s.draft_vocab * (act_bytes + 4 + (4 if act_bytes != 4 else 0))
    hidden_step = n * (12 * s.draft_hidden + 2 * s.draft_attn_width + 4 * s.draft_intermediate) * act_bytes
    ttt = steps * (vocab_step + hidden_step)
    backward = 2 * n * s.draft_vocab * 4  # the loss's gradient through one step's logits
    return {"target forward": gathered + target_forward + kept, "draft TTT step": kept + ttt + backward}


def gathered_bytes(s: Shapes, target_bytes: int) -> int:
    """What a target sharded by ``shard_target`` holds gathered at most during its forward. FSDP2 keeps the
    running layer whole and prefetches the next, and each gather passes through a buffer of the whole
    layer before it is copied out: about four layers (measured on two gloo ranks, tests/train/
    test_plan_sharded.py). An untied head is its own unit (itself and its buffer, at the end); a tied
    one stays with the root, gathered beside the layers for the whole forward."""
    table = s.vocab * s.hidden
    layers = 4 * s.largest_layer + (table if s.tied else 0)
    return max(layers, 0 if s.tied else 2 * table) * target_bytes


def phases(s: Shapes, recipe: Recipe, gpus: int, shard_target: bool | None = None) -> dict[str, int]:
    """``step_phases`` for the recipe at ``gpus`` ranks: a sharded target gathers ``gathered_bytes`` during
    its forward (an MoE layer with all its experts)."""
    _, target_bytes, act_bytes = _dtypes(recipe)
    shard = recipe.train.shard_target if shard_target is None else shard_target
    gathered = gathered_bytes(s, target_bytes) if shard and gpus > 1 else 0
    return step_phases(s, recipe.data.tokens_per_batch, recipe.train.ttt_steps, target_bytes, act_bytes, gathered)


def memory_parts(s: Shapes, recipe: Recipe, gpus: int, shard_target: bool | None = None) -> dict[str, int]:
    device, target_bytes, _ = _dtypes(recipe)
    t = recipe.train
    shard = t.shard_target if shard_target is None else shard_target
    world = max(1, gpus)
    sharded = shard and world > 1
    split = world if (t.parallel == "fsdp" and world > 1) else 1
    target = s.target_params * target_bytes
    parts = {
        f"target shard (1/{world})" if sharded else "target weights": target // world if sharded else target,
        "draft weights (fp32)": s.draft_params * 4 // split,
        "draft gradients": s.draft_trainable * 4 // split,
        "optimizer (AdamW)": 2 * s.draft_trainable * 4 // split,
    }
    if world > 1 and t.parallel == "ddp":
        parts["DDP gradient buckets"] = s.draft_trainable * 4
    parts["activations"] = max(phases(s, recipe, world, shard).values())
    if device == "cuda":
        parts["CUDA context and slack"] = GPU_OVERHEAD
    return parts


def loading_parts(s: Shapes, recipe: Recipe, sharded: bool = False) -> dict[str, int]:
    """Bytes per GPU (or process) while loading: ``load_target`` puts the whole target on the rank's device
    and the whole draft is built beside it. On the CPU the safetensors file stays mapped while the weights
    are copied out of it. ``sharded`` (``train.shard_target`` over several ranks): rank 0's host memory,
    the whole target and its file's pages; no GPU holds more than its shard."""
    device, target_bytes, _ = _dtypes(recipe)
    if sharded:
        return {"target": s.target_params * target_bytes, "its file's pages": s.target_params * s.stored_bytes}
    parts = {"target": s.target_params * target_bytes}
    if device == "cpu":
        parts["its file's pages"] = s.target_params * s.stored_bytes
    parts["draft"] = s.draft_params * 4
    if device == "cuda":
        parts["CUDA context"] = GPU_OVERHEAD
    return parts


def fewest_gpus(s: Shapes, recipe: Recipe, gpu_memory: int, shard_target: bool | None = None,
                most: int = 4096, loading: bool = True) -> int | None:
    """The smallest GPU count whose per-GPU need fits ``gpu_memory``; None when none up to ``most`` does.
    ``loading=False``: the training step alone, as if each rank loaded only its shard."""
    shard = recipe.train.shard_target if shard_target is None else shard_target
    if loading and not shard and sum(loading_parts(s, recipe).values()) > gpu_memory:
        return None  # every rank holds the whole target first, whatever the count
    n = 1
    while n <= most:
        if sum(memory_parts(s, recipe, n, shard_target).values()) <= gpu_memory:
            return n
        n += 1 if n < 16 else 8
    return None


def _data_tokens(recipe: Recipe) -> int | None:
    from ..data.tokenized import TokenizedSplit

    path = Path(recipe.data.path) if recipe.data.path else None
    if path is None or not path.is_dir():
        return None
    total = 0
    for split in ("train", "heldout"):
        try:
            lengths = TokenizedSplit(path, split).lengths()
        except EyasError:
            continue
        total += int(lengths.clip(max=recipe.data.max_length).sum())
    return total or None


def make_plan(recipe: Recipe, gpu_memory: int = 80 * GB, gpus: int | None = None,
              trust_remote_code: bool = False) -> Plan:
    s = read_shapes(recipe, trust_remote_code)
    device, target_bytes, _ = _dtypes(recipe)
    shard = recipe.train.shard_target
    least = fewest_gpus(s, recipe, gpu_memory)
    least_sharded = least if shard else fewest_gpus(s, recipe, gpu_memory, shard_target=True)
    step_sharded = fewest_gpus(s, recipe, gpu_memory, shard_target=True, loading=False)
    # sharded and no count fits: shown over as many GPUs as the target has layers, a shard no larger than a layer
    shown = gpus or least or (step_sharded or max(2, s.layers) if shard else None) or 1
    offline_bytes = DTYPE_BYTES[recipe.train.offline_dtype]
    notes = []
    if shard or (least is None and least_sharded is not None):
        notes.append(f"train.shard_target gathers whole decoder layers on every GPU: the largest "
                     f"holds {s.largest_layer / 1e9:,.2f} B parameters "
                     f"({s.largest_layer * target_bytes / GB:,.1f} GB), counted four times (the layer running, "
                     "the next one, and the buffer each passes through), during the target's forward only")
    return Plan(
        shapes=s, device=device, gpus=shown, gpu_memory=gpu_memory, tokens_per_batch=recipe.data.tokens_per_batch,
        ttt_steps=recipe.train.ttt_steps, parts=memory_parts(s, recipe, shown),
        phases=phases(s, recipe, shown), loading=loading_parts(s, recipe, shard and shown > 1),
        sharded_load=shard and shown > 1,
        min_gpus=least, min_gpus_sharded=least_sharded, min_gpus_step=step_sharded,
        offline_per_token=(len(s.aux_layer_ids) + 1) * s.hidden * offline_bytes,
        offline_fixed=s.vocab * s.hidden * 4, offline_tokens=_data_tokens(recipe), notes=notes,
    )


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def format_plan(plan: Plan, recipe: Recipe) -> str:
    s, t = plan.shapes, recipe.train
    n_aux = len(s.aux_layer_ids)
    _, target_bytes, _ = _dtypes(recipe)
    per = "GPU" if plan.device == "cuda" else "process (CPU)"
    lines = [
        (f"target      {s.name} ({s.architecture}): {s.target_params / 1e9:,.2f} B parameters, "
         f"{s.layers} layers, hidden {s.hidden:,}, vocabulary {s.vocab:,}"),
        (f"draft       captures layers {s.aux_layer_ids} (SGLang ids {[i - 1 for i in s.aux_layer_ids]}); "
         f"fc {n_aux} x {s.hidden:,} = {s.fc_in:,} -> {s.draft_hidden:,}; draft vocabulary {s.draft_vocab:,}; "
         f"{s.draft_trainable / 1e9:,.2f} B trainable parameters"),
        (f"run         {plan.gpus} {per}{'s' if plan.gpus != 1 else ''}, {t.parallel}"
         f"{', target sharded (FSDP2)' if t.shard_target else ', target whole on each'}, "
         f"{plan.tokens_per_batch:,} tokens a rank a step, {plan.ttt_steps} TTT steps, target at "
         f"{target_bytes * 8}-bit"),
        f"memory per {per.split(' ')[0]}:",
    ]
    gathered = f" with {_size(gathered_bytes(s, target_bytes))} of gathered layers" * (
        t.shard_target and plan.gpus > 1)
    forward, draft_step = plan.phases.values()
    phases = f"   the larger of the target's forward {_size(forward)}{gathered} and the draft's TTT {_size(draft_step)}"
    for name, value in plan.parts.items():
        lines.append(f"  {name:<26}{_size(value):>12}{phases if name == 'activations' else ''}")
    lines.append(f"  {'training step':<26}{_size(plan.total):>12}")
    loaded = " + ".join(f"{name} {_size(value)}" for name, value in plan.loading.items())
    where = "in rank 0's host memory, each GPU gets its shard" if plan.sharded_load else "whole on each"
    lines.append(f"  {'loading':<26}{_size(plan.load_total):>12}   {loaded}, {where}")
    lines.append(f"  {'peak':<26}{_size(plan.peak):>12}   (of {_size(plan.gpu_memory)})")
    if plan.device == "cuda":
        nodes = lambda n: " (counted in 8-GPU nodes above 16)" if n > 16 else ""  # noqa: E731
        if plan.min_gpus is not None:
            lines.append(f"fewest GPUs {plan.min_gpus} of {_size(plan.gpu_memory)}{nodes(plan.min_gpus)} "
                         "(fewer cannot hold the run)")
        elif t.shard_target:
            gathered = gathered_bytes(s, target_bytes)
            lines.append(f"fewest GPUs none: with this recipe no number of {_size(plan.gpu_memory)} GPUs holds the run;"
                         f" every GPU gathers {_size(gathered)} of whole layers whatever the count")
            if gathered + GPU_OVERHEAD >= plan.gpu_memory:
                lines.append("            no recipe setting lowers that: use GPUs with more memory (--gpu-memory)")
            else:
                lines.append("            lower data.tokens_per_batch or draft.vocab_size, set train.parallel=fsdp, "
                             "or use GPUs with more memory (--gpu-memory)")
        elif plan.load_total > plan.gpu_memory:
            lines.append(f"fewest GPUs none: every GPU loads the whole target "
                         f"({_size(plan.load_total)} with the draft, of {_size(plan.gpu_memory)})")
            if plan.min_gpus_step is not None:
                lines.append(f"            with --set train.shard_target=true: {plan.min_gpus_step} GPUs"
                             f"{nodes(plan.min_gpus_step)}, each loading only its shard")
        else:
            lines.append(f"fewest GPUs none: with this recipe no number of {_size(plan.gpu_memory)} GPUs holds the run")
            if plan.min_gpus_sharded is not None and not t.shard_target:
                lines.append(f"            with --set train.shard_target=true: {plan.min_gpus_sharded} GPUs")
            else:
                lines.append("            lower data.tokens_per_batch or draft.vocab_size, set train.parallel=fsdp, "
                             "or use GPUs with more memory (--gpu-memory)")
    per_token = plan.offline_per_token
    lines.append(f"offline     {n_aux} x {s.hidden:,} x {DTYPE_BYTES[t.offline_dtype]} B = "
                 f"{_size(n_aux * s.hidden * DTYPE_BYTES[t.offline_dtype])} a token of captured states, plus the "
                 f"final state {s.hidden:,} x {DTYPE_BYTES[t.offline_dtype]} B: {_size(per_token)} a token "
                 f"({t.offline_dtype}), and {_size(plan.offline_fixed)} for the lm_head copy")
    if plan.offline_tokens:
        lines.append(f"            the data's {plan.offline_tokens:,} tokens: "
                     f"{_size(plan.offline_tokens * per_token + plan.offline_fixed)}")
    else:
        lines.append(f"            1M tokens: {_size(1e6 * per_token + plan.offline_fixed)}; "
                     f"1B tokens: {_size(1e9 * per_token + plan.offline_fixed)}")
    lines.extend(f"note        {n}" for n in plan.notes)
    return "\n".join(lines)
