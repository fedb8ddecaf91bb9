#!/usr/bin/env bash
# Wait (up to ${1:-560} s) for the background GPU job, show its log, and hand its results to $OUT when done.
J=/tmp/job
while [ ! -f $J/DONE ] && [ $SECONDS -lt ${1:-560} ]; do sleep 5; done
tail -c 7000 $J/log | tr '\r' '\n' | grep -v '^\s*$' | tail -60
if [ -f $J/DONE ] && [ -n "${OUT:-}" ]; then
  cd $J && tar czf $OUT/results.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude='*.npy' --exclude='tensorboard' \
      data/meta.json data/heldout.jsonl bench1 bench2 run/log.jsonl run/summary.json run/recipe.yaml eval-*.json log 2>/dev/null
  gzip -c data/train.jsonl > $OUT/train.jsonl.gz
  [ -d run/draft ] && (cd run/draft && cp config.json $OUT/draft-config.json && split -b 15m model.safetensors $OUT/draft-st-)
  ls -la $OUT
fi
