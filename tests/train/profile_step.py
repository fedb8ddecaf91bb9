"""Where a training step's time goes: target forward, TTT forward, backward, optimizer, and the
top operators (torch.profiler), on the CPU or a GPU. Not a test (pytest does not collect it).

    .venv/bin/python tests/train/profile_step.py --target smollm2-135m-instruct --length 1024 --batch 2
    python tests/train/profile_step.py --target /tmp/smollm2.gguf --data DATA --length 2048 --batch 8 --device cuda

Rows are synthetic (random ids, the last row padded to 3/4) unless ``--data`` names a prepared
folder, whose first rows are then cut to ``--length``. The recipe is the default but for the
sizes given. Prints phase medians over ``--reps`` steps as JSON, then the profiler table.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from eyas.train.batches import Batch, collate  # noqa: E402
from eyas.train.recipe import load_recipe  # noqa: E402
from eyas.train.trainer import Trainer  # noqa: E402


def size_arguments(reps: int) -> argparse.ArgumentParser:
    """The arguments this script and bench_ttt.py share."""
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="tiny", help="tiny, or a target eyas loads (smollm2-135m-instruct, a .gguf)")
    for name, default in (("--length", 512), ("--batch", 2), ("--ttt-steps", 7), ("--draft-vocab", 16384),
                          ("--reps", reps)):
        p.add_argument(name, type=int, default=default)
    p.add_argument("--device", default="cpu")
    return p


def tiny_on(device: str):
    """The tests' tiny random Llama, fp32, with room for long rows."""
    from helpers import tiny_target

    target = tiny_target(dtype=torch.float32, max_position_embeddings=8192)
    target.model.to(device)
    return target


def main() -> None:
    p = size_arguments(reps=3)
    p.add_argument("--data", default=None, help="a prepared data folder (default: synthetic rows)")
    p.add_argument("--rows", type=int, default=25, help="profiler table rows (0: no profile)")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    target = None
    data = a.data
    if a.target == "tiny":
        from train_fixtures import make_data

        target = tiny_on(a.device)
        data = data or str(make_data(target, Path("/tmp/eyas-profile-data"), rows=16))
    elif data is None:
        data = "/tmp/eyas-profile-none"  # synthetic rows; the trainer still wants a folder
        from eyas.data.tokenized import write_split

        Path(data).mkdir(parents=True, exist_ok=True)
        write_split(Path(data), "train", [([1, 2, 3, 4], [0, 1, 1, 0])])
    sets = [f"data.path={data}", "output=/tmp/eyas-profile-run", f"data.max_length={a.length}",
            f"data.tokens_per_batch={a.length * a.batch}", f"draft.vocab_size={a.draft_vocab}",
            f"train.ttt_steps={a.ttt_steps}", f"train.device={a.device}", "train.max_steps=10",
            "log.progress=false", "log.tensorboard=false", "log.eval_every=0", "log.checkpoint_every=0"]
    if a.target != "tiny":
        sets.append(f"target={a.target}")
    tr = Trainer(load_recipe(None, sets), target=target)
    vocab = tr.target.info.vocab_size
    if a.data:
        b = collate(tr.train_split, list(range(a.batch)), a.length)
    else:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, min(vocab, 20000), (a.batch, a.length), generator=g)
        valid = torch.ones(a.batch, a.length, dtype=torch.bool)
        valid[-1, a.length * 3 // 4:] = False
        ids[~valid] = 0
        mask = valid.float()
        mask[:, :8] = 0
        b = Batch(ids, mask, valid, list(range(a.batch)))
    dev = tr.ctx.device

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(times):
        sync()
        c0 = time.process_time()
        t0 = time.perf_counter()
        aux, logits = tr.states(b)
        sync()
        t1 = time.perf_counter()
        with tr.autocast():
            loss, _ = tr.wrapped(b.input_ids.to(dev), aux.float(), logits, b.loss_mask.to(dev), b.valid.to(dev),
                                 tr._step_norm(b))
        sync()
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(tr.module.parameters(), 0.5)
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        sync()
        times.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3, time.process_time() - c0))

    step([])  # warm-up
    times = []
    for _ in range(a.reps):
        step(times)
    names = ("target_forward", "ttt_forward", "ttt_backward", "optimizer")
    med = {f"{n}_ms": round(1000 * statistics.median(t[i] for t in times), 1) for i, n in enumerate(names)}
    total = sum(med.values())
    tokens = int(b.valid.sum())
    print(json.dumps({"target": a.target, "device": a.device, "batch": a.batch, "length": a.length,
                      "tokens": tokens, "ttt_steps": a.ttt_steps, "threads": torch.get_num_threads(), **med,
                      "step_ms": round(total, 1), "tokens_per_s": round(1000 * tokens / total),
                      "process_cpu_s": round(statistics.median(t[4] for t in times), 2)}))
    if a.rows:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            step([])
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=a.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
