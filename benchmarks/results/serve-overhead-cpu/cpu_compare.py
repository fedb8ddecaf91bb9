"""Host CPU time per generated token, per server thread, before vs after (robust to a busy machine).

    OMP_NUM_THREADS=1 python cpu_compare.py BEFORE_SRC AFTER_SRC MODEL OUT.json [reps]

Starts one NONE server per source tree, maps its native thread ids to names with ``py-spy dump``,
and per rep and client count (1, 16), for each side in turn, reads each thread's user+system CPU
time from /proc/PID/task/TID/stat around a load of 4 streaming requests per client x 128 tokens.
Reports CPU ms per 100 tokens for the engine thread, the event loop (MainThread) and the whole
process, and the wall-clock tok/s (which other jobs on the machine disturb far more).
"""
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import serve_load as sl

from eyas.common.prompts import prompt_set

before, after, model, out = sys.argv[1:5]
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
PER, TOK = int(os.environ.get("PER", "4")), int(os.environ.get("TOK", "128"))
TICK = os.sysconf("SC_CLK_TCK")
servers = {}
for name, src in (("before", before), ("after", after)):
    port = sl.free_port()
    p = subprocess.Popen([sys.executable, "-m", "eyas.serve", "--model-path", model, "--speculative-algorithm", "NONE",
                          "--port", str(port), "--max-running-requests", "64", "--log-interval", "0"],
                         env={**os.environ, "PYTHONPATH": src}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers[name] = (p, f"http://127.0.0.1:{port}")


def names(pid):
    dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, check=False).stdout
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"Thread (\d+) \(\w+\): \"([^\"]+)\"", dump)}


def cpu(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(f[11]) + int(f[12])) / TICK
    return out


try:
    prompts = prompt_set("chat")
    for name, (p, url) in servers.items():
        sl.wait_ready(url, p, None)
        asyncio.run(sl.load(url, "x", prompts, 16, 1, 64, 0.0, True, 300))  # warm
    tids = {name: names(p.pid) for name, (p, _) in servers.items()}
    rows = []
    for rep in range(reps):
        for c in [int(x) for x in os.environ.get("CLIENTS", "1,16").split(",")]:
            for name, (p, url) in (list(servers.items()) if rep % 2 == 0 else list(servers.items())[::-1]):
                a = cpu(p.pid)
                done, errors, secs = asyncio.run(sl.load(url, sl.served_model(url), prompts, c, PER, TOK, 0.0, True, 300))
                b = cpu(p.pid)
                assert not errors, errors
                toks = sum(r["tokens"] for r in done)
                per = lambda tid_set, a=a, b=b, toks=toks: 1000 * sum(b.get(t, 0) - a.get(t, 0) for t in tid_set) / toks * 100
                by_name = {}
                for t, n in tids[name].items():
                    by_name.setdefault(n, set()).add(t)
                row = {"rep": rep, "clients": c, "side": name, "tokens": toks, "tokens_per_s": round(toks / secs, 1),
                       "engine_cpu_ms_per_100_tokens": round(per(by_name.get("eyas-engine", set())), 2),
                       "loop_cpu_ms_per_100_tokens": round(per(by_name.get("MainThread", set())), 2),
                       "process_cpu_ms_per_100_tokens": round(per(set(b)), 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for c in [int(x) for x in os.environ.get("CLIENTS", "1,16").split(",")]:
        for side in servers:
            rs = [r for r in rows if r["clients"] == c and r["side"] == side]
            summary[f"clients {c}, {side}"] = {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]
                                               if k not in ("rep", "clients", "side", "tokens")}
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
finally:
    for p, _ in servers.values():
        p.terminate(); p.wait()
