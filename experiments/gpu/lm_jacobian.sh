#!/usr/bin/env bash
# The DEQ-Transformer LM at its `:gpu` size (d_model 512, batch 64 x 256) on one
# accelerator, with and without the Jacobian regulariser, trained side by side for the
# same steps: does the regulariser's bpc cost shrink with training length (issue 33's
# ">= 2x fewer forward steps at <= 0.02 bpc"; on the 2-core CPU, a third of an epoch,
# the weights 2 / 0.5 / 0.1 cost +0.22 / +0.12 / +0.04 bpc, BUILD_NOTES)?
#
#   bash experiments/gpu/lm_jacobian.sh OUT_DIR [SHAKESPEARE_DIR]
#
# Writes OUT_DIR/{deq,jacobian}/ (each run's workdir) and their logs, then the table of
# `experiments.language_model.table` (valid and test bpc, forward steps) and OUT_DIR/table.json.
# STEPS (default 1,000: about 3.5 epochs of Shakespeare; the H100 trained the DEQ alone
# at 8 steps/s, so two runs sharing it need ~4-5 minutes), PRETRAIN (the weight-tied
# warm-up, default STEPS / 5), WEIGHT (the Jacobian weight, default 0.1), FREQ (the
# fraction of steps it is computed on, default 0.4) and RUN_SECONDS (each run's time
# limit, default 480) size it; EXTRA adds --config flags to both runs. On a CPU:
#   SIZE=smoke STEPS=6 bash experiments/gpu/lm_jacobian.sh /tmp/x
# Each run's data are prepared once under its workdir (a few seconds for Shakespeare).
# Then `launch.evaluate` scores both runs' best checkpoints at the budgets EVAL_ITERS
# (default 30,90: the unregularised DEQ does not reach 1e-3 within 30, so its steps to
# converge are censored there), and with EXCLUDE (a regular expression, e.g. ' {10,}')
# also outside and inside its matches; it writes OUT_DIR/{deq,jacobian}_eval.json / .log.
# SHAKESPEARE_DIR defaults to where `python -m launch.prepare_data shakespeare` writes the
# corpus (~/.cache/deq_jax/shakespeare); set-up on a GPU machine: README.md here.
set -uo pipefail
out=$1
corpus=${2:-$HOME/.cache/deq_jax/shakespeare}
py=${PYTHON:-python3}
size=${SIZE:-gpu}
steps=${STEPS:-1000}
pretrain=${PRETRAIN:-$((steps / 5))}
weight=${WEIGHT:-0.1}
freq=${FREQ:-0.4}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
# shellcheck source=experiments/gpu/lib.sh
source "$(dirname "$0")/lib.sh"

common=(--config.task.path="$corpus" --config.train.steps="$steps"
  --config.train.pretrain_steps="$pretrain" --config.train.warmup_steps=$((steps / 10 + 1))
  --config.eval.every_steps=$((steps / 2)) --config.ckpt.every_steps=$((steps / 2))
  --config.log.every_steps=$((steps / 10 + 1)))
stamp "two runs of $steps steps ($pretrain weight-tied warm-up), size $size"
timeout "${RUN_SECONDS:-480}" "$py" -m launch.main --config "configs/lm_shakespeare.py:$size" \
  --workdir "$out/deq" "${common[@]}" ${EXTRA:-} > "$out/deq.log" 2>&1 &
timeout "${RUN_SECONDS:-480}" "$py" -m launch.main \
  --config "configs/lm_shakespeare.py:$size,jacobian" --workdir "$out/jacobian" "${common[@]}" \
  --config.regularizer.jacobian_weight="$weight" --config.regularizer.jacobian_freq="$freq" \
  ${EXTRA:-} > "$out/jacobian.log" 2>&1 &
wait
for run in deq jacobian; do stamp "$run:"; tail -3 "$out/$run.log"; done
"$py" -m experiments.language_model.table --group "DEQ=$out/deq" \
  --group "DEQ + Jacobian (weight $weight, p $freq)=$out/jacobian" --output "$out/table.json"
for run in deq jacobian; do
  suffix=""; [ "$run" = jacobian ] && suffix=",jacobian"
  "$py" -m launch.evaluate --config "configs/lm_shakespeare.py:$size$suffix" \
    --workdir "$out/$run" --config.task.path="$corpus" --splits=valid,test \
    --max_iters="${EVAL_ITERS:-30,90}" --exclude="${EXCLUDE:-}" \
    --output "$out/${run}_eval.json" > "$out/${run}_eval.log" 2>&1
  stamp "$run at budgets ${EVAL_ITERS:-30,90} (exit $?):"; tail -6 "$out/${run}_eval.log"
done
