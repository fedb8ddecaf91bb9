"""What a live server says about its own speculative configuration, where it says anything.

eyas and SGLang answer ``GET /get_server_info`` with their settings: eyas with
``algorithm``, ``draft``, ``aux_layer_ids``, the tree (src/eyas/serve/banner.py ``describe``);
SGLang with its ``ServerArgs`` fields ``speculative_algorithm``, ``speculative_draft_model_path``,
``speculative_num_steps``, ``speculative_eagle_topk``, ``speculative_num_draft_tokens``
(sgl-project/sglang python/sglang/srt/server_args.py, returned by /get_server_info in
python/sglang/srt/entrypoints/http_server.py). vLLM has no such endpoint.

On SGLang this catches the story's mistake directly: ``EAGLE`` with an EAGLE-3 draft. When the
draft path is readable here, its kind is read from its config (any format eyas knows).
"""

from __future__ import annotations

import httpx

from ..common.server_metrics import EYAS, SGLANG
from ..errors import EyasError
from .verdict import OK, PROBLEM, WARNING, Report


def fetch(client: httpx.Client, url: str, kind: str) -> dict | None:
    if kind not in (EYAS, SGLANG):
        return None
    try:
        r = client.get(url + "/get_server_info")
        data = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


EAGLE_UNCHECKED = "EAGLE, its draft not readable here"  # what add_rows returns: an EAGLE-3 draft is not confirmed


def draft_is_eagle3(path: str | None) -> bool | None:
    """True/False when the draft folder is readable here, None otherwise."""
    if not path:
        return None
    from .. import formats
    from ..checks import draft_kind
    from ..pipeline import draft_fc_width

    try:
        cfg = formats.read_config(path)
    except EyasError:
        return None
    fc_in, n_aux = draft_fc_width(cfg)
    arch = ",".join(getattr(cfg, "architectures", None) or [])
    return draft_kind(fc_in, fc_in // n_aux if fc_in else 0, n_aux, arch) == "eagle3"


def num_draft_tokens(kind: str, info: dict | None) -> int | None:
    """The most tokens a verify step checks, counting the root, as the server says (None: not told).
    A step accepts at most this many tokens (the draft's plus the bonus), which bounds tau."""
    if not info:
        return None
    key = "num_draft_tokens" if kind == EYAS else "speculative_num_draft_tokens"
    found = [info.get(key)]
    if kind == EYAS:  # a schedule or auto runs other trees than the one num_draft_tokens names
        from ..config import AUTO, AUTO_CANDIDATES, parse_schedule

        schedule = info.get("batch_schedule")
        settings = info.get("settings")
        if isinstance(settings, list):  # every setting the server may run, as "steps,topk,tokens" or "0"
            found += [int(p[2]) for p in (str(x).split(",") for x in settings) if len(p) == 3 and p[2].isdigit()]
        elif isinstance(schedule, str) and schedule.lower() == AUTO:  # a server from before ``settings``
            found += [c[2] for c in AUTO_CANDIDATES]
        elif schedule:
            try:
                found += [s.num_draft_tokens for _, s in parse_schedule(schedule) if s.speculative]
            except EyasError:
                pass
    found = [int(n) for n in found if isinstance(n, int) and not isinstance(n, bool) and n >= 2]
    return max(found) if found else None


def add_rows(report: Report, kind: str, info: dict | None) -> str | None:
    """A 'configuration' row; returns the algorithm the server runs (None when not told)."""
    if not info:
        return None
    if kind == EYAS:
        alg = info.get("algorithm")
        tree = (f"steps {info.get('num_steps')}, topk {info.get('eagle_topk')}, "
                f"draft tokens {info.get('num_draft_tokens')}")
        msg = (f"{alg}, draft {info.get('draft')}, captured layers {info.get('aux_layer_ids')} "
               f"(fc {info.get('fc_in')} -> {info.get('fc_out')}), {tree}" if info.get("speculative") else f"{alg}")
        for w in info.get("warnings") or []:
            report.add("training match", WARNING, w.removeprefix("WARNING: "),
                       "serve with the chat template and context the draft was trained with")
        report.add("configuration", OK, msg)
        return alg
    alg = info.get("speculative_algorithm")
    draft = info.get("speculative_draft_model_path")
    tree = (f"steps {info.get('speculative_num_steps')}, topk {info.get('speculative_eagle_topk')}, "
            f"draft tokens {info.get('speculative_num_draft_tokens')}")
    if alg in (None, "NONE", ""):
        report.add("configuration", OK, "no --speculative-algorithm")
        return "NONE"
    if str(alg).upper() == "EAGLE":
        eagle3 = draft_is_eagle3(draft)
        if eagle3:
            report.add("configuration", PROBLEM,
                       f"--speculative-algorithm EAGLE with {draft}, an EAGLE-3 draft: SGLang captures no aux "
                       "states and skips fc, so the draft sees other features than it was trained on and nearly "
                       "every proposal is rejected (accept length about 1.00), silently",
                       "restart SGLang with --speculative-algorithm EAGLE3")
        elif eagle3 is None:
            report.add("configuration", WARNING, f"--speculative-algorithm EAGLE with draft {draft}: if that draft is "
                       "EAGLE-3, nothing is accepted", f"check it: eyas doctor --draft {draft} --target TARGET "
                       "--speculative-algorithm EAGLE")
        else:
            report.add("configuration", OK, f"EAGLE with an EAGLE-1/2 draft {draft}, {tree}")
        return {True: "EAGLE", None: EAGLE_UNCHECKED, False: "EAGLE with an EAGLE-1/2 draft"}[eagle3]
    if str(alg).upper() == "EAGLE3" and aux_switched_off(draft):
        report.add("configuration", PROBLEM,
                   f"--speculative-algorithm EAGLE3 with {draft}, whose config.json sets eagle_config."
                   "use_aux_hidden_state false: SGLang captures no aux states for it and skips fc, so nearly every "
                   "proposal is rejected (accept length about 1.00), silently",
                   "set eagle_config.use_aux_hidden_state to true in the draft's config.json (or re-export it "
                   "with eyas export) and restart SGLang")
        return "EAGLE3 without aux states"
    report.add("configuration", OK, f"--speculative-algorithm {alg}, draft {draft}, {tree}")
    return str(alg)


def aux_switched_off(path: str | None) -> bool:
    """Whether a draft folder readable here tells SGLang not to capture aux states (eagle_config.use_aux_hidden_state
    false, read by SGLang's EAGLE worker with a default of true)."""
    import json
    from pathlib import Path

    try:
        eagle = json.loads((Path(path) / "config.json").read_text()).get("eagle_config")
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    return isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False
