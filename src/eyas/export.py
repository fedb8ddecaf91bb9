"""``eyas export DRAFT --format sglang|speculators --out DIR``: a draft folder SGLang or vLLM serves as is.

The source may be in any format eyas reads (see ``eyas.formats``). The command writes a
complete folder (config.json + model.safetensors; token embeddings are shared from the target, as
both engines do) and prints the launch lines for it. Those lines always say ``EAGLE3``/``eagle3``:
SGLang's ``EAGLE`` would run an EAGLE-3 draft without its aux states and accept nothing. The target
they name (and speculators' verifier) is one SGLang and vLLM can resolve (``public_target``): the
Hugging Face name of eyas's built-in target, or a local path made absolute.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

from . import formats
from .common.outputs import check_output_folder
from .errors import EyasError
from .formats import names as format_names
from .formats import write as format_writers
from .formats.checks import check_maps
from .layers import to_sglang
from .models.loading import SMOLLM2

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# eyas's built-in target names -> the Hugging Face model they are (what SGLang and vLLM download)
HF_NAMES = {SMOLLM2: "HuggingFaceTB/SmolLM2-135M-Instruct"}


def public_target(target: str | None) -> str | None:
    """A target name SGLang and vLLM resolve: the HF name of a built-in target, a local path made absolute
    (the lines may run from another folder), anything else (a hub name) as given."""
    if not target:
        return target
    if target.lower() in HF_NAMES:
        return HF_NAMES[target.lower()]
    path = Path(target).expanduser()
    return str(path.resolve()) if path.exists() else target


MAX_SPECULATIVE_TOKENS = 32


def speculative_tokens(text: str) -> int:
    """``--speculative-tokens``: a whole number of draft tokens per step, 1 to 32, refused at parsing."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of draft tokens; e.g. 3") from None
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{k} draft tokens per step is outside 1 to {MAX_SPECULATIVE_TOKENS}: each one costs a draft forward "
            "pass and a verified position, and an EAGLE-3 draft's acceptance falls with every position, so past a "
            "handful none is accepted; pass 3 to 8 (e.g. --speculative-tokens 3)")
    return k


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write a draft in SGLang/SpecForge or speculators (vLLM) format",
        description="Export an EAGLE-3 draft (eyas, SGLang/SpecForge, speculators or official EAGLE-3 "
                    "folder) for SGLang or vLLM, and print the launch lines.",
    )
    p.add_argument("draft", help="draft folder (any format eyas reads) or a draft shipped with eyas")
    p.add_argument("--format", required=True, choices=["sglang", "speculators"], type=str.lower,
                   help="sglang: LlamaForCausalLMEagle3 (SGLang, SpecForge; vLLM reads it too); "
                        "speculators: Eagle3Speculator (vLLM)")
    p.add_argument("--out", required=True, help="output folder (created; must be empty or absent)")
    p.add_argument("--target", default=None,
                   help="target model name or path for the launch lines and speculators' verifier "
                        "(default: the target recorded in the draft)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast weights (default: keep)")
    p.add_argument("--include-embeddings", action="store_true",
                   help="also write embed_tokens.weight (default: shared from the target at load time)")
    p.add_argument("--speculative-tokens", type=speculative_tokens, default=None, metavar="K",
                   help="draft tokens per step, 1 to 32: speculators writes it as proposal_methods[0]."
                        "speculative_tokens (vLLM's default num_speculative_tokens); the printed vLLM line passes it "
                        "as num_speculative_tokens and, given, the SGLang line runs a chain of K (default 3; "
                        "SGLang's line: a tree of 5 steps, topk 4, 8 draft tokens)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="read a .bin/.pt pickle draft (an official EAGLE-3 release ships pytorch_model.bin); "
                        "refused by default since unpickling can run code, and read with weights_only even then")
    p.set_defaults(func=run)


