#!/bin/bash
# usage: MODEL=TINY_FOLDER profile.sh SRC_DIR CLIENTS OUT_PREFIX   (py-spy from PyPI; SRC_DIR: an eyas src/ tree)
set -e
SRC=$1; C=$2; OUT=$3
PORT=$(python3 -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
cd /work/main
OMP_NUM_THREADS=1 PYTHONPATH=$SRC .venv/bin/python -m eyas.serve --model-path $MODEL --speculative-algorithm NONE \
  --port $PORT --max-running-requests 64 --log-interval 0 > $OUT.server.log 2>&1 &
SPID=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
OMP_NUM_THREADS=1 .venv/bin/python benchmarks/serve_load.py --url http://127.0.0.1:$PORT --clients $C --temperatures 0 --requests-per-client 2 --max-tokens 128 > /dev/null 2>&1  # warm
${PYSPY:-py-spy} record --nonblocking -p $SPID --threads --format raw -r 200 -o $OUT.raw -- > /dev/null 2>&1 &
PPID2=$!
sleep 1
OMP_NUM_THREADS=1 .venv/bin/python benchmarks/serve_load.py --url http://127.0.0.1:$PORT --clients $C --temperatures 0 --requests-per-client 4 --max-tokens 128 --out $OUT.json 2>&1 | grep tok/s
kill -INT $PPID2; wait $PPID2 || true
kill $SPID; wait $SPID || true
