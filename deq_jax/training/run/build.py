"""Builds the run's components (task, DEQ spec, model) from a config.

Every component is chosen by name through its registry, so an unknown name or keyword
fails at start-up with the valid ones listed. See ``configs/default.py`` for the
sections read here. `check_layout` turns a config written for the old layout (solver,
backward mode, initial state and budgets outside ``config.deq``) into an error that
names the new key.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn

from deq_jax import backward as backward_lib
from deq_jax import models as models_lib
from deq_jax import solvers as solvers_lib
from deq_jax import tasks as tasks_lib
from deq_jax.backward.base import Backward
from deq_jax.backward.krylov import gmres
from deq_jax.nn.spec import DEQSpec
from deq_jax.solvers.base import Solver

# Old config keys (before ``config.deq``) and where each lives now.
RENAMED_KEYS = {
    "solver": "deq.solver",
    "backward": "deq.backward",
    "model.z_init": "deq.z_init",
    "model.train_max_iter": "deq.train_max_iter",
    "model.eval_max_iter": "deq.eval_max_iter",
    "eval.settle_patience": "deq.settle_patience",
    "eval.settle_tol": "deq.settle_tol",
    "neural_solver.tol": "deq.neural_solver.tol",
    "neural_solver.max_iter": "deq.neural_solver.max_iter",
    "neural_solver.target_tol": "deq.neural_solver.target_tol",
    "neural_solver.target_max_iter": "deq.neural_solver.target_max_iter",
}
# The fields of ``config.deq`` besides its ``solver`` and ``backward`` sections
# (``neural_solver``: the budgets of a neural-solver run, read by `NeuralSolverSpec`).
DEQ_FIELDS = (
    "z_init",
    "train_max_iter",
    "eval_max_iter",
    "settle_patience",
    "settle_tol",
    "neural_solver",
    "precision",
    "floor_margin",
)


def renamed_key(key: str) -> str | None:
    """The new name of an old dotted config key (``"solver.tol"`` -> ``"deq.solver.tol"``),
    or ``None`` if ``key`` was not moved."""
    for old, new in RENAMED_KEYS.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old) :]
    return None


def check_layout(config: Any) -> None:
    """Fails on a config that still has a key of the old layout.

    Raises:
      ValueError: naming the old key and the new one (e.g. ``model.z_init`` ->
        ``deq.z_init``).
    """
    sections = _section(config)
    for old, new in RENAMED_KEYS.items():
        section, _, field = old.partition(".")
        present = section in sections and (not field or field in dict(sections[section]))
        if present:
            raise ValueError(
                f"config.{old} has moved to config.{new} (everything a DEQ solves with "
                "lives in config.deq; see configs/default.py)."
            )


def _section(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _sub_section(section: dict[str, Any], name: str, what: str) -> dict[str, Any]:
    """The keyword sub-section ``section[name]``; a registered name may have none."""
    sub = section.get(name, {})
    if not isinstance(sub, dict):
        raise ValueError(f"{what}.{name} must be a section of keywords, got {sub!r}.")
    return dict(sub)


def build_solver(config: Any) -> Solver:
    """``solvers.get(name, tol=..., stop_mode=..., **config[name])`` from ``config.deq.solver``.

    A ``name`` with parentheses is a composed solver's spec string
    (`deq_jax.solvers.from_spec`, e.g. ``"fallback(anderson, broyden)"`` or
    ``"sequence(fixed_point_iteration:3, anderson)"``): every part takes the section's
    budget keywords and its own sub-section (``anderson.m``, ``fallback.patience``).

    Raises:
      ValueError: for an unknown solver name or keyword, listing the valid ones.
    """
    section = _section(config)
    name = section["name"]
    common = ("tol", "stop_mode", "max_iter", "full_budget")
    hyper = {k: section[k] for k in common if k in section}
    if "(" in name or name in solvers_lib.COMBINATORS:  # e.g. "fallback(anderson, broyden)"
        subs = {n: _sub_section(section, n, "deq.solver") for n in solvers_lib.names()}
        return solvers_lib.from_spec(name, subs, **hyper)
    if name not in solvers_lib.names():
        return solvers_lib.get(name)  # raises, listing the valid names
    hyper.update(_sub_section(section, name, "deq.solver"))
    return solvers_lib.get(name, **hyper)


def build_backward(config: Any) -> Backward:
    """``backward.get(name, **config[name])`` from ``config.deq.backward``.

    For ``ift``, ``solver=""`` inherits the forward solver, whose ``tol`` and budget a
    non-zero ``ift.tol`` and ``ift.max_iter`` change; ``"gmres"`` or a solver name
    builds that solver with the section's ``tol`` and ``max_iter`` (0: its defaults).

    Raises:
      ValueError: for an unknown mode name or keyword, listing the valid ones.
    """
    section = _section(config)
    name = section["name"]
    hyper = _sub_section(section, name, "deq.backward") if name in backward_lib.names() else {}
    if name == "ift":
        solver_name = hyper.pop("solver", "")
        tol, max_iter = hyper.pop("tol", 0.0), hyper.pop("max_iter", 0)
        limits = {k: v for k, v in (("tol", tol), ("max_iter", max_iter)) if v}
        if solver_name == "gmres":
            hyper["solver"] = gmres(**limits)
        elif solver_name:
            hyper["solver"] = solvers_lib.get(solver_name, **limits)
        else:
            hyper.update(limits)
    return backward_lib.get(name, **hyper)


def build_deq_spec(config: Any) -> DEQSpec:
    """The `DEQSpec` of ``config.deq``: its ``solver`` and ``backward`` sections, the
    initial state, the budgets (0: the solver's ``max_iter``) and the cell's
    ``precision`` (`deq_jax.precision`: ``default``, ``float32``, ``bfloat16``).

    Raises:
      ValueError: for an unknown field, solver, backward mode or keyword, listing the
        valid ones.
    """
    section = _section(config)
    unknown = sorted(set(section) - {"solver", "backward", *DEQ_FIELDS})
    if unknown:
        valid = ", ".join(("solver", "backward", *DEQ_FIELDS))
        raise ValueError(f"Unknown field(s) of config.deq: {', '.join(unknown)}. Valid: {valid}.")
    return DEQSpec(
        solver=build_solver(section["solver"]),
        backward=build_backward(section["backward"]),
        z_init=section.get("z_init", "zeros"),
        train_max_iter=section.get("train_max_iter") or None,
        eval_max_iter=section.get("eval_max_iter") or None,
        precision=section.get("precision", "default"),
        floor_margin=section.get("floor_margin", 1.0),
    )


def build_model(config: Any, deq: DEQSpec) -> nn.Module:
    """``models.get(name, deq=deq, **fields)`` from ``config.model``.

    An empty string for ``norm`` means no normalisation.

    Raises:
      ValueError: for an unknown model name or attribute, listing the valid ones.
    """
    fields = _section(config)
    name = fields.pop("name")
    if fields.get("norm", None) == "":
        fields["norm"] = None
    return models_lib.get(name, deq=deq, **fields)


def build_task(config: Any, workdir: str) -> Any:
    """``tasks.get(name, data_dir=..., **fields)`` from ``config.task``.

    An empty ``data_dir`` puts what a task stores (converted records, cached token ids)
    under ``{workdir}/data``.
    """
    fields = _section(config)
    name = fields.pop("name")
    if not fields.get("data_dir", None):
        fields["data_dir"] = os.path.join(workdir, "data")
    return tasks_lib.get(name, **fields)
