"""Speed/accuracy Pareto curves of the classic solvers and the neural solver on a trained DEQ.

For the DEQ and the solvers that ``launch.main`` trained with a ``*_hypersolver``
config, sweeps the iteration budget of every solver -- Anderson, Broyden, fixed-point
iteration, the neural solver, the neural solver handing over to Anderson after its
trained ``K`` steps, and the ablations (no initialiser, initialiser only with Anderson,
least-squares alpha with learned beta) -- and measures on the same eval
batches: the wall time per batch (median over ``--repeats`` timed calls after
compilation, the solvers interleaved so they share the machine's load), the relative
residual and the task metric. Every solve runs its whole budget (``full_budget``). Writes
``solver_pareto.json`` (with a summary: the time each solver needs to reach a relative
residual of 1e-3 and Anderson's best metric, and the neural solver's speed-up) and
``solver_pareto.png`` (the paper's Figure 4: metric and residual against time; Figure
8a: residual against solver step, past the ``K`` steps the solver was trained on)::

    python -m experiments.neural_solver.pareto --config configs/prefix_sum_hypersolver.py \\
        --workdir /tmp/ps_solver --config.neural_solver.deq_workdir=/tmp/ps --split test_32

On a language model (``configs/lm_shakespeare_hypersolver.py``) every solver streams the
first ``--max_batches`` segments of the split with the segment memory, the metric is
bits per character (lower is better; a solver must come within 0.005 bpc of Anderson's
best) and the time is that of one segment batch with a filled memory.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Figures 4, 8a).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import flags

from deq_jax.training.run.writers import write_json
from experiments.neural_solver.pareto_lm import residual_curves_lm, sweep_lm, timed
from launch import flags as launch_flags

DEFAULT_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
RESIDUAL_GOAL = 1e-3
# The metric a solver must reach: Anderson's best, less this margin.
METRIC_MARGIN = 0.005
REPORT_FILE = "solver_pareto.json"


def define_flags() -> None:
    """This program's flags (``--config`` and ``--workdir`` come from `launch.main`)."""
    flags.DEFINE_list("budgets", [str(b) for b in DEFAULT_BUDGETS], "Iteration budgets.")
    flags.DEFINE_integer("repeats", 7, "Timed calls per solver and budget (median kept).")
    flags.DEFINE_integer("max_batches", 2, "Eval batches for residual and metric (0: all).")
    flags.DEFINE_list("solvers", [], "The solvers swept (empty: every one of the lineup).")
    flags.DEFINE_string(
        "reuse_classic",
        "",
        "An earlier solver_pareto.json of the same DEQ, split, batches and budgets: its "
        "classic solvers' metrics are reused (they do not depend on the fit), and only timed.",
    )
    flags.DEFINE_string("split", "", "Eval split (empty: the task's first eval split).")
    flags.DEFINE_float(
        "margin",
        METRIC_MARGIN,
        "How far from Anderson's metric counts as reaching it: absolute for accuracies and "
        "bits per character (0.001 = 0.1 points), relative for mse and perplexity.",
    )


