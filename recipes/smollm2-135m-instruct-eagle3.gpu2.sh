#!/usr/bin/env bash
# The next GPU run for the SmolLM2 draft: train to a time budget on every visible GPU (torchrun),
# warm-started from the shipped draft, then `eyas eval` on the held-out split at T=0: chain 5/1/6
# (with the no-speculation baseline) and tree 6/8/48, 64 prompts x 128 tokens, as the first script.
# Nothing is regenerated: the prepared data folder is carried in.
#
# Needs /tmp/smollm2.gguf and the wheels in /tmp/site (../shared/tools/stage-smollm2.sh), and
#   DATA_FROM  a copy of the prepared data folder (.gpudata, carried with the job)     or PREPARE
#   PREPARE    instead: prepare the data here, with these `eyas prepare` arguments (sources, answers),
#              on every GPU; greedy answers (--temperature 0) come from eyas's engine
#   BUDGET     seconds of training (train.time_budget_s)                               default 420
#   INIT       warm start: a draft folder or shipped name; `none` = random init        default the shipped draft
#   NG         GPUs                                                                    default all visible
#   M          the target                                                              default /tmp/smollm2.gguf
#   BENCH=1    a 40-step one-GPU throughput run first;  PROFILE=1  one profiled step (profile.txt) first
#   EXTRA      more `eyas train` arguments, e.g. "--set optim.lr=1e-3"
#   GREEDY=1   first add a greedy (T=0) answer by the target to every carried conversation
#              (`eyas prepare --regenerate --keep-answers --temperature 0`; DATA_FROM needs train.jsonl
#              and heldout.jsonl) and train on both answers; GREEDY_MAX new tokens at most (256)
#   TREES      eval trees as steps,topk,tokens                                         default "6,8,48"
#   EVAL=0     skip those evals (the pair benchmarks measure the draft on chat prompts instead)
#   PAIR=1     then benchmarks/pair.py: the new draft on the chat and the held-out prompt sets, the shipped
#              draft on the chat prompts (PAIR_ARGS: more pair.py arguments; PAIR_SETS: some of
#              "chat heldout chat-shipped", default all three)
#   BATCH=1    then benchmarks/batch_throughput.py with the new draft (BATCH_ARGS: more of its arguments)
#   DRY=1      a CPU dry run of the same command lines: 2 steps, 2 prompts x 8 tokens (DEVICE=cpu)
# Usage:
#   bash recipes/smollm2-135m-instruct-eagle3.gpu2.sh        # in the foreground (one 10-minute call: BUDGET <= 300)
#   bash recipes/smollm2-135m-instruct-eagle3.gpu2.sh start  # in the background (setsid), returns at once
#   bash recipes/smollm2-135m-instruct-eagle3.gpu2.sh wait [SECONDS]   # wait (default 560 s), show the log
# Takes about BUDGET + 4 minutes on 2 x H200 (target load ~30 s, evals ~3 min, side by side on two
# GPUs), so BUDGET 420 runs in the background with one `wait 560` and one more `wait`.
# Writes /tmp/job/{log, run/, eval-*.json, pair-*.json, batch.json, DONE}. Results go to $OUT (when
# set) at the end of a foreground run, or from every `wait` call (what exists so far): results.tgz
# (logs, evals, benchmarks, summary, recipe, data meta, draft config), draft-config.json and the
# draft's model.safetensors in 15 MB parts (rebuild: cat draft-model.safetensors.part-* > model.safetensors).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
J=${J:-/tmp/job}
SELF=$(readlink -f "$0")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
stamp() { echo "=== $(date +%T) $*"; }

collect() {  # at most 8 files of at most 16 MiB come back from $OUT
  [ -n "${OUT:-}" ] || return 0
  (cd $J && tar czf $OUT/results.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude=tensorboard \
     log recipe.yaml eval-*.json pair-*.json batch.json profile.txt bench/log.jsonl run/log.jsonl run/summary.json run/recipe.yaml \
     run/draft/config.json data/meta.json 2>/dev/null)
  if [ -f $J/run/draft/model.safetensors ]; then
    cp $J/run/draft/config.json $OUT/draft-config.json
    split -b 15m $J/run/draft/model.safetensors $OUT/draft-model.safetensors.part-
  fi
  ls -la $OUT
}

