#!/usr/bin/env bash
# The neural solver's fit ablated (issue 79): each VARIANT fitted with SEEDS seeds to one
# trained DEQ, then swept at every budget of BUDGETS against Anderson (the metric over the
# whole split, the time of a batch interleaved), then one table over the seeds.
#
#   bash experiments/neural_solver/ablations.sh TASK OUT_DIR DEQ_WORKDIR [VARIANT ...]
#
# TASK: prefix_sum (configs/prefix_sum_hypersolver.py; test_32, 2,000 examples, budgets
# 8..32) or lm_jacobian (configs/lm_shakespeare_hypersolver.py:jacobian; the whole
# validation split, budgets 2..12). VARIANTs (default: all, in this order):
#   paper            the default: the paper's recipe (with the Anderson tail since issue 79's
#                    second session; the rows measured before it had none: no_tail)
#   no_tail          the paper's recipe with the learned update past K
#   previous         the recipe before issue 79 (the configs' :previous)
#   weights_previous the paper's recipe with the earlier weights 1 : 1 : 0.1 (l3 decayed to 0
#                    over the whole fit)
#   detached         the paper's recipe with the first 80% of the steps detached
#   learned_beta / fixed_beta   beta learned / fixed at 1 (each task's other choice)
#   steps200, steps3000         200 / 3,000 fit steps
#   relative         the relative error
#   log              the log of the batch's mean relative error (the tail keeps its weight)
#   anderson_tail    the paper's fit, solving with Anderson on its history after K steps
#                    (now the default; kept for the runs that named it)
#   log_tail         both
# Each run: OUT_DIR/VARIANT/sSEED/{fit.log, pareto.log, neural_solver.json,
# solver_pareto.json}; the first sweep's Anderson rows are reused by the others
# (--reuse_classic: the same DEQ, split and budgets). A finished run is skipped. Then
# `python -m experiments.neural_solver.ablation_table OUT_DIR` prints the table.
# PYTHON picks the interpreter; EXTRA adds flags to every fit, EXTRA_SWEEP to every sweep (the
# last of a flag given twice wins: EXTRA_SWEEP=--repeats=3); DRY_RUN=1 prints the commands.
set -uo pipefail
task=$1
out=$2
deq=$3
shift 3
py=${PYTHON:-python}
seeds=${SEEDS:-0 1 2}
variants=${*:-paper previous weights_previous detached learned_beta fixed_beta steps200 steps3000 relative}
case $task in
  prefix_sum)
    config=configs/prefix_sum_hypersolver.py model=""
    sweep="--split=test_32 --config.task.test_size=2000 --max_batches=0 --repeats=5 \
--budgets=${BUDGETS:-8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32}"
    ;;
  lm_jacobian)
    config=configs/lm_shakespeare_hypersolver.py model=jacobian
    sweep="--max_batches=0 --repeats=5 --budgets=${BUDGETS:-2,3,4,5,6,7,8,9,10,11,12}"
    ;;
  *) echo "TASK must be prefix_sum or lm_jacobian, got $task" >&2; exit 2 ;;
esac
ns=--config.neural_solver
variant_flags() {
  case $1 in
    paper | previous) echo "" ;;
    weights_previous) echo "$ns.l1=1.0 $ns.l2=1.0 $ns.l3=0.1 $ns.l3_final=0.0 $ns.l3_decay=1.0" ;;
    detached) echo "$ns.detached_steps=800" ;;
    learned_beta) echo "$ns.learn_beta=True" ;;
    fixed_beta) echo "$ns.learn_beta=False" ;;
    steps200) echo "$ns.train_steps=200" ;;
    steps3000) echo "$ns.train_steps=3000" ;;
    relative) echo "$ns.error=relative" ;;
    log) echo "$ns.error=log" ;;
    anderson_tail) echo "$ns.anderson_tail=True" ;;
    no_tail) echo "$ns.anderson_tail=False" ;;
    log_tail) echo "$ns.error=log $ns.anderson_tail=True" ;;
    *) echo "unknown variant $1" >&2; return 2 ;;
  esac
}
run() {  # run LOG COMMAND...
  local log=$1
  shift
  if [[ -n ${DRY_RUN:-} ]]; then echo "$*"; return 0; fi
  mkdir -p "$(dirname "$log")"
  echo "[$(date +%T)] $* > $log"
  nice -n 10 "$@" >"$log" 2>&1
  echo "[$(date +%T)] exit $?"
}
reference=""
for variant in $variants; do
  flags=$(variant_flags "$variant") || exit 2
  arg=$model
  if [[ $variant == previous ]]; then arg=${model:+$model,}previous; fi
  for seed in $seeds; do
    dir=$out/$variant/s$seed
    common=(--config "$config${arg:+:$arg}" --workdir "$dir" "$ns.deq_workdir=$deq")
    if [[ ! -f $dir/neural_solver.json ]]; then
      # shellcheck disable=SC2086  # flags are words
      run "$dir/fit.log" "$py" -m launch.main "${common[@]}" "$ns.seed=$seed" \
        "$ns.ablations=False" $flags ${EXTRA:-}
    fi
    if [[ ! -f $dir/solver_pareto.json ]]; then
      solvers=anderson,hyper_anderson
      if [[ $variant == paper ]]; then solvers=$solvers,init_only; fi
      # shellcheck disable=SC2086
      run "$dir/pareto.log" "$py" -m experiments.neural_solver.pareto "${common[@]}" $sweep \
        --solvers=$solvers ${reference:+--reuse_classic=$reference} ${EXTRA_SWEEP:-}
    fi
    if [[ -z $reference && -f $dir/solver_pareto.json ]]; then reference=$dir/solver_pareto.json; fi
  done
done
