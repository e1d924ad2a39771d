#!/usr/bin/env bash
# The cell's precision on one NVIDIA GPU (issue 78): bfloat16 against the backend's
# default (TF32 on an H100/H200), each solve stopping at its tolerance or its measured
# residual floor, against the torchdeq twins in the same run.
#
#   bash experiments/gpu/precision.sh OUT_DIR [SHAKESPEARE_DIR]
#
# Stages (STAGES, default "lm mdeq twins train loop"; about 7 minutes on an H200 with the
# defaults; each stage has a time limit, so the script ends with its logs and table):
#   lm     `benchmarks.step_time` of the GPU-sized LM (d_model 512, 8 heads of 64,
#          d_inner 2,048, batch 64 x 256, memory 256; the twins' solver settings), in
#          precision default and bfloat16, ROUNDS rounds interleaved: train step, eval
#          batch, f(z*) and its TFLOP/s, solver steps, floor and the samples on it;
#   mdeq   the same for MDEQ-SMALL (`configs/mdeq_cifar10.py:small`, 32x32x3, batch 128,
#          synthetic images);
#   twins  the torchdeq twins (TWINS_DIR, default ../shared/benchmarks/torch_twins, run
#          with TWIN_PYTHON, default PYTHON) at the GPU-sized LM and at MDEQ-SMALL's
#          channels (32/64/128/256), TWIN_DEVICE=cuda, with and without TF32; skipped
#          with a note where torch or torchdeq is missing;
#   train  the Shakespeare LM at the GPU size trained TRAIN_SECONDS (default 150) in each
#          precision (a weight-tied warm-up of PRETRAIN steps, default 200, then the
#          DEQ; stopped by SIGTERM, which saves a checkpoint there), then its valid bpc
#          (`launch.evaluate --checkpoint=last`). The issue's five minutes:
#          STAGES=train TRAIN_SECONDS=300 (about 11 minutes; its own call);
#   loop   the solver loop's fixed cost against jaxopt on the easy tanh problem
#          (`python -m benchmarks.solvers --loop_cost`; skipped where jaxopt is missing).
# Precision bfloat16 is the TPU's default arithmetic (one bfloat16 pass per float32
# matmul, emulated here by casting): its train run is the check that such a run trains
# without burning its budget. Then `experiments.precision.gpu_table OUT_DIR` writes
# OUT_DIR/table.md and table.json (ratios, goals met or not).
# PYTHON picks the interpreter (default python3), EXTRA adds flags to every deq_jax run,
# DRY_RUN=1 prints the commands instead of running them (tests/test_device_scripts.py).
# On a CPU, a smoke version: SIZE=smoke ROUNDS=1 TRAIN_SECONDS=40 STAGES="lm train".
set -uo pipefail
out=$1
corpus=${2:-$HOME/.cache/deq_jax/shakespeare}
py=${PYTHON:-python3}
twin_py=${TWIN_PYTHON:-$py}
twins=${TWINS_DIR:-../shared/benchmarks/torch_twins}
stages=${STAGES:-lm mdeq twins train loop}
rounds=${ROUNDS:-2}
size=${SIZE:-gpu}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
mkdir -p "$out"
# shellcheck source=experiments/gpu/lib.sh
source experiments/gpu/lib.sh  # (the working directory is the repository)

if [[ $size == smoke ]]; then
  lm_size=(--config configs/lm_shakespeare.py:smoke --vocab 12)
  mdeq_size=(--config configs/mdeq_cifar10.py:smoke --input_shape 32,32,3)
  lm_twin_size=(--batch 4 --seq-len 8 --mem-len 8 --d-model 16 --n-head 2 --d-inner 32)
  mdeq_twin_size=(--image-size 32 --in-channels 3 --channels 8 8 --batch 8)
  protocol=(--warmup 1 --steps 2 --eval_steps 2 --f_evals 3)
else
  lm_size=(--config configs/lm_shakespeare.py --vocab 96 --config.model.d_model=512
    --config.model.n_head=8 --config.model.d_head=64 --config.model.d_inner=2048
    --config.model.mem_len=256 --config.train.seq_len=256 --config.train.batch_size=64)
  mdeq_size=(--config configs/mdeq_cifar10.py:small --input_shape 32,32,3 --batch 128)
  lm_twin_size=(--batch 64 --seq-len 256 --mem-len 256 --d-model 512 --n-head 8 --d-inner 2048)
  mdeq_twin_size=(--image-size 32 --in-channels 3 --channels 32 64 128 256 --batch 128)
  protocol=(--warmup 3 --steps 10 --eval_steps 10 --f_evals 20)
