#!/usr/bin/env bash
# deq_jax against its PyTorch/torchdeq twins, interleaved on one machine.
#
# For each of ROUNDS rounds and each VARIANT given (default: round), runs the language
# model's twin then deq_jax's language model, then MDEQ-TINY's twin then deq_jax's
# MDEQ-TINY, every run tagged "<variant><round>" on both sides, at the twins' default
# sizes (torch_twins/README.md):
#   LM: vocab 96, d_model 256, 4 heads of 64, d_inner 1024, seq 128, mem 128, batch 16,
#       dropout 0.1 (dropouti 0.1, dropatt 0), weight norm, post-LN, Adam 2.5e-4
#       constant (no warm-up, no clipping, no weight-tied pretraining), Anderson m 6
#       lam 1e-4, max 20, tol 1e-3 rel, IFT backward 20.
#   MDEQ-TINY: 28x28x1, head_channels (1,1), final_channels 4, batch 64, Adam 1e-3,
#       Broyden tol 1e-3 rel, train/eval max 19 f-evaluations (the twin's 18 + 1),
#       IFT backward 21 (the twin's 20 + 1).
# Variants:
#   round      each side's own solver stopping at its tolerance;
#   fixedwork  the LM only, every forward solve running its whole budget
#              (--config.deq.solver.full_budget=True here, --f-tol 1e-12 on the twin);
#   minimal    budgets of 2 forward and 2 backward steps on both models.
# Writes OUT_DIR/jax.jsonl, OUT_DIR/twin.jsonl and a log per run under OUT_DIR/logs,
# then prints the ratio table (python -m benchmarks.twin_ratios).
#
# Usage:
#   TWIN_PYTHON=/work/.venv-torch/bin/python [TWINS_DIR=../shared/benchmarks/torch_twins] \
#     [ROUNDS=2] [MODELS="lm mdeq"] [PYTHON=python] [NICE=5] [WARMUP=3] [STEPS=10] \
#     [EVAL_STEPS=10] [F_EVALS=20] [DRY_RUN=1] \
#     bash benchmarks/twins.sh OUT_DIR [round] [fixedwork] [minimal]
# DRY_RUN=1 prints the commands instead of running them. TWINS_DIR is relative to the
# repository root. A round of the two models takes about 4 minutes on an idle 2-core
# CPU (deq_jax's MDEQ compile about a minute of it).
set -euo pipefail

