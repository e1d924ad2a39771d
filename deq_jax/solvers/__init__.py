"""Fixed-point solvers: pure functions on `jax.lax.while_loop`.

Every solver is a frozen, hashable dataclass of hyper-parameters, built directly
(``anderson(m=5, tol=1e-4)``) or by name (``get("anderson", m=5)``), composed ones
also by a spec string (``get("fallback(anderson, broyden)")``). The function to solve
is passed at call time through `deq_jax.fixed_point`.
"""

from deq_jax.solvers.anderson import AndersonState, anderson, anderson_step, anderson_weights
from deq_jax.solvers.base import Solution, Solver, SolverStats, residuals
from deq_jax.solvers.broyden import BroydenState, broyden, broyden_step, inv_jacobian_matvec
from deq_jax.solvers.combinators import sequence
from deq_jax.solvers.fixed_point_iteration import damped_step, fixed_point_iteration
from deq_jax.solvers.linalg import spd_solve
from deq_jax.solvers.loop import LOOPS, iterate, iterate_observed, iterate_unrolled
from deq_jax.solvers.registry import from_spec, get, names, register
from deq_jax.solvers.reversible import reversible, reversible_step, reversible_unstep
from deq_jax.solvers.spec import COMBINATORS
from deq_jax.solvers.switching import TRIGGERS, FallbackState, RestartState, fallback, restart

__all__ = [
    "AndersonState",
    "COMBINATORS",
    "BroydenState",
    "FallbackState",
    "LOOPS",
    "RestartState",
    "Solution",
    "Solver",
    "SolverStats",
    "TRIGGERS",
    "anderson",
    "anderson_step",
    "anderson_weights",
    "broyden",
    "broyden_step",
    "damped_step",
    "fallback",
    "fixed_point_iteration",
    "from_spec",
    "get",
    "inv_jacobian_matvec",
    "iterate",
    "iterate_observed",
    "iterate_unrolled",
    "names",
    "register",
    "residuals",
    "restart",
    "reversible",
    "reversible_step",
    "reversible_unstep",
    "sequence",
    "spd_solve",
]