fi
# the twins' solver settings (benchmarks/twins.sh)
lm_solver=(--config.model.dropout=0.1 --config.model.dropouti=0.1 --config.model.dropatt=0.0
  --config.train.optimizer=adam --config.train.learning_rate=2.5e-4
  --config.train.schedule=constant --config.train.warmup_steps=0 --config.train.grad_clip_norm=0
  --config.train.pretrain_steps=0 --config.deq.solver.name=anderson --config.deq.solver.tol=1e-3
  --config.deq.solver.anderson.m=6 --config.deq.train_max_iter=20 --config.deq.eval_max_iter=20
  --config.deq.backward.name=ift --config.deq.backward.ift.max_iter=20)
mdeq_solver=(--config.train.pretrain_steps=0 --config.train.warmup_steps=0)

for stage in $stages; do
  case $stage in
    lm | mdeq)
      args=("${lm_size[@]}" "${lm_solver[@]}")
      [[ $stage == mdeq ]] && args=("${mdeq_size[@]}" "${mdeq_solver[@]}")
      for round in $(seq 1 "$rounds"); do
        for precision in default bfloat16; do
          run "${STEP_SECONDS:-150}" "$out/${stage}_${precision}_$round.log" \
            "$py" -m benchmarks.step_time "${args[@]}" "${protocol[@]}" \
            --config.deq.precision="$precision" --out "$out/steps.jsonl" \
            --tag "${stage}_${precision}_$round" ${EXTRA:-}
        done
      done
      ;;
    twins)
      if [[ -z ${DRY_RUN:-} ]] && ! "$twin_py" -c "import torch, torchdeq" 2>/dev/null; then
        stamp "twins skipped: torch or torchdeq is not importable by $twin_py"
        continue
      fi
      for tf32 in 0 1; do
        flag=(); [[ $tf32 == 1 ]] && flag=(--tf32)
        run "${TWIN_SECONDS:-120}" "$out/twin_lm_tf32_$tf32.log" env TWIN_DEVICE=cuda \
          "$twin_py" "$twins/lm_twin.py" "${lm_twin_size[@]}" "${flag[@]}" \
          --out "$out/twin.jsonl" --tag "lm_tf32_$tf32"
        run "${TWIN_SECONDS:-120}" "$out/twin_mdeq_tf32_$tf32.log" env TWIN_DEVICE=cuda \
          "$twin_py" "$twins/mdeq_twin.py" --grad ift "${mdeq_twin_size[@]}" "${flag[@]}" \
          --out "$out/twin.jsonl" --tag "mdeq_tf32_$tf32"
      done
      ;;
    train)
      variant=gpu; [[ $size == smoke ]] && variant=smoke
      for precision in default bfloat16; do
        run "${TRAIN_SECONDS:-150}" "$out/train_$precision.log" \
          "$py" -m launch.main --config "configs/lm_shakespeare.py:$variant" \
          --workdir "$out/train_$precision" --config.task.path="$corpus" \
          --config.deq.precision="$precision" --config.train.pretrain_steps="${PRETRAIN:-200}" \
          --config.eval.every_steps=0 --config.ckpt.every_steps=100000 ${EXTRA:-}
        run "${EVAL_SECONDS:-90}" "$out/eval_$precision.log" \
          "$py" -m launch.evaluate --config "configs/lm_shakespeare.py:$variant" \
          --workdir "$out/train_$precision" --config.task.path="$corpus" \
          --config.deq.precision="$precision" --checkpoint=last --splits=valid \
          --max_batches="${EVAL_BATCHES:-40}" --output "$out/eval_$precision.json"
      done
      ;;
    loop)
      if [[ -z ${DRY_RUN:-} ]] && ! "$py" -c "import jaxopt" 2>/dev/null; then
        stamp "loop skipped: jaxopt is not importable by $py"
        continue
      fi
      run "${LOOP_SECONDS:-120}" "$out/loop_cost.log" "$py" -m benchmarks.solvers --loop_cost \
        --tols 1e-4 --repeats 41 --output "$out/loop_cost.jsonl"
      ;;
    *)
      echo "Unknown stage $stage: lm, mdeq, twins, train or loop." >&2
      exit 2
      ;;
  esac
done
[[ -n ${DRY_RUN:-} ]] && exit 0
"$py" -m experiments.precision.gpu_table "$out"
