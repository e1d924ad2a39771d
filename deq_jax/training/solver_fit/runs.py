"""One neural-solver fit for every model family: `fit_solvers` and `load_solvers`.

A family (the task models, the language model) says what differs through a small
`SolverFamily`: how its trained model is restored, which batches reach the frozen DEQ
(for the language model, training segments with their memory), how one model is scored,
and how the comparison reads. The run itself is the same for all:

1. restore the trained model of ``neural_solver.deq_workdir`` and freeze its DEQ
   (`restore_frozen`, `deq_jax.training.FrozenDEQ`);
2. fit HyperAnderson and the initialiser with the model frozen and, with ``ablations``,
   the `VARIANTS` "no initialiser" and "least-squares alpha + learned beta"
   (`fit_variants`), each on batches solved to their fixed points by Anderson run long,
   a fresh batch a step (or a pool cycled), their residual checked
   (`deq_jax.training.solver_fit.targets.TargetStream`), each checkpointed with orbax
   (`save_fit`; ``{workdir}/checkpoints``, ``{workdir}/ablations/<name>``);
3. score the model with Anderson and with the fitted solver at the solver's budget
   (`compare`) and write ``neural_solver.json`` (`fit_report`: parameter counts, the
   fit's cost, its target solves included, against the model's training time, the
   targets' residual, the comparison).

`load_solvers` restores the fitted solvers for the solver sweeps. The fit runs on one
device: the solver's network is tiny and its batches are small.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import linen as nn

from deq_jax.neural_solver.initializer import LearnedInit
from deq_jax.neural_solver.solver import neural_solver
from deq_jax.neural_solver.state_shape import check_state_shape, state_shape_of
from deq_jax.neural_solver.state_shape import to_json as state_shape_json
from deq_jax.solvers.anderson import anderson
from deq_jax.training.families.evaluate import read_train_seconds
from deq_jax.training.families.family import Family
from deq_jax.training.families.setup import begin_run
from deq_jax.training.run.checkpoint import Checkpointer
from deq_jax.training.run.writers import write_json
from deq_jax.training.solver_fit.frozen_deq import FrozenDEQ
from deq_jax.training.solver_fit.spec import NeuralSolverSpec, SolverFit, fit

REPORT_FILE = "neural_solver.json"
# The variants a run fits: name -> (alpha_mode, with an initialiser).
VARIANTS = {
    "hyper_anderson": ("learned", True),
    "no_init": ("learned", False),
    "ls_alpha": ("least_squares", True),
}


@dataclasses.dataclass(frozen=True)
class SolverFamily:
    """What a model family brings to a solver fit; `fit_solvers` does the rest.

    Attributes:
      what: the model's name in messages ("DEQ", "language model").
      short: its name in the size-and-time line ("DEQ", "LM").
      train_hint: the command that trains one, for the error messages.
      training: the training loop's `deq_jax.training.families.family.Family` of the model: its
        ``setup`` restores the trained model (a `deq_jax.training.families.setup.Run`), its
        ``report_file`` holds the training time.
      extras: ``run -> batch keys`` that reach the cell as model keywords.
      batches: ``(config, run, variables, spec) -> batches`` that `FrozenDEQ.targets`
        solves (dicts with ``"inputs"`` and the ``extras``).
      held_out: ``(config, run, variables, spec, split) -> batches`` as ``batches``,
        from an eval split the fit never sees (``""``: the family's default), for
        the diagnostics (``experiments/neural_solver/diagnose.py``).
      score: ``(config, run, model, max_iter) -> metrics`` of one model with its
        solver at ``max_iter`` (a tree of numbers).
      eval_lines: ``(comparison, run) -> lines`` that summarise `compare`'s result.
      twice_unroll: also score the fitted solver at twice its trained
        ``unroll_steps`` (``"neural_2K"``).
    """

    what: str
    short: str
    train_hint: str
    training: type[Family]
    extras: Callable[[Any], tuple[str, ...]]
    batches: Callable[[Any, Any, Any, NeuralSolverSpec], Iterator[dict[str, Any]]]
    held_out: Callable[[Any, Any, Any, NeuralSolverSpec, str], Iterator[dict[str, Any]]]
    score: Callable[[Any, Any, nn.Module, int], Any]
    eval_lines: Callable[[dict[str, Any], Any], list[str]]
    twice_unroll: bool = False


class HyperSolverRun(NamedTuple):
    """A trained model with its fitted solvers.

    Attributes:
      deq: the model family's run (model, task, restored state, mesh).
      frozen: the `FrozenDEQ` of that model.
      solvers: ``{variant: (neural_solver, LearnedInit or None)}``.
      report: the run's ``neural_solver.json``.
    """

    deq: Any
    frozen: FrozenDEQ
    solvers: dict[str, tuple[neural_solver, LearnedInit | None]]
    report: dict[str, Any]


def variant_dir(workdir: str, name: str) -> str:
    """Where a variant's checkpoints go: the workdir, or ``ablations/<name>`` in it."""
    return workdir if name == "hyper_anderson" else os.path.join(workdir, "ablations", name)


def restore_frozen(
    family: SolverFamily, config: Any, emit: Callable[[str], None] = print
) -> tuple[Any, FrozenDEQ]:
    """The trained model of ``config.neural_solver.deq_workdir`` and its `FrozenDEQ`.

    Raises:
      ValueError: if ``deq_workdir`` is empty or holds no checkpoint.
    """
    spec = NeuralSolverSpec.from_run_config(config)
    what, hint = family.what, family.train_hint
    if not spec.deq_workdir:
        raise ValueError(
            f"Set --config.neural_solver.deq_workdir to the workdir of a trained {what} ({hint})."
        )
    run = family.training().setup(config, spec.deq_workdir)
    run.checkpointer.close()
    if run.start_step == 0:
        raise ValueError(
            f"No checkpoint in {spec.deq_workdir}: train the {what} there first ({hint}), "
            "then point neural_solver.deq_workdir at its workdir."
        )
    emit(f"restored the {what} at step {run.start_step} from {spec.deq_workdir}")
    variables = jax.device_get(run.state.variables())
    extras = family.extras(run)
    return run, FrozenDEQ(run.model, variables, target_solver=spec.target_solver(), extras=extras)


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


class VariantFit(NamedTuple):
    """One fitted variant, the targets it learned from (`TargetStream.summary`), its
    whole cost (target solves and steps) and its first batch of `Targets` (shapes)."""

    fitted: SolverFit
    targets: dict[str, Any]
    seconds: float
    probe: Any


def fit_variants(
    family: SolverFamily,
    config: Any,
    run: Any,
    frozen: FrozenDEQ,
    spec: NeuralSolverSpec,
    workdir: str,
    emit: Callable[[str], None],
) -> dict[str, VariantFit]:
    """Fits the solver (and, with ``spec.ablations``, its `VARIANTS`), each on its own
    `TargetStream` of the family's batches (the same batches for each), and checkpoints
    each under `variant_dir`."""
    names = list(VARIANTS) if spec.ablations else ["hyper_anderson"]
    fits: dict[str, VariantFit] = {}
    for i, name in enumerate(names):
        alpha_mode, use_init = VARIANTS[name]
        began = time.perf_counter()
        batches = family.batches(config, run, frozen.variables, spec)
        targets = spec.targets(frozen, batches, emit if i == 0 else None)
        fitted = fit(
            spec,
            frozen,
            targets,
            num_steps=spec.train_steps,
            alpha_mode=alpha_mode,
            use_init=use_init,
            emit=emit,
        )
        seconds = time.perf_counter() - began
        fits[name] = VariantFit(fitted, targets.summary(), seconds, targets.first)
        emit(_fit_line(name, spec, fits[name]))
        save_fit(variant_dir(workdir, name), spec.train_steps, fitted)
    return fits


def _fit_line(name: str, spec: NeuralSolverSpec, done: VariantFit) -> str:
    """A fitted variant's steps, cost (its target solves' share) and loss."""
    losses, t = done.fitted.losses, done.targets
    return (
        f"{name}: {spec.train_steps} steps in {done.seconds:.1f} s ({t['seconds']:.1f} s "
        f"solving {t['examples']} targets, relative residual mean "
        f"{t['rel_residual_mean']:.2e}), loss {losses[0]:.4g} -> {np.mean(losses[-10:]):.4g}"
    )


def compare(
    family: SolverFamily,
    config: Any,
    run: Any,
    frozen: FrozenDEQ,
    fitted: SolverFit,
    spec: NeuralSolverSpec,
) -> dict[str, Any]:
    """The family's scores of the model with Anderson and with the fitted solver, both at
    ``spec.max_iter`` (and, with ``family.twice_unroll``, the fitted solver at twice its
    ``unroll_steps``), as floats."""
    neural = frozen.with_solver(fitted.solver, fitted.init or "keep")
    lineup = {
        "anderson": (frozen.with_solver(anderson(tol=spec.tol, max_iter=spec.max_iter)), None),
        "neural": (neural, None),
    }
    if family.twice_unroll:
        lineup["neural_2K"] = (neural, 2 * spec.unroll_steps)
    out = {
        name: family.score(config, run, model, budget or spec.max_iter)
        for name, (model, budget) in lineup.items()
    }
    return jax.tree_util.tree_map(float, out)


def fit_report(
    spec: NeuralSolverSpec,
    fits: dict[str, VariantFit],
    *,
    deq_params: int,
    deq_seconds: float | None,
    evaluation: dict,
) -> dict[str, Any]:
    """The ``neural_solver.json`` of a fit: shapes, sizes, the fit's cost against the
    model's training, the targets' residual and ``evaluation``."""
    main = fits["hyper_anderson"]
    probe = main.probe
    solver = main.fitted
    solver_params = solver.solver.params.size + (solver.init.params.size if solver.init else 0)
    return {
        "deq_workdir": spec.deq_workdir,
        "state_shape": state_shape_json(state_shape_of(probe.z_star)),
        "input_shape": list(probe.x.shape[1:]),
        "spec": dict(vars(spec)),
        "deq_params": deq_params,
        "solver_params": solver_params,
        "param_fraction": solver_params / deq_params,
        "target_seconds": main.targets["seconds"],
        "targets": {name: f.targets for name, f in fits.items()},
        "fit_seconds": {name: f.seconds for name, f in fits.items()},
        "deq_train_seconds": deq_seconds,
        "time_fraction": None if not deq_seconds else main.seconds / deq_seconds,
        "final_loss": {name: float(np.mean(f.fitted.losses[-10:])) for name, f in fits.items()},
        "eval": evaluation,
    }


def _size_line(report: dict[str, Any], short: str) -> str:
    """The solver's size and fitting cost against the model's (``short`` names it)."""
    fit_seconds = report["fit_seconds"]["hyper_anderson"]
    share = ""
    if report["deq_train_seconds"]:
        share = f" ({100 * report['time_fraction']:.1f}% of the {short}'s training)"
    return (
        f"solver: {report['solver_params']} parameters ({100 * report['param_fraction']:.2f}% "
        f"of the {short}'s {report['deq_params']}); fit {fit_seconds:.1f} s, "
        f"{report['target_seconds']:.1f} s of it solving targets{share}"
    )


def fit_solvers(
    family: SolverFamily, config: Any, workdir: str, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Fits a neural solver (and its ablations) to the trained model of
    ``config.neural_solver.deq_workdir`` (the four stages of the module docstring).

    Args:
      family: the model family (`SolverFamily`).
      config: the model's config with a ``neural_solver`` section.
      workdir: where the solver's checkpoints and ``neural_solver.json`` go.
      emit: receives every human-readable line.

    Returns:
      A `HyperSolverRun`.

    Raises:
      ValueError: if the model's workdir has no checkpoint.
      TargetResidualError: if the model does not converge well enough to give fixed
        points (see `TargetStream`).
      WorkdirLockedError: if another live run holds ``workdir``.
    """
    spec = NeuralSolverSpec.from_run_config(config)
    lock = begin_run(config, workdir, emit)  # one live run per workdir, as training
    try:
        return _fit_solvers(family, config, workdir, emit, spec)
    finally:
        if lock is not None:
            lock.release()


def _fit_solvers(family, config, workdir, emit, spec: NeuralSolverSpec) -> HyperSolverRun:
    """`fit_solvers` once the workdir is held."""
    run, frozen = restore_frozen(family, config, emit)
    fits = fit_variants(family, config, run, frozen, spec, workdir, emit)
    main = fits["hyper_anderson"].fitted
    report = fit_report(
        spec,
        fits,
        deq_params=count_params(run.state.params),
        deq_seconds=read_train_seconds(spec.deq_workdir, family.training.report_file),
        evaluation=compare(family, config, run, frozen, main, spec),
    )
    path = os.path.join(workdir, REPORT_FILE)
    write_json(path, report, indent=2, sort_keys=True)
    emit(_size_line(report, family.short))
    for line in family.eval_lines(report["eval"], run):
        emit(line)
    emit(f"Wrote {path}")
    solvers = {name: (f.fitted.solver, f.fitted.init) for name, f in fits.items()}
    return HyperSolverRun(run, frozen, solvers, report)


def load_solvers(
    family: SolverFamily, config: Any, workdir: str, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Restores the solvers `fit_solvers` wrote to ``workdir`` (and their model).

    Raises:
      FileNotFoundError: if ``workdir`` holds no ``neural_solver.json``.
    """
    report = read_solver_report(workdir)
    run, frozen = restore_frozen(family, config, emit)
    return HyperSolverRun(run, frozen, restore_solvers(report, workdir), report)


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
