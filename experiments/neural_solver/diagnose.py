"""Where the fit's objective puts its weight, and where the fitted solver stops improving.

For a solver fitted by ``launch.main`` with a ``*_hypersolver`` config, unrolls the fitted
HyperAnderson and Anderson from the same start ``h_phi(x)`` (and Anderson from zero) for
``2K`` steps, on the first batches the fit itself trained on and on held-out batches of
an eval split, and prints per step:

* the mean relative error ``||z_k - z*|| / ||z*||`` of each solver, on both;
* each trained step's share of the fit's weighted convergence loss
  (``w_k e_k / sum_j w_j e_j``, with the fit's error measure), on the fit's batches;
* the learned solver's mean ``beta_k`` and a summary of ``alpha_k``: the weight on the
  newest image, the largest ``|alpha|`` and the negative mass.

How to read it: an objective that stops teaching the tail puts its shares in the first
steps while the learned error flattens past them on the fit's own batches too; a solver
that does not generalise falls on the fit's batches but not on the held-out ones.
Writes ``diagnose.json`` and ``diagnose.png`` in the solver's workdir::

    python -m experiments.neural_solver.diagnose --config configs/prefix_sum_hypersolver.py \\
        --workdir /tmp/ps_solver --config.neural_solver.deq_workdir=/tmp/ps --batches=4

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.2, Fig. 8a).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from deq_jax import _flat
from deq_jax.analysis.trajectory import solver_trajectory
from deq_jax.neural_solver.loss import step_errors, step_weights, unroll
from deq_jax.solvers.anderson import anderson
from deq_jax.training.run.writers import write_json
from deq_jax.training.solver_fit.hypersolver import load_hypersolver, solver_family
from deq_jax.training.solver_fit.spec import NeuralSolverSpec
from experiments.neural_solver.plots import plot_diagnosis
from launch import flags as launch_flags

REPORT_FILE = "diagnose.json"


def define_flags() -> None:
    """This program's flags (``--config`` and ``--workdir`` come from `launch.main`)."""
    flags.DEFINE_integer("batches", 4, "Batches of the fit's own and of held-out data.")
    flags.DEFINE_integer("steps", 0, "Steps to unroll (0: twice the fit's K).")
    flags.DEFINE_string("split", "", "Held-out eval split (empty: the family's default).")


def batch_curves(hyper: Any, steps: int, error: str) -> Callable[[Any], dict[str, np.ndarray]]:
    """``targets -> curves`` for one batch of `Targets` (jitted once): per step
    ``0..steps`` the mean relative error of each solver, and per step ``1..steps`` the
    learned steps' mean fit error ``e_k`` (``error``), beta and a summary of alpha."""
    solver, init = hyper.solvers["hyper_anderson"]
    classic = anderson(m=solver.m)

    @jax.jit
    def curves(args, x, z_star):
        z0 = init(x) if init is not None else jax.tree_util.tree_map(jnp.zeros_like, z_star)
        layout = _flat.layout_of(z_star, batched=True)
        fn = _flat.flat_fn(hyper.frozen.f, layout, args)
        target, start = _flat.flatten(z_star, layout), _flat.flatten(z0, layout)
        norm = jnp.linalg.norm(target, axis=-1)
        rel_error = lambda z, fz: jnp.linalg.norm(z - target, axis=-1) / norm
        run = lambda method, z: jnp.mean(
            solver_trajectory(
                lambda z_, _: fn(z_), z, None, solver=method, observe=rel_error, steps=steps + 1
            ),
            axis=0,
        )
        out = {
            "hyper_anderson": run(solver, start),
            "anderson_from_init": run(classic, start),
            "anderson_from_zero": run(classic, jnp.zeros_like(start)),
        }
        learned = unroll(solver, solver.variables, fn, start, steps)
        out["fit_error"] = jnp.mean(step_errors(learned.zs, target, error), axis=-1)
        alphas = learned.alphas  # [steps, B, m + 1] in ring order
        newest = (jnp.arange(1, steps + 1) - 1) % alphas.shape[-1]  # the newest image's slot
        on_newest = jnp.take_along_axis(alphas, newest[:, None, None], axis=-1)[..., 0]
        out["beta"] = jnp.mean(learned.betas, axis=-1)
        out["alpha_newest"] = jnp.mean(on_newest, axis=-1)
        out["alpha_max_abs"] = jnp.mean(jnp.max(jnp.abs(alphas), axis=-1), axis=-1)
        out["alpha_negative_mass"] = jnp.mean(jnp.sum(jnp.minimum(alphas, 0.0), axis=-1), axis=-1)
        return out

    return lambda t: jax.tree_util.tree_map(np.asarray, curves(t.args, t.x, t.z_star))


