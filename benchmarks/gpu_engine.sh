#!/usr/bin/env bash
# The GPU engine benchmarks (a)-(d) in one go, each bounded in time, results under $OUT (or /tmp/gpu-engine).
#   MODEL=/tmp/smollm2.gguf [DRAFT=folder] [ONLY="c d"] bash benchmarks/gpu_engine.sh
# Besides: e = engine_check (the engine against HF, steps launched ahead, seeded sampling; run it first),
# k = kernel_profile greedy / T 1.0 / T 0.7 top-p 0.95 (none, 4/4/16, 6/8/32), s = the served load (1 and 16
# clients, T 0 and 0.7, NONE against auto) with the overlap schedule off, then on (OVERLAPS="overlap": on
# alone; CLIENTS=1,4,16,64: more levels; INPROC=1: the engine in-process beside each level), f = what feeding the
# draft costs the plain steps of `auto` (a server that never speculates but feeds the draft, against NONE, served at
# 1, 16 and 64 clients or F_CLIENTS, T 0 and 0.7; once per draft feed interval, F_INTERVALS, "8 1"), p = the sampling distribution's kernel at T 0.7 top-p 0.95 (1, 5, 33,
# 129 rows) at its default launch and at more candidates a search pass (fewer passes), m = rows that end leaving the
# batch at once (--membership-wait-steps 0) against waiting for others (8), auto and NONE servers, 16 and 64 clients
# (M_CLIENTS), T 0.7 (M_TEMPS), alternated twice, r = four servers side by side (NONE, auto, auto with
# --membership-wait-steps 0, static 3/1/4), loaded one at a time in rotating order, R_ROUNDS (4) rounds of 64
# clients T 0.7, 16 clients T 0.7 and 64 clients T 0 (top-p 0.95, R_LEVELS): the lines serve_load prints, one JSON a
# run, v = this tree's NONE and static 3/1/4 servers against the same from OLD_SRC (another checkout's src, its
# drafts in place), rotating as r (V_LEVELS: 64, 16 and 4 clients at T 0.7).
# Needs PYTHONPATH with src (and the staged wheels): scripts/gpu-stage.sh stages them in three calls.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-engine}; MODEL=${MODEL:-/tmp/smollm2.gguf}; ONLY=${ONLY:-"c d a b"}
mkdir -p "$OUT"; cd "$(dirname "$0")"
D=${DRAFT:+--draft $DRAFT}
SHIPPED=smollm2-135m-instruct-eagle3  # the servers need a draft named: the shipped one unless DRAFT
stamp() { echo "=== $(date +%T) $*"; }
SPEC="--speculative-algorithm EAGLE3 --speculative-draft-model-path ${DRAFT:-$SHIPPED}"
S314="--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
rotate() {  # rotate "C,T ...": the servers of names/envs/flags up at once, each level loaded on one at a time in
  # rotating order (R_ROUNDS rounds), 4 requests a client, top-p 0.95, 256 tokens; one JSON a run
  local n=${#names[@]} pids=() k i r lv c t j up
  for ((k = 0; k < n; k++)); do env ${envs[$k]} python3 -m eyas.serve --model-path "$MODEL" --max-running-requests 64 \
    --log-interval 0 ${flags[$k]} --port $((8200 + k)) > "$OUT/server-${names[$k]}.log" 2>&1 & pids+=($!); done
  for i in $(seq 1 300); do up=0; for ((k = 0; k < n; k++)); do
    curl -sf localhost:$((8200 + k))/health >/dev/null && up=$((up + 1)); done; [ $up = $n ] && break; sleep 1; done
  stamp "$up of $n up after $i s"
  for r in $(seq 1 ${R_ROUNDS:-4}); do for lv in $1; do IFS=, read -r c t <<< "$lv"
    for ((k = 0; k < n; k++)); do j=$(( (k + r) % n ))
      timeout 90 python3 serve_load.py --url http://127.0.0.1:$((8200 + j)) --clients $c --temperatures $t --top-p 0.95 \
        --requests-per-client 4 --min-requests 64 --max-tokens 256 --out "$OUT/rot-${names[$j]}-c$c-t$t-r$r.json" \
        | grep "c=" | sed "s/^/r$r ${names[$j]} /"; done; done; done
  kill "${pids[@]}"
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
for b in $ONLY; do
  case $b in
    c) stamp "(c) pair"; timeout 240 python3 pair.py --model-path "$MODEL" $D --out "$OUT/pair-smollm2.json" ;;
    d) stamp "(d) batch"; timeout 200 python3 batch_throughput.py --model-path "$MODEL" $D --out "$OUT/batch-smollm2.json" ;;
    a) stamp "(a) decode 8B"; timeout 200 python3 decode_8b.py --out "$OUT/decode-8b.json" ;;
    e) stamp "(e) engine check"; timeout 240 python3 engine_check.py --out "$OUT/engine-check.json" ;;
    k) stamp "(k) kernel profile, greedy and sampled"
       for t in "0 1.0" "1.0 1.0" "0.7 0.95"; do set -- $t
         timeout 150 python3 kernel_profile.py --model-path "$MODEL" $D --specs none 4,4,16 6,8,32 --temperature $1 \
           --top-p $2 --out "$OUT/kernel-profile-t$1-p$2.json"; done ;;
    s) stamp "(s) served load, overlap off and on"
       for o in ${OVERLAPS:-no-overlap overlap}; do
         timeout ${S_TIMEOUT:-400} python3 serve_load.py --model-path "$MODEL" --speculative-draft-model-path "${DRAFT:-$SHIPPED}" \
           --speculative-algorithm EAGLE3 --speculative-batch-schedule auto --clients ${CLIENTS:-1,16} --temperatures 0,0.7 \
           --top-p 0.95 --min-requests 32 --max-tokens 256 --$o-schedule ${INPROC:+--in-process} --logs "$OUT/logs-$o" \
           --out "$OUT/serve-load-$o.json"; done ;;
    f) stamp "(f) plain steps that feed the draft against NONE, served"
       for i in ${F_INTERVALS:-8 1}; do
         timeout ${F_TIMEOUT:-300} python3 serve_load.py --model-path "$MODEL" --speculative-draft-model-path \
           "${DRAFT:-$SHIPPED}" --speculative-algorithm EAGLE3 --speculative-batch-schedule "4096:0;4097:3,1,4" \
           --draft-feed-interval $i --clients ${F_CLIENTS:-1,16,64} --temperatures 0,0.7 --top-p 0.95 \
           --min-requests 32 --requests-per-client ${F_RPC:-4} --max-tokens 256 --logs "$OUT/logs-fed-i$i" \
           --out "$OUT/fed-none-i$i.json"; done ;;
    m) stamp "(m) batch changes at once (--membership-wait-steps 0) against waiting (8), auto and NONE, alternated"
       for rep in 1 2; do for w in 0 8; do
         timeout ${M_TIMEOUT:-280} python3 serve_load.py --model-path "$MODEL" --speculative-draft-model-path \
           "${DRAFT:-$SHIPPED}" --speculative-algorithm EAGLE3 --speculative-batch-schedule auto \
           --serve-flags "--membership-wait-steps $w" --clients ${M_CLIENTS:-16,64} --temperatures ${M_TEMPS:-0.7} \
           --top-p 0.95 --requests-per-client 4 --min-requests 64 --max-tokens 256 --logs "$OUT/logs-m$w-$rep" \
           --out "$OUT/membership-w$w-rep$rep.json"; done; done ;;
    r) stamp "(r) four servers, rotating"
       names=(none auto8 auto0 s314); envs=("" "" "" "")
       flags=("" "$SPEC --speculative-batch-schedule auto" "$SPEC --speculative-batch-schedule auto --membership-wait-steps 0"
              "$SPEC $S314")
       rotate "${R_LEVELS:-64,0.7 16,0.7 64,0}" ;;
    v) stamp "(v) this tree against OLD_SRC's, NONE and static 3/1/4 servers, rotating"
       old="PYTHONPATH=/tmp/site:$OLD_SRC TRITON_CACHE_DIR=/tmp/triton-old"
       names=(none-new none-old s314-new s314-old); envs=("" "$old" "" "$old")
       flags=("" "" "$SPEC $S314" "$SPEC $S314")
       rotate "${V_LEVELS:-64,0.7 16,0.7 4,0.7}" ;;
    p) stamp "(p) distribution kernel configs"  # each config compiles its launches' variants first: minutes
       timeout ${P_TIMEOUT:-400} python3 kernel_profile.py --distribution ${P_ROWS:-1,33},49152 --temperature 0.7 \
         --top-p 0.95 --distribution-configs ${P_CONFIGS:-64x64x256x4 64x256x256x4} --out "$OUT/distribution-configs.json" ;;
    b) stamp "(b) verify cost"; timeout 150 python3 verify_cost.py --out "$OUT/verify-cost-8b.json" &&
       timeout 60 python3 verify_cost.py --model-path "$MODEL" --out "$OUT/verify-cost-smollm2.json" ;;
  esac 2>&1 | grep -v "Loading weights" | tee "$OUT/log-$b.txt"
done
stamp done
