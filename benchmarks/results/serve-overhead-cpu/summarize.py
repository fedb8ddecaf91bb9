"""Summarize py-spy raw (collapsed) output per thread: samples, inclusive share of marked frames."""
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

MARKS = {
    "engine.step (model forward + host share)": "Engine.step (",
    "engine.prefill": "Engine.prefill (",
    "Detokenizer.push/flush": "Detokenizer.",
    "Scheduler._deliver (incl. detok + sink)": "Scheduler._deliver (",
    "Scheduler._finish": "Scheduler._finish (",
    "call_soon_threadsafe (wakeups)": "call_soon_threadsafe (",
    "metrics (prometheus)": "prometheus_client",
    "SSE framing (json.dumps in sse)": "sse (eyas/serve",
    "_stream generator (openai_routes)": "_stream (eyas/serve/openai_routes",
    "JobRun.events": "JobRun.events (",
    "uvicorn/h11 protocol": "h11",
    "starlette StreamingResponse": "StreamingResponse",
    "request prepare (tokenize, parse)": "Preparer",
    "asyncio event loop (_run_once)": "_run_once (",
    "selector/epoll wait": "select (selectors.py",
}
def main(path):
    per_thread = defaultdict(Counter)
    totals = Counter()
    selfs = defaultdict(Counter)
    for line in Path(path).read_text().splitlines():
        line = line.rstrip("\n")
        if not line: continue
        stack, _, n = line.rpartition(" ")
        n = int(n)
        parts = stack.split(";")
        m = re.match(r"thread \((\d+)\): ?(.*)", parts[0])
        name = parts[0] if not m else (parts[1].split(" ")[0] if not m.group(2) else m.group(2))
        name = m.group(2) or "main" if m else parts[0]
        # thread names: py-spy puts the name after the id
        totals[name] += n
        frames = parts[1:]
        for label, key in MARKS.items():
            if any(key in f for f in frames):
                per_thread[name][label] += n
        if frames:
            selfs[name][re.sub(r":\d+\)", ")", frames[-1])] += n
    out = {}
    for name, total in totals.most_common():
        out[name] = {"samples": total,
                     "inclusive_pct": {k: round(100 * v / total, 1) for k, v in per_thread[name].most_common()},
                     "top_self_pct": {k: round(100 * v / total, 1) for k, v in selfs[name].most_common(8)}}
    return out
if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1]), indent=1))
