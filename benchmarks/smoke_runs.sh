#!/usr/bin/env bash
# Runs every config's `:smoke` variant from a fresh workdir through `launch.main` and times it
# (wall and CPU seconds, compilation included), each neural-solver config on the DEQ its base
# smoke run just trained. A failed run is listed as FAILED with its log.
#
#   bash benchmarks/smoke_runs.sh [OUT_DIR]      # default /tmp/deq_smoke_runs
#
# Writes OUT_DIR/times.txt (a line per run) and OUT_DIR/<config>.log. The MDEQ runs read
# Fashion-MNIST's idx files (`apt-get install dataset-fashion-mnist`); CIFAR-10 and
# WikiText-103 need their files and are left out. Exit status: the number of failed runs.
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/deq_smoke_runs}
rm -rf "$out/w" && mkdir -p "$out/w" && : > "$out/times.txt"
failed=0
run() {  # NAME CONFIG [DEQ_RUN]: trains CONFIG:smoke in $out/w/NAME (a fit of DEQ_RUN's DEQ)
  local name=$1 config=$2 extra=()
  [ $# -gt 2 ] && extra=(--config.neural_solver.deq_workdir="$out/w/$3")
  if ! /usr/bin/time -f "$name wall %e s cpu %U+%S s" -a -o "$out/times.txt" \
      python -m launch.main --config "$config" --workdir "$out/w/$name" "${extra[@]}" \
      > "$out/$name.log" 2>&1; then
    echo "$name FAILED (log: $out/$name.log)" >> "$out/times.txt"
    failed=$((failed + 1))
  fi
  tail -n 1 "$out/times.txt"
}
run prefix_sum configs/prefix_sum.py:smoke
run prefix_sum_hypersolver configs/prefix_sum_hypersolver.py:smoke prefix_sum
run mazes configs/mazes.py:smoke
run mazes_hypersolver configs/mazes_hypersolver.py:smoke mazes
run digits configs/digits.py:smoke
run digits_hypersolver configs/digits_hypersolver.py:smoke digits
run blurry_digits configs/blurry_digits.py:smoke
run edge_copy configs/edge_copy.py:smoke
run matrix_inversion configs/matrix_inversion.py:smoke
run synthetic_1d configs/synthetic_1d.py:smoke
run clrs_bfs configs/clrs.py:bfs,smoke
run lm_shakespeare configs/lm_shakespeare.py:smoke
run lm_shakespeare_hypersolver configs/lm_shakespeare_hypersolver.py:smoke lm_shakespeare
run mdeq_fashion_mnist configs/mdeq_fashion_mnist.py:smoke
run mdeq_fashion_mnist_hypersolver configs/mdeq_fashion_mnist_hypersolver.py:smoke mdeq_fashion_mnist
exit "$failed"
