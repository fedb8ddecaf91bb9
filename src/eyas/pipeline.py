"""Build a checked engine from user-facing arguments (what ``eyas serve`` and friends take).

Order matters: the algorithm/draft-path checks run on the arguments alone, then the draft's
``config.json`` is read and checked against the target's config, and only then are weights loaded
into the engine. A refused configuration costs no generation.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from . import formats
from .checks import check_algorithm, check_room
from .common.draft_registry import default_draft_for, resolve_draft_path
from .config import AUTO, Algorithm, SpecConfig, parse_schedule
from .engine_config import EngineConfig
from .errors import EyasError
from .models.loading import SMOLLM2, load_target, resolve_device
from .models.native import choose
from .models.target import Target

log = logging.getLogger("eyas")

@dataclass
class EngineArgs:
    model_path: str = SMOLLM2
    speculative_algorithm: str | None = None  # None: EAGLE3 when a draft is known, else NONE
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int = 5
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 6
    speculative_batch_schedule: str | None = None  # "1:6,8,48;4:4,4,16;32:0" per batch size, or "auto"
    device: str = "auto"  # auto: cuda when a GPU is visible, else cpu (as the CLI's --device)
    dtype: str = "auto"
    context_length: int | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    engine: str = "auto"  # auto: native Llama path on CUDA when the model allows it; native; generic
    cuda_graphs: bool = True
    max_batch: int = 64  # rows the native path's preallocated KV cache holds
    cuda_graph_max_bs: int | None = None  # largest batch with CUDA graphs (default: max_batch)
    mem_fraction_static: float | None = None  # SGLang's: weights + KV pools within this share of memory
    draft_feed_interval: int = 8  # plain steps beside speculation: the draft is fed their tokens this many at once
    tokenizer_path: str | None = None  # a tokenizer other than the target's own

    def engine_config(self) -> EngineConfig:
        return EngineConfig(max_batch=self.max_batch, cuda_graphs=self.cuda_graphs,
                            graph_max_batch=self.cuda_graph_max_bs, mem_fraction_static=self.mem_fraction_static,
                            draft_feed_interval=self.draft_feed_interval)


def draft_fc_width(cfg) -> tuple[int | None, int]:
    """(fc input width, number of aux states) a draft config implies; fc None for non-EAGLE-3 configs."""
    eagle = getattr(cfg, "eagle_config", None) or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    n_aux = len(ids) if ids is not None else 3
    arch = ",".join(getattr(cfg, "architectures", None) or [])
    if "eagle3" not in arch.lower() and not eagle and getattr(cfg, "target_hidden_size", None) is None:
        return None, n_aux
    width = int(getattr(cfg, "target_hidden_size", None) or cfg.hidden_size)
    return n_aux * width, n_aux


def check_device(device: str) -> str:
    """``device`` when this machine can use it, else an EyasError that says why and what to pass instead."""
    import torch

    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        raise EyasError(f"--device {device!r} is not a device", "use auto, cpu, cuda or cuda:N") from None
    if kind.type == "cpu":
        return device
    if kind.type != "cuda":  # mps, xpu, meta, ...: the kernels, graphs and memory checks are CUDA's or the CPU's
        raise EyasError(f"--device {device}: eyas runs on a CUDA GPU or the CPU, not on {kind.type!r}",
                        "pass --device cuda, --device cpu, or auto (the GPU when one is usable)")
    if torch.version.cuda is None and torch.version.hip is None:
        raise EyasError(f"--device {device}: this PyTorch ({torch.__version__}) is a CPU-only build, with no CUDA",
                        "install a CUDA build of PyTorch (https://pytorch.org/get-started/locally/), or pass "
                        "--device cpu (--device auto picks the GPU when one is usable)")
    if not torch.cuda.is_available():
        raise EyasError(f"--device {device}: PyTorch sees no GPU (check nvidia-smi, the driver and "
                        "CUDA_VISIBLE_DEVICES)", "make a GPU visible, or pass --device cpu")
    if kind.index is not None and kind.index >= torch.cuda.device_count():
        raise EyasError(f"--device {device}: there are {torch.cuda.device_count()} visible GPUs (cuda:0 to "
                        f"cuda:{torch.cuda.device_count() - 1})", "pass one of them")
    return device


def load_tokenizer(path: str, vocab_size: int, trust_remote_code: bool = False):
    """``--tokenizer-path``: a local tokenizer (HF folder, .gguf file or built-in name) instead of the target's,
    refused when it has ids the target has no embedding for."""
    from transformers import AutoTokenizer

    from .models.loading import resolve

    folder, gguf = Path(path).expanduser(), None
    if path.lower() == SMOLLM2 or folder.suffix == ".gguf":
        folder, gguf = resolve(path)  # the built-in target's GGUF, or a .gguf file
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code,
                                                  **({"gguf_file": gguf} if gguf else {}))
    except (OSError, ValueError) as e:
        from .models.safety import remote_code_refusal

        if remote_code_refusal(e, folder):
            raise remote_code_refusal(e, folder) from None
        if not folder.exists():  # else transformers reads it as a hub repo id and complains about its characters
            raise EyasError(f"--tokenizer-path {path}: no such file or folder here, nor a tokenizer in the local "
                            "Hugging Face cache (eyas never downloads one: model hubs may be unreachable)",
                            "pass a local folder with tokenizer.json / tokenizer_config.json, a .gguf file, or "
                            f"{SMOLLM2!r}; check the path for typos") from None
        if folder.is_file():
            raise EyasError(f"--tokenizer-path {path}: is a file ({folder.name}), not a tokenizer folder",
                            f"pass its folder: --tokenizer-path {folder.parent}") from None
        raise EyasError(f"--tokenizer-path {path}: no tokenizer could be loaded: {type(e).__name__}: {str(e)[:300]}",
                        "point at a folder with tokenizer.json / tokenizer_config.json (or a .gguf file)") from None
    if len(tokenizer) > vocab_size:
        raise EyasError(f"--tokenizer-path {path}: the tokenizer has {len(tokenizer)} tokens, more than the "
                        f"target's {vocab_size} embeddings", "use the tokenizer the target was trained with")
    return tokenizer


def build_engine(args: EngineArgs, warm_up: bool = True):
    """The checked engine; on the native path with graphs, every CUDA graph is captured before it
    is returned (``warm_up``), with a progress bar and a summary line on stderr."""
    from .engine.engine import Engine

    draft_path = args.speculative_draft_model_path
    algorithm = None if args.speculative_algorithm is None else Algorithm.parse(args.speculative_algorithm)
    if draft_path is None and algorithm is not Algorithm.NONE:
        draft_path = default_draft_for(args.model_path)  # the draft shipped for this target, if any
    if algorithm is None:  # nothing said: speculate when a draft is known
        algorithm = Algorithm.EAGLE3 if draft_path else Algorithm.NONE
    auto = (args.speculative_batch_schedule or "").strip().lower() == AUTO
    schedule = () if auto else parse_schedule(args.speculative_batch_schedule, algorithm)  # refused below with NONE
    if auto and algorithm is not Algorithm.NONE:  # auto without speculation is plain decoding: NONE stays NONE
        spec = SpecConfig.auto(algorithm)
    elif algorithm is not Algorithm.NONE or schedule:
        steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
        if topk == 1 and isinstance(tokens, int) and 2 <= tokens <= steps and not schedule:
            log.warning("--speculative-num-steps %d with --speculative-num-draft-tokens %d: a chain verifies its first "
                        "%d drafted tokens, so it drafts %d steps, not %d (the same tokens, without the draft "
                        "forwards whose tokens no step would verify); SGLang instead raises the draft tokens to "
                        "steps + 1 = %d", steps, tokens, tokens - 1, tokens - 1, steps, steps + 1)
            steps = tokens - 1
        spec = SpecConfig(algorithm, steps, topk, tokens, schedule)
    else:
        spec = SpecConfig(Algorithm.NONE)
    # Cheap checks first: flags and the draft's config.json, before any weights are read.
    resolved = resolve_draft_path(draft_path) if draft_path else None
    if resolved is None:
        check_algorithm(algorithm, draft_path, None, 0, 3)
    else:
        # any format (eyas, SGLang, speculators, official), eyas-shaped
        cfg = formats.read_config(resolved, allow_pickle=args.allow_pickle)
        fc_in, n_aux = draft_fc_width(cfg)
        check_algorithm(algorithm, str(resolved), fc_in, fc_in // n_aux if fc_in else 0, n_aux,
                        ",".join(getattr(cfg, "architectures", None) or []))
    if args.context_length is not None and args.context_length < 1:
        raise EyasError(f"--context-length {args.context_length} leaves no room for a single token",
                        "pass a positive length (e.g. --context-length 4096), or leave it out to use the target's")
    if args.context_length is not None:
        check_room(args.context_length, max(spec.verify_sizes))
    device = check_device(resolve_device(args.device))
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static <= 1:
        raise EyasError(f"--mem-fraction-static must be in (0, 1], got {args.mem_fraction_static}",
                        "e.g. 0.85: weights and KV cache together take at most 85% of the device's memory")
    target: Target = load_target(args.model_path, device=device, dtype=args.dtype,
                                 trust_remote_code=args.trust_remote_code, allow_pickle=args.allow_pickle)
    if args.context_length:
        if target.info.max_context and args.context_length > target.info.max_context:
            raise EyasError(
                f"--context-length {args.context_length} exceeds the target's {target.info.max_context}",
                f"use at most {target.info.max_context}",
            )
        target.info = type(target.info)(**{**target.info.__dict__, "max_context": args.context_length})
    if args.tokenizer_path:
        target.tokenizer = load_tokenizer(args.tokenizer_path, target.info.vocab_size, args.trust_remote_code)
    target, generic_reason = choose(target, args.engine)
    draft = None
    if resolved is not None:
        draft = formats.load_draft(resolved, embed_weight=target.embed_tokens.weight,
                                   device=device, dtype=target.dtype, allow_pickle=args.allow_pickle)
    engine = Engine(target, draft, spec, draft_path=str(resolved) if resolved else None, config=args.engine_config())
    if generic_reason:
        engine.layout += f" ({generic_reason})"
    if args.mem_fraction_static is not None and not engine.static:
        engine.layout += (f"; --mem-fraction-static {args.mem_fraction_static:g} has no effect here: this path "
                          "preallocates no KV cache, it grows with the running rows")
    log.debug("engine: %s", engine.layout)
    # captured at startup; adaptive speculation on a GPU times its settings there even without graphs
    if warm_up and (engine.static and args.cuda_graphs or engine.chooser and engine.device.type == "cuda"):
        print(engine.warm_up(), file=sys.stderr, flush=True)
    return engine


def baseline_engine(engine):
    """The same target and sizing, no draft, its CUDA graphs captured now: a baseline timed while it
    captures graphs and compiles kernels on first use (as one built bare did) is not a baseline (on
    the H200, eyas eval's measured 481 tok/s that way against 658-694 warmed up)."""
    from .engine.engine import Engine

    plain = Engine(engine.target, None, SpecConfig(Algorithm.NONE), config=engine.config)
    plain.warm_up(progress=False)
    return plain


def add_engine_arguments(parser) -> None:
    """The flags every engine-backed command takes, spelled as SGLang spells them."""
    g = parser.add_argument_group("model and speculation (SGLang's flag names)")
    g.add_argument("--model-path", "--model", default=SMOLLM2,
                   help=f"target: local HF folder, .gguf file, or {SMOLLM2!r} (default)")
    g.add_argument("--speculative-algorithm", type=algorithm_name, metavar="{NONE,EAGLE,EAGLE3}", default=None,
                   help="default: EAGLE3 when a draft is given or shipped for the target, else NONE")
    g.add_argument("--speculative-draft-model-path", default=None,
                   help="draft folder or shipped draft name (default: the draft shipped for the target)")
    g.add_argument("--speculative-num-steps", type=int, default=None, help="draft tree depth (default 5)")
    g.add_argument("--speculative-eagle-topk", type=int, default=None, help="branching per node; 1 = chain (default 1)")
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="tokens verified per step, counting the root (default 6)")
    g.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="vLLM's spelling of the flags above: '{\"method\": \"eagle3\", \"model\": DRAFT, "
                        "\"num_speculative_tokens\": K}' is EAGLE3 with a chain of K (K steps, topk 1, K+1 draft "
                        "tokens); a \"speculative_token_tree\" gives its depth, widest branching and node count")
    g.add_argument("--speculative-batch-schedule", default=None, metavar="SCHEDULE",
                   help="settings per running batch size, instead of the three above (refused beside them): "
                        "BOUND:STEPS,TOPK,TOKENS entries (BOUND:0 = no speculation) for batches up to BOUND, the "
                        "last one also for larger, e.g. '1:6,8,48;4:4,4,16;16:3,1,4;32:0' (eyas tune prints "
                        "one); or 'auto': each step runs the candidate (no speculation, chains 3,1,4 and 5,1,6, "
                        "trees 4,4,16 and 6,8,32) with the most expected tokens/s for its batch size, from step "
                        "costs measured at startup and the live acceptance (eyas serve's default with a draft, "
                        "unless a tree setting is given)")
    g.add_argument("--device", default="auto",
                   help="auto (default: cuda when a GPU is visible, else cpu), cpu, cuda, cuda:1, ...")
    g.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--tokenizer-path", default=None,
                   help="tokenizer folder (or .gguf file) instead of the target's own (default: the target's)")
    g.add_argument("--mem-fraction-static", type=float, default=None, metavar="F",
                   help="as SGLang's: the share of the device's memory that weights and the native path's "
                        "preallocated KV cache may take together (the rest stays for activations and CUDA graphs); "
                        "the cache holds fewer tokens when it is lower (default: the cache takes 40%% of the "
                        "memory free after loading; on the CPU, 2 GiB)")
    g.add_argument("--context-length", type=int, default=None, help="cap on prompt + output tokens")
    g.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    g.add_argument("--allow-pickle", action="store_true",
                   help="allow .bin/.pt pickle checkpoints (refused by default: unpickling can run code)")
    g.add_argument("--engine", choices=["auto", "native", "generic"], default="auto",
                   help="auto (default): the native Llama-family path with a static KV cache on CUDA when the "
                        "model allows it, else the generic Hugging Face path")
    g.add_argument("--disable-cuda-graph", action="store_true",
                   help="native path: run every forward eagerly (debugging; the eager path is the reference); "
                        "also skips the startup capture")
    g.add_argument("--cuda-graph-max-bs", type=int, default=None,
                   help="native path: largest batch size with CUDA graphs, captured at startup; larger batches "
                        "run eagerly (default: the max batch)")
    g.add_argument("--draft-feed-interval", type=int, default=8,
                   help="native path, with a schedule or auto: plain steps keep their tokens for the draft, which "
                        "takes them this many steps at once (1: fed on every step; default 8)")


