"""Served vs in-process, before vs after, interleaved level by level on one busy CPU.

    OMP_NUM_THREADS=1 python compare.py BEFORE_SRC AFTER_SRC MODEL OUT.json [reps]

Starts one NONE server per source tree (PYTHONPATH=SRC python -m eyas.serve), builds the same
engine in-process, then per rep and client count (1, 16) runs: before, after, in-process, in
turn, so load swings from other processes hit all three alike. 4 requests per client x 128 tokens.
"""
import asyncio
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import serve_load as sl

from eyas.bench.offline import run_engine, warm_up
from eyas.common.prompts import chat_ids, prompt_set
from eyas.sample.sampling import SamplingParams
from eyas.pipeline import EngineArgs, build_engine

before, after, model, out = sys.argv[1:5]
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 4
PER, TOK = 4, 128
procs, urls = [], {}
for name, src in (("before", before), ("after", after)):
    port = sl.free_port()
    env = {**os.environ, "PYTHONPATH": src}
    p = subprocess.Popen([sys.executable, "-m", "eyas.serve", "--model-path", model, "--speculative-algorithm", "NONE",
                          "--port", str(port), "--max-running-requests", "64", "--log-interval", "0"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p); urls[name] = f"http://127.0.0.1:{port}"
try:
    for name, url in urls.items():
        sl.wait_ready(url, procs[list(urls).index(name)], None)
    prompts = prompt_set("chat")
    engine = build_engine(EngineArgs(model_path=model, speculative_algorithm="NONE", max_batch=64))
    ids = [chat_ids(engine.target.tokenizer, p) for p in prompts]
    warm_up(engine, ids[0])
    for url in urls.values():
        asyncio.run(sl.load(url, "x", prompts, 4, 2, 32, 0.0, True, 300))
    rows = []
    for rep in range(reps):
        for c in (1, 16):
            for name, url in urls.items():
                done, errors, secs = asyncio.run(sl.load(url, sl.served_model(url), prompts, c, PER, TOK, 0.0, True, 300))
                assert not errors, errors
                toks = sum(r["tokens"] for r in done)
                rows.append({"rep": rep, "clients": c, "side": name, "tokens_per_s": toks / secs,
                             "itl_p50_ms": 1000 * statistics.median([g for r in done for g in r["gaps"]]),
                             "ttft_p50_ms": 1000 * statistics.median([r["ttft"] for r in done])})
            run = run_engine(engine, [ids[i % len(ids)] for i in range(c * PER)],
                             SamplingParams(max_new_tokens=TOK, ignore_eos=True), c, "in-process")
            rows.append({"rep": rep, "clients": c, "side": "in-process", "tokens_per_s": run.tokens_per_s,
                         "tpot_p50_ms": 1000 * statistics.median([r.tpot for r in run.requests])})
            print(json.dumps(rows[-3:]), flush=True)
    summary = {}
    for c in (1, 16):
        for side in ("before", "after", "in-process"):
            rs = [r for r in rows if r["clients"] == c and r["side"] == side]
            summary[f"c{c} {side}"] = {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]
                                       if k not in ("rep", "clients", "side")}
        for side in ("before", "after"):
            ratios = [r["tokens_per_s"] / i["tokens_per_s"] for r, i in zip(
                [r for r in rows if r["clients"] == c and r["side"] == side],
                [r for r in rows if r["clients"] == c and r["side"] == "in-process"])]
            summary[f"c{c} {side}"]["served_over_in_process_median"] = round(statistics.median(ratios), 3)
    __import__("pathlib").Path(out).write_text(json.dumps({"summary": summary, "rows": rows, "per_client_requests": PER, "max_tokens": TOK,
               "model": "tiny random Llama, 4 layers, hidden 64, fp32 (tests/helpers.py save_tiny_model)",
               "machine": "2-core CPU shared with other jobs (load average 4-8), OMP_NUM_THREADS=1"},
              indent=1))
    print(json.dumps(summary, indent=1))
finally:
    for p in procs:
        p.terminate(); p.wait()
