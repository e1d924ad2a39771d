"""Time one config's training step and evaluation step on synthetic data, and its cell.

For any config in ``configs/`` (the language model, MDEQ, the reasoning tasks, ...),
builds the run as training does, with fresh weights (``train.seed``, 0 by default), and
times the step the training loop runs (its family's, host batch in and metrics on the
host) and the evaluators' jitted eval step, on data drawn with seed 1 before any timing
(`benchmarks.step_bench`): for a language model uniform tokens over ``--vocab`` ids, a
new segment each step with the memory carried as in training; for the other tasks
``N(0, 1)`` inputs of ``--input_shape`` (default: the task's) and uniform labels (a task
whose batches carry more, a graph's adjacency or CLRS's features, its own generated
batches, under ``--workdir``).

Protocol, as the PyTorch twins' (``torch_twins/README.md`` in the shared benchmarks):
``--warmup`` untimed train steps (the first compiles: ``first_step_incl_compile_s``),
``--steps`` timed train steps (each blocked on its outputs), one untimed evaluation
batch (its compile: ``eval_compile_incl_run_s``), ``--eval_steps`` timed evaluation
batches of the train batch size; medians. Then at the fixed point of the last
evaluation batch, in eval mode (`deq_jax.nn.deq_call`, which exposes the DEQ's
`deq_jax.nn.EquilibriumProblem`): one jitted cell evaluation ``f(z*)`` and one VJP of
``f`` w.r.t. ``z`` (the linearisation made once, as the implicit backward solve applies
it), each the median of ``--f_evals`` calls after two warm-up calls. Per step it reports
the train milliseconds per forward cell evaluation (over ``nstep_max``, the
evaluations the batched solve ran) and the solver statistics of both solves. For the
cell it reports XLA's count of the floating-point operations of one ``f(z*)``
(`benchmarks.throughput`), the TFLOP/s that count achieves in the median ``f(z*)``
time, and the fraction of the chip's dense peak for the run's arithmetic
(``config.deq.precision``: ``"default"`` is TF32 on an NVIDIA GPU, bfloat16 on a TPU),
omitted for a chip without a known peak (the CPU).

No data file is read: a language model's vocabulary size comes from ``--vocab`` (no
corpus needed), an image model's input shape from ``--input_shape`` when its data files
are absent (the task reads its shape from them); tensorflow-datasets need not be
installed (`tests/test_optional_packages.py`)::

    python -m benchmarks.step_time --config configs/lm_shakespeare.py --vocab 96 \\
        --steps 3 --eval_steps 3 --f_evals 5
    python -m benchmarks.step_time --config configs/mdeq_fashion_mnist.py \\
        --input_shape 28,28,1 --config.model.head_channels='(1,1)' \\
        --config.model.final_channels=4 --batch 64 --out /tmp/jax.jsonl --tag a

Budgets and sizes are the config's (``--config.deq.train_max_iter=``,
``--config.deq.backward.ift.max_iter=``, ``--config.model.d_model=``, ...);
``--full_budget`` makes every solve run its whole budget. Prints a table and one JSON
record (appended to ``--out``), with the keys of the twins' records: ``model``,
``side``, ``tag``, ``params``, ``train_ms`` / ``eval_ms`` / ``f_eval_ms`` / ``vjp_ms``
(``median``, ``min``, ``max``, ``mean``, ``all``), ``train_ms_per_fwd_f_eval``, the
solver statistics, ``env`` (with the ``device_kind``) and ``command``; and
``f_eval_flops``, ``f_eval_tflops_per_s``, ``precision``, ``arithmetic``
(``"tf32"``, ``"fp32"``, ``"bf16"`` or ``None``), ``peak_tflops`` and
``f_eval_fraction_of_peak`` (``None`` without a known peak or count).
`benchmarks.twin_ratios` pairs such records with the twins'; ``benchmarks/twins.sh``
runs both sides interleaved.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks import throughput
from benchmarks.step_bench import Bench, Options, build_bench, configured
from launch import flags as launch_flags

F_WARMUP = 2  # untimed calls before the f(z) and VJP timings, as the twins


def summarize_ms(seconds: Sequence[float]) -> dict[str, Any]:
    """``{median, min, max, mean, all}`` in milliseconds (the twins' format)."""
    ms = [1e3 * s for s in seconds]
    return {
        "median": statistics.median(ms),
        "min": min(ms),
        "max": max(ms),
        "mean": statistics.fmean(ms),
        "all": [round(t, 2) for t in ms],
    }


def stat_summary(values: Sequence[float]) -> dict[str, Any]:
    """``{mean, min, max, per_step}`` of a per-step statistic (the twins' format)."""
    values = [float(v) for v in values]
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "per_step": [round(v, 6) for v in values],
    }


