#!/usr/bin/env bash
# The chat-leaning prompt mix for the next SmolLM2 draft (issue 31), from the chat-prompts corpus
# (70,905 prompts from 17 sources, 37% math; ../shared/data/chat-prompts/SOURCES.md): `eyas prepare`'s
# flags kept in one place, for the CPU (--select-only: check the mix, rebuild the chat holdout) and for
# the GPU run (recipes/smollm2-135m-instruct-eagle3.gpu2.sh, which takes them as PREPARE).
#
# The mix: real users' prompts (ShareGPT, hh-rlhf, OpenAssistant, arena-hard, koala, alpaca-eval,
# prompts.chat), GPTeacher roleplay and code and self-instruct whole; StrategyQA and the T0 tasks at half;
# open QA (NQ, WebQuestions) at 0.2; the three math sets at 0.1: about 34,200 prompts, 7.5% math. 400
# single-turn prompts set aside first as the chat holdout (holdout-prompts.jsonl, ~19 per source and
# category over 21 of them: chat, roleplay, coding, writing, reasoning, math, STEM, NLP tasks, red-team
# requests), chosen by --holdout-seed alone, so every mix and every regeneration seed is measured on the
# same prompts. Every prompt set eyas reports acceptance on is excluded.
#
#   CORPUS   the chat-prompts folder: default ../shared/data/chat-prompts, else .stage/chat-prompts (carried)
#   ANSWER_T the target's answers' temperature (default 0: greedy; sampled answers with --seed SEED)
#   SEED     the mix's and the answers' seed (default 4; the chat holdout does not depend on it)
#   MAX_PROMPTS  at most this many training prompts (default all: about 33,500), for a shorter run
# Usage:
#   bash recipes/smollm2-135m-instruct-chat-mix.sh select OUT     # any machine, ~15 s: the prompts, holdout file, summary
#   bash recipes/smollm2-135m-instruct-chat-mix.sh flags          # print the flags
#   bash recipes/smollm2-135m-instruct-chat-mix.sh gpu [start|wait [S]]  # gpu2.sh with PREPARE = the flags + greedy answers
#   bash recipes/smollm2-135m-instruct-chat-mix.sh judge [DRAFT]  # on the GPU after `gpu`: DRAFT (default the run's)
#        and the shipped draft on the chat holdout (tau at 6/8/32 and 4/4/16 greedy, 6/8/32 at T 0.7) and on the
#        built-in chat set, per category, one after the other (`eyas eval`, batch 64, 256 tokens, eager: about
#        50 s each; QUICK=1: the holdout at 6/8/32 alone, T 0 and 0.7; TOP_P=0.95: the T 0.7 runs with that
#        top-p); the JSONs go to /tmp/job/judge and,
#        as judge.tgz, to $OUT
# The shipped draft v9 came from three stages, each: SEED=S MAX_PROMPTS=12000 ANSWER_T=0.7 INIT=<the stage
# before> NG=1 BUDGET=B EVAL=0 EXTRA="--set optim.lr=3e-4 --set data.tokens_per_batch=32768" CORPUS=... bash
# recipes/smollm2-135m-instruct-chat-mix.sh gpu start, with S, B = 4, 420 (init v8); 5, 300; 6, 300; then
# QUICK=1 TOP_P=0.95 ... judge (docs/train.md, "The shipped draft"). v8 was one stage from v6: greedy answers
# (ANSWER_T=0), every prompt, SEED 4, BUDGET=780.
# On the GPU machine the corpus is not at ../shared: copy it under .stage/ (ignored by git, 4.4 MB) and carry
# it with the call (carry [".stage/chat-prompts"]). gpu2.sh's other variables (BUDGET, INIT, EXTRA, NG, EVAL,
# PAIR, ...) pass through.
set -euo pipefail
REPO=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$REPO"
CORPUS=${CORPUS:-$([ -d ../shared/data/chat-prompts ] && echo ../shared/data/chat-prompts || echo .stage/chat-prompts)}
HOLDOUT_SOURCES=sharegpt-v3-pypi,sharegpt92k-sample,oasst-eval-prompts,koala-test-set,arena-hard,hh-rlhf-test,prompts-chat,gpteacher,self-instruct-human,strategyqa,gsm8k-train,qwen-math-evals,t0-templates
WEIGHTS=strategyqa=0.5,t0-templates=0.5,nq-open=0.2,webquestions=0.2,gsm8k-train=0.1,math-test=0.1,qwen-math-evals=0.1
FLAGS="--input $CORPUS --exclude bench --exclude benchmarks/heldout-prompts-smollm2.jsonl
  --holdout-prompts 400 --holdout-sources $HOLDOUT_SOURCES --holdout-seed 0 --source-weights $WEIGHTS --seed ${SEED:-4}
  ${MAX_PROMPTS:+--max-prompts $MAX_PROMPTS}"
ANSWERS="--regenerate --temperature ${ANSWER_T:-0} --max-new-tokens 384 --batch-size 2048"

case "${1:-flags}" in
  flags) echo $FLAGS ;;
  select) PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
          $PY -m eyas prepare --select-only --out "${2:?usage: $0 select OUT}" $FLAGS ;;
  gpu) shift; PREPARE="$FLAGS $ANSWERS" exec bash recipes/smollm2-135m-instruct-eagle3.gpu2.sh "${@:-run}" ;;
  judge) D=${2:-/tmp/job/run/draft}; H=${HOLDOUT:-/tmp/job/data/holdout-prompts.jsonl}; J=/tmp/job/judge
         mkdir -p $J; export PYTHONPATH=${PYTHONPATH:-/tmp/site:$REPO/src}
         for d in "new $D" "shipped smollm2-135m-instruct-eagle3"; do
           read -r dn dp <<< "$d"
           for r in "hold $H 0 6,8,32" "hold $H 0 4,4,16" "hold $H 0.7 6,8,32" "chat chat 0 6,8,32"; do
             [ -n "${QUICK:-}" ] && [[ "$r" == *4,4,16 || "$r" == chat* ]] && continue
             read -r set prompts t tree <<< "$r"; IFS=, read -r S K N <<< "$tree"
             echo "=== $dn $set $tree T=$t"
             ${PY:-python3} -m eyas eval --model-path ${M:-/tmp/smollm2.gguf} --speculative-draft-model-path "$dp" \
               --prompts "$prompts" --num-prompts 400 --max-new-tokens 256 --batch-size 64 --temperature $t \
               $( [ "$t" != 0 ] && [ -n "${TOP_P:-}" ] && echo --top-p $TOP_P ) \
               --speculative-num-steps $S --speculative-eagle-topk $K --speculative-num-draft-tokens $N \
               --disable-cuda-graph --json-out $J/$dn-$set-$S-$K-$N-t$t.json 2>&1 | grep -v "it/s]"
           done
         done
         [ -z "${OUT:-}" ] || tar czf $OUT/judge.tgz -C /tmp/job judge ;;
  *) echo "usage: $0 flags | select OUT | gpu [run|start|wait [SECONDS]] | judge [DRAFT]"; exit 2 ;;
esac
