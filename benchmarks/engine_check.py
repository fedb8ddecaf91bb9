#!/usr/bin/env python3
"""The engine on this GPU against Hugging Face, before any benchmark trusts it.

    python benchmarks/engine_check.py --out engine-check.json

The CPU tests run every path of the engine, the graph path eagerly; this runs them on the GPU with
CUDA graphs captured, on a tiny random Llama in float32 (TF32 off) and a draft trained on it for a
few seconds (the tests' own helpers):

- greedy: NONE, a chain and a tree, native eager and native graphs, a batch of prompts, each output
  equal to HF ``generate``'s greedy continuation;
- overlapped: each step launched before the last one is read back (the server's overlap schedule), the
  same greedy outputs, and the same seeded sampled ones as steps taken one at a time;
- deferred draft feed: plain steps beside drafting ones (``engine/feed.py``), steps launched ahead, rows
  joining and leaving: greedy tokens equal HF's, and the draft accepts what a draft fed every step accepts
  (sampled rows: as many tokens, within 10%: a block fed at once may round otherwise than token by token);
- sampled: a seeded request gives the same tokens alone, among greedy and sampled neighbours at any
  row, when it joins a running batch (the device sampler and tree verifier inside the graphs) and
  eagerly (its draws in torch ops, not the kernel), and without speculation; another seed gives other tokens.

Prints each check and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import ROOT, write

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "engine")]

from helpers import reference_greedy, tiny_target, train_draft  # noqa: E402
from test_deferred_feed import LATE  # noqa: E402
from test_deferred_feed import PROMPTS as FEED_PROMPTS  # noqa: E402
from test_deferred_feed import engine as feeding_engine  # noqa: E402
from test_deferred_feed import run as feed_run  # noqa: E402  the CPU test's loop: plain and drafting steps in turn
from test_overlap import overlapped  # noqa: E402  the CPU test's loop with steps launched ahead
from test_seeded_rows import MINE, OTHERS, PROMPT, joined_late  # noqa: E402  the CPU test's request and batch

from eyas.config import SpecConfig, setting_name  # noqa: E402
from eyas.engine.engine import Engine  # noqa: E402
from eyas.models.native import NativeTarget  # noqa: E402
from eyas.sample.sampling import SamplingParams  # noqa: E402

PROMPTS = [PROMPT, [7] * 9, [200, 13], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]]
SPECS = [SpecConfig("NONE"), SpecConfig("EAGLE3", 5, 1, 6), SpecConfig("EAGLE3", 4, 2, 6)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda", help="cpu: the same checks, the graph path run eagerly")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    target = tiny_target(dtype=torch.float32)
    draft = train_draft(target)
    target.model.to(args.device)
    draft.to(args.device)
    want = [reference_greedy(target.model, p, args.new_tokens) for p in PROMPTS]
    checks, failed = [], 0

    def record(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failed
        failed += not ok
        checks.append({"check": name, "ok": ok, "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)

    greedy = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    for graphs in (False, True):
        native = NativeTarget.from_target(target)
        for spec in SPECS:
            engine = Engine(native, draft if spec.speculative else None, spec, max_batch=8,
                            cuda_graphs=graphs)
            outs = engine.generate(PROMPTS, greedy)
            bad = [i for i, (o, w) in enumerate(zip(outs, want)) if o.output_ids != w]
            accepted = sum(o.stats.accepted for o in outs)
            record(f"greedy {setting_name(spec)} {'graphs' if graphs else 'eager'}", not bad,
                   f"rows differing from HF: {bad}; draft tokens accepted: {accepted}")
    for spec in SPECS:  # the overlap schedule: each step launched before the last is read back
        engine = Engine(NativeTarget.from_target(target), draft if spec.speculative else None, spec, max_batch=8,
                        cuda_graphs=True)
        outs, ahead = overlapped(engine, [greedy] * len(PROMPTS), PROMPTS)
        bad = [i for i, (o, w) in enumerate(zip(outs, want)) if o != w]
        record(f"greedy {setting_name(spec)} graphs, steps launched ahead", not bad and ahead > 0,
               f"rows differing from HF: {bad}; steps launched ahead: {ahead}")
    for sampled in (False, True):
        extra = dict(temperature=0.8, top_p=0.9, seed=5) if sampled else {}
        rows = [SamplingParams(max_new_tokens=n, ignore_eos=True, **extra) for n in (30, 44, 12, 38)]
        every = feed_run(feeding_engine(target, draft, 1), rows)
        got, accepted, fed = feed_run(feeding_engine(target, draft, 4), rows, ahead=True)
        ratio = sum(accepted) / max(1, sum(every[1]))
        if sampled:
            ok, label = 0.9 <= ratio <= 1.1, "sampled"
        else:
            refs = [reference_greedy(target.model, p, 44) for p in (*FEED_PROMPTS, LATE)]
            ok, label = got == [r[:len(g)] for r, g in zip(refs, got)] and got == every[0] and ratio == 1, "greedy"
        record(f"deferred draft feed {label}, steps launched ahead", ok and fed > 0,
               f"draft tokens accepted {sum(accepted)} (fed every step: {sum(every[1])}); feeds given: {fed}; "
               f"tokens equal to a feed every step: {got == every[0]}")
    spec = SPECS[2]
    engine = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8, cuda_graphs=True)
    alone = engine.generate([PROMPTS[0]], MINE)[0]
    record("sampled: the draft's tokens are accepted", alone.stats.accepted > 0, f"{alone.stats.accepted}")
    for row in (0, 3):
        batch = OTHERS[:row] + [(PROMPTS[0], MINE)] + OTHERS[row:]
        outs = engine.generate([p for p, _ in batch], [sp for _, sp in batch])
        record(f"sampled: seeded request at row {row} of 4", outs[row].output_ids == alone.output_ids)
    record("sampled: seeded request joining a running batch", joined_late(engine) == alone.output_ids)
    plain = Engine(NativeTarget.from_target(target), None, SpecConfig("NONE"), max_batch=8, cuda_graphs=True)
    record("sampled: the seeded request's tokens without speculation (draws keyed by position)",
           plain.generate([PROMPTS[0]], MINE)[0].output_ids == alone.output_ids)
    other = SamplingParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1278, ignore_eos=True)
    record("sampled: another seed, other tokens",
           engine.generate([PROMPTS[0]], other)[0].output_ids != alone.output_ids)
    eager = Engine(NativeTarget.from_target(target), draft, spec, max_batch=8).generate([PROMPTS[0]], MINE)[0]
    record("sampled: the eager path (draws in torch ops) gives the graphs' tokens (draws in a kernel)",
           eager.output_ids == alone.output_ids)
    # 8 rows of this tree are 48 distribution rows: one program a row, where the batch-1 checks take the split
    # (T 0.2: nearly the greedy path, which the tiny draft is trained on)
    many = [SamplingParams(max_new_tokens=args.new_tokens, temperature=0.2, seed=s, ignore_eos=True) for s in range(8)]
    rate = [sum(o.stats.accepted for o in outs) / max(1, sum(o.stats.drafts for o in outs))
            for outs in (engine.generate([PROMPTS[0]] * 8, many),
                         [engine.generate([PROMPTS[0]], sp)[0] for sp in many])]
    record("sampled: 8 rows at once accept the draft's tokens as rows one at a time do",
           rate[0] > 0.5 * rate[1] > 0, f"accepted a step: {rate[0]:.2f} (8 rows), {rate[1]:.2f} (1 row)")
    record("sampled: the filtered whole-step graph ran", bool(engine.whole_steps[spec].graphs["filtered"].graphs))
    rows = [sp for _, sp in OTHERS[:1]] + [MINE] + [sp for _, sp in OTHERS[1:3]]
    prompts = [p for p, _ in OTHERS[:1]] + [PROMPTS[0]] + [p for p, _ in OTHERS[1:3]]
    one = [o.output_ids for o in engine.generate(prompts, rows)]
    ahead, launched = overlapped(engine, rows, prompts)
    kept = [0, 1, 3]  # the greedy row and the seeded ones (row 2 draws fresh each run)
    record("sampled: steps launched ahead give the tokens of steps one at a time",
           [ahead[i] for i in kept] == [one[i] for i in kept] and launched > 0, f"steps launched ahead: {launched}")
    seconds = time.perf_counter() - start
    print(f"{len(checks) - failed}/{len(checks)} checks passed in {seconds:.0f} s")
    if args.out:
        write(args.out, "the engine on the GPU against HF greedy; seeded sampling in any batch",
              {"checks": checks, "failed": failed, "seconds": round(seconds, 1)})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