# SGLang's and vLLM's other kinds of speculation, named so a refusal says what each one is
OTHER_ALGORITHMS = {"NEXTN": "the target's own multi-token-prediction layers", "MTP": "the target's own "
                    "multi-token-prediction layers", "STANDALONE": "a separate small draft model", "NGRAM": "n-gram "
                    "lookup in the prompt", "LOOKAHEAD": "n-gram lookahead", "MEDUSA": "Medusa heads"}


def algorithm_name(text: str) -> str:
    """``--speculative-algorithm``: NONE, EAGLE or EAGLE3 in any case; another kind of speculation is named."""
    name = text.strip().upper()
    if name in ("NONE", "EAGLE", "EAGLE3"):
        return name
    what = f" ({OTHER_ALGORITHMS[name]})" if name in OTHER_ALGORITHMS else ""
    raise argparse.ArgumentTypeError(f"{text!r}{what} is not an algorithm eyas runs: eyas speculates with EAGLE-3 "
                                     "drafts; use EAGLE3 (or NONE), or serve that kind with SGLang or vLLM")


SPECULATIVE_FLAGS = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                     "speculative_eagle_topk", "speculative_num_draft_tokens")


def speculative_flags(ns) -> dict:
    """The speculative settings of parsed flags: SGLang's flags, or vLLM's --speculative-config JSON
    (``speculative_config.from_vllm``) for what they leave unset; a setting given both ways is refused."""
    from .speculative_config import from_vllm

    flags = {name: getattr(ns, name, None) for name in SPECULATIVE_FLAGS}
    spelled = from_vllm(ns.speculative_config) if getattr(ns, "speculative_config", None) else {}
    if spelled:
        both = [name for name in spelled if flags[name] is not None]
        if both:
            raise EyasError("--speculative-config and " + ", ".join("--" + n.replace("_", "-") for n in both)
                            + " set the same setting",
                            "give each setting once: in the JSON (vLLM's spelling) or as a flag (SGLang's)")
    tree = [("--" + n.replace("_", "-")) for n in SPECULATIVE_FLAGS[2:] if flags[n] is not None]
    tree += ["--speculative-config"] if any(n in spelled for n in SPECULATIVE_FLAGS[2:]) else []
    schedule = getattr(ns, "speculative_batch_schedule", None)
    if schedule and tree:  # the schedule sets the tree for every batch size: the flags would be dropped silently
        raise EyasError(f"--speculative-batch-schedule {schedule!r} sets the tree for every batch size, so "
                        f"{', '.join(tree)} would be ignored",
                        "give the tree once: as --speculative-batch-schedule entries (BOUND:STEPS,TOPK,TOKENS), "
                        "or as the tree flags without a schedule")
    flags.update(spelled)
    defaults = EngineArgs()
    return {name: getattr(defaults, name) if value is None else value for name, value in flags.items()}


def engine_args_from(ns, rows: int = 1) -> EngineArgs:
    """``EngineArgs`` from parsed engine flags; ``rows``: the most a command without --max-running-requests runs
    at once (eval's --batch-size, bench's highest --concurrency), so that the KV cache holds them (64 at least)."""
    return EngineArgs(
        model_path=ns.model_path,
        **speculative_flags(ns),
        speculative_batch_schedule=getattr(ns, "speculative_batch_schedule", None),
        device=resolve_device(ns.device),
        dtype=ns.dtype,
        context_length=ns.context_length,
        trust_remote_code=ns.trust_remote_code,
        allow_pickle=getattr(ns, "allow_pickle", False),
        engine=getattr(ns, "engine", "auto"),
        cuda_graphs=not getattr(ns, "disable_cuda_graph", False),
        max_batch=getattr(ns, "max_running_requests", None) or max(64, rows),
        cuda_graph_max_bs=getattr(ns, "cuda_graph_max_bs", None),
        mem_fraction_static=getattr(ns, "mem_fraction_static", None),
        draft_feed_interval=getattr(ns, "draft_feed_interval", 8),
        tokenizer_path=getattr(ns, "tokenizer_path", None),
    )
