"""vLLM's ``--speculative-config`` JSON, read as another spelling of eyas's (SGLang's) speculative flags.

vLLM (``vllm/config/speculative.py``) describes speculation as one JSON object:

``method``                  ``eagle3`` or ``eagle`` here (eyas runs EAGLE drafts only): the algorithm
``model``                   the draft: ``--speculative-draft-model-path``
``num_speculative_tokens``  draft tokens per step; without a tree, a chain of that many:
                            ``--speculative-num-steps K --speculative-eagle-topk 1
                            --speculative-num-draft-tokens K+1`` (eyas counts the root)
``speculative_token_tree``  vLLM's static tree, a list of paths such as ``"[(0,), (1,), (0, 0)]"``;
                            eyas's tree is chosen per step (EAGLE-2), so the tree gives its budget:
                            depth -> num_steps, widest branching -> eagle_topk, nodes + 1 ->
                            num_draft_tokens
``draft_tensor_parallel_size`` 1 only

Any other key is refused with the list of those read: vLLM knobs eyas lacks must not be dropped silently.
"""

from __future__ import annotations

import ast
import json

from .errors import EyasError

METHODS = {"eagle3": "EAGLE3", "eagle": "EAGLE"}
# vLLM's other methods (SpeculativeMethod), named so the refusal can say what each one is not
OTHER_METHODS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "mtp", "deepseek_mtp")
KEYS = ("method", "model", "num_speculative_tokens", "speculative_token_tree", "draft_tensor_parallel_size")
EXAMPLE = '\'{"method": "eagle3", "model": "./draft", "num_speculative_tokens": 5}\''


def from_vllm(text: str) -> dict:
    """The ``EngineArgs`` fields a ``--speculative-config`` JSON sets (only those it sets)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise EyasError(f"--speculative-config is not JSON: {e}", f"pass a JSON object, e.g. {EXAMPLE}") from None
    if not isinstance(data, dict):
        raise EyasError(f"--speculative-config must be a JSON object, got {type(data).__name__}",
                        f"e.g. {EXAMPLE}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise EyasError(f"--speculative-config: eyas does not read {', '.join(map(repr, unknown))} and will not "
                        f"ignore it; it reads {', '.join(KEYS)}",
                        "drop those keys (eyas's other settings have their own flags: see eyas serve --help)")
    out: dict = {}
    if data.get("method") is not None:
        method = str(data["method"]).lower()
        if method not in METHODS:
            others = "" if method not in OTHER_METHODS else f" ({method} is another kind of speculation)"
            raise EyasError(f"--speculative-config method {data['method']!r} is not one eyas runs{others}: eyas "
                            f"speculates with EAGLE drafts only, methods {', '.join(METHODS)}",
                            "use \"method\": \"eagle3\" for an EAGLE-3 draft, or serve that method with vLLM")
        out["speculative_algorithm"] = METHODS[method]
    if data.get("model") is not None:
        if not isinstance(data["model"], str) or not data["model"]:
            raise EyasError(f"--speculative-config model must be a path, got {data['model']!r}", f"e.g. {EXAMPLE}")
        out["speculative_draft_model_path"] = data["model"]
    tp = data.get("draft_tensor_parallel_size")
    if tp is not None and tp != 1:
        raise EyasError(f"--speculative-config draft_tensor_parallel_size {tp!r}: eyas runs on one device",
                        "drop it (or set 1)")
    k = data.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise EyasError(f"--speculative-config num_speculative_tokens must be a positive integer, got {k!r}",
                        f"e.g. {EXAMPLE}")
    tree = data.get("speculative_token_tree")
    if tree is not None:
        paths = parse_tree(tree)
        if k is not None and k != len(paths):
            raise EyasError(f"--speculative-config num_speculative_tokens {k} but speculative_token_tree has "
                            f"{len(paths)} nodes: a tree proposes one token per node",
                            f"set num_speculative_tokens to {len(paths)}, or drop it")
        out.update(speculative_num_steps=max(map(len, paths)),
                   speculative_eagle_topk=max(i for p in paths for i in p) + 1,
                   speculative_num_draft_tokens=len(paths) + 1)
    elif k is not None:
        out.update(speculative_num_steps=k, speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return out


def parse_tree(tree) -> list[tuple[int, ...]]:
    """vLLM's ``speculative_token_tree`` (a Python-literal string, or a JSON list) -> its paths, checked."""
    fix = "write the tree as vLLM does: a list of paths, each a tuple of child indices, e.g. \"[(0,), (1,), (0, 0)]\""
    try:
        value = ast.literal_eval(tree) if isinstance(tree, str) else tree
        paths = [tuple(p) for p in value]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise EyasError(f"--speculative-config speculative_token_tree {tree!r} is not a list of paths", fix) from None
    bad = [p for p in paths if not p or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)]
    if not paths or bad:
        raise EyasError(f"--speculative-config speculative_token_tree has no paths or a bad one ({bad[:1]})", fix)
    known = set(paths)
    orphans = [p for p in paths if len(p) > 1 and p[:-1] not in known]
    if orphans or len(known) != len(paths):
        raise EyasError("--speculative-config speculative_token_tree: " + (
            f"the parent of {orphans[0]} is missing" if orphans else "a path appears twice"), fix)
    return paths
