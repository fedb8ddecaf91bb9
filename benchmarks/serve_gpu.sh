#!/usr/bin/env bash
# Serve the target twice (EAGLE3 and a baseline without speculation), benchmark both over HTTP with
# `eyas bench`, check the speculative server with `eyas doctor`, and print a short summary.
#
#   bash benchmarks/serve_gpu.sh                        # GPU: SmolLM2 GGUF + shipped draft, tree 6/8/48
#   SPEC=chain OUT=/tmp/serve-bench-chain bash benchmarks/serve_gpu.sh      # chain 5/1/6
#
# GPUs: with two or more visible, EAGLE3 runs on the first and the baseline on the second (one
# CUDA_VISIBLE_DEVICES each); with one, both servers run side by side on it. The bench measures
# one side at a time and an idle eyas server does no work, so sharing a GPU costs memory, not speed.
#
# Environment (defaults in brackets):
#   PYTHON [python3]   MODEL [/tmp/smollm2.gguf]   DRAFT [smollm2-135m-instruct-eagle3]
#   SPEC [tree]: tree = --speculative-num-steps 6 --speculative-eagle-topk 8 --speculative-num-draft-tokens 48,
#                chain = 5/1/6; STEPS, TOPK, NDRAFT override either
#   DEVICE [cuda] (or cpu)   DTYPE [bfloat16]   PROMPTS ["chat code"]: built-in sets, one bench each
#   NUM_PROMPTS [30] per set (0 = the whole set; each built-in set has 30)   MAX_TOKENS [128]
#   CONCURRENCY [1,8,32]   PROBES [5] (doctor)   CONTEXT_LENGTH [2048] (the shipped draft's training length)
#   SKIP_SETS_AFTER [180]: a prompt set that would start later than this many seconds into the run is
#                   skipped (0 = never), which keeps the run near 6 minutes when speculation is slow
#   SPEC_PORT [30000]   BASE_PORT [30001]   STARTUP_TIMEOUT [600] s   COMMIT [git rev-parse HEAD]
#   OUT [/tmp/serve-bench]: bench-<set>/ (bench.json, PNGs, table), doctor.json, *.log, metrics, meta.txt
#
# CPU smoke test (a few minutes on 2 cores):
#   PYTHON=.venv/bin/python DEVICE=cpu DTYPE=float32 MODEL=smollm2-135m-instruct SPEC=chain PROMPTS=chat \
#   NUM_PROMPTS=4 MAX_TOKENS=16 CONCURRENCY=1,2 PROBES=2 bash benchmarks/serve_gpu.sh
#
# Exit status: 0 when both servers started and every bench request succeeded (a doctor verdict of
# "SLOWER THAN BASELINE" is a measurement, not a failure); otherwise non-zero, with the server
# log tails printed. Both servers are stopped on every exit.
set -euo pipefail

PY=${PYTHON:-python3}
MODEL=${MODEL:-/tmp/smollm2.gguf}
DRAFT=${DRAFT:-smollm2-135m-instruct-eagle3}
SPEC=${SPEC:-tree}
case $SPEC in
  tree) STEPS=${STEPS:-6} TOPK=${TOPK:-8} NDRAFT=${NDRAFT:-48} ;;
  chain) STEPS=${STEPS:-5} TOPK=${TOPK:-1} NDRAFT=${NDRAFT:-6} ;;
  *) echo "SPEC must be tree or chain, got '$SPEC'" >&2; exit 2 ;;
esac
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
PROMPTS=${PROMPTS:-chat code}
NUM_PROMPTS=${NUM_PROMPTS:-30}
MAX_TOKENS=${MAX_TOKENS:-128}
CONTEXT_LENGTH=${CONTEXT_LENGTH:-2048}
SKIP_SETS_AFTER=${SKIP_SETS_AFTER:-180}
CONCURRENCY=${CONCURRENCY:-1,8,32}
PROBES=${PROBES:-5}
SPEC_PORT=${SPEC_PORT:-30000}
BASE_PORT=${BASE_PORT:-30001}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-600}
OUT=${OUT:-/tmp/serve-bench}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
SPEC_URL=http://127.0.0.1:$SPEC_PORT
BASE_URL=http://127.0.0.1:$BASE_PORT

