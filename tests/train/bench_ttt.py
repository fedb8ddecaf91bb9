"""Time the TTT loss (forward + backward): the old dense-mask reference against ``ttt_loss``.

    .venv/bin/python tests/train/bench_ttt.py --target smollm2 --length 1024 --batch 2
    python tests/train/bench_ttt.py --target smollm2 --length 2048 --batch 8 --device cuda   # bf16 autocast

Same draft, same batch (last row padded to 3/4), old and new alternately, median of ``--reps``
wall times (and, on the CPU, of the process's CPU seconds, which other processes on a shared
machine disturb less); prints one JSON line. Not a test (pytest does not collect it); the reference lives
in test_ttt_fast.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from profile_step import size_arguments, tiny_on  # noqa: E402
from test_ttt_fast import reference_ttt_loss  # noqa: E402

from eyas.models.draft import Eagle3Draft  # noqa: E402
from eyas.train.ttt import target_states, ttt_loss  # noqa: E402


def main() -> None:
    a = size_arguments(reps=5).parse_args()
    cuda = a.device.startswith("cuda")
    if a.target == "tiny":
        target = tiny_on(a.device)
    else:
        from eyas.models.loading import load_target

        target = load_target("smollm2-135m-instruct" if a.target == "smollm2" else a.target, device=a.device,
                             dtype="bfloat16" if cuda else "float32")
    vocab = min(a.draft_vocab, target.info.vocab_size)
    draft = Eagle3Draft.for_target(target, vocab).float().to(a.device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(target.info.vocab_size, 20000), (a.batch, a.length), generator=gen)
    valid = torch.ones(a.batch, a.length, dtype=torch.bool)
    valid[-1, a.length * 3 // 4:] = False
    ids[~valid] = 0
    ids, valid = ids.to(a.device), valid.to(a.device)
    aux, logits = target_states(target, ids, valid.sum(1))
    aux = aux.float()
    loss_mask = valid.float()
    params = [q for q in draft.parameters() if q.requires_grad]

    def run(fn):
        if cuda:
            torch.cuda.synchronize()
        t, c = time.perf_counter(), time.process_time()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            out = fn(draft, ids, aux, logits, loss_mask, valid, steps=a.ttt_steps)
        loss = out if torch.is_tensor(out) else out.loss if hasattr(out, "loss") else out[0]
        torch.autograd.grad(loss, params)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t, time.process_time() - c, float(loss.detach())

    impls = {"old_dense_mask": reference_ttt_loss, "new": ttt_loss}
    times = {k: [] for k in impls}
    cpu = {k: [] for k in impls}
    losses = {}
    for k, fn in impls.items():  # warm-up
        losses[k] = run(fn)[2]
    for _ in range(a.reps):
        for k, fn in impls.items():
            wall, used, _ = run(fn)
            times[k].append(wall)
            cpu[k].append(used)
    tokens = int(valid.sum())
    res = {"target": a.target, "device": a.device, "batch": a.batch, "length": a.length, "ttt_steps": a.ttt_steps,
           "draft_vocab": vocab, "threads": torch.get_num_threads(), "reps": a.reps,
           **{f"{k}_ms_median": round(1000 * statistics.median(v), 1) for k, v in times.items()},
           **{f"{k}_ms_all": [round(1000 * x) for x in v] for k, v in times.items()},
           **({f"{k}_cpu_s_median": round(statistics.median(v), 2) for k, v in cpu.items()} if not cuda else {}),
           "speedup": round(statistics.median(times["old_dense_mask"]) / statistics.median(times["new"]), 2),
           "tokens_per_s_new": round(tokens / statistics.median(times["new"])),
           "loss_old": losses["old_dense_mask"], "loss_new": losses["new"]}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