def _mean(curves: list[dict[str, np.ndarray]]) -> dict[str, list[float]]:
    return {k: [float(v) for v in np.mean([c[k] for c in curves], axis=0)] for k in curves[0]}


def loss_shares(
    fit_error: Sequence[float], unroll_steps: int, error: str = "absolute"
) -> list[float]:
    """Each trained step's share of the weighted convergence loss ``sum_k w_k e_k``; for
    the ``"log"`` error, ``sum_k w_k log e_k``, where a step's share of a tenfold
    reduction is its weight ``w_k`` whatever its error."""
    weights = np.asarray(step_weights(unroll_steps))
    if error == "log":
        return [float(x) for x in weights]
    weighted = weights * np.asarray(fit_error[:unroll_steps])
    return [float(x) for x in weighted / weighted.sum()]


def diagnose(
    config: Any,
    workdir: str,
    *,
    batches: int = 4,
    steps: int = 0,
    split: str = "",
    emit: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The report (see the module docstring); also printed through ``emit``."""
    hyper = load_hypersolver(config, workdir, emit)
    spec = NeuralSolverSpec.from_config(hyper.report["spec"])
    family = solver_family(config)
    unroll_steps = spec.unroll_steps
    steps = steps or 2 * unroll_steps
    run, frozen = hyper.deq, hyper.frozen
    sources = {
        "fit": spec.targets(frozen, family.batches(config, run, frozen.variables, spec)),
        "held_out": map(
            frozen.targets, family.held_out(config, run, frozen.variables, spec, split)
        ),
    }
    report: dict[str, Any] = {"unroll_steps": unroll_steps, "steps": steps, "error": spec.error}
    curves = batch_curves(hyper, steps, spec.error)
    for name, source in sources.items():
        chosen = list(itertools.islice(source, batches))
        report[name] = _mean([curves(t) for t in chosen])
        report[name]["examples"] = sum(int(np.size(t.rel_residual)) for t in chosen)
    report["fit"]["loss_share"] = loss_shares(report["fit"]["fit_error"], unroll_steps, spec.error)
    for line in _table(report):
        emit(line)
    path = os.path.join(workdir, REPORT_FILE)
    write_json(path, report, indent=2, sort_keys=True)
    emit(f"Wrote {path} and {plot_diagnosis(report, os.path.join(workdir, 'diagnose.png'))}")
    return report


def _table(report: dict[str, Any]) -> list[str]:
    """The per-step lines: relative errors (fit / held-out), loss share, beta, alpha."""
    fit, held, k_fit = report["fit"], report["held_out"], report["unroll_steps"]
    lines = [
        f"{fit['examples']} examples of the fit's batches, {held['examples']} held out; "
        f"relative error ||z_k - z*|| / ||z*|| (fit / held-out); K = {k_fit}",
        "step  hyper_anderson        anderson from h(x)    anderson from 0       "
        "loss share  beta   alpha: newest  max|a|  neg. mass",
    ]
    for k in range(report["steps"] + 1):
        cells = [
            f"{fit[name][k]:.2e} / {held[name][k]:.2e}"
            for name in ("hyper_anderson", "anderson_from_init", "anderson_from_zero")
        ]
        extra = ""
        if k >= 1:
            share = f"{100 * fit['loss_share'][k - 1]:9.2f}%" if k <= k_fit else " " * 10
            i = k - 1
            extra = (
                f"  {share}  {fit['beta'][i]:.3f}  {fit['alpha_newest'][i]:+.3f}  "
                f"{fit['alpha_max_abs'][i]:.3f}  {fit['alpha_negative_mass'][i]:+.3f}"
            )
        lines.append(f"{k:4d}  " + "  ".join(cells) + extra)
    last = report["steps"]
    tail = sum(fit["loss_share"][k_fit // 2 :])
    lines.append(
        f"steps {k_fit // 2 + 1}..{k_fit} carry {100 * tail:.1f}% of the loss; at step {last} "
        f"the learned error is {fit['hyper_anderson'][last]:.2e} (fit) / "
        f"{held['hyper_anderson'][last]:.2e} (held out), Anderson from h(x) "
        f"{fit['anderson_from_init'][last]:.2e} / {held['anderson_from_init'][last]:.2e}"
    )
    return lines


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    flag = flags.FLAGS
    diagnose(
        launch_flags.CONFIG.value,
        launch_flags.WORKDIR.value,
        batches=flag.batches,
        steps=flag.steps,
        split=flag.split,
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    define_flags()
    launch_flags.run(main)