def solver_lineup(hyper: Any, only: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """``{name: (solver, z_init)}``: the classic solvers from zero, the neural ones
    (those named in ``only``, when given).

    Besides the fitted variants: ``init_only`` (the trained initialiser with Anderson)
    and the other side of ``anderson_tail``: ``hyper_anderson_tail`` for a solver fitted
    without it (the same solver handing over to Anderson after the ``K`` steps it was
    trained on), ``hyper_anderson_no_tail`` for one fitted with it (the learned update
    at every step).

    Raises:
      ValueError: for a name in ``only`` that is not in the lineup.
    """
    from deq_jax import solvers

    lineup = {
        "anderson": (solvers.anderson(m=5), "zeros"),
        "broyden": (solvers.broyden(), "zeros"),
        "fixed_point_iteration": (solvers.fixed_point_iteration(), "zeros"),
    }
    for name, (solver, init) in hyper.solvers.items():
        lineup[name] = (solver, init or "zeros")
    main, main_init = hyper.solvers["hyper_anderson"]
    if main.anderson_after is None:  # also the hand-over to Anderson past the trained K
        unroll = int(hyper.report["spec"]["unroll_steps"])
        lineup["hyper_anderson_tail"] = (main.replace(anderson_after=unroll), main_init or "zeros")
    else:  # also the learned update past K
        lineup["hyper_anderson_no_tail"] = (main.replace(anderson_after=None), main_init or "zeros")
    if main_init is not None:
        lineup["init_only"] = (solvers.anderson(m=5), main_init)
    unknown = sorted(set(only) - set(lineup))
    if unknown:
        raise ValueError(f"Unknown solvers {unknown}; the lineup: {', '.join(lineup)}.")
    return {name: pair for name, pair in lineup.items() if not only or name in only}


def metric_key(metrics: dict[str, float]) -> tuple[str, bool]:
    """The task metric reported and whether higher is better."""
    for key in ("string_accuracy", "maze_accuracy", "accuracy"):
        if key in metrics:
            return key, True
    for key in ("bpc", "ppl"):
        if key in metrics:
            return key, False
    return "mse", False


def metric_target(key: str, best: float, higher: bool, margin: float = METRIC_MARGIN) -> float:
    """The metric a solver must reach: Anderson's ``best`` less ``margin`` (absolute for
    accuracies and bits per character, relative for mse and perplexity)."""
    if higher:
        return best - margin
    return best + margin if key == "bpc" else best * (1 + margin)


def sweep(
    hyper: Any,
    lineup: dict[str, tuple[Any, Any]],
    split: str,
    budgets: Sequence[int],
    repeats: int,
    max_batches: int,
    batch_size: int,
    cached: dict[str, list[dict[str, float]]] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """``{solver: [row per budget]}`` of the ``lineup`` (`solver_lineup`) with time,
    residual, metric and nstep per row, on ``max_batches`` batches (0: the whole split);
    a solver in ``cached`` (its rows of an earlier sweep) is only timed."""
    from deq_jax.training.families import evaluate, metrics, steps

    deq, frozen = hyper.deq, hyper.frozen
    task, mesh, state = deq.task, deq.mesh, deq.state
    extras = tuple(task.batch_extras)
    batches = list(itertools.islice(task.eval_iterator(split, batch_size), max_batches or None))
    batches = [evaluate.device_batch(b, mesh, extras) for b in batches]
    calls = {}
    for name, (solver, z_init) in lineup.items():
        for budget in budgets:
            model = frozen.with_solver(solver.replace(full_budget=True, max_iter=budget), z_init)
            calls[name, budget] = steps.make_eval_step(
                model,
                task.metrics,
                mesh,
                budget,
                regression=metrics.is_regression(task),
                extras=extras,
            )
    cached = cached or {}
    results = {
        key: metrics.combine_split(task, jax.device_get([fn(state, b) for b in batches]))
        for key, fn in calls.items()
        if key[0] not in cached
    }
    for name, rows in cached.items():
        results.update({(name, r["budget"]): r for r in rows if r["budget"] in budgets})
    times: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
    for _ in range(repeats):  # interleaved, so every solver sees the same load
        for key, fn in calls.items():
            times[key].append(timed(lambda fn=fn: fn(state, batches[0])))
    table: dict[str, list[dict[str, float]]] = {}
    for name, budget in calls:  # the lineup's order
        row = {k: float(v) for k, v in results[name, budget].items()}
        row.update(budget=budget, seconds=float(np.median(times[name, budget])))
        table.setdefault(name, []).append(row)
    return table


def residual_curves(
    hyper: Any, lineup: dict[str, tuple[Any, Any]], split: str, steps_max: int, batch_size: int
) -> dict[str, list]:
    """Mean relative residual after each solver step (Figure 8a), one batch."""
    from deq_jax.nn.intercept import deq_call

    task = hyper.deq.task
    batch = next(iter(task.eval_iterator(split, batch_size)))
    extras = {k: batch[k] for k in task.batch_extras}
    curves = {}
    for name, (solver, z_init) in lineup.items():
        model = hyper.frozen.with_solver(
            solver.replace(full_budget=True, max_iter=steps_max, stop_mode="rel"), z_init
        )
        call = jax.jit(
            lambda v, x, e, model=model: deq_call(model, v, x, max_iter=steps_max, **e).stats.trace
        )
        trace = np.asarray(call(hyper.frozen.variables, batch["inputs"], extras))  # [B, T]
        curves[name] = [float(x) for x in np.mean(trace, axis=0)]
    return curves


def _first(rows: list[dict], ok: Callable[[dict], bool]) -> dict | None:
    """The row of the smallest budget meeting ``ok``: its time is that budget's, not the
    least time of any budget meeting it (on a loaded machine a larger budget can time
    faster, and the least of many noisy times favours the solver with more rows)."""
    good = [r for r in rows if ok(r)]
    return min(good, key=lambda r: r["budget"]) if good else None


def summarize(
    table: dict[str, list[dict]],
    curves: dict[str, list],
    unroll: int,
    margin: float = METRIC_MARGIN,
) -> dict:
    """Time to the residual goal and to Anderson's metric (at its largest budget, less
    ``margin``: `metric_target`), speed-ups, stability past ``K``."""
    key, higher = metric_key(table["anderson"][0])
    best = max(table["anderson"], key=lambda r: r["budget"])[key]
    target = metric_target(key, best, higher, margin)
    meets = (lambda r: r[key] >= target) if higher else (lambda r: r[key] <= target)
    out: dict[str, Any] = {"metric": key, "metric_target": target, "residual_goal": RESIDUAL_GOAL}
    for name, rows in table.items():
        at_res = _first(rows, lambda r: r["rel_residual"] <= RESIDUAL_GOAL)
        at_metric = _first(rows, meets)
        curve = curves.get(name, [])
        out[name] = {
            "seconds_to_residual": at_res and at_res["seconds"],
            "budget_to_residual": at_res and at_res["budget"],
            "seconds_to_metric": at_metric and at_metric["seconds"],
            "budget_to_metric": at_metric and at_metric["budget"],
            "residual_at_K": curve[unroll - 1] if len(curve) >= unroll else None,
            "residual_at_2K": curve[2 * unroll - 1] if len(curve) >= 2 * unroll else None,
            "residual_at_end": curve[-1] if curve else None,
        }
    for name in table:
        for what in ("residual", "metric"):
            mine, ref = out[name][f"seconds_to_{what}"], out["anderson"][f"seconds_to_{what}"]
            out[name][f"speedup_{what}_vs_anderson"] = ref / mine if mine and ref else None
            mine, ref = out[name][f"budget_to_{what}"], out["anderson"][f"budget_to_{what}"]
            out[name][f"evals_ratio_{what}_vs_anderson"] = ref / mine if mine and ref else None
    return out


CLASSIC = ("anderson", "broyden", "fixed_point_iteration")


def reused_rows(path: str, expected: dict[str, Any], names: Sequence[str]) -> dict[str, list]:
    """The classic solvers' rows (of ``names``) of an earlier ``solver_pareto.json``.

    Raises:
      ValueError: if that sweep's DEQ, split, batches or budgets differ from ``expected``.
    """
    with open(path) as f:
        earlier = json.load(f)
    for key, value in expected.items():
        have = earlier.get(key)
        if key == "budgets" and have is not None and set(value) <= set(have):
            continue
        if have != value:
            raise ValueError(f"{path} swept {key}={have!r}, not {value!r}: it cannot be reused.")
    return {n: earlier["table"][n] for n in names if n in CLASSIC and n in earlier["table"]}


def run_pareto(
    config: Any,
    workdir: str,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    repeats: int = 7,
    max_batches: int = 2,
    split: str = "",
    margin: float = METRIC_MARGIN,
    solvers: Sequence[str] = (),
    reuse_classic: str = "",
    emit: Callable[[str], None] = print,
) -> dict:
    """Sweeps the ``solvers`` (every one of `solver_lineup` when empty; the classic ones'
    metrics read from ``reuse_classic``, an earlier report, when given: `reused_rows`),
    summarises, writes ``solver_pareto.json`` and the PNG; returns the report."""
    from deq_jax.training.solver_fit.hypersolver import load_hypersolver, solver_family
    from deq_jax.training.solver_fit.language import LANGUAGE
    from experiments.neural_solver.plots import plot_pareto

    hyper = load_hypersolver(config, workdir, emit)
    if solver_family(config) is LANGUAGE:  # segments streamed with their memory
        seq_len = config.eval.seq_len or config.train.seq_len
        sweep_fn = functools.partial(sweep_lm, seq_len=seq_len)
        curves_fn = functools.partial(residual_curves_lm, seq_len=seq_len)
    else:
        sweep_fn, curves_fn = sweep, residual_curves
    split = split or hyper.deq.task.eval_splits[0]
    unroll = int(hyper.report["spec"]["unroll_steps"])
    batch_size = config.eval.batch_size
    lineup = solver_lineup(hyper, solvers)
    same = {
        "deq_workdir": hyper.report["deq_workdir"],
        "split": split,
        "batch_size": batch_size,
        "max_batches": max_batches,
        "budgets": list(budgets),
    }
    cached = reused_rows(reuse_classic, same, list(lineup)) if reuse_classic else {}
    table = sweep_fn(hyper, lineup, split, budgets, repeats, max_batches, batch_size, cached=cached)
    curves = curves_fn(hyper, lineup, split, max(max(budgets), 4 * unroll), batch_size)
    report = {
        **same,
        "reused_classic": reuse_classic or None,
        "repeats": repeats,
        "devices": jax.device_count(),
        "unroll_steps": unroll,
        "solver_fit": {k: hyper.report[k] for k in ("param_fraction", "time_fraction")},
        "table": table,
        "residual_curves": curves,
        "margin": margin,
        "summary": summarize(table, curves, unroll, margin),
    }
    path = os.path.join(workdir, REPORT_FILE)
    write_json(path, report, indent=2, sort_keys=True)
    figure = plot_pareto(report, os.path.join(workdir, "solver_pareto.png"))
    key = report["summary"]["metric"]
    emit(f"split {split}, {batch_size} examples per batch; seconds per batch (median):")
    for name in table:
        s = report["summary"][name]
        emit(
            f"  {name:22s} to residual {RESIDUAL_GOAL:g}: budget {s['budget_to_residual']}, "
            f"{_fmt(s['seconds_to_residual'])} s (x{_fmt(s['speedup_residual_vs_anderson'])}); "
            f"to {key} {report['summary']['metric_target']:.4f}: budget "
            f"{s['budget_to_metric']}, {_fmt(s['seconds_to_metric'])} s "
            f"(x{_fmt(s['speedup_metric_vs_anderson'])} in time, "
            f"x{_fmt(s['evals_ratio_metric_vs_anderson'])} in evaluations); residual at K/2K/end "
            f"{_fmt(s['residual_at_K'])}/{_fmt(s['residual_at_2K'])}/{_fmt(s['residual_at_end'])}"
        )
    emit(f"Wrote {path} and {figure}")
    return report


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    flag = flags.FLAGS
    run_pareto(
        launch_flags.CONFIG.value,
        launch_flags.WORKDIR.value,
        budgets=[int(b) for b in flag.budgets],
        repeats=flag.repeats,
        max_batches=flag.max_batches,
        split=flag.split,
        margin=flag.margin,
        solvers=flag.solvers,
        reuse_classic=flag.reuse_classic,
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    launch_flags.run(main)