def run(args) -> int:
    from .common.draft_registry import resolve_draft_path

    source = resolve_draft_path(args.draft)
    out = check_output_folder(Path(args.out).expanduser(), "--out")
    if out.exists() and any(out.iterdir()):
        raise EyasError(f"--out {out} exists and is not an empty folder", "choose a new output folder")
    if out.resolve() == source.resolve():
        raise EyasError("--out is the draft folder itself", "choose a new output folder")
    folder = formats.read_draft(source, allow_pickle=args.allow_pickle)
    check_maps(folder.path, folder.format, folder.config, folder.state)  # what eyas serve and the doctor refuse
    settle_trained_layers(folder, source)
    dtype = DTYPES[args.dtype] if args.dtype else None
    if args.target:
        check_target_folder(args.target, folder.config)
    if args.include_embeddings and "embed_tokens.weight" not in folder.state:
        folder.state["embed_tokens.weight"] = target_embeddings(args.target or format_names.recorded_target(
            folder.config), folder, source, args.allow_pickle)
    target = public_target(args.target or format_names.recorded_target(folder.config))
    if args.format == "sglang":
        format_writers.write_sglang(folder, out, include_embeddings=args.include_embeddings, dtype=dtype)
    else:
        format_writers.write_speculators(folder, out, verifier=target, include_embeddings=args.include_embeddings,
                                         dtype=dtype, speculative_tokens=args.speculative_tokens or 3)
    print(f"exported {format_names.LOOKS_LIKE[folder.format]} from {source}")
    print(f"      as {args.format} to {out}")
    ids = folder.aux_layer_ids
    print("captured target layers (inputs of decoder layers): "
          + (str(ids) if ids is not None else "the target's default [2, N//2, N-3]"))
    captured = folder.state["fc.weight"].shape[1] // int(getattr(folder.config, "target_hidden_size", None)
                                                         or folder.config.hidden_size)
    if captured != 3:
        print(f"warning: this draft fuses {captured} captured layers; SGLang and vLLM build the fc for 3, so they "
              "will not load it (eyas serves it)")
    for line in launch_lines(args.format, out, target, args.speculative_tokens):
        print(line)
    return 0


def settle_trained_layers(folder, source) -> None:
    """The captured layers an export writes are those the draft was trained on, where that is recorded
    (``eyas.aux_layer_ids``): written out where the config names none (servers would take the target's
    default), and a config that names others is refused, as ``eyas doctor`` refuses it."""
    trained = (getattr(folder.config, "eyas", None) or {}).get("aux_layer_ids")
    if not isinstance(trained, list):
        return
    ids = folder.aux_layer_ids
    if ids is None:
        folder.config.eagle_config = {**(getattr(folder.config, "eagle_config", None) or {}),
                                      "eagle_aux_hidden_state_layer_ids": to_sglang(trained)}
    elif list(ids) != list(trained):
        raise EyasError(f"the draft in {source} was trained on the inputs of target layers {list(trained)}, but its "
                        f"config makes servers capture {list(ids)}: exported so, it would be fed other states than "
                        "it learnt from and accept little, silently",
                        f"set eagle_config.eagle_aux_hidden_state_layer_ids to {to_sglang(trained)} in "
                        f"{source}/config.json (or export the training run's own draft folder)")


def target_embeddings(target: str | None, folder, source, allow_pickle: bool) -> torch.Tensor:
    """The token embeddings a draft that shares its target's takes, read from the target (``--include-embeddings``
    for consumers that want them in the folder): its width and vocabulary checked against the draft's."""
    from .models.loading import load_target

    if not target:
        raise EyasError(f"--include-embeddings: the draft in {source} shares its target's embeddings and records no "
                        "target to read them from", "pass --target (the target's folder or name)")
    print(f"reading the token embeddings from the target {target}")
    weight = _embeddings_alone(Path(target).expanduser())
    if weight is None:  # a GGUF, a built-in name, pickle weights: the model is loaded (on the CPU)
        weight = load_target(target, device="cpu", allow_pickle=allow_pickle).embed_tokens.weight
    want = (int(folder.config.vocab_size), int(folder.config.hidden_size))
    if tuple(weight.shape) != want:
        raise EyasError(f"--include-embeddings: the target {target}'s embeddings are {tuple(weight.shape)}, the draft "
                        f"takes {want}: another target", "pass the target the draft was trained for with --target")
    return weight.detach().to(folder.state["fc.weight"].dtype).clone()  # the dtype of the rest of the draft