usage() {
  sed -n '23,30p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
[[ -n "${TWIN_PYTHON:-}" ]] || { echo "TWIN_PYTHON is not set." >&2; usage; }
cd "$(dirname "$0")/.."
mkdir -p "$1/logs"
OUT=$(cd "$1" && pwd)
shift
VARIANTS=("${@:-round}")
TWINS_DIR=$(cd "${TWINS_DIR:-../shared/benchmarks/torch_twins}" && pwd)
ROUNDS=${ROUNDS:-2}
MODELS=${MODELS:-lm mdeq}
PYTHON=${PYTHON:-python}
NICE=${NICE:-5}
PROTOCOL_TWIN=(--warmup "${WARMUP:-3}" --steps "${STEPS:-10}" --eval-steps "${EVAL_STEPS:-10}"
  --f-evals "${F_EVALS:-20}")
PROTOCOL_JAX=(--warmup "${WARMUP:-3}" --steps "${STEPS:-10}" --eval_steps "${EVAL_STEPS:-10}"
  --f_evals "${F_EVALS:-20}")

LM_JAX=(--config configs/lm_shakespeare.py --vocab 96
  --config.model.d_model=256 --config.model.n_head=4 --config.model.d_head=64
  --config.model.d_inner=1024 --config.model.mem_len=128 --config.model.dropout=0.1
  --config.model.dropouti=0.1 --config.model.dropatt=0.0 --config.train.seq_len=128
  --config.train.batch_size=16 --config.train.optimizer=adam --config.train.learning_rate=2.5e-4
  --config.train.schedule=constant --config.train.warmup_steps=0 --config.train.grad_clip_norm=0
  --config.train.pretrain_steps=0 --config.deq.solver.name=anderson --config.deq.solver.tol=1e-3
  --config.deq.solver.stop_mode=rel --config.deq.solver.anderson.m=6
  --config.deq.solver.anderson.lam=1e-4 --config.deq.train_max_iter=20
  --config.deq.eval_max_iter=20 --config.deq.backward.name=ift
  --config.deq.backward.ift.max_iter=20)
MDEQ_JAX=(--config configs/mdeq_fashion_mnist.py --model_name mdeq_tiny --input_shape 28,28,1
  "--config.model.head_channels=(1,1)" --config.model.final_channels=4
  --config.train.batch_size=64 --config.train.optimizer=adam --config.train.learning_rate=1e-3
  --config.train.schedule=constant --config.train.warmup_steps=0 --config.train.grad_clip_norm=0
  --config.train.pretrain_steps=0 --config.deq.solver.name=broyden --config.deq.solver.tol=1e-3
  --config.deq.solver.stop_mode=rel --config.deq.train_max_iter=19 --config.deq.eval_max_iter=19
  --config.deq.backward.name=ift --config.deq.backward.ift.max_iter=21)
MINIMAL_JAX=(--config.deq.train_max_iter=2 --config.deq.eval_max_iter=2
  --config.deq.backward.ift.max_iter=2)

# Runs one measurement: twin_or_jax model variant tag; its output goes to a log.
measure() {
  local side=$1 model=$2 variant=$3 tag=$4 extra_twin=() extra_jax=()
  case "$variant" in
    round) ;;
    fixedwork) extra_twin=(--f-tol 1e-12) extra_jax=(--config.deq.solver.full_budget=True) ;;
    minimal) extra_twin=(--f-max-iter 2 --b-max-iter 2) extra_jax=("${MINIMAL_JAX[@]}") ;;
    *) echo "Unknown variant $variant: round, fixedwork or minimal." >&2; exit 2 ;;
  esac
  local log="$OUT/logs/${side}_${model}_${tag}.log" cmd
  if [[ $side == twin ]]; then
    local script=lm_twin.py grad=()
    [[ $model == mdeq ]] && script=mdeq_twin.py grad=(--grad ift)
    cmd=(nice -n "$NICE" "$TWIN_PYTHON" "$TWINS_DIR/$script" "${grad[@]}" "${PROTOCOL_TWIN[@]}"
      "${extra_twin[@]}" --out "$OUT/twin.jsonl" --tag "$tag")
  else
    local args=("${LM_JAX[@]}")
    [[ $model == mdeq ]] && args=("${MDEQ_JAX[@]}")
    cmd=(nice -n "$NICE" "$PYTHON" -m benchmarks.step_time "${args[@]}" "${PROTOCOL_JAX[@]}"
      "${extra_jax[@]}" --out "$OUT/jax.jsonl" --tag "$tag")
  fi
  if [[ -n ${DRY_RUN:-} ]]; then
    printf '%q ' "${cmd[@]}"
    echo
  else
    echo "$(date +%H:%M:%S) $side $model $tag (log $log)"
    "${cmd[@]}" >"$log" 2>&1
  fi
}

for round in $(seq 1 "$ROUNDS"); do
  for variant in "${VARIANTS[@]}"; do
    for model in $MODELS; do
      [[ $variant == fixedwork && $model != lm ]] && continue  # the twins' fixedwork is the LM's
      measure twin "$model" "$variant" "$variant$round"
      measure jax "$model" "$variant" "$variant$round"
    done
  done
done
[[ -n ${DRY_RUN:-} ]] && exit 0
"$PYTHON" -m benchmarks.twin_ratios --records "$OUT/jax.jsonl" --twin_records "$OUT/twin.jsonl"
