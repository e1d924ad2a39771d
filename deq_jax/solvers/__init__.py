"""Fixed-point solvers: pure functions on `jax.lax.while_loop`.

Every solver is a frozen, hashable dataclass of hyper-parameters, built directly
(``anderson(m=5, tol=1e-4)``) or by name (``get("anderson", m=5)``). The function to
solve is passed at call time through `deq_jax.fixed_point`.
"""

from deq_jax._registry import Registry
from deq_jax.solvers.anderson import AndersonState, anderson, anderson_step, anderson_weights
from deq_jax.solvers.base import Solution, Solver, SolverStats, residuals
from deq_jax.solvers.broyden import BroydenState, broyden, broyden_step, inv_jacobian_matvec
from deq_jax.solvers.fixed_point_iteration import damped_step, fixed_point_iteration
from deq_jax.solvers.linalg import spd_solve
from deq_jax.solvers.loop import LOOPS, iterate, iterate_unrolled

_REGISTRY = Registry("solver")
# The registry's bound methods are this package's public registry functions.
register, get, names = _REGISTRY.register, _REGISTRY.get, _REGISTRY.names
for _ctor in (fixed_point_iteration, anderson, broyden):
    register(_ctor.__name__, _ctor)


__all__ = [
    "AndersonState",
    "BroydenState",
    "LOOPS",
    "Solution",
    "Solver",
    "SolverStats",
    "anderson",
    "anderson_step",
    "anderson_weights",
    "broyden",
    "broyden_step",
    "damped_step",
    "fixed_point_iteration",
    "get",
    "inv_jacobian_matvec",
    "iterate",
    "iterate_unrolled",
    "names",
    "register",
    "residuals",
    "spd_solve",
]