case "${1:-run}" in
  start)
    [ -n "${DATA_FROM:-}" ] && export DATA_FROM=$(readlink -f "$DATA_FROM")
    mkdir -p $J && rm -f $J/DONE
    EYAS_JOB_BACKGROUND=1 setsid nohup bash "$SELF" run > $J/log 2>&1 < /dev/null &
    echo "started in the background; follow with: bash $0 wait"; exit 0 ;;
  wait)
    while [ ! -f $J/DONE ] && [ $SECONDS -lt ${2:-560} ]; do sleep 5; done
    tail -c 8000 $J/log | tr '\r' '\n' | grep -v '^\s*$' | tail -60
    [ -f $J/DONE ] || echo "still running: call wait again (what exists so far is collected)"
    collect
    exit 0 ;;
  run) ;;
  *) echo "usage: $0 [run|start|wait [SECONDS]]"; exit 2 ;;
esac

mkdir -p $J && rm -f $J/DONE
[ -n "${EYAS_JOB_BACKGROUND:-}" ] || exec > >(tee $J/log) 2>&1
finish() { [ "$1" = 0 ] && stamp done || stamp "$2"; touch $J/DONE; [ -n "${EYAS_JOB_BACKGROUND:-}" ] || collect; exit "$1"; }

[ -n "${DATA_FROM:-}" ] && DATA_FROM=$(readlink -f "$DATA_FROM")
[ -n "${PREPARE:-}" ] || { [ -n "${DATA_FROM:-}" ] && [ -f "$DATA_FROM/meta.json" ]; } || {
  echo "DATA_FROM must name a prepared data folder (a copy of .gpudata), or PREPARE give eyas prepare's arguments"; finish 2 "no data"; }
rm -rf $J/src $J/data $J/data-mix $J/run $J/bench $J/eval-*.json $J/pair-*.json $J/batch.json $J/profile.txt
cp -r "$REPO/src" $J/src && cp "$REPO/recipes/smollm2-135m-instruct-eagle3.gpu2.yaml" $J/recipe.yaml
[ -n "${PREPARE:-}" ] || cp -r "$DATA_FROM" $J/data
cp "$REPO/tests/train/profile_step.py" $J/ 2>/dev/null
export PYTHONPATH=/tmp/site:$J/src
PY=${PY:-python3}
DEV=${DEVICE:-cuda}
M=${M:-/tmp/smollm2.gguf}
INIT=${INIT:-smollm2-135m-instruct-eagle3}
[ "$INIT" = none ] && INIT=null
TRAIN_DRY="" EVAL_DRY="" PROFILE_SIZE="--length 1024 --batch 16 --reps 3"
if [ "${DRY:-0}" != 0 ]; then
  PROFILE_SIZE="--length 64 --batch 2 --reps 1"
  TRAIN_DRY="--set train.max_steps=2 --set train.time_budget_s=null --set data.tokens_per_batch=2048 --set data.eval_rows=4 --set log.eval_every=2"
  EVAL_DRY="--num-prompts 2 --max-new-tokens 8 --batch-size 2"
fi
if [ "$DEV" = cuda ]; then
  NG=${NG:-$($PY -c 'import torch; print(torch.cuda.device_count())')}
  stamp "gpus: $NG"; nvidia-smi --query-gpu=name,memory.used --format=csv
else
  NG=${NG:-1}
fi
if [ -n "${PREPARE:-}" ]; then
  stamp "prepare: $PREPARE"
  prep() { $PY -m torch.distributed.run --standalone --nproc-per-node $NG -m eyas prepare --model $M --device $DEV \
    --out $J/data $PREPARE "$@"; }
  prep || { stamp "prepare failed; once more with answers from HF generate"; prep --regen-engine generic; } \
    || finish 1 "prepare failed"
  $PY -c "import json; m=json.load(open('$J/data/meta.json')); print('regeneration', json.dumps(m['regeneration']['stats']))"
fi
$PY -c "import json; m=json.load(open('$J/data/meta.json')); print('data', json.dumps(m['splits']))"

