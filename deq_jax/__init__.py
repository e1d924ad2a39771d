"""deq_jax: deep equilibrium models in JAX and Flax.

The functional core::

    import deq_jax as dj
    sol = dj.fixed_point(f, z0, (params, x),
                         solver=dj.solvers.anderson(m=5, tol=1e-4, max_iter=50),
                         backward=dj.backward.ift())
    sol.value, sol.stats.nstep, sol.stats.rel_residual

See ``shared/DESIGN.md`` for the architecture: solvers and backward modes at the bottom,
Flax modules (`deq_jax.nn`) above them, the task models (`deq_jax.models`), then
analysis, the neural solver and training; tasks (data) beside the bottom layers.
"""

from deq_jax import analysis, backward, models, neural_solver, nn, regularizers, solvers
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
    "regularizers",
    "solvers",
]