def _embeddings_alone(folder: Path) -> torch.Tensor | None:
    """The input embedding table of a safetensors model folder, read alone (an 8B target's 1 GB, not its 16), or
    None where the folder holds no such tensor."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        with safe_open(str(file), framework="pt") as f:
            name = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            if name is not None:
                return f.get_tensor(name)
    return None


def check_target_folder(target: str, config) -> None:
    """``--target`` where it names a folder here: it exists, and its width and vocabulary are the draft's
    target's (a hub name is written as given: nothing here to compare)."""
    path = Path(target).expanduser()
    if not path.exists():
        if target.startswith(("/", "./", "../", "~")):
            raise EyasError(f"--target {target}: no such folder", "pass the target's folder or its hub name")
        return
    file = path / "config.json"
    if not file.is_file():
        return
    try:
        data = json.loads(file.read_text())
    except ValueError:
        return
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    want = {"hidden_size": int(getattr(config, "target_hidden_size", None) or config.hidden_size),
            "vocab_size": int(config.vocab_size)}
    wrong = [f"{k} {text.get(k)} (the draft's target: {v})" for k, v in want.items()
             if isinstance(text.get(k), int) and text[k] != v]
    if wrong:
        raise EyasError(f"--target {target} is not this draft's target: its " + ", ".join(wrong),
                        "pass the target the draft was trained for, or leave --target out (the recorded one)")


def launch_lines(fmt: str, out: Path, target: str | None, speculative_tokens: int | None = None,
                 tp: int = 1) -> list[str]:
    """The exact commands that serve ``out`` (across ``tp`` GPUs); ``TARGET`` stands in when the target is
    unknown. ``speculative_tokens`` K: vLLM's num_speculative_tokens (default 3) and SGLang's tree made a chain
    of K (K steps, topk 1, K+1 draft tokens, as eyas reads vLLM's config); None: SGLang's tree 5,4,8."""
    steps, topk, tokens = (5, 4, 8) if speculative_tokens is None else (speculative_tokens, 1, speculative_tokens + 1)
    model = shlex.quote(target) if target else "TARGET"
    draft = shlex.quote(str(Path(out).resolve()))
    lines = []
    if fmt == "sglang":
        # SGLang flags: --speculative-algorithm EAGLE3 turns on aux-state capture (EAGLE does not).
        lines += ["", "SGLang:",
                  f"  python -m sglang.launch_server --model-path {model} --speculative-algorithm EAGLE3 "
                  f"--speculative-draft-model-path {draft} --speculative-num-steps {steps} "
                  f"--speculative-eagle-topk {topk} --speculative-num-draft-tokens {tokens}"
                  + (f" --tp {tp}" if tp > 1 else "")]
    spec = json.dumps({"method": "eagle3", "model": str(Path(out).resolve()),
                       "num_speculative_tokens": speculative_tokens or 3})
    lines += ["", "vLLM:", f"  vllm serve {model} --speculative-config {shlex.quote(spec)}"
              + (f" --tensor-parallel-size {tp}" if tp > 1 else "")]
    if fmt == "speculators" and target:
        lines += [f"  (or, serving the verifier recorded in its config: vllm serve {draft})"]
    if not target:
        lines += ["", "TARGET: the target model the draft was trained for (pass --target to fill it in)"]
    return lines
