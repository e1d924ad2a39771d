#!/usr/bin/env bash
# The two accelerator measurements the flagship issues ask for, in one lease:
#  1. the DEQ-Transformer LM at its `:gpu` size (d_model 512, batch 64 x 256): training
#     and evaluation tokens per second, the chip alone (issue 33);
#  2. the neural solver on MDEQ-TINY (issue 34): a Jacobian-regularised MDEQ on
#     Fashion-MNIST (the unregularised one does not converge within 24 steps, so
#     "equal accuracy" would compare unconverged solves), its HyperAnderson solver fitted
#     with the MDEQ frozen, then `experiments.neural_solver.pareto` on the validation split.
#
#   bash experiments/gpu/flagship_solvers.sh OUT_DIR [FASHION_MNIST_DIR] [SHAKESPEARE_DIR]
#
# On one H100 the stages took 57 s, 149 s, ~90 s and 137 s (BUILD_NOTES); MDEQ_STEPS
# (default 1,900: 4.4 epochs) sets the MDEQ's training length. Each stage has its own
# time limit (LM_SECONDS, MDEQ_SECONDS, FIT_SECONDS, PARETO_SECONDS; 580 s together) so
# the script ends, and its logs and reports are kept, within ten minutes. EXTRA_LM /
# EXTRA_MDEQ / EXTRA_FIT / EXTRA_PARETO add --config flags (or flags) to a stage. The
# data: the four Fashion-MNIST idx files and the corpus of `python -m launch.prepare_data
# shakespeare` (set-up on a GPU machine: README.md here). On a CPU, shrink everything
# with the `smoke` sizes, e.g.
#   LM_VARIANT=smoke LM_STEPS=12 MDEQ_VARIANT=smoke,jacobian MDEQ_STEPS=4 BUDGETS=2,4 \
#     bash experiments/gpu/flagship_solvers.sh /tmp/x
set -uo pipefail
out=$1
fm=${2:-/usr/share/datasets/fashion-mnist}
corpus=${3:-$HOME/.cache/deq_jax/shakespeare}
py=${PYTHON:-python3}
lm_variant=${LM_VARIANT:-gpu}
mdeq_variant=${MDEQ_VARIANT:-jacobian}
budgets=${BUDGETS:-4,8,12,18}
mdeq_steps=${MDEQ_STEPS:-1900}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
# shellcheck source=experiments/gpu/lib.sh
source "$(dirname "$0")/lib.sh"

stamp "LM ($lm_variant) throughput"
timeout "${LM_SECONDS:-100}" "$py" -m launch.main --config "configs/lm_shakespeare.py:$lm_variant" \
  --workdir "$out/lm_$lm_variant" --config.task.path="$corpus" --config.train.steps="${LM_STEPS:-60}" \
  --config.train.pretrain_steps=0 --config.train.warmup_steps=10 --config.eval.every_steps=0 \
  --config.log.every_steps=20 --config.ckpt.every_steps=100000 ${EXTRA_LM:-} \
  > "$out/lm.log" 2>&1
stamp "LM exit $?"; tail -4 "$out/lm.log"

stamp "MDEQ ($mdeq_variant) training"
timeout "${MDEQ_SECONDS:-190}" "$py" -m launch.main --config "configs/mdeq_fashion_mnist.py:$mdeq_variant" \
  --workdir "$out/mdeq" --config.task.dir="$fm" --config.train.steps="$mdeq_steps" \
  --config.eval.every_steps=$((mdeq_steps / 2)) --config.ckpt.every_steps=$((mdeq_steps / 2)) \
  ${EXTRA_MDEQ:-} > "$out/mdeq.log" 2>&1
stamp "MDEQ exit $?"; grep -A6 "Per-length" "$out/mdeq.log"

stamp "neural solver fit"
timeout "${FIT_SECONDS:-130}" "$py" -m launch.main \
  --config "configs/mdeq_fashion_mnist_hypersolver.py:$mdeq_variant" --workdir "$out/solver" \
  --config.task.dir="$fm" --config.neural_solver.deq_workdir="$out/mdeq" ${EXTRA_FIT:-} \
  > "$out/solver.log" 2>&1
stamp "fit exit $?"; tail -6 "$out/solver.log"

stamp "solver Pareto"
timeout "${PARETO_SECONDS:-160}" "$py" -m experiments.neural_solver.pareto \
  --config "configs/mdeq_fashion_mnist_hypersolver.py:$mdeq_variant" --workdir "$out/solver" \
  --config.task.dir="$fm" --config.neural_solver.deq_workdir="$out/mdeq" --budgets="$budgets" \
  --repeats=5 --max_batches=2 ${EXTRA_PARETO:-} > "$out/pareto.log" 2>&1
stamp "Pareto exit $?"; tail -25 "$out/pareto.log"
