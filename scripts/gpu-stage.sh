#!/usr/bin/env bash
# The SmolLM2 GGUF and the wheels the GPU image lacks, onto a device machine in as few calls as the carry limit
# allows: the GGUF xz-compressed (98.4 -> 90.4 MB) and cut into parts that each fit beside the working tree.
#
#   bash scripts/gpu-stage.sh plan      # here: builds .stage/ (../shared/tools/stage-smollm2.sh first, if
#                                       # needed), cuts .stage/gguf/part-N, prints each device call to make
#   bash scripts/gpu-stage.sh take N    # on the device, call N: keeps part N (and, in call 1, installs the wheels)
#   bash scripts/gpu-stage.sh unpack    # on the device, last call: joins the parts into /tmp/smollm2.gguf, checks
#                                       # its sha256; then: export PYTHONPATH=/tmp/site:$PWD/src
#                                       # (py-spy, staged with the wheels: /tmp/site/bin/py-spy record -p PID ...)
#
# A device call carries at most 64 MiB, counted in the files' disk blocks, tracked tree included (about 34 MiB
# with the shipped draft), so the parts take what is left less a margin (MARGIN_KB, 320): three calls today;
# the wheels and any other carried files (EXTRA_KB, in KiB) ride with part 1. The machine is given back 30 s after a call: make the calls back
# to back, the last part's call also doing the run (`take N && unpack && ...`). Where a call finds /tmp/stage
# gone, the machine was given back: start again from call 1.
set -euo pipefail
STAGE=/tmp/stage
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:-}" in
  plan)
    cd "$(git rev-parse --show-toplevel)"
    [ -f .stage/part_aa ] || [ -d .stage/gguf ] || bash ../shared/tools/stage-smollm2.sh
    # py-spy (a sampling profiler, one static binary in its wheel): where a served step's host time goes
    ls .stage/whl/py_spy-*.whl >/dev/null 2>&1 || python3 -m pip download -q py-spy==0.4.3 --no-deps \
      --only-binary :all: --platform manylinux2014_x86_64 --python-version 3.12 -d .stage/whl \
      || echo "py-spy not staged (no PyPI here?): the device gets no profiler" >&2
    mkdir -p .stage/gguf
    if [ -f .stage/part_aa ]; then  # stage-smollm2.sh's raw parts: compressed once
      cat .stage/part_a? | xz -9 -T2 > .stage/gguf.xz && rm .stage/part_a?
    fi
    [ -f .stage/gguf.xz ] || cat .stage/gguf/part-* > .stage/gguf.xz
    tree_kb=$(git ls-files -z | xargs -0 du -c | tail -1 | cut -f1)
    untracked_kb=$(git ls-files -o --exclude-standard -z | xargs -0 -r du -c | tail -1 | cut -f1)
    whl_kb=$(du -s .stage/whl | cut -f1)
    room=$(( (65536 - tree_kb - ${untracked_kb:-0} - ${MARGIN_KB:-320}) * 1024 ))  # bytes a call can carry besides the tree
    first=$(( room - (whl_kb + ${EXTRA_KB:-0}) * 1024 ))
    [ $first -gt 4000000 ] || { echo "no room: the tree takes ${tree_kb} KiB of the 65536" >&2; exit 1; }
    rm -f .stage/gguf/part-*
    total=$(stat -c %s .stage/gguf.xz); at=0; n=1
    while [ $at -lt $total ]; do
      size=$([ $n = 1 ] && echo $first || echo $room)
      dd if=.stage/gguf.xz of=.stage/gguf/part-$n bs=1M iflag=skip_bytes,count_bytes skip=$at count=$size status=none
      at=$((at + size)); n=$((n + 1))
    done
    rm .stage/gguf.xz
    parts=$((n - 1))
    echo "tree ${tree_kb} KiB (+${untracked_kb:-0} untracked); ${parts} calls, back to back:"
    for i in $(seq 1 $parts); do
      carry="\".stage/gguf/part-$i\""; [ $i = 1 ] && carry="$carry, \".stage/whl\""
      cmd="bash scripts/gpu-stage.sh take $i"; [ $i = $parts ] && cmd="$cmd && bash scripts/gpu-stage.sh unpack && ..."
      echo "  call $i: carry [$carry]  command: $cmd"
    done ;;
  take)
    n=${2:?usage: take N}
    [ "$n" = 1 ] && rm -rf $STAGE
    mkdir -p $STAGE
    [ "$n" = 1 ] || [ -f $STAGE/part-1 ] || { echo "no part 1 in $STAGE: the machine was given back; start again" >&2; exit 3; }
    cp .stage/gguf/part-"$n" $STAGE/
    if [ "$n" = 1 ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .stage/whl/*.whl
      nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    fi
    ls -la $STAGE ;;
  unpack)
    ls $STAGE/part-* > /dev/null || { echo "no parts in $STAGE: start again from call 1" >&2; exit 3; }
    cat $(ls $STAGE/part-* | sort -t- -k2 -n) | xz -d > /tmp/smollm2.gguf
    echo "$SHA  /tmp/smollm2.gguf" | sha256sum -c - ;;
  *) sed -n 2,15p "$0"; exit 2 ;;
esac
