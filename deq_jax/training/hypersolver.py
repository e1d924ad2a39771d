"""`train_hypersolver(config, workdir)`: a neural solver for a trained DEQ, from a config.

The config is the DEQ's own (task, model, solver, ... sections) plus a ``neural_solver``
section whose ``deq_workdir`` names the trained DEQ's workdir. The run

1. restores the DEQ's latest checkpoint (`deq_jax.training.setup`);
2. solves ``target_batches`` training batches to their fixed points with Anderson run
   long and checks the residual (`collect_targets`);
3. fits the HyperAnderson solver and the initialiser with the DEQ frozen (`fit`) and,
   with ``ablations``, the "no initialiser" and "least-squares alpha + learned beta"
   variants;
4. checkpoints each with orbax (``{workdir}/checkpoints``, ``{workdir}/ablations/<name>``),
   evaluates the model on the eval splits with Anderson and with the trained solver at
   the solver's budget, and writes ``neural_solver.json`` (parameter counts, the fit's
   time against the DEQ's training time, the evaluation).

`load_hypersolver` restores the trained solvers for `launch/solver_pareto.py`. The fit
runs on one device: the solver's network is tiny and its batches are small.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from deq_jax.neural_solver.initializer import LearnedInit
from deq_jax.neural_solver.solver import neural_solver
from deq_jax.neural_solver.state_shape import check_state_shape, state_shape_of
from deq_jax.neural_solver.state_shape import to_json as state_shape_json
from deq_jax.solvers.anderson import anderson
from deq_jax.training.checkpoint import Checkpointer
from deq_jax.training.evaluate import Evaluator, read_train_seconds
from deq_jax.training.frozen_deq import FrozenDEQ
from deq_jax.training.setup import setup
from deq_jax.training.solver_fit import NeuralSolverSpec, SolverFit, collect_targets, fit
from deq_jax.training.writers import write_json

REPORT_FILE = "neural_solver.json"
# The variants a run fits: name -> (alpha_mode, with an initialiser).
VARIANTS = {
    "hyper_anderson": ("learned", True),
    "no_init": ("learned", False),
    "ls_alpha": ("least_squares", True),
}


def variant_dir(workdir: str, name: str) -> str:
    """Where a variant's checkpoints go: the workdir, or ``ablations/<name>`` in it."""
    return workdir if name == "hyper_anderson" else os.path.join(workdir, "ablations", name)


class HyperSolverRun(NamedTuple):
    """A trained DEQ with its fitted solvers.

    Attributes:
      deq: the DEQ's `deq_jax.training.Run` (model, task, restored state, mesh).
      frozen: the `FrozenDEQ` of that model.
      solvers: ``{variant: (neural_solver, LearnedInit or None)}``.
      report: the run's ``neural_solver.json``.
    """

    deq: Any
    frozen: FrozenDEQ
    solvers: dict[str, tuple[neural_solver, LearnedInit | None]]
    report: dict[str, Any]


def restore_frozen(
    config: Any,
    setup_fn: Callable[[Any, str], Any],
    *,
    what: str,
    train_hint: str,
    extras: Callable[[Any], tuple[str, ...]],
    emit: Callable[[str], None] = print,
) -> tuple[Any, FrozenDEQ]:
    """The trained model of ``config.neural_solver.deq_workdir`` and its `FrozenDEQ`.

    The one restore behind `restore_deq` and the language model's `restore_lm`.

    Args:
      config: the run config (the model's own sections plus ``neural_solver``).
      setup_fn: ``(config, workdir) -> run`` that builds the model and restores its
        latest checkpoint (`deq_jax.training.setup` or `setup_language_model`).
      what: the model's name in messages ("DEQ", "language model").
      train_hint: how to train one, for the error messages.
      extras: ``run -> batch keys`` that reach the cell as model keywords.
      emit: where the progress line goes.

    Raises:
      ValueError: if ``deq_workdir`` is empty or holds no checkpoint.
    """
    spec = NeuralSolverSpec.from_run_config(config)
    if not spec.deq_workdir:
        raise ValueError(
            f"Set --config.neural_solver.deq_workdir to the workdir of a trained {what} "
            f"({train_hint})."
        )
    run = setup_fn(config, spec.deq_workdir)
    run.checkpointer.close()
    if run.start_step == 0:
        raise ValueError(
            f"No checkpoint in {spec.deq_workdir}: train the {what} there first ({train_hint}), "
            "then point neural_solver.deq_workdir at its workdir."
        )
    emit(f"restored the {what} at step {run.start_step} from {spec.deq_workdir}")
    variables = jax.device_get(run.state.variables())
    frozen = FrozenDEQ(run.model, variables, target_solver=spec.target_solver(), extras=extras(run))
    return run, frozen