mkdir -p "$OUT"
rm -rf "$OUT"/bench-* "$OUT"/metrics-*.txt  # this script's own outputs of an earlier run, never stale figures
rm -f "$OUT"/{meta.txt,summary.txt,doctor.json,doctor.log,eagle3.log,baseline.log}
say() { echo "[$(date +%H:%M:%S)] $*"; }
PIDS=() CHILD=""
run() { "$@" & CHILD=$!; wait "$CHILD"; }  # in the background, so that a signal reaches the trap at once
cleanup() {
  local rc=$?
  [[ -n $CHILD ]] && kill -TERM "$CHILD" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [[ $rc -ne 0 ]]; then
    for log in "$OUT/eagle3.log" "$OUT/baseline.log"; do
      [[ -f $log ]] && { echo "----- last lines of $log -----" >&2; tail -n 30 "$log" >&2; }
    done
    echo "FAILED (exit $rc); everything so far is in $OUT" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Which GPU each server gets (none on the CPU).
SPEC_GPU="" BASE_GPU="" PLACEMENT="cpu"
if [[ $DEVICE == cuda* ]]; then
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then IFS=, read -ra GPUS <<<"$CUDA_VISIBLE_DEVICES"
  else mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader); fi
  [[ ${#GPUS[@]} -ge 1 ]] || { echo "DEVICE=$DEVICE but no GPU is visible" >&2; exit 1; }
  SPEC_GPU=${GPUS[0]} BASE_GPU=${GPUS[1]:-${GPUS[0]}} DEVICE=cuda
  PLACEMENT="EAGLE3 on GPU $SPEC_GPU, baseline on GPU $BASE_GPU"
fi

{
  echo "start: $(date -Is)"
  echo "commit: $COMMIT"
  echo "host: $(hostname)"
  echo "model: $MODEL  draft: $DRAFT  spec: $SPEC $STEPS/$TOPK/$NDRAFT  device: $DEVICE $DTYPE ($PLACEMENT)"
  echo "bench: prompts '$PROMPTS' x $NUM_PROMPTS, max_tokens $MAX_TOKENS, concurrency $CONCURRENCY, temperature 0"
  "$PY" -c 'import sys, torch, transformers; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")' || true
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader | sed 's/^/nvidia-smi: /'
  fi
} | tee "$OUT/meta.txt"

serve() {  # name gpu port flags...: start one server in the background, log to $OUT/name.log
  local name=$1 gpu=$2 port=$3; shift 3
  (
    [[ -n $gpu ]] && export CUDA_VISIBLE_DEVICES=$gpu
    exec "$PY" -m eyas serve --model-path "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
      --context-length "$CONTEXT_LENGTH" --host 127.0.0.1 --port "$port" --shutdown-timeout 5 "$@"
  ) >"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}

wait_health() {  # name url pid
  local deadline=$((SECONDS + STARTUP_TIMEOUT))
  until "$PY" -c "import urllib.request as u; u.urlopen('$2/health', timeout=2)" 2>/dev/null; do
    kill -0 "$3" 2>/dev/null || { echo "the $1 server exited before answering /health" >&2; exit 1; }
    ((SECONDS < deadline)) || { echo "the $1 server did not answer /health within $STARTUP_TIMEOUT s" >&2; exit 1; }
    sleep 2
  done
  say "$1 ready at $2"
}

"$PY" -c 'import eyas, fastapi, uvicorn, httpx, prometheus_client, tqdm' ||
  { echo "$PY cannot import eyas and the serve/bench dependencies (PYTHONPATH?)" >&2; exit 1; }
say "starting servers ($PLACEMENT)"
serve eagle3 "$SPEC_GPU" "$SPEC_PORT" --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT" \
  --speculative-num-steps "$STEPS" --speculative-eagle-topk "$TOPK" --speculative-num-draft-tokens "$NDRAFT"
serve baseline "$BASE_GPU" "$BASE_PORT" --speculative-algorithm NONE
wait_health eagle3 "$SPEC_URL" "${PIDS[0]}"
wait_health baseline "$BASE_URL" "${PIDS[1]}"

BENCH_RC=0
for set in $PROMPTS; do
  if ((SKIP_SETS_AFTER > 0 && SECONDS > SKIP_SETS_AFTER)); then
    say "skipping the $set prompts: ${SECONDS} s into the run (SKIP_SETS_AFTER=$SKIP_SETS_AFTER)"; continue
  fi
  say "eyas bench: $set prompts"
  mkdir -p "$OUT/bench-$set"
  run "$PY" -m eyas bench --url "$SPEC_URL" --baseline-url "$BASE_URL" --prompts "$set" --num-prompts "$NUM_PROMPTS" \
    --max-tokens "$MAX_TOKENS" --temperature 0 --concurrency "$CONCURRENCY" --out "$OUT/bench-$set" \
    >"$OUT/bench-$set/table.txt" 2>"$OUT/bench-$set.log" || { BENCH_RC=$?; tail -c 1500 "$OUT/bench-$set.log" >&2; }
  cat "$OUT/bench-$set/table.txt"
done

say "eyas doctor"
DOCTOR_RC=0
run "$PY" -m eyas doctor --url "$SPEC_URL" --baseline-url "$BASE_URL" --probes "$PROBES" --max-tokens "$MAX_TOKENS" \
  --json >"$OUT/doctor.json" 2>"$OUT/doctor.log" || DOCTOR_RC=$?
for side in eagle3:$SPEC_URL baseline:$BASE_URL; do
  "$PY" -c "import urllib.request as u; print(u.urlopen('${side#*:}/metrics', timeout=10).read().decode())" \
    >"$OUT/metrics-${side%%:*}.txt" || true
done
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader | sed 's/^/nvidia-smi after: /' >>"$OUT/meta.txt"
fi
echo "end: $(date -Is) (${SECONDS} s)" >>"$OUT/meta.txt"

"$PY" - "$OUT" "$PROMPTS" "$DOCTOR_RC" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, sets, doctor_rc = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3]
print((out / "meta.txt").read_text().strip())
print(f"{'set':6} {'conc':>4} {'base tok/s':>10} {'spec tok/s':>10} {'speedup':>7} {'tau':>5} {'rate':>5} {'spec TTFT ms':>12} {'errors':>6}")
for s in sets:
    f = out / f"bench-{s}" / "bench.json"
    if not f.exists():
        print(f"{s:6} not measured (skipped, or failed: see the log above and {out}/bench-{s}.log)")
        continue
    for lv in json.loads(f.read_text())["levels"]:
        b, p = lv["baseline"] or {}, lv["speculative"] or {}
        acc, ttft = p.get("acceptance") or {}, p.get("ttft_mean_s")
        fmt = lambda v, spec: format(v, spec) if v is not None else "-"
        print(f"{s:6} {lv['concurrency']:>4} {fmt(b.get('tokens_per_s'), '10.1f')} {fmt(p.get('tokens_per_s'), '10.1f')} "
              f"{fmt(lv['speedup'], '6.2f')}x {fmt(acc.get('tau'), '5.2f')} {fmt(acc.get('accept_rate'), '5.2f')} "
              f"{fmt(ttft and ttft * 1000, '12.0f')} {len(b.get('errors', [])) + len(p.get('errors', [])):>6}")
try:
    d = json.loads((out / "doctor.json").read_text())
    fig = d["figures"]
    print(f"doctor: {d['verdict']} (exit {doctor_rc}; probes: {fig.get('tokens_per_s')} vs baseline "
          f"{fig.get('baseline_tokens_per_s')} tok/s, per position {fig.get('per_position')})")
except (OSError, ValueError, KeyError) as e:
    print(f"doctor: no report ({type(e).__name__}: {e}); see {out}/doctor.log")
print(f"results: {out}")
EOF
[[ $BENCH_RC -eq 0 ]] || { echo "eyas bench failed (exit $BENCH_RC): see $OUT/bench-*.log" >&2; exit 1; }
((DOCTOR_RC <= 1)) || { echo "eyas doctor failed (exit $DOCTOR_RC): see $OUT/doctor.log" >&2; exit 1; }
