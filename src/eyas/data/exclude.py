"""Prompts kept out of training: every prompt set eyas reports acceptance on, and any file.

``--exclude`` takes a built-in benchmark set (``chat``, ``code``, ``reasoning``, ``all``), ``bench``
for every built-in set at once (sets added later included), or a file, folder or glob of
conversations in any format ``files`` reads (a ``{"prompt"}`` JSONL such as
``benchmarks/heldout-prompts-smollm2.jsonl``, an earlier ``holdout-prompts.jsonl``, a data
folder's ``heldout.jsonl``). A conversation is dropped when any of its user turns is one of those
prompts, case and whitespace folded.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EyasError
from .chat import prompt_messages
from .files import prompt_file_records, read_inputs
from .split import fold


def bench_sets() -> dict[str, list[str]]:
    """eyas bench's built-in prompt sets by name (the one place data reads bench's prompts)."""
    from ..common.prompts import SETS

    return {name: list(prompts) for name, prompts in SETS.items()}


def excluded_prompts(names: list[str]) -> list[str]:
    """The user prompts that ``--exclude`` names."""
    sets = bench_sets()
    out: list[str] = []
    for name in names:
        if name in ("bench", "all"):
            out += [p for prompts in sets.values() for p in prompts]
        elif name in sets:
            out += sets[name]
        elif _is_text(Path(name)):  # one prompt a line, as eyas eval --prompts reads it
            out += [m[0]["content"] for m, _ in prompt_file_records(Path(name))]
        else:
            try:
                records = list(read_inputs([name]))
            except EyasError as e:  # a file that exists but cannot be read keeps its own fix (re-encode, ...)
                raise EyasError(f"--exclude {name}: {e.problem}", e.fix if Path(name).is_file() else
                                f"name a prompt set ({', '.join(['bench', 'all', *sets])}) or a file, "
                                "folder or glob of prompts") from None
            out += [m["content"] for r in records for m in r["messages"] if m["role"] == "user"]
    return out


def drop_excluded(records, texts) -> tuple[list[dict], list[dict]]:
    """(records none of whose user turns is one of ``texts``, the others), case and whitespace
    folded: keeps benchmark prompts out of the data."""
    banned = {fold(t) for t in texts}
    kept, dropped = [], []
    for r in records:
        hit = any(m["role"] == "user" and fold(m["content"]) in banned for m in prompt_messages(r["messages"]))
        (dropped if hit else kept).append(r)
    return kept, dropped


def _is_text(path: Path) -> bool:
    """A plain-text prompt file: not gzipped, its first non-blank character neither ``{`` nor ``[``."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(4096).removeprefix(b"\xef\xbb\xbf")  # past a byte-order mark
    return not head.startswith(b"\x1f\x8b") and head.lstrip()[:1] not in (b"{", b"[")