def restore_deq(config: Any, emit: Callable[[str], None] = print) -> tuple[Any, FrozenDEQ]:
    """The trained DEQ of ``config.neural_solver.deq_workdir`` and its `FrozenDEQ`
    (`restore_frozen` with `deq_jax.training.setup`).

    Raises:
      ValueError: if ``deq_workdir`` is empty or holds no checkpoint.
    """
    return restore_frozen(
        config,
        setup,
        what="DEQ",
        train_hint="python -m launch.main --config configs/<task>.py --workdir DIR, "
        "without the neural_solver section",
        extras=lambda run: run.task.batch_extras,
        emit=emit,
    )


def count_params(tree: Any) -> int:
    """The number of entries of every array in ``tree``."""
    return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(tree)))


def save_fit(directory: str, step: int, fitted: SolverFit) -> None:
    """Checkpoints a fitted solver (and initialiser) into ``directory`` at ``step``."""
    tree = {"solver": fitted.solver.variables}
    if fitted.init is not None:
        tree["init"] = fitted.init.params.tree
    ckpt = Checkpointer(directory, every_steps=1, keep=1)
    ckpt.maybe_save(step, tree, force=True)
    ckpt.close()


def _evaluate(config: Any, deq: Any, frozen: FrozenDEQ, fitted: SolverFit) -> dict:
    """Eval-split metrics with Anderson and with the fitted solver, at ``spec.max_iter``
    (``eval.batch_size`` and ``eval.max_batches`` of the config)."""
    spec = NeuralSolverSpec.from_run_config(config)
    models = {
        "anderson": frozen.with_solver(anderson(tol=spec.tol, max_iter=spec.max_iter)),
        "neural": frozen.with_solver(fitted.solver, fitted.init or "keep"),
    }
    out = {}
    for name, model in models.items():
        evaluator = Evaluator(
            model, deq.task, deq.mesh, config.eval.batch_size, config.eval.max_batches
        )
        out[name] = evaluator.evaluate_splits(deq.state, deq.task.eval_splits, spec.max_iter)
    return jax.tree_util.tree_map(float, out)


def fit_variants(
    spec: NeuralSolverSpec,
    frozen: FrozenDEQ,
    pool: list,
    workdir: str,
    emit: Callable[[str], None],
) -> dict[str, SolverFit]:
    """Fits the solver (and, with ``spec.ablations``, its `VARIANTS`) on ``pool`` and
    checkpoints each under `variant_dir`."""
    names = list(VARIANTS) if spec.ablations else ["hyper_anderson"]
    fits: dict[str, SolverFit] = {}
    for name in names:
        alpha_mode, use_init = VARIANTS[name]
        fits[name] = fit(
            spec,
            frozen,
            pool,
            num_steps=spec.train_steps,
            alpha_mode=alpha_mode,
            use_init=use_init,
            emit=emit,
        )
        losses = fits[name].losses
        emit(
            f"{name}: {spec.train_steps} steps in {fits[name].seconds:.1f} s, loss "
            f"{losses[0]:.4g} -> {np.mean(losses[-10:]):.4g}"
        )
        save_fit(variant_dir(workdir, name), spec.train_steps, fits[name])
    return fits


def fit_report(
    spec: NeuralSolverSpec,
    pool: list,
    fits: dict[str, SolverFit],
    *,
    deq_params: int,
    target_seconds: float,
    deq_seconds: float | None,
    evaluation: dict,
) -> dict[str, Any]:
    """The ``neural_solver.json`` of a fit: shapes, sizes, times and ``evaluation``."""
    main = fits["hyper_anderson"]
    solver_params = main.solver.params.size + (main.init.params.size if main.init else 0)
    fit_seconds = target_seconds + main.seconds
    return {
        "deq_workdir": spec.deq_workdir,
        "state_shape": state_shape_json(state_shape_of(pool[0].z_star)),
        "input_shape": list(pool[0].x.shape[1:]),
        "spec": dict(vars(spec)),
        "deq_params": deq_params,
        "solver_params": solver_params,
        "param_fraction": solver_params / deq_params,
        "target_seconds": target_seconds,
        "fit_seconds": {name: f.seconds for name, f in fits.items()},
        "deq_train_seconds": deq_seconds,
        "time_fraction": None if not deq_seconds else fit_seconds / deq_seconds,
        "final_loss": {name: float(np.mean(f.losses[-10:])) for name, f in fits.items()},
        "eval": evaluation,
    }


