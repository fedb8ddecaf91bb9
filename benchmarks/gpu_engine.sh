#!/usr/bin/env bash
# The GPU engine benchmarks (a)-(d) in one go, each bounded in time, results under $OUT (or /tmp/gpu-engine).
#   MODEL=/tmp/smollm2.gguf [DRAFT=folder] [ONLY="c d"] bash benchmarks/gpu_engine.sh
# Needs PYTHONPATH with src (and the staged wheels); see ../shared/tools/stage-smollm2.sh.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-engine}; MODEL=${MODEL:-/tmp/smollm2.gguf}; ONLY=${ONLY:-"c d a b"}
mkdir -p "$OUT"; cd "$(dirname "$0")"
D=${DRAFT:+--draft $DRAFT}
stamp() { echo "=== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
for b in $ONLY; do
  case $b in
    c) stamp "(c) pair"; timeout 240 python3 pair.py --model-path "$MODEL" $D --out "$OUT/pair-smollm2.json" ;;
    d) stamp "(d) batch"; timeout 200 python3 batch_throughput.py --model-path "$MODEL" $D --out "$OUT/batch-smollm2.json" ;;
    a) stamp "(a) decode 8B"; timeout 200 python3 decode_8b.py --out "$OUT/decode-8b.json" ;;
    b) stamp "(b) verify cost"; timeout 150 python3 verify_cost.py --out "$OUT/verify-cost-8b.json" &&
       timeout 60 python3 verify_cost.py --model-path "$MODEL" --out "$OUT/verify-cost-smollm2.json" ;;
  esac 2>&1 | grep -v "Loading weights" | tee "$OUT/log-$b.txt"
done
stamp done