DATA=$J/data
if [ -n "${GREEDY:-}" ]; then
  stamp "greedy answers beside the carried ones (T=0, at most ${GREEDY_MAX:-256} new tokens)"
  LIMIT=""; [ "${DRY:-0}" != 0 ] && LIMIT="--max-new-tokens 8"
  $PY -m torch.distributed.run --standalone --nproc-per-node $NG -m eyas prepare --model $M --device $DEV \
    --out $J/data-mix --input $J/data/train.jsonl --input $J/data/heldout.jsonl --regenerate --keep-answers \
    --temperature 0 --max-new-tokens ${GREEDY_MAX:-256} --batch-size 1024 $LIMIT || finish 1 "prepare failed"
  DATA=$J/data-mix
fi
T="--recipe $J/recipe.yaml --model $M --data $DATA --set train.device=$DEV --set draft.init_from=$INIT"
if [ -n "${PROFILE:-}" ]; then
  stamp "profile one step ($PROFILE_SIZE, synthetic rows)"
  $PY $J/profile_step.py --target $M $PROFILE_SIZE --device $DEV --rows 30 > $J/profile.txt 2>&1
  head -c 6000 $J/profile.txt
fi
if [ -n "${BENCH:-}" ]; then
  stamp "bench: 40 steps on 1 GPU"
  $PY -m eyas train $T --output $J/bench --set train.max_steps=40 --set train.time_budget_s=null --set log.every=5 \
    --set log.eval_every=0 --set log.checkpoint_every=0 $TRAIN_DRY || finish 1 "bench failed"
fi

stamp "train on $NG rank(s), budget ${BUDGET:-420} s, init $INIT"
$PY -m torch.distributed.run --standalone --nproc-per-node $NG -m eyas train $T --output $J/run \
  --set train.time_budget_s=${BUDGET:-420} --set train.max_steps=null ${EXTRA:-} $TRAIN_DRY || finish 1 "train failed"

D=$J/run/draft
E="--model-path $M --speculative-draft-model-path $D --data $DATA --num-prompts 64 --max-new-tokens 128 --batch-size 16 --device $DEV --temperature 0 $EVAL_DRY"
CHAIN="--speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6 --baseline --json-out $J/eval-chain.json"
if [ "${EVAL:-1}" != 0 ]; then
  stamp "eval chain 5/1/6 and trees ${TREES:-6,8,48}"
  $PY -m eyas eval $E $CHAIN || finish 1 "eval chain failed"
  for t in ${TREES:-6,8,48}; do
    IFS=, read -r S K N <<< "$t"
    $PY -m eyas eval $E --speculative-num-steps $S --speculative-eagle-topk $K --speculative-num-draft-tokens $N \
      --json-out $J/eval-tree-$S-$K-$N.json || finish 1 "eval tree $t failed"
  done
fi
$PY - "$J" <<'PYEOF'
import json, sys, pathlib
j = pathlib.Path(sys.argv[1])
s = json.loads((j / "run/summary.json").read_text())
print("train:", s["steps"], "steps,", s["tokens_per_s"], "tokens/s on", s["ranks"], "rank(s); held-out acc", (s.get("heldout") or {}).get("acc"))
for f in sorted(j.glob("eval-*.json")):
    r = json.loads(f.read_text())
    print(f.name, "tau", r["accept_length"], "per position", r["accepted_per_position"], "speedup", r.get("speedup"))
PYEOF
if [ "${PAIR:-0}" != 0 ]; then  # the new draft on chat and held-out prompts, then the shipped one on chat, side by side
  for run in "chat chat $D" "heldout $REPO/benchmarks/heldout-prompts-smollm2.jsonl $D" "chat-shipped chat shipped"; do
    read -r name set draft <<< "$run"
    [[ " ${PAIR_SETS:-chat heldout chat-shipped} " == *" $name "* ]] || continue
    stamp "pair benchmark: $name"
    $PY "$REPO/benchmarks/pair.py" --model-path $M $([ "$draft" = shipped ] || echo --draft $draft) --prompts "$set" \
      --num-prompts 20 --hf-prompts 0 --out $J/pair-$name.json ${PAIR_ARGS:-} || finish 1 "pair $name failed"
  done
fi
if [ "${BATCH:-0}" != 0 ]; then
  stamp "throughput by batch size with the new draft"
  $PY "$REPO/benchmarks/batch_throughput.py" --model-path $M --draft $D --out $J/batch.json ${BATCH_ARGS:-} \
    || finish 1 "batch throughput failed"
fi
finish 0
