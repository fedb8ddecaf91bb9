#!/usr/bin/env bash
# The GPU run that made the shipped SmolLM2 draft, start to end, with eyas's own commands.
# Expects /tmp/smollm2.gguf and the wheels installed to /tmp/site (see ../shared/tools/stage-smollm2.sh).
# Writes /tmp/job/{data,bench1,bench2,run,eval-*.json,log} and /tmp/job/DONE at the end.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
J=/tmp/job
mkdir -p $J && rm -rf $J/src && cp -r src $J/src && cp recipes/smollm2-135m-instruct-eagle3.yaml $J/recipe.yaml
export PYTHONPATH=/tmp/site:$J/src
M=/tmp/smollm2.gguf
NG=$(python3 -c 'import torch; print(torch.cuda.device_count())')
stamp() { echo "=== $(date +%T) $*"; }
stamp "gpus: $NG"; nvidia-smi --query-gpu=name,memory.used --format=csv

stamp prepare
[ -n "${DATA_FROM:-}" ] && [ ! -f $J/data/meta.json ] && cp -r "$DATA_FROM" $J/data  # data carried from an earlier run
[ -f $J/data/meta.json ] || torchrun --standalone --nproc-per-node $NG -m eyas prepare --model $M --out $J/data \
  --source chatterbot --source pydoc --source self --self-per-topic 40 --regenerate --temperature 0.8 \
  --max-new-tokens 384 --batch-size 2048 --held-out 0.02 --device cuda || { stamp "prepare failed"; touch $J/DONE; exit 1; }
python3 -c "import json; m=json.load(open('$J/data/meta.json')); print(json.dumps(m['regeneration']['stats']), json.dumps(m['splits']))"

B="--recipe $J/recipe.yaml --model $M --data $J/data --set train.max_steps=40 --set train.time_budget_s=null \
   --set log.every=5 --set log.eval_every=0 --set log.checkpoint_every=0 --set log.progress=false"
if [ -z "${SKIP_BENCH:-}" ]; then stamp "bench 1 gpu"; python3 -m eyas train $B --output $J/bench1; fi
if [ -z "${SKIP_BENCH:-}" ] && [ "$NG" -ge 2 ]; then stamp "bench $NG gpus"; torchrun --standalone --nproc-per-node $NG -m eyas train $B --output $J/bench$NG; fi

stamp "train ${BUDGET:+(time budget $BUDGET s)}"
torchrun --standalone --nproc-per-node $NG -m eyas train --recipe $J/recipe.yaml --model $M --data $J/data \
  --output $J/run ${BUDGET:+--set train.time_budget_s=$BUDGET --set train.max_steps=null} --set log.progress=false || { stamp "train failed"; touch $J/DONE; exit 1; }

[ -n "${SKIP_EVAL:-}" ] && { stamp done; touch $J/DONE; exit 0; }
D=$J/run/draft
E="--model-path $M --speculative-draft-model-path $D --data $J/data --num-prompts 64 --max-new-tokens 128 --device cuda"
stamp "eval chain"; python3 -m eyas eval $E --batch-size 16 --baseline --speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6 --json-out $J/eval-chain.json
stamp "eval tree 6/8/48"; python3 -m eyas eval $E --batch-size 16 --speculative-num-steps 6 --speculative-eagle-topk 8 --speculative-num-draft-tokens 48 --json-out $J/eval-tree-6-8-48.json
[ -z "${SKIP_BENCH:-}" ] && stamp "eval tree 5/4/16" && python3 -m eyas eval $E --batch-size 16 --speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16 --json-out $J/eval-tree-5-4-16.json
stamp done
touch $J/DONE
