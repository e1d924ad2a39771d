#!/usr/bin/env bash
# Reversible DEQ against the IFT DEQ and the Jacobian-regularised DEQ on the Shakespeare
# language model at the CPU size (issue 71): trains the three with the same data, steps
# and seed, then scores each over the whole validation split at every forward budget.
#
# Usage (from the repository root; OUT a fresh directory):
#   [SEEDS="0 1 2"] [STEPS=1500] [PRETRAIN=300] [BUDGETS=4,6,8,9,10,12,15,20,30] \
#     bash experiments/reversible/lm.sh OUT
# then
#   python -m experiments.reversible.table --root OUT
# prints valid bpc against the budget and the training time for each run.
# The default sizes (1,500 steps, 300 of them weight-tied) take about 25 minutes a run
# on an idle 2-core CPU; STEPS=600 PRETRAIN=150 is the short version.
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n 2,14p "$0" >&2; exit 2; }
OUT=$1
SEEDS=${SEEDS:-0}
STEPS=${STEPS:-1500}
PRETRAIN=${PRETRAIN:-300}
BUDGETS=${BUDGETS:-4,6,8,9,10,12,15,20,30}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
for seed in $SEEDS; do
  for variant in deq jacobian reversible; do
    arg=""; [[ $variant != deq ]] && arg=":$variant"
    dir="$OUT/${variant}_s$seed"
    common=(--config "configs/lm_shakespeare.py$arg" --workdir "$dir" --config.train.seed="$seed"
      --config.train.steps="$STEPS" --config.train.pretrain_steps="$PRETRAIN")
    echo "$(date +%T) train $dir"
    python -m launch.main "${common[@]}" > "$dir.train.log" 2>&1
    echo "$(date +%T) evaluate $dir at $BUDGETS"
    python -m launch.evaluate "${common[@]}" --splits=valid --max_iters="$BUDGETS" \
      > "$dir.eval.log" 2>&1
  done
done
echo "$(date +%T) done"
