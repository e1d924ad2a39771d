#!/usr/bin/env bash
# The neural solver on MDEQ-TINY fitted the paper's way (issue 79), on one NVIDIA GPU, in
# under 8 minutes with the defaults (each stage has a time limit; the logs and reports
# stay when one runs out):
#
#   bash experiments/gpu/neural_solver.sh OUT_DIR [FASHION_MNIST_DIR]
#
# Stages (STAGES, default "mdeq fit sweep diagnose"):
#   mdeq      MDEQ-TINY with the Jacobian term (configs/mdeq_fashion_mnist.py:jacobian),
#             MDEQ_STEPS steps (default 1,900: 4.4 epochs, 111 s on an H100 at ec0dd29);
#             limit MDEQ_SECONDS (150);
#   fit       its solver, the paper's recipe (configs/mdeq_fashion_mnist_hypersolver.py
#             :jacobian: weights 0.1 : 0.02 : 1e-5, l3 decayed over the first 40%, BPTT
#             through K = 10, 1,000 steps on fresh unaugmented images, targets from 100
#             Anderson steps, no ablations); limit FIT_SECONDS (170);
#   sweep     experiments.neural_solver.pareto at every budget of BUDGETS (4..12) on
#             EVAL_BATCHES (10) test batches of 500 (5,000 images): Anderson, the fitted
#             solver, its initialiser with Anderson; median of 5; limit SWEEP_SECONDS (110);
#   diagnose  experiments.neural_solver.diagnose on 4 batches; limit DIAGNOSE_SECONDS (45);
# then one line per solver from OUT_DIR/solver/solver_pareto.json: the budget to
# Anderson's best accuracy less 0.5 points, the speed-up in time and in evaluations, and
# the goal (>= 1.6x in time).
# PYTHON picks the interpreter (default python3); EXTRA_MDEQ / EXTRA_FIT / EXTRA_SWEEP add
# flags to a stage (e.g. EXTRA_FIT=--config.neural_solver.train_steps=500);
# DRY_RUN=1 prints the commands instead of running them (tests/test_device_scripts.py).
# On a CPU, the smoke size: SIZE=smoke (MDEQ and fit of 4 steps, budgets 2,3, 2 test
# batches of 50; every stage's limit 300 s).
set -uo pipefail
out=$1
fm=${2:-/usr/share/datasets/fashion-mnist}
py=${PYTHON:-python3}
stages=${STAGES:-mdeq fit sweep diagnose}
if [[ ${SIZE:-gpu} == smoke ]]; then
  variant=smoke,jacobian steps=${MDEQ_STEPS:-4} budgets=${BUDGETS:-2,3}
  batches=${EVAL_BATCHES:-2} eval_batch=50 limits=(300 300 300 300)
else
  variant=jacobian steps=${MDEQ_STEPS:-1900} budgets=${BUDGETS:-4,5,6,7,8,9,10,11,12}
  batches=${EVAL_BATCHES:-10} eval_batch=500 limits=(150 170 110 45)
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
mkdir -p "$out"
# shellcheck source=experiments/gpu/lib.sh
source experiments/gpu/lib.sh  # (the working directory is the repository)
RUN_TAIL=${RUN_TAIL:-12}
solver_config=configs/mdeq_fashion_mnist_hypersolver.py:$variant
solver=(--config "$solver_config" --workdir "$out/solver" --config.task.dir="$fm"
  --config.neural_solver.deq_workdir="$out/mdeq")
for stage in $stages; do
  case $stage in
    mdeq)
      # shellcheck disable=SC2086  # EXTRA_* are lists of flags
      run "${MDEQ_SECONDS:-${limits[0]}}" "$out/mdeq.log" "$py" -m launch.main \
        --config "configs/mdeq_fashion_mnist.py:$variant" --workdir "$out/mdeq" \
        --config.task.dir="$fm" --config.train.steps="$steps" \
        --config.eval.every_steps=$((steps / 2)) --config.ckpt.every_steps=$((steps / 2)) \
        ${EXTRA_MDEQ:-}
      ;;
    fit)
      # shellcheck disable=SC2086
      run "${FIT_SECONDS:-${limits[1]}}" "$out/fit.log" "$py" -m launch.main "${solver[@]}" \
        --config.neural_solver.ablations=False ${EXTRA_FIT:-}
      ;;
    sweep)
      # shellcheck disable=SC2086
      run "${SWEEP_SECONDS:-${limits[2]}}" "$out/sweep.log" "$py" -m experiments.neural_solver.pareto \
        "${solver[@]}" --split=test --budgets="$budgets" --max_batches="$batches" \
        --config.eval.batch_size="$eval_batch" --solvers=anderson,hyper_anderson,init_only \
        --repeats=5 ${EXTRA_SWEEP:-}
      ;;
    diagnose)
      run "${DIAGNOSE_SECONDS:-${limits[3]}}" "$out/diagnose.log" "$py" -m experiments.neural_solver.diagnose \
        "${solver[@]}" --batches=4
      ;;
    *) echo "unknown stage $stage (mdeq fit sweep diagnose)" >&2; exit 2 ;;
  esac
done
if [[ -z ${DRY_RUN:-} && -f $out/solver/solver_pareto.json ]]; then
  "$py" - "$out/solver/solver_pareto.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
summary = report["summary"]
print(f"target {summary['metric']} {summary['metric_target']:.4f} on {report['split']}")
for name in report["table"]:
    s = summary[name]
    speed = s["speedup_metric_vs_anderson"]
    goal = "" if name == "anderson" else f"; goal >= 1.6x {'met' if speed and speed >= 1.6 else 'not met'}"
    print(f"{name}: budget {s['budget_to_metric']}, x{speed} in time, "
          f"x{s['evals_ratio_metric_vs_anderson']} in evaluations{goal}")
EOF
fi
