"""Builds the run's components (task, solver, backward mode, model) from a config.

Every component is chosen by name through its registry, so an unknown name or keyword
fails at start-up with the valid ones listed. See ``configs/default.py`` for the
sections read here.
"""

from __future__ import annotations

import os
from typing import Any

import flax.linen as nn

from deq_jax import backward as backward_lib
from deq_jax import solvers as solvers_lib
from deq_jax import tasks as tasks_lib
from deq_jax.backward.base import Backward
from deq_jax.backward.krylov import gmres
from deq_jax.nn import models as models_lib
from deq_jax.solvers.base import Solver


def _section(config: Any) -> dict[str, Any]:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _sub_section(section: dict[str, Any], name: str, what: str) -> dict[str, Any]:
    """The keyword sub-section ``section[name]``; a registered name may have none."""
    sub = section.get(name, {})
    if not isinstance(sub, dict):
        raise ValueError(f"{what}.{name} must be a section of keywords, got {sub!r}.")
    return dict(sub)


def build_solver(config: Any) -> Solver:
    """``solvers.get(name, tol=..., stop_mode=..., **config[name])`` from ``config.solver``.

    Raises:
      ValueError: for an unknown solver name or keyword, listing the valid ones.
    """
    section = _section(config)
    name = section["name"]
    if name not in solvers_lib.names():
        return solvers_lib.get(name)  # raises, listing the valid names
    hyper = {k: section[k] for k in ("tol", "stop_mode", "max_iter") if k in section}
    hyper.update(_sub_section(section, name, "solver"))
    return solvers_lib.get(name, **hyper)


def build_backward(config: Any) -> Backward:
    """``backward.get(name, **config[name])`` from ``config.backward``.

    For ``ift``, ``solver=""`` reuses the forward solver; ``"gmres"`` or a solver name
    builds that solver with the section's ``tol`` and ``max_iter``.

    Raises:
      ValueError: for an unknown mode name or keyword, listing the valid ones.
    """
    section = _section(config)
    name = section["name"]
    hyper = _sub_section(section, name, "backward") if name in backward_lib.names() else {}
    if name == "ift":
        solver_name = hyper.pop("solver", "")
        tol, max_iter = hyper.pop("tol", None), hyper.pop("max_iter", None)
        limits = {k: v for k, v in (("tol", tol), ("max_iter", max_iter)) if v is not None}
        if solver_name == "gmres":
            hyper["solver"] = gmres(**limits)
        elif solver_name:
            hyper["solver"] = solvers_lib.get(solver_name, **limits)
    return backward_lib.get(name, **hyper)


def build_model(config: Any, solver: Solver, backward: Backward) -> nn.Module:
    """``models.get(name, solver=solver, backward=backward, **fields)`` from ``config.model``.

    An empty string for ``norm`` means no normalisation.

    Raises:
      ValueError: for an unknown model name or attribute, listing the valid ones.
    """
    fields = _section(config)
    name = fields.pop("name")
    if fields.get("norm", None) == "":
        fields["norm"] = None
    return models_lib.get(name, solver=solver, backward=backward, **fields)


def build_task(config: Any, workdir: str) -> Any:
    """``tasks.get(name, data_dir=..., **fields)`` from ``config.task``.

    An empty ``data_dir`` puts the generated data under ``{workdir}/data``.
    """
    fields = _section(config)
    name = fields.pop("name")
    if not fields.get("data_dir", None):
        fields["data_dir"] = os.path.join(workdir, "data")
    return tasks_lib.get(name, **fields)
