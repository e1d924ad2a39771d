#!/usr/bin/env bash
# MDEQ-TINY on Fashion-MNIST on one accelerator, sized to a wall-clock budget:
# three seeds of the DEQ, one of its explicit twin (weight-tied, unrolled n_layer
# steps) and one of the Jacobian-regularised DEQ, run side by side; then the images
# per second of MDEQ-SMALL at CIFAR-10's size (synthetic images). The step count is
# fitted to the budget from a timed train step (full forward budget, so on the safe
# side), divided by the number of runs sharing the chip.
#
#   bash experiments/gpu/mdeq_fashion_mnist.sh OUT_DIR [TRAIN_SECONDS] [FASHION_MNIST_DIR]
#
# Writes OUT_DIR/<run>/ (each run's workdir: report.json, metrics) and OUT_DIR/*.log.
# CONFIG (default configs/mdeq_fashion_mnist.py:gpu) and EXTRA (more --config flags
# for every run) change what runs; EXTRA="--config.train.batch_size=8" etc. on a CPU.
# RUNS lists the runs as variant:seed (default deq:0,deq:1,deq:2,explicit:0,jacobian:0);
# JAC_STOP (a fraction, e.g. 0.41 as locuslab's JAC_STOP_EPOCH 90 of 220) ends the
# Jacobian runs' term at that fraction of the fitted steps. FASHION_MNIST_DIR holds the
# four Fashion-MNIST idx files (set-up on a GPU machine: README.md here).
set -euo pipefail
out=$1
seconds=${2:-330}
data=${3:-/usr/share/datasets/fashion-mnist}
config=${CONFIG:-configs/mdeq_fashion_mnist.py:gpu}
extra=${EXTRA:-}
py=${PYTHON:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$out"
IFS=, read -r -a runs <<< "${RUNS:-deq:0,deq:1,deq:2,explicit:0,jacobian:0}"

"$py" -m benchmarks.step_cost --config "$config" --workdir "$out/cost_tiny" --budgets 12 \
  --backwards ift --repeats 5 --synthetic --input_shape 28,28,1 $extra 2>&1 | tail -3
step_s=$("$py" -c "import json; print(json.load(open('$out/cost_tiny/step_cost.json'))['rows'][0]['train_seconds'])")
steps=$("$py" -c "print(max(20, int($seconds / ($step_s * ${#runs[@]} * 1.3)) // 10 * 10))")
echo "train step ${step_s}s alone; ${#runs[@]} runs of $steps steps each"

for run in "${runs[@]}"; do
  variant=${run%%:*} seed=${run##*:}
  suffix=""; [ "$variant" != deq ] && suffix=",$variant"
  pre=$((steps / 8)); [ "$variant" = explicit ] && pre=0
  stop=""
  if [ "$variant" = jacobian ] && [ -n "${JAC_STOP:-}" ]; then
    stop="--config.regularizer.jacobian_stop_step=$("$py" -c "print(int($steps * $JAC_STOP))")"
  fi
  "$py" -m launch.main --config "$config$suffix" --workdir "$out/${variant}_s$seed" \
    --config.task.dir="$data" --config.train.seed="$seed" --config.train.steps="$steps" \
    --config.train.pretrain_steps="$pre" --config.train.warmup_steps=$((steps / 20)) \
    --config.eval.every_steps="$steps" --config.ckpt.every_steps="$steps" \
    --config.log.every_steps=$((steps / 10)) $stop $extra > "$out/${variant}_s$seed.log" 2>&1 &
done
wait
grep -h -A6 "Per-length" "$out"/*_s*.log || true
timeout 100 "$py" -m benchmarks.step_cost --config configs/mdeq_cifar10.py:small \
  --workdir "$out/cost_small" --budgets 26 --backwards ift --repeats 3 --synthetic \
  --input_shape 32,32,3 2>&1 | tail -3 || echo "SMALL throughput: timed out"
