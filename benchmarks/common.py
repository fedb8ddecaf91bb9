"""What every GPU benchmark here shares: the machine record, the JSON writer, timing, model shapes.

Each benchmark is one command and writes one JSON file holding what it measured, the command, the
commit (``COMMIT`` from the environment where the tree has no .git) and the machine.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def commit() -> str:
    """``COMMIT`` from the environment, else git's HEAD, with ``+wip`` where the tree differs from it (a
    GPU machine's copy of the tree can carry an older .git: its HEAD alone named the wrong commit)."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                        check=True).stdout.strip()
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+wip" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
    return info


def write(path: str | Path, what: str, data: dict, quiet: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"what": what, "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "commit": commit(),
              "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **data}
    path.write_text(json.dumps(record, indent=1) + "\n")
    if not quiet:
        print(f"wrote {path}")
    return path


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(fn, reps: int = 20, warmup: int = 3) -> list[float]:
    """Wall milliseconds of ``fn()`` per call, synchronised around each call."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "n": len(xs)}


def copy_bandwidth(gib: float = 4.0) -> dict:
    """Device-to-device copy bandwidth (bytes read + written per second), median of 20 copies."""
    n = int(gib * 2**30) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), reps=20, warmup=3)
    bw = [2 * n * 2 / (m / 1e3) for m in ms]
    x = y = None
    torch.cuda.empty_cache()
    return {"bytes_per_s": statistics.median(bw), "spread": [min(bw), max(bw)]}


def llama31_8b_config(layers: int = 32):
    """The Llama-3.1-8B shape (random weights are enough to measure speed)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128009,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})


def qwen3_8b_config(layers: int = 36):
    """The Qwen3-8B shape (per-head q/k norms, 151,936 tokens, untied head)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0, bos_token_id=151643,
                       eos_token_id=151645)


def smollm2_135m_config():
    """SmolLM2-135M-Instruct's shape (30 layers, hidden 576, 9 query / 3 KV heads, vocab 49152, tied head)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       tie_word_embeddings=True, rope_theta=100000.0, bos_token_id=1, eos_token_id=2)


def random_model(config, dtype=torch.bfloat16, device="cuda"):
    from transformers import AutoModelForCausalLM

    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    return model.eval()


def read_bytes_per_token(model) -> int:
    """Weight bytes one decode step reads: everything but the embedding table (one row of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = emb.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    return total if tied else total - emb.numel() * emb.element_size()


def load_pair(model_path: str, draft_path: str | None, dtype: str = "bfloat16", device: str = "cuda"):
    """(native target, draft) through eyas's own checked loading; the shipped draft by default."""
    from eyas.models.loading import load_target
    from eyas.models.native import choose

    target, _ = choose(load_target(model_path, device=device, dtype=dtype), "native")
    return target, load_draft_for(target, draft_path, device)


def load_draft_for(target, draft_path: str | None, device: str = "cuda"):
    """The draft at ``draft_path`` (the shipped one by default) over ``target``'s embedding."""
    from eyas import formats
    from eyas.common.draft_registry import BUILTIN_DRAFTS, resolve_draft_path

    path = resolve_draft_path(draft_path or BUILTIN_DRAFTS["smollm2-135m-instruct"])
    return formats.load_draft(path, embed_weight=target.embed_tokens.weight, device=device, dtype=target.dtype)


def chat_prompts(tokenizer, sets: str = "chat", n: int = 0) -> list[list[int]]:
    from eyas.common.prompts import chat_ids, prompt_set

    texts = prompt_set(sets)
    return [chat_ids(tokenizer, t) for t in (texts[:n] if n else texts)]