def fit_and_report(
    spec: NeuralSolverSpec,
    frozen: FrozenDEQ,
    batches: Iterator[Any],
    workdir: str,
    *,
    deq_params: int,
    deq_seconds: float | None,
    evaluate: Callable[[SolverFit], dict],
    what: str = "DEQ",
    emit: Callable[[str], None] = print,
) -> tuple[dict[str, SolverFit], dict[str, Any]]:
    """Stages 2-4 of a solver fit, for any frozen model: the fixed points of
    ``spec.target_batches`` of ``batches`` (`collect_targets`), the variants
    (`fit_variants`), ``evaluate`` of the main fit, and ``{workdir}/neural_solver.json``
    (`fit_report`); emits the size and time line, with ``what`` naming the model.

    Returns:
      ``(fits, report)``.
    """
    began = time.perf_counter()
    pool = collect_targets(frozen, batches, spec.target_batches, spec.max_target_residual, emit)
    target_seconds = time.perf_counter() - began
    fits = fit_variants(spec, frozen, pool, workdir, emit)
    main = fits["hyper_anderson"]
    report = fit_report(
        spec,
        pool,
        fits,
        deq_params=deq_params,
        target_seconds=target_seconds,
        deq_seconds=deq_seconds,
        evaluation=evaluate(main),
    )
    write_json(os.path.join(workdir, REPORT_FILE), report, indent=2, sort_keys=True)
    fit_seconds = target_seconds + main.seconds
    share = (
        f" ({100 * report['time_fraction']:.1f}% of the {what}'s training)" if deq_seconds else ""
    )
    emit(
        f"solver: {report['solver_params']} parameters ({100 * report['param_fraction']:.2f}% "
        f"of the {what}'s {deq_params}); fit {fit_seconds:.1f} s{share}"
    )
    return fits, report


def train_hypersolver(
    config: Any, workdir: str, *, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Fits a neural solver (and its ablations) to the DEQ of ``neural_solver.deq_workdir``.

    Args:
      config: the DEQ's config with a ``neural_solver`` section (see
        ``configs/default.py`` and ``configs/prefix_sum_hypersolver.py``).
      workdir: where the solver's checkpoints and ``neural_solver.json`` go.
      emit: receives every human-readable line.

    Returns:
      A `HyperSolverRun`.

    Raises:
      ValueError: if the DEQ's workdir has no checkpoint, or the DEQ does not converge
        well enough to give fixed points (see `collect_targets`).
    """
    spec = NeuralSolverSpec.from_run_config(config)
    os.makedirs(workdir, exist_ok=True)
    deq, frozen = restore_deq(config, emit)
    fits, report = fit_and_report(
        spec,
        frozen,
        deq.task.train_iterator(spec.batch_size, seed=spec.seed + 1),
        workdir,
        deq_params=count_params(deq.state.params),
        deq_seconds=read_train_seconds(spec.deq_workdir),
        evaluate=lambda main: _evaluate(config, deq, frozen, main),
        emit=emit,
    )
    for name, by_split in report["eval"].items():
        for split, metrics in by_split.items():
            shown = {k: v for k, v in metrics.items() if k.endswith("accuracy") or k == "mse"}
            shown["nstep_mean"] = metrics["nstep_mean"]
            emit(f"eval {name} {split}: " + "  ".join(f"{k} {v:.4f}" for k, v in shown.items()))
    emit(f"Wrote {os.path.join(workdir, REPORT_FILE)}")
    solvers = {name: (f.solver, f.init) for name, f in fits.items()}
    return HyperSolverRun(deq, frozen, solvers, report)


def load_hypersolver(
    config: Any, workdir: str, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Restores the solvers `train_hypersolver` wrote to ``workdir`` (and their DEQ).

    Raises:
      FileNotFoundError: if ``workdir`` holds no ``neural_solver.json``.
    """
    report = read_solver_report(workdir)
    deq, frozen = restore_deq(config, emit)
    return HyperSolverRun(deq, frozen, restore_solvers(report, workdir), report)


def read_solver_report(workdir: str) -> dict[str, Any]:
    """The ``neural_solver.json`` a solver fit wrote to ``workdir``.

    Raises:
      FileNotFoundError: if there is none (no solver was fitted there).
    """
    path = os.path.join(workdir, REPORT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No {REPORT_FILE} in {workdir}: fit a solver there first "
            "(python -m launch.main with a *_hypersolver config and this --workdir)."
        )
    with open(path) as f:
        return json.load(f)


def restore_solvers(
    report: dict[str, Any], workdir: str
) -> dict[str, tuple[neural_solver, LearnedInit | None]]:
    """The fitted variants a solver run's ``workdir`` holds, from its report
    (``neural_solver.json``: the spec, the state and input shapes)."""
    spec = NeuralSolverSpec.from_config(report["spec"])
    state_shape = check_state_shape(report["state_shape"])
    key = jax.random.PRNGKey(0)
    solvers = {}
    for name, (alpha_mode, use_init) in VARIANTS.items():
        directory = variant_dir(workdir, name)
        if not os.path.isdir(os.path.join(directory, "checkpoints")):
            continue
        solver = spec.untrained_solver(key, state_shape, alpha_mode)
        template = {"solver": solver.variables}
        if use_init:
            x = np.zeros((1, *report["input_shape"]), np.float32)
            template["init"] = spec.initializer(state_shape).init(key, x)
        ckpt = Checkpointer(directory, every_steps=1, keep=1)
        tree, _ = ckpt.restore_or_init(template)
        ckpt.close()
        init = spec.learned_init(state_shape, tree["init"]) if use_init else None
        solvers[name] = (solver.with_params(tree["solver"]), init)
    return solvers
