"""The Jacobian-regularisation report: synthetic 1-D and digits runs over gamma.

Trains (or, when a run's workdir already holds its final checkpoint, loads) one run per
Jacobian weight ``gamma``, scores each at its best checkpoint on validation
(`deq_jax.training.run.selection`; ``scored_step`` in the JSON) and writes
``{workdir}/jacobian_report.json`` and PNG figures:

* ``synthetic_1d``: validation MSE, mean Anderson steps to relative residual 1e-3 and
  the spectral radius for each gamma, over the train seeds ``--seeds`` (mean, standard
  deviation: `launch.seeds.mean_std`, and the issue's goal on the medians: ``goal``);
  the learned map as ``f(z; x) - z`` over a z-grid for a few ``x``
  (``synthetic_surface.png``) and the mean relative residual per iteration over the
  validation set (``synthetic_convergence.png``), as in Figure 5 of Bai et al. (the
  first seed), and MSE against steps for every seed (``synthetic_seeds.png``).
* ``digits``: test accuracy at inference budgets of 1..8 function evaluations and the
  steps to relative residual 1e-3 for each gamma (``digits_budget.png``), as in their
  Table 3, with the "best" regularised gamma (fewest steps within one point of the
  unregularised accuracy, else the most accurate).
* the spectral radius of ``J_f(z*)`` over training for both (``spectral_radius.png``)
  and the cost of the regulariser: the median train-step time with ``p = 1`` over the
  median without it (``step_time``), at the parameters of the least and the most
  regularised run of each task (the solver's work, and so the cost, depends on them).

Usage::

    python -m experiments.jacobian.report --workdir /tmp/jacobian_report \\
        --gammas=0,1,2,4 --digits_gammas=0,1,2,5 --synthetic_steps=80000 --digits_steps=1000 \\
        --seeds=0,1,2

``--synthetic_seeds=N`` is ``--seeds=0,...,N-1`` (the older spelling).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from launch import flags as launch_flags
from launch import seeds as seed_stats
from launch.runs import best_run, trained_run, write_report


def define_flags() -> None:
    """Defines this program's flags (``--workdir`` comes from `launch.main`); in a
    function, so importing the module next to another report defines nothing."""
    flags.DEFINE_list("gammas", ["0", "1", "2", "4"], "Jacobian weights, synthetic_1d.")
    flags.DEFINE_list("digits_gammas", ["0", "1", "2", "5"], "Jacobian weights, digits.")
    flags.DEFINE_integer("synthetic_steps", 80_000, "Train steps per synthetic run.")
    flags.DEFINE_list("seeds", [], "Train seeds of the synthetic runs, e.g. 0,1,2 (default 0).")
    flags.DEFINE_integer("synthetic_seeds", 0, "N: the same as --seeds=0,...,N-1.")
    flags.DEFINE_integer("digits_steps", 1_000, "Train steps per digits run.")
    flags.DEFINE_float("digits_freq", 1.0, "Jacobian frequency p of digits runs.")
    flags.DEFINE_integer("timing_steps", 20, "Timed train steps per variant.")
    flags.DEFINE_boolean("smoke", False, "Tiny runs (the configs' smoke variants).")


REPORT_FILE = "jacobian_report.json"
NFE_BUDGETS = tuple(range(1, 9))
SURFACE_XS = (-2.0, -1.0, 0.0, 1.0, 2.0)


def spectral_history(workdir: str) -> list[tuple[int, float]]:
    """``[(step, spectral radius)]`` of the train records of ``metrics.jsonl``."""
    from deq_jax.training import read_metrics

    return [
        (r["step"], r["spectral_radius"])
        for r in read_metrics(workdir)
        if r["split"] == "train" and "spectral_radius" in r
    ]


def convergence_trace(run: Any, split: str, max_iter: int) -> np.ndarray:
    """Mean relative residual after each of ``max_iter`` evaluations over ``split``.

    The solver runs its whole budget (``full_budget``) on every sample.
    """
    spec = run.model.deq
    model = run.model.clone(
        deq=spec.replace(solver=spec.solver.replace(full_budget=True, stop_mode="rel"))
    )
    inputs = jnp.asarray(run.task.arrays(split)["inputs"])  # [N, 1]
    apply = jax.jit(lambda v, x: model.apply(v, x, train=False, max_iter=max_iter)[1].trace)
    return np.asarray(jnp.mean(apply(run.state.variables(), inputs), axis=0))  # [max_iter]


def synthetic_surface(run: Any, z_grid: np.ndarray) -> dict[str, list[float]]:
    """``f(z; x) - z`` of the learned cell over ``z_grid`` for each ``x`` in `SURFACE_XS`."""
    from deq_jax.models.synthetic import ScalarReLUCell

    cell = ScalarReLUCell(run.model.hidden)
    variables = {"params": run.state.params["cell"]}
    z = jnp.asarray(z_grid, jnp.float32)[:, None]  # [G, 1]
    out = {}
    for x in SURFACE_XS:
        fz = cell.apply(variables, z, jnp.full_like(z, x))  # [G, 1]
        out[f"{x:g}"] = np.asarray(fz - z)[:, 0].tolist()
    return out


def step_time(run: Any, config: Any, steps: int) -> dict[str, float]:
    """Median train-step seconds with the regulariser at ``p = 1`` and without it.

    Each variant is compiled and run twice before ``steps`` timed steps on one batch.
    """
    from deq_jax.training import JacobianRegularizer, make_train_step
    from deq_jax.training.families.evaluate import device_batch
    from deq_jax.training.families.metrics import is_regression
    from deq_jax.training.run import sharding

    batch = device_batch(next(run.task.train_iterator(config.train.batch_size, seed=0)), run.mesh)
    section = config.regularizer.to_dict()
    section.update(jacobian_freq=1.0, jacobian_weight=max(section["jacobian_weight"], 1.0))
    variants = {"off": JacobianRegularizer(), "p1": JacobianRegularizer.from_config(section)}
    medians = {}
    for name, reg in variants.items():
        step = make_train_step(
            run.model,
            run.task.metrics,
            run.schedule,
            run.mesh,
            regression=is_regression(run.task),
            regularizer=reg,
        )
        state = sharding.replicate(jax.device_get(run.state), run.mesh)
        times = []
        for i in range(steps + 2):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            if i >= 2:
                times.append(time.perf_counter() - start)
        medians[f"{name}_seconds"] = float(np.median(times))
    medians["ratio"] = medians["p1_seconds"] / medians["off_seconds"]
    return medians


def _eval_summary(run: Any, split: str) -> dict[str, float]:
    from deq_jax.training import Evaluator

    metrics = Evaluator(run.model, run.task, run.mesh, 500).evaluate(run.state, split)
    keep = ("mse", "accuracy", "nstep_mean", "rel_residual", "converged")
    return {k: v for k, v in metrics.items() if k in keep}


def _with_gamma(config: Any, gamma: float) -> Any:
    config = config.copy_and_resolve_references()
    config.regularizer.jacobian_weight = float(gamma)
    return config


def _seed_config(config: Any, gamma: float, seed: int) -> Any:
    config = _with_gamma(config, gamma)
    config.train.seed = int(seed)
    return config


def synthetic_workdir(root: str, gamma: float, seed: int = 0) -> str:
    """A synthetic run's workdir; seed 0 keeps the single-seed report's name."""
    suffix = f"_seed{seed}" if seed else ""
    return os.path.join(root, f"synthetic_1d_gamma{gamma:g}{suffix}")


def seed_statistics(per_seed: Sequence[dict[str, float]]) -> dict[str, float]:
    """Median, mean and standard deviation (`launch.seeds.mean_std`) over seeds of
    ``mse`` and ``nstep_mean``."""
    out = {}
    for key in ("mse", "nstep_mean"):
        values = [s[key] for s in per_seed]
        stats = seed_stats.mean_std(values)
        out[f"{key}_seed_median"] = float(np.median(np.asarray(values, float)))
        out[f"{key}_seed_mean"] = stats["mean"]
        out[f"{key}_seed_std"] = stats["std"]
    return out


def synthetic_goal(section: dict[str, Any], gammas: Sequence[float]) -> dict[str, Any] | None:
    """The issue's goal, largest gamma against gamma = 0, on the medians over seeds.

    ``steps_ratio`` (goal <= 0.4) and ``mse_ratio`` (goal <= 1.1), plus the same ratios
    seed by seed (runs of equal seed paired); ``None`` without both gammas. Medians,
    because an unregularised seed can diverge (the instability the paper is about) and
    its MSE would swamp a mean.
    """
    top = max(gammas)
    if 0.0 not in gammas or top <= 0:
        return None
    base, reg = section["0"], section[f"{top:g}"]
    pairs = list(zip(base["seeds"], reg["seeds"], strict=True))
    steps = reg["nstep_mean_seed_median"] / base["nstep_mean_seed_median"]
    mse = reg["mse_seed_median"] / base["mse_seed_median"]
    return {
        "gamma": f"{top:g}",
        "seeds": len(pairs),
        "steps_ratio": steps,
        "mse_ratio": mse,
        "met": bool(steps <= 0.4 and mse <= 1.1),
        "steps_ratio_per_seed": [r["nstep_mean"] / b["nstep_mean"] for b, r in pairs],
        "mse_ratio_per_seed": [r["mse"] / b["mse"] for b, r in pairs],
    }


def synthetic_section(
    base: Any, root: str, gammas: Sequence[float], emit, seeds: int | Sequence[int] = 1
) -> dict[str, Any]:
    """Trains/loads the synthetic runs per gamma and seed and measures them.

    ``seeds`` are the train seeds (``train.seed``: initialisation and batch order, the
    data stay fixed), or their number N for 0..N-1. The first seed of each gamma gives
    the figures (surface, convergence, spectral radius over training); every seed gives
    validation MSE and steps at its best checkpoint, summarised in ``*_seed_median``,
    ``*_seed_mean`` and ``*_seed_std``.
    """
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    out: dict[str, Any] = {}
    z_grid = np.linspace(-8.0, 8.0, 161)
    for gamma in gammas:
        per_seed = []
        for seed in seeds:
            workdir = synthetic_workdir(root, gamma, seed)
            run, step, _ = best_run(_seed_config(base, gamma, seed), workdir)
            summary = _eval_summary(run, "validation")
            rho = spectral_history(workdir)
            final = rho[-1][1] if rho else None
            per_seed.append(
                dict(seed=seed, **summary, scored_step=step, spectral_radius_final=final)
            )
            if seed == seeds[0]:
                out[f"{gamma:g}"] = {
                    **summary,
                    "spectral_radius_final": per_seed[0]["spectral_radius_final"],
                    "spectral_radius": rho,
                    "convergence": convergence_trace(run, "validation", 30).tolist(),
                    "surface": synthetic_surface(run, z_grid),
                }
            emit(
                f"synthetic_1d gamma={gamma:g} seed={seed}: validation mse "
                f"{summary['mse']:.5f}, Anderson steps to rel. residual 1e-3 "
                f"{summary['nstep_mean']:.2f}, spectral radius "
                f"{per_seed[-1]['spectral_radius_final']}"
            )
        entry = out[f"{gamma:g}"]
        entry["seeds"] = per_seed
        entry.update(seed_statistics(per_seed))
        if len(seeds) > 1:
            emit(
                f"synthetic_1d gamma={gamma:g} over {len(seeds)} seeds: median mse "
                f"{entry['mse_seed_median']:.5f}, median steps "
                f"{entry['nstep_mean_seed_median']:.2f} (means {entry['mse_seed_mean']:.5g}, "
                f"{entry['nstep_mean_seed_mean']:.2f})"
            )
    out["z_grid"] = z_grid.tolist()
    goal = synthetic_goal(out, gammas)
    if goal is not None:
        out["goal"] = goal
        emit(
            f"synthetic_1d goal (gamma={goal['gamma']} vs 0, medians over {goal['seeds']} "
            f"seed(s)): steps ratio {goal['steps_ratio']:.3f} (goal <= 0.4), mse ratio "
            f"{goal['mse_ratio']:.3f} (goal <= 1.1): {'met' if goal['met'] else 'not met'}"
        )
    return out


def digits_section(base: Any, root: str, gammas: Sequence[float], emit) -> dict[str, Any]:
    """Trains/loads one digits run per gamma; accuracy at NFE 1..8 and steps to 1e-3."""
    from deq_jax.training import Evaluator

    out: dict[str, Any] = {}
    for gamma in gammas:
        workdir = os.path.join(root, f"digits_gamma{gamma:g}")
        run, step, _ = best_run(_with_gamma(base, gamma), workdir)
        evaluator = Evaluator(run.model, run.task, run.mesh, base.eval.batch_size)
        budget = {k: evaluator.evaluate(run.state, "test", k)["accuracy"] for k in NFE_BUDGETS}
        summary = _eval_summary(run, "test")
        rho = spectral_history(workdir)
        out[f"{gamma:g}"] = {
            **summary,
            "accuracy_at_nfe": {str(k): v for k, v in budget.items()},
            "scored_step": step,
            "spectral_radius_final": rho[-1][1] if rho else None,
            "spectral_radius": rho,
        }
        emit(
            f"digits gamma={gamma:g}: test accuracy {summary['accuracy']:.4f}, Anderson steps "
            f"to rel. residual 1e-3 {summary['nstep_mean']:.2f}, accuracy at NFE 1..8 "
            + " ".join(f"{v:.3f}" for v in budget.values())
            + f", spectral radius {out[f'{gamma:g}']['spectral_radius_final']}"
        )
    out["best_gamma"] = best_gamma(out, gammas)
    return out


def best_gamma(results: dict[str, Any], gammas: Sequence[float]) -> str | None:
    """The regularised gamma with the fewest steps within 1 point of gamma = 0's
    accuracy, else the most accurate one; ``None`` without a regularised run."""
    others = [f"{g:g}" for g in gammas if g > 0]
    if not others:
        return None
    base = results.get("0", {}).get("accuracy", 0.0)
    close = [g for g in others if results[g]["accuracy"] >= base - 0.01]
    if close:
        return min(close, key=lambda g: results[g]["nstep_mean"])
    return max(others, key=lambda g: results[g]["accuracy"])


def run_report(
    workdir: str,
    *,
    synthetic_config: Any,
    digits_config: Any,
    gammas: Sequence[float],
    digits_gammas: Sequence[float],
    timing_steps: int,
    synthetic_seeds: int | Sequence[int] = 1,
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs every part of the report and writes the JSON and the PNGs into ``workdir``.

    Returns:
      The report (what ``jacobian_report.json`` holds).
    """
    from experiments.jacobian import plots as jacobian_plots

    os.makedirs(workdir, exist_ok=True)
    report: dict[str, Any] = {
        "synthetic_1d": synthetic_section(
            synthetic_config, workdir, gammas, emit, seeds=synthetic_seeds
        ),
        "digits": digits_section(digits_config, workdir, digits_gammas, emit),
    }
    report["step_time"] = {}
    for task, config, task_gammas in (
        ("synthetic_1d", synthetic_config, gammas),
        ("digits", digits_config, digits_gammas),
    ):
        for gamma in sorted({min(task_gammas), max(task_gammas)}):
            name = f"{task}_gamma{gamma:g}"
            timing_config = _with_gamma(config, gamma)
            run = trained_run(timing_config, os.path.join(workdir, name))
            t = report["step_time"][name] = step_time(run, timing_config, timing_steps)
            emit(
                f"{name} train step: {1e3 * t['off_seconds']:.2f} ms without the regulariser, "
                f"{1e3 * t['p1_seconds']:.2f} ms with p=1 (ratio {t['ratio']:.2f})"
            )
    write_report(os.path.join(workdir, REPORT_FILE), report, emit=emit)  # before the plots
    for png in jacobian_plots.plot_all(report, workdir):
        emit(f"Wrote {png}")
    return report


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    from configs import digits, synthetic_1d

    launch_flags.quiet_library_logs()
    flag = flags.FLAGS
    variant = "smoke" if flag.smoke else None
    syn, dig = synthetic_1d.get_config(variant), digits.get_config(variant)
    if not flag.smoke:
        syn.train.steps, dig.train.steps = flag.synthetic_steps, flag.digits_steps
    dig.regularizer.jacobian_freq = flag.digits_freq
    run_report(
        launch_flags.WORKDIR.value,
        synthetic_config=syn,
        digits_config=dig,
        gammas=[float(g) for g in flag.gammas],
        digits_gammas=[float(g) for g in flag.digits_gammas],
        timing_steps=flag.timing_steps,
        synthetic_seeds=seed_stats.seeds_or_count(flag.seeds, flag.synthetic_seeds),
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["workdir"])  # --workdir is launch.main's flag
    app.run(main)