def time_train(bench: Bench, warmup: int) -> tuple[Any, float, list[float], list[dict]]:
    """Runs every train batch through the loop's step, the memory carried.

    Returns:
      ``(state, first step's seconds with its compile, timed seconds, timed steps'
      metrics)``: the steps after the ``warmup`` first are timed.
    """
    state, carry = bench.run.state, bench.run.carry
    first, seconds, rows = 0.0, [], []
    for number, batch in enumerate(bench.train_batches, start=1):
        began = time.perf_counter()
        state, carry, metrics = bench.step(state, carry, batch, number)
        jax.block_until_ready((state, carry))
        elapsed = time.perf_counter() - began
        if number == 1:
            first = elapsed
        if number > warmup:
            seconds.append(elapsed)
            rows.append(metrics)
    return state, first, seconds, rows


def time_cell(f: Callable, z_star: Any, args: Any, n: int) -> tuple[list[float], list[float]]:
    """Seconds of ``n`` jitted calls of ``f(z*, args)`` and of ``n`` VJPs of ``f``
    w.r.t. ``z`` at ``z*`` (the pullback made once, as the implicit backward applies
    it), each after `F_WARMUP` untimed calls."""
    cell = jax.jit(f)
    pullback = jax.jit(lambda z, args: jax.vjp(lambda z: f(z, args), z)[1])(z_star, args)
    vjp = jax.jit(lambda pullback, u: pullback(u)[0])
    u = jax.tree_util.tree_map(jnp.ones_like, z_star)

    def timed(call):
        for _ in range(F_WARMUP):
            jax.block_until_ready(call())
        seconds = []
        for _ in range(n):
            began = time.perf_counter()
            jax.block_until_ready(call())
            seconds.append(time.perf_counter() - began)
        return seconds

    return timed(lambda: cell(z_star, args)), timed(lambda: vjp(pullback, u))


def env_record() -> dict[str, Any]:
    """The machine and library versions a record was measured with."""
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id}" for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "python": platform.python_version(),
        "n_cpu_visible": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "host": socket.gethostname(),
        "nice": os.nice(0),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _train_stats(rows: list[dict], seconds: list[float]) -> dict[str, Any]:
    """The per-step solver statistics of the timed train steps, and the milliseconds per
    forward cell evaluation (the batched solve runs ``nstep_max`` of them)."""
    stats = {
        "train_fwd_nstep_mean": stat_summary([r["nstep_mean"] for r in rows]),
        "train_fwd_nstep_max": stat_summary([r["nstep_max"] for r in rows]),
        "train_fwd_rel_residual_mean": stat_summary([r["rel_residual"] for r in rows]),
        "train_loss": stat_summary([r["loss"] for r in rows]),
        "train_ms_per_fwd_f_eval": stat_summary(
            [1e3 * s / max(float(r["nstep_max"]), 1.0) for s, r in zip(seconds, rows, strict=True)]
        ),
    }
    for key in ("floor", "at_floor"):  # a reduced-precision cell's residual floor
        if key in rows[0]:
            stats[f"train_fwd_{key}"] = stat_summary([r[key] for r in rows])
    for key in ("nstep_max", "nstep_mean", "abs_residual_max", "floor_mean", "at_floor_fraction"):
        if f"bwd_{key}" in rows[0]:
            stats[f"train_bwd_{key}"] = stat_summary([r[f"bwd_{key}"] for r in rows])
    return stats


