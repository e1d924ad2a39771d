"""What every solver shares: hyper-parameters, the result types, the solver protocol.

A solver is a frozen dataclass of hyper-parameters. It never sees pytrees or batches
of pytrees: `deq_jax.solvers.loop` hands it a flat ``[B, D]`` array (one row per
independent problem) and a function ``fn: [B, D] -> [B, D]``. A solver implements two
pure methods:

* ``init(z0) -> aux``: allocates its own state (history buffers) for ``z0 [B, D]``; every
  array in ``aux`` has the batch axis first and a fixed shape.
* ``propose(aux, z, fz, k) -> (z_next, aux)``: given the current iterate ``z``, its
  image ``fz = fn(z)`` and the number ``k >= 1`` of evaluations of ``fn`` made so far,
  returns the next iterate to evaluate.

The loop (per-sample stopping, best-iterate tracking, divergence, statistics) lives in
`deq_jax.solvers.loop` and is the same for all solvers. To add a solver, subclass
`Solver`, implement ``init`` and ``propose``, and `deq_jax.solvers.register` it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.floor import Floor
from deq_jax.solvers.summary import stats_summary, value_summary

STOP_MODES = ("abs", "rel")

# Added to ||f(z)|| in the relative residual, as in torchdeq.
REL_EPS = 1e-8


class SolverStats(NamedTuple):
    """Per-sample statistics of a fixed-point solve.

    Shapes are ``[B]`` for a state batched along axis 0 and ``[]`` for an unbatched one
    (``trace`` has one more trailing axis of length ``max_iter``).

    Attributes:
      nstep: evaluations of ``f`` spent on the sample (the initial one included) until
        it converged, diverged or ran out of budget; ``1 <= nstep <= max_iter``.
      abs_residual: ``||f(z) - z||_2`` of the returned iterate (``inf`` if no iterate
        had a finite residual).
      rel_residual: ``abs_residual / (||f(z)||_2 + 1e-8)`` of the returned iterate.
      converged: the returned iterate's residual (in the solver's ``stop_mode``) is at
        most ``tol``.
      diverged: a non-finite residual was met; the sample was stopped and the best
        finite iterate returned.
      trace: the stop-mode residual after each evaluation; entries at and after
        ``nstep`` hold the returned residual.
      part: for a composed solver (`deq_jax.solvers.sequence`, ``fallback``,
        ``restart``), ``[B]`` int32: the code of the part that made the sample's last
        step (documented with each combinator); ``None`` for a plain solver.
      switched_at: for a composed solver, ``[B]`` int32: the evaluation count ``k`` at
        which that part took over (its first proposal follows evaluation ``k``); ``0``
        if the sample never switched. ``None`` for a plain solver.
      floor: for a solve that measured its residual floor (a solver with a ``floor``,
        `deq_jax.solvers.floor`: a cell in reduced precision), ``[B]``: the floor, in
        the stop mode's units; ``None`` otherwise.
      at_floor: with ``floor``, ``[B]`` bool: the sample stopped on the floor (its
        residual passed ``margin * floor`` but not ``tol``; it counts as converged).

    Printed (``repr``, ``str``), the statistics read as a one-line summary (steps,
    residuals, converged and diverged counts, shapes); ``stats.summary(trace=True)``
    adds the residual trace, and ``stats.trace`` is the array itself.
    """

    nstep: jax.Array
    abs_residual: jax.Array
    rel_residual: jax.Array
    converged: jax.Array
    diverged: jax.Array
    trace: jax.Array
    part: jax.Array | None = None
    switched_at: jax.Array | None = None
    floor: jax.Array | None = None
    at_floor: jax.Array | None = None

    def summary(self, trace: bool = False) -> str:
        """A one-line summary; with ``trace``, the residual trace below it
        (`deq_jax.solvers.summary.stats_summary`)."""
        return stats_summary(self, trace)

    def __repr__(self) -> str:
        return stats_summary(self)


class Solution(NamedTuple):
    """The result of `deq_jax.fixed_point`: the fixed point and its statistics.

    Attributes:
      value: the fixed point ``z*``, a pytree like ``z0``; differentiable w.r.t. the
        ``args`` of the solve according to the backward mode.
      stats: a `SolverStats` of the forward solve.

    Printed, the value shows as its leaves' dtypes and shapes and the statistics as
    their summary.
    """

    value: Any
    stats: SolverStats

    def __repr__(self) -> str:
        return f"Solution(value={value_summary(self.value)}, stats={self.stats!r})"


class Phase(NamedTuple):
    """One stretch of a solve run with a step of its own (see `Solver.phases`).

    Attributes:
      propose: ``(aux, z, fz, k) -> (z_next, aux)``, the step of this stretch.
      stay: ``(aux, k) -> [] bool``, whether the next step is still this stretch's
        (checked before each step, after the loop's own stopping test); ``None``: to
        the end of the solve.
      enter: ``(aux, z, fz, k) -> aux``, run once when the stretch starts, turns the
        state the previous stretch left (or ``init``'s) into this stretch's; ``None``
        keeps it.
    """

    propose: Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]
    stay: Callable[[Any, jax.Array], jax.Array] | None = None
    enter: Callable[[Any, jax.Array, jax.Array, jax.Array], Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Solver(abc.ABC):
    """Hyper-parameters common to every solver.

    Attributes:
      tol: stopping tolerance on the residual of each sample.
      max_iter: the most evaluations of ``f`` per solve (the first one included).
      stop_mode: ``"rel"`` stops on ``||f(z) - z|| / ||f(z)||``, ``"abs"`` on
        ``||f(z) - z||``.
      full_budget: run every sample for the whole budget (``max_iter`` evaluations; a
        fixed depth, as "unroll + backprop" training needs) instead of stopping it once
        its residual passes ``tol``; ``tol`` then only decides ``converged`` in the
        statistics. A diverging sample still stops.
      floor: a `deq_jax.solvers.floor.Floor` (the unit roundoff of ``f``'s arithmetic):
        the solve measures the residual floor of a reduced-precision ``f`` (one more
        evaluation) and stops each sample at ``max(tol, margin * floor)``; ``None`` (the
        default, true float32) stops at ``tol``. `deq_jax.nn.DEQSpec` sets it from its
        ``precision``, `deq_jax.fixed_point` from its ``precision`` argument.
    """

    tol: float = 1e-4
    max_iter: int = 50
    stop_mode: str = "rel"
    full_budget: bool = False
    floor: Floor | None = None

    def __post_init__(self):
        if not self.tol > 0:
            raise ValueError(f"tol must be positive, got {self.tol!r}.")
        if not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {self.max_iter!r}.")
        if self.stop_mode not in STOP_MODES:
            raise ValueError(
                f"stop_mode must be one of {', '.join(STOP_MODES)}, got {self.stop_mode!r}."
            )
        if self.floor is not None and not isinstance(self.floor, Floor):
            raise TypeError(f"floor must be None or a Floor, got {self.floor!r}.")

    @property
    def name(self) -> str:
        """The registry name of this solver (its constructor's name)."""
        return type(self).__name__

    def replace(self, **changes: Any) -> Solver:
        """A copy with some hyper-parameters changed (e.g. ``max_iter``)."""
        return dataclasses.replace(self, **changes)

    @abc.abstractmethod
    def init(self, z0: jax.Array) -> Any:
        """Allocates the solver's own state for ``z0 [B, D]``."""

    @abc.abstractmethod
    def propose(self, aux: Any, z: jax.Array, fz: jax.Array, k: jax.Array):
        """Returns ``(z_next, aux)`` from ``z [B, D]``, ``fz = fn(z)`` and ``k`` evals."""

    def hand_over(self, aux: Any, to: Solver, k: jax.Array) -> Any | None:
        """This solver's history as a state of ``to``, when a composed solver switches.

        `deq_jax.solvers.sequence` calls it when ``to`` takes over from this solver;
        ``aux`` holds the evaluations ``1 .. k`` this solver booked (``k`` a traced int).
        ``None`` (the default) starts ``to`` afresh from the current iterate (``to`` then
        counts evaluations from its start); a state of ``to`` continues this history,
        and ``to`` sees the evaluation count of the whole solve.
        """
        del aux, to, k
        return None

    def phases(self) -> tuple[Phase, ...] | None:
        """The solve as stretches with steps of their own, for the `jax.lax.while_loop`.

        A composed solver whose step picks a branch each time (`jax.lax.switch` or
        `jax.lax.cond` over its parts' states) pays for the choice on every step;
        split into phases (`Phase`), each stretch runs in a loop of its own with only the
        branch it needs. `deq_jax.solvers.iterate` runs the phases in order with
        ``loop="while"`` or ``"python"``, and calls ``propose`` with ``"scan"`` (and
        when the solver is a part of another); both give the same iterates. ``None``
        (the default): one stretch, ``propose``.
        """
        return None

    def book(self, aux: Any, res: jax.Array, k: jax.Array) -> Any:
        """The state with the loop's residual of evaluation ``k`` booked in it.

        Called by the loop after each evaluation (the first included), before the
        ``propose`` that follows it, with ``res [B]`` the residual of the iterate in the
        loop's stop mode (and ``k`` as `rewind`'s). A combinator that watches each
        sample's residual (`deq_jax.solvers.fallback`, ``restart``) keeps its watch
        here instead of computing the residual again; it forwards the residual to the
        parts it runs. The default returns ``aux`` unchanged.
        """
        del res, k
        return aux

    def rewind(self, aux: Any, k: jax.Array) -> jax.Array | None:
        """``[B]`` bool: the samples whose next iterate is their best one so far.

        Called by the loop right after ``propose(aux, z, fz, k)`` (``aux`` is the state
        that step returned, ``k`` its count, a scalar or per sample ``[B]``); on the rows
        marked, the loop evaluates the sample's lowest-residual iterate of the solve
        instead of the proposal. A combinator that restarts a sample from its best
        iterate (`deq_jax.solvers.fallback`, ``restart``) marks it so, then restarts on
        the next step from that iterate and its image, one evaluation later, without
        carrying copies of the best iterate in its own state. A combinator forwards the
        marks of the parts it runs. ``None`` (the default): nothing is ever rewound.
        """
        del aux, k
        return None

    def path(self, aux: Any, k: jax.Array) -> tuple[jax.Array, jax.Array] | None:
        """``(part [B], switched_at [B])`` of a composed solver after evaluation ``k``.

        The loop records it per sample while the sample runs (`SolverStats.part`,
        `SolverStats.switched_at`); ``None`` (a plain solver) records nothing.
        """
        del aux, k
        return None


def residuals(z: jax.Array, fz: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Absolute and relative residuals of ``z [B, D]`` given ``fz = f(z)``; each ``[B]``.

    If ``||f(z)||`` overflows, the relative residual is ``inf`` (not ``0``), so a
    diverging sample is never mistaken for a converged one.
    """
    abs_res = jnp.linalg.norm(fz - z, axis=-1)
    fz_norm = jnp.linalg.norm(fz, axis=-1)
    rel_res = jnp.where(jnp.isfinite(fz_norm), abs_res / (fz_norm + REL_EPS), jnp.inf)
    return abs_res, rel_res
