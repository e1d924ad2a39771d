"""deq_jax: deep equilibrium models in JAX and Flax.

The functional core::

    import deq_jax as dj
    sol = dj.fixed_point(f, z0, (params, x),
                         solver=dj.solvers.anderson(m=5, tol=1e-4, max_iter=50),
                         backward=dj.backward.ift())
    sol.value, sol.stats.nstep, sol.stats.rel_residual

See ``shared/DESIGN.md`` for the architecture: solvers and backward modes at the bottom,
Flax modules (`deq_jax.nn` for linen, `deq_jax.nnx` for NNX) above them, the task
models (`deq_jax.models`), then analysis, the neural solver and training; tasks (data)
beside the bottom layers.

``import deq_jax`` needs only jax, flax, optax and numpy. `deq_jax.training` (orbax
checkpoints, TensorBoard logs, absl logging: the ``[train]`` extra) is imported on first
use, ``dj.training.train_and_evaluate`` or ``import deq_jax.training``, as are the image
tasks (`deq_jax.tasks.get`); tensorflow-datasets only when a task reads or writes its
tfds records (its ``prepare()`` and ``source()``), never when it is built.
"""

import importlib

from deq_jax import (
    analysis,
    backward,
    models,
    neural_solver,
    nn,
    nnx,
    regularizers,
    solvers,
    tasks,
)
from deq_jax.fixed_point import fixed_point
from deq_jax.solvers.base import Solution, Solver, SolverStats

__version__ = "0.1.0"

__all__ = [
    "Solution",
    "Solver",
    "SolverStats",
    "analysis",
    "backward",
    "fixed_point",
    "models",
    "neural_solver",
    "nn",
    "nnx",
    "regularizers",
    "solvers",
    "tasks",
    "training",
]

# Subpackages that need the ``[train]`` extra, imported by their first attribute access.
_ON_FIRST_USE = ("training",)


def __getattr__(name: str):
    """PEP 562: imports `deq_jax.training` when ``deq_jax.training`` is first read.

    Raises:
      ModuleNotFoundError: naming the ``[train]`` extra, when a package it brings is
        missing.
      AttributeError: for any other name.
    """
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == __name__:
            raise
        hint = f"deq_jax.{name} needs {error.name!r}: pip install 'deq_jax[train]'"
        raise ModuleNotFoundError(hint, name=error.name) from error
