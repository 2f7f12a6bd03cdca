#!/usr/bin/env bash
# HistoPipe on real runs, W=2, on this machine: one training run per placement policy, the same
# config, seed and prompts, speculation off (so the simulator's one-token-per-iteration cost model
# can replay the steps), then `rhymerl bench pipe --real-lake` puts them side by side (bubble
# ratio, makespan, the oracle gap) and the simulator is checked against the tier-1 run.
#
#   scripts/pipe-real-w2.sh [OUT] [EPOCHS]     # default bench/out/pipe-real, 3 epochs (~15 min)
#
# Runs one after another (never concurrently: two runs on 2 cores measure each other's load).
# Results: OUT/real.json, OUT/real.txt, OUT/check.json, OUT/check.txt; lake and MLflow in OUT.
set -euo pipefail
OUT=${1:-bench/out/pipe-real}
EPOCHS=${2:-3}
BIN=${BIN:-.venv/bin}
mkdir -p "$OUT"
COMMON=(epochs="$EPOCHS" spec.enabled=false rollout.num_workers=2 pipe.gantt=false
        lake.url="\"$OUT/lake\"" tracking.uri="\"sqlite:///$OUT/mlflow.db\"" tracking.experiment='"pipe-real"')

declare -A SETTINGS=(
  [naive]='pipe.policy="naive"'
  [round_robin]='pipe.policy="round_robin"'
  [lpt]='pipe.policy="lpt"'
  [tier2]='pipe.policy="tier2"'
  [tier2-migrate]='pipe.policy="tier2" pipe.migrate=true'
)
ORDER=(naive round_robin lpt tier2 tier2-migrate)

for name in "${ORDER[@]}"; do
  done_runs=$("$BIN/rhymerl" lake sql "SELECT count(*) AS n FROM runs WHERE name = 'pipe-$name' AND status = 'finished'" \
       --lake "$OUT/lake" --format csv 2>/dev/null | tail -n 1 || true)
  if [ "${done_runs:-0}" != "0" ] && [ -n "$done_runs" ]; then
    echo "pipe-$name: already finished in $OUT/lake, skipped"
    continue
  fi
  echo "pipe-$name: $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)"
  # shellcheck disable=SC2086  # SETTINGS values are several KEY=VALUE words
  "$BIN/rhymerl" run --config configs/default.toml --set "${COMMON[@]}" name="\"pipe-$name\"" \
    ${SETTINGS[$name]} > "$OUT/pipe-$name.log" 2>&1
  tail -n 14 "$OUT/pipe-$name.log" | grep -E '^\s*[0-9]+ ' || true
done

ids() {  # run ids of the named runs, in ORDER
  local list=""
  for name in "$@"; do
    id=$("$BIN/rhymerl" lake sql "SELECT run_id FROM runs WHERE name = 'pipe-$name' AND status = 'finished'" \
           --lake "$OUT/lake" --format csv | tail -n 1)
    list="$list${list:+,}$id"
  done
  echo "$list"
}
RUNS=$(ids "${ORDER[@]}")
"$BIN/python" -m bench.pipe_bench --real-lake "$OUT/lake" --real-runs "$RUNS" --json-out "$OUT/real.json" \
  | tee "$OUT/real.txt"
LPT=$(ids lpt)
"$BIN/python" -m bench.pipe_bench --check-lake "$OUT/lake" --check-run "$LPT" --check-warmup 1 \
  --json-out "$OUT/check.json" | tee "$OUT/check.txt"
