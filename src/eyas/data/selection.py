"""Which prompts go where: exclusion, deduplication, the chat holdout, the mix and the split, in
that order, each step's drops counted per source (``ledger``). Nothing here needs the target, so
``eyas prepare --select-only`` runs it on any machine in seconds and writes what a full run would
choose: the same prompts, the same chat holdout file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EyasError
from . import holdout, mix
from .exclude import drop_excluded, excluded_prompts
from .ledger import Ledger
from .split import dedup, split

if TYPE_CHECKING:
    from .prepare_config import PrepareConfig


def select(records: list[dict], cfg: PrepareConfig, ledger: Ledger, log=print):
    """(train, held out, chat holdout): exclusion, dedup, the chat holdout, the mix and the split,
    each step's drops counted per source in ``ledger``."""
    weights = mix.parse(cfg.source_weights)
    names = {mix.source_key(r) for r in records}
    mix.check_names(weights, names)
    mix.check_names(dict.fromkeys(cfg.holdout_sources), names, "--holdout-sources")
    ledger.add("read", records)
    if cfg.exclude:
        records, dropped = drop_excluded(records, excluded_prompts(cfg.exclude))
        ledger.add("excluded", dropped)
        log(f"{len(dropped)} records dropped: their prompts are in {', '.join(cfg.exclude)}")
    records, dups = dedup(records)
    ledger.add("duplicate", dups)
    records, chat_eval, leaked = holdout.pick(records, cfg.holdout_prompts, cfg.holdout_sources, cfg.holdout_seed)
    ledger.add("holdout", chat_eval)
    if len(chat_eval) < cfg.holdout_prompts:
        among = f" of source {', '.join(cfg.holdout_sources)}" if cfg.holdout_sources else ""
        log(f"warning: --holdout-prompts {cfg.holdout_prompts}: only {len(chat_eval)} records{among} are a prompt "
            "alone (one user turn, no answer), the only ones set aside; give a prompt file (--input) to draw the "
            "holdout from, or ask for fewer")
    ledger.add("excluded", leaked)
    records, left_out = mix.apply(records, weights, cfg.max_prompts, cfg.mix_seed)
    ledger.add("mixed out", left_out)
    ledger.add("kept", records)
    if not records:
        raise EyasError(f"no prompts left after exclusion, deduplication, the holdout and the mix:\n{ledger.table()}",
                        "loosen --source-weights / --max-prompts / --exclude, or add sources")
    train, held = split(records, cfg.held_out)
    log(f"{len(records)} records, {len(dups)} duplicates dropped, {len(chat_eval)} set aside for the chat "
        f"holdout: {len(train)} train, {len(held)} held out")
    return train, held, chat_eval


def selection_meta(cfg: PrepareConfig, ledger: Ledger, chat_eval: list[dict]) -> dict:
    """The selection's part of ``meta.json``."""
    per_source = ledger.as_dict()
    total = {c: sum(d[c] for d in per_source.values()) for c in ("excluded", "duplicate")}
    return {
        "sources": cfg.sources, "inputs": cfg.inputs, "held_out_fraction": cfg.held_out,
        "magpie_prompts": cfg.magpie_prompts if "magpie" in cfg.sources else None,
        "excluded": {"sets": cfg.exclude, "records": total["excluded"]}, "duplicates_dropped": total["duplicate"],
        "mix": {"source_weights": mix.parse(cfg.source_weights), "max_prompts": cfg.max_prompts, "seed": cfg.mix_seed},
        "holdout": {"file": holdout.FILE if chat_eval else None, "prompts": len(chat_eval),
                    "sources": cfg.holdout_sources, "seed": cfg.holdout_seed},
        "per_source": per_source,
    }


def write_jsonl(path: Path, records: list[dict]) -> None:
    with Path(path).open("w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
