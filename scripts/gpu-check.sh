#!/usr/bin/env bash
# The trainer's real code path on this machine's GPU (FSDP2 at one rank, bf16, activation
# checkpointing, a Qwen2-0.5B-shaped random model, 64 x 1,024 tokens): tokens per second, peak
# memory and a weight-sync check, written as one JSON (scripts/gpu_check.py says what and how).
#
#   scripts/gpu-check.sh [--out bench/out/gpu-check.json] [--steps 3]   # on a GPU
#   scripts/gpu-check.sh --tiny                                         # a tiny shape, on a CPU
#
# Needs only torch and transformers: no vLLM, Ray, Prefect, MLflow or DuckDB, no install of the
# project, no download. PYTHON picks the interpreter (default .venv/bin/python, else python, else
# python3). Exits 1 when the check fails (the JSON is still written), 2 on bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python
  elif command -v python >/dev/null; then PYTHON=python
  else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" scripts/gpu_check.py "$@"
