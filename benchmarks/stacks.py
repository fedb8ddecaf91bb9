#!/usr/bin/env python3
"""Where a thread's time went, from py-spy's collapsed stacks (``serve_load.py --py-spy``), as tables.

    python benchmarks/stacks.py logs/main.stacks.txt logs/NONE.stacks.txt --thread _loop --under _turn
    python benchmarks/stacks.py logs/main.stacks.txt --thread _loop --under _turn --out results/stacks.json

A line of py-spy's raw format is one stack, outermost frame first (``thread (id);func (file:line);...``), and
its count of samples. ``--thread FUNC`` keeps the threads with FUNC in some stack (the server's engine thread:
``_loop``); ``--under FUNC`` the samples with FUNC in their stack (``_turn``: the engine thread's turns, not its
waits for work), ``--skip FUNC`` drops those with FUNC (``warm_up``). For each file: the samples kept, each
function's inclusive share (in the stack at all) and each line's own share (the innermost frame: where a sample
was, a wait in C included, since py-spy records idle threads too), largest first. At ``--rate`` 200 a sample is
5 ms of that thread's wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse(path: Path) -> list[tuple[str, list[str], int]]:
    """(thread, frames outermost first, samples) per line of a raw collapsed-stack file."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        out.append((thread, frames, int(count)))
    return out


def short(frame: str) -> str:
    """``func (file:line)`` with the file's folders dropped."""
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({Path(m['file']).name}{':' + m['line'] if m['line'] else ''})"


def func_of(frame: str) -> str:
    m = FRAME.match(frame)
    return f"{m['func']} ({Path(m['file']).name})" if m else frame


def summarize(stacks, thread: str | None, under: str | None, skip: list[str], top: int, match: str | None = None
              ) -> dict:
    def named(frames, name):  # a frame of function ``name`` (``Class.name`` too)
        return any(func == name or func.endswith("." + name) for func in (f.split(" (", 1)[0] for f in frames))

    threads = {t for t, frames, _ in stacks if thread is None or named(frames, thread)}
    kept = [(frames, n) for t, frames, n in stacks if t in threads and (under is None or named(frames, under))
            and not any(named(frames, s) for s in skip)]
    total = sum(n for _, n in kept)
    inclusive, own = Counter(), Counter()
    for frames, n in kept:
        for f in {func_of(f) for f in frames if match is None or match in f}:
            inclusive[f] += n
        if frames:
            own[short(frames[-1])] += n
    share = lambda c: [[k, v, round(v / total, 4)] for k, v in c.most_common(top)]  # noqa: E731
    return {"threads": len(threads), "samples": total, "inclusive": share(inclusive), "own": share(own)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--thread", default=None, help="keep threads with this function in a stack (e.g. _loop)")
    p.add_argument("--under", default=None, help="keep samples with this function in their stack (e.g. _turn)")
    p.add_argument("--skip", action="append", default=[], help="drop samples with this function (repeatable)")
    p.add_argument("--match", default=None, help="the inclusive table: only frames whose file path has this "
                   "(e.g. eyas/)")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", default=None, help="JSON file (default: tables printed)")
    args = p.parse_args(argv)
    result = {str(f): summarize(parse(f), args.thread, args.under, args.skip, args.top, args.match) for f in args.files}
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()
                                                           if k not in ("files", "out")}, "files": result},
                                             indent=1) + "\n")
    for name, r in result.items():
        print(f"== {name}: {r['samples']} samples over {r['threads']} thread(s)")
        for title in ("inclusive", "own"):
            print(f"-- {title}")
            for key, n, s in r[title]:
                print(f"{100 * s:6.1f}% {n:7d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