def measure(config: Any, options: Options, command: str = "") -> dict[str, Any]:
    """Times ``config``'s train and eval steps and its cell (module docstring).

    Args:
      config: any config of ``configs/`` (overrides applied).
      options: the run's `Options`.
      command: the command line, stored in the record.

    Returns:
      The JSON record (module docstring).

    Raises:
      ValueError: for a language model without a vocabulary size, or counts below 1.
    """
    config = configured(config, options)
    env = env_record()
    with tempfile.TemporaryDirectory() as scratch:
        bench = build_bench(config, options, options.workdir or scratch)
        state, first, train_s, rows = time_train(bench, options.warmup)
        eval_first, _ = bench.evaluate(state, bench.eval_batches[0])
        timed = [bench.evaluate(state, batch) for batch in bench.eval_batches[1:]]
        f, z_star, args = bench.problem(state, bench.eval_batches[-1])
        f_s, vjp_s = time_cell(f, z_star, args, options.f_evals)
        flops = throughput.compiled_flops(f, z_star, args)
    env["loadavg_at_end"] = list(os.getloadavg())
    device = jax.devices()[0]
    precision = config.deq.get("precision", "default")
    cell = throughput.achieved(
        flops, statistics.median(f_s), device.device_kind, device.platform, precision
    )
    eval_s, evals = [s for s, _ in timed], [e for _, e in timed]
    unit, count = bench.unit, bench.per_batch
    record = {
        "model": options.model_name or config.model.name,
        "side": "jax",
        "variant": f"{config.deq.solver.name}_{config.deq.backward.name}",
        "tag": options.tag,
        "params": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
        "data": bench.data,
        "batch": config.train.batch_size,
        **bench.sizes,
        "config": json.loads(config.to_json_best_effort()),
        "first_step_incl_compile_s": first,
        "eval_compile_incl_run_s": eval_first,
        "train_ms": summarize_ms(train_s),
        f"train_{unit}_per_s": count / statistics.median(train_s),
        f"train_{unit}_per_s_best": count / min(train_s),
        "eval_ms": summarize_ms(eval_s),
        f"eval_{unit}_per_s": count / statistics.median(eval_s),
        **_train_stats(rows, train_s),
        "eval_nstep_mean": stat_summary([e["nstep_mean"] for e in evals]),
        "eval_nstep_max": stat_summary([e["nstep_max"] for e in evals]),
        "eval_rel_residual_mean": stat_summary([e["rel_residual"] for e in evals]),
        "f_eval_ms": summarize_ms(f_s),
        "vjp_ms": summarize_ms(vjp_s),
        "f_eval_flops": cell["flops"],
        "f_eval_tflops_per_s": cell["tflops_per_s"],
        "precision": cell["precision"],
        "arithmetic": cell["arithmetic"],
        "peak_tflops": cell["peak_tflops"],
        "f_eval_fraction_of_peak": cell["fraction_of_peak"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "env": env,
        "command": command,
    }
    return record


def format_table(record: dict[str, Any]) -> str:
    """A short human table of a record: milliseconds and the solver counts."""
    ms = lambda key: record[key]
    lines = [
        f"{record['model']} ({record['variant']}, tag {record['tag'] or '-'}): "
        f"{record['params']:,} parameters, batch {record['batch']}, {record['data']} data, "
        f"first step with compile {record['first_step_incl_compile_s']:.1f} s",
        f"{'':28s} {'median':>10s} {'min':>10s} {'max':>10s}",
    ]
    rows = [
        ("train step ms", ms("train_ms")),
        ("eval batch ms", ms("eval_ms")),
        ("train ms per fwd f-eval", ms("train_ms_per_fwd_f_eval")),
        ("f(z*) alone ms", ms("f_eval_ms")),
        ("VJP of f alone ms", ms("vjp_ms")),
    ]
    for name, values in rows:
        middle = values.get("median", values.get("mean"))
        lines.append(f"{name:28s} {middle:10.2f} {values['min']:10.2f} {values['max']:10.2f}")
    counts = [
        ("train fwd nstep mean/max", "train_fwd_nstep_mean", "train_fwd_nstep_max"),
        ("train bwd nstep mean/max", "train_bwd_nstep_mean", "train_bwd_nstep_max"),
        ("eval nstep mean/max", "eval_nstep_mean", "eval_nstep_max"),
    ]
    for name, mean, top in counts:
        if mean in record:
            lines.append(f"{name:28s} {record[mean]['mean']:10.2f} {record[top]['max']:10.0f}")
    lines.append(
        f"{'rel residual train/eval':28s} {record['train_fwd_rel_residual_mean']['mean']:10.2e} "
        f"{record['eval_rel_residual_mean']['mean']:10.2e}"
    )
    return "\n".join(lines + _throughput_lines(record))


def _throughput_lines(record: dict[str, Any]) -> list[str]:
    """The table's lines on ``f(z*)``'s FLOPs, TFLOP/s and fraction of the chip's peak."""
    flops, rate = record["f_eval_flops"], record["f_eval_tflops_per_s"]
    if flops is None:
        return [f"{'f(z*) FLOPs (XLA count)':28s} {'-':>10s} (the backend counts none)"]
    lines = [
        f"{'f(z*) FLOPs (XLA count)':28s} {flops:10.3e}",
        f"{'f(z*) TFLOP/s at median':28s} {rate:10.4g}",
    ]
    fraction, precision = record["f_eval_fraction_of_peak"], record["precision"]
    kind = record["env"]["device_kind"]
    if fraction is None:
        lines.append(f"{'f(z*) fraction of peak':28s} {'-':>10s} (no peak known: {kind})")
    else:
        lines.append(
            f"{'f(z*) fraction of peak':28s} {fraction:10.2%} of {record['peak_tflops']:g} "
            f"TFLOP/s ({kind}, {record['arithmetic']}, precision {precision})"
        )
    return lines


def write_record(record: dict[str, Any], out: str) -> None:
    """Prints the record as one JSON line and appends it to ``out`` (unless empty)."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def define_flags() -> None:
    """Defines the command's flags (besides ``--config`` and ``--workdir``). Called when
    the module runs as the command only: other tools of the suite define ``--out``,
    ``--steps``, ``--batch`` and ``--input_shape`` with their own meanings."""
    flags.DEFINE_integer("batch", 0, "Train (and eval) batch size; 0: the config's.")
    flags.DEFINE_bool("full_budget", False, "Every solve runs its whole budget.")
    flags.DEFINE_integer("warmup", 3, "Untimed train steps (the first compiles).")
    flags.DEFINE_integer("steps", 10, "Timed train steps.")
    flags.DEFINE_integer("eval_steps", 10, "Timed evaluation batches.")
    flags.DEFINE_integer("f_evals", 20, "Timed calls of f(z*) and of its VJP.")
    flags.DEFINE_list("input_shape", [], "One example's input shape, e.g. 28,28,1.")
    flags.DEFINE_integer("vocab", 0, "A language model's vocabulary size, e.g. 96.")
    flags.DEFINE_string("out", "", "Append the JSON record to this file ('': print only).")
    flags.DEFINE_string("tag", "", "A free label stored in the record.")
    flags.DEFINE_string("model_name", "", "The record's model name (default: model.name).")


def main(argv: Sequence[str]) -> None:
    """Times ``--config`` as the flags say, prints the table and the JSON record."""
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    f = flags.FLAGS
    options = Options(
        batch=f.batch,
        full_budget=f.full_budget,
        warmup=f.warmup,
        steps=f.steps,
        eval_steps=f.eval_steps,
        f_evals=f.f_evals,
        input_shape=tuple(int(s) for s in f.input_shape),
        vocab=f.vocab,
        tag=f.tag,
        model_name=f.model_name,
        workdir=launch_flags.WORKDIR.value or "",
    )
    command = "python -m benchmarks.step_time " + " ".join(sys.argv[1:])
    record = measure(launch_flags.CONFIG.value, options, command)
    print(format_table(record), flush=True)
    write_record(record, f.out)


if __name__ == "__main__":
    define_flags()
    try:
        launch_flags.validate_argv(sys.argv[1:])
    except (launch_flags.UnknownOverrideError, FileNotFoundError) as e:
        print(f"FATAL Flags parsing error: {e}", file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config"])
    app.run(main)
