"""Per-sample switching combinators: `fallback` to a backup solver, `restart` on a stall.

Both watch each sample's residual (in their ``stop_mode``) and act on that sample
alone: the other samples go on exactly as under the wrapped solver. Both restart the
part they hand a sample to from the sample's lowest-residual iterate of the solve, with
a fresh state (history), and record the switch in the statistics
(`deq_jax.SolverStats.part`, ``switched_at``).

Both are fed by the loop: it hands them the residual of each evaluation
(`deq_jax.solvers.Solver.book`), and the restart costs one evaluation: the step that
switches a sample marks it (`deq_jax.solvers.Solver.rewind`), the loop evaluates the
sample's best iterate next (it keeps that iterate anyway), and the part taking over
starts from there and its image. So the combinators carry only ``[B]`` numbers per
sample (best residual, stall count) and compute no residual of their own: carrying and
updating ``[B, D]`` copies of the best iterate and its image in every step, and the
residual computed twice, cost them 5-10% per step on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Phase, Solver
from deq_jax.solvers.combinators import (
    check_keywords,
    check_part,
    inherit_hyper,
    overrides,
    propose_rows,
    set_hyper,
    started,
    where_rows,
)

# What makes `fallback` hand a sample to its backup.
TRIGGERS = ("nonfinite", "diverging", "stalled")


class Watch(NamedTuple):
    """Each sample's best residual so far and how long ago it improved."""

    best_res: jax.Array  # [B] the lowest residual so far
    stall: jax.Array  # [B] int32, evaluations since the residual last improved


def _watch_init(z0: jax.Array) -> Watch:
    batch = z0.shape[0]
    return Watch(
        best_res=jnp.full((batch,), jnp.inf, z0.dtype),
        stall=jnp.zeros((batch,), jnp.int32),
    )


def _watch(w: Watch, res: jax.Array, reset: jax.Array | None = None) -> Watch:
    """Books the residual ``res [B]`` of an evaluation; ``reset`` rows restart the stall."""
    better = res < w.best_res  # false for NaN
    stall = jnp.where(better, 0, w.stall + 1)
    if reset is not None:
        stall = jnp.where(reset, 0, stall)
    return Watch(best_res=jnp.where(better, res, w.best_res), stall=stall)


def _rewound(start: jax.Array, k: jax.Array) -> jax.Array:
    """``[B]``: the samples switched (restarted) after evaluation ``k - 1``, whose
    ``k``-th evaluation is therefore their best iterate (``start``: 0 for never)."""
    return (start > 0) & (start == k - 1)


def _check_patience(patience: Any) -> None:
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1, got {patience!r}.")


def _has_state(aux: Any) -> bool:
    """Whether a part's state is there (a phase that does not run it carries ``()``)."""
    return bool(jax.tree_util.tree_leaves(aux))


class FallbackState(NamedTuple):
    """The two parts' states, which samples are on the backup, and the watch."""

    primary: Any
    backup: Any  # () in the first phase, before any sample switched (see `fallback.phases`)
    on_backup: jax.Array  # [B] bool
    start: jax.Array  # [B] int32, evaluation after which the sample switched (0: never)
    watch: Watch
    jump: jax.Array  # [B] the last residual over the best one before it ("diverging")


@dataclasses.dataclass(frozen=True)
class fallback(Solver):  # noqa: N801 - registry name is the constructor name
    """``primary``, and per sample ``backup`` once ``primary`` fails on that sample.

    A sample switches (once, for good) when one of the ``when`` triggers fires after
    one of its evaluations, the ``k``-th:

    * ``"nonfinite"``: the primary proposes a non-finite iterate (e.g. Anderson's
      least-squares system went singular);
    * ``"diverging"``: the residual exceeds ``growth`` times the sample's best one (or
      is not finite);
    * ``"stalled"``: the residual has not gone below the sample's best for
      ``patience`` evaluations in a row.

    The primary's proposal is then dropped: evaluation ``k + 1`` is the sample's
    lowest-residual iterate of the solve (`Solver.rewind`), and the backup, with a
    fresh state, makes the sample's proposals from there on. The other samples keep the
    primary's iterates, bit for bit. The backup runs only once some sample uses it.

    Statistics: ``part`` is 0 (primary) or 1 (backup); ``switched_at`` the evaluation
    ``k`` after which the sample switched (0: never); the return to the best iterate is
    the backup's first move, its first own proposal follows evaluation ``k + 1``.

    Built positionally (``fallback(anderson(), broyden())``) or by keywords
    (``fallback(primary=anderson(), backup=broyden())``); the other fields are keywords.

    Attributes:
      primary: the solver tried first.
      backup: the solver a failing sample switches to.
      when: the triggers, a subset of ``("nonfinite", "diverging", "stalled")``.
      patience: evaluations without a new best residual that count as a stall.
      growth: the multiple of the best residual that counts as diverging.
      tol, max_iter, stop_mode, full_budget: see `Solver`; unset, the primary's.

    References:
      Walker & Ni, "Anderson acceleration for fixed-point iterations", SIAM J. Numer.
      Anal. 2011 (safeguarding Anderson's least-squares step).
    """

    primary: Solver
    backup: Solver
    _: dataclasses.KW_ONLY
    when: tuple[str, ...] = TRIGGERS
    patience: int = 10
    growth: float = 100.0
    tol: float | None = None
    max_iter: int | None = None
    stop_mode: str | None = None
    full_budget: bool | None = None

    def __post_init__(self):
        check_part(self.primary, "fallback's primary")
        check_part(self.backup, "fallback's backup")
        when = (self.when,) if isinstance(self.when, str) else tuple(self.when)
        unknown = sorted(set(when) - set(TRIGGERS))
        if unknown or not when:
            raise ValueError(
                f"fallback(when=...) takes one or more of {', '.join(TRIGGERS)}; got {self.when!r}."
            )
        object.__setattr__(self, "when", when)
        _check_patience(self.patience)
        if not self.growth > 1:
            raise ValueError(f"growth must be > 1, got {self.growth!r}.")
        inherit_hyper(self, self.primary)
        super().__post_init__()

    def init(self, z0):
        batch = z0.shape[0]
        return FallbackState(
            primary=self.primary.init(z0),
            backup=self.backup.init(z0),
            on_backup=jnp.zeros((batch,), bool),
            start=jnp.zeros((batch,), jnp.int32),
            watch=_watch_init(z0),
            jump=jnp.zeros((batch,), z0.dtype),
        )

    def _triggered(self, aux: FallbackState, z_primary: jax.Array) -> jax.Array:
        fired = jnp.zeros(aux.on_backup.shape, bool)
        if "nonfinite" in self.when:
            # a row's sum is not finite if an entry is not (or if the entries are so
            # large that their sum overflows): one reduction instead of two
            fired |= ~jnp.isfinite(jnp.sum(z_primary, axis=1))
        if "diverging" in self.when:
            fired |= aux.jump > self.growth  # (an infinite jump: a non-finite residual)
        if "stalled" in self.when:
            fired |= aux.watch.stall >= self.patience
        return fired

    def _primary_step(self, aux, z, fz, k):
        """The primary's step, and the state with the samples switching now."""
        z_primary, primary = self.primary.propose(aux.primary, z, fz, k)
        switch = ~aux.on_backup & self._triggered(aux, z_primary)
        on_backup, start = aux.on_backup | switch, jnp.where(switch, k, aux.start)
        return z_primary, aux._replace(primary=primary, on_backup=on_backup, start=start)

    @staticmethod
    def _backup_count(start, k):
        """The backup's own count per sample: 1 at its first proposal (after ``start + 1``)."""
        return jnp.maximum(k - start, 1)

    def _backup_rows(self, aux, z, fz, k):
        """The backup's step on every row; fresh on the samples rewound by the last step."""
        fresh = _rewound(aux.start, k)  # z is their best iterate
        state = where_rows(fresh, started(self.backup, z, fz, self), aux.backup)
        return propose_rows(self.backup, state, z, fz, self._backup_count(aux.start, k))

    def propose(self, aux, z, fz, k):
        z_primary, new = self._primary_step(aux, z, fz, k)
        z_backup, backup = jax.lax.cond(
            jnp.any(aux.on_backup),
            lambda: self._backup_rows(aux, z, fz, k),
            lambda: (z_primary, aux.backup),
        )
        # (the samples switching now are rewound: their proposal is not evaluated)
        z_next = jnp.where(aux.on_backup[:, None], z_backup, z_primary)
        return z_next, new._replace(backup=backup)

    def book(self, aux, res, k):
        """The watch (and the parts' own) after evaluation ``k`` with residual ``res``."""
        if "diverging" in self.when:
            # (inf / inf, the first evaluation, is NaN, not a jump; a non-finite res is inf)
            jump = jnp.where(jnp.isfinite(res), res / aux.watch.best_res, jnp.inf)
            aux = aux._replace(jump=jump)
        aux = aux._replace(watch=_watch(aux.watch, res))
        if overrides(self.primary, "book"):
            aux = aux._replace(primary=self.primary.book(aux.primary, res, k))
        if overrides(self.backup, "book") and _has_state(aux.backup):
            count = self._backup_count(aux.start, k)
            aux = aux._replace(backup=self.backup.book(aux.backup, res, count))
        return aux

    def rewind(self, aux, k):
        """The samples that switched in this step, and the marks of the part each runs."""
        marks = aux.on_backup & (aux.start == k)
        if overrides(self.primary, "rewind"):
            marks |= ~aux.on_backup & self.primary.rewind(aux.primary, k)
        if overrides(self.backup, "rewind") and _has_state(aux.backup):
            earlier = aux.on_backup & (aux.start < k)
            marks |= earlier & self.backup.rewind(aux.backup, self._backup_count(aux.start, k))
        return marks

    def phases(self):
        """Until a sample switches, the primary's steps alone (no backup state carried).

        The step in which a sample switches is the last of the first stretch (its
        proposal is rewound, `rewind`); the backup's state is built on entering the
        second, whose steps are `propose`'s.
        """

        def enter_backup(aux, z, fz, k):
            return aux._replace(backup=self.backup.init(z))

        return (
            Phase(
                self._primary_step,
                stay=lambda aux, k: ~jnp.any(aux.on_backup),
                enter=lambda aux, z, fz, k: aux._replace(backup=()),
            ),
            Phase(self.propose, enter=enter_backup),
        )

    def path(self, aux, k):
        return aux.on_backup.astype(jnp.int32), aux.start


class RestartState(NamedTuple):
    """The solver's state, each sample's last restart, and the watch."""

    inner: Any
    start: jax.Array  # [B] int32, evaluation after which the sample last restarted (0: never)
    watch: Watch


@dataclasses.dataclass(frozen=True, kw_only=True)
class restart(Solver):  # noqa: N801 - registry name is the constructor name
    """``solver``, restarted per sample from its best iterate when its residual stalls.

    When a sample's residual has not gone below its best for ``patience`` evaluations
    in a row (the ``k``-th the last), the solver's proposal for it is dropped:
    evaluation ``k + 1`` is the sample's lowest-residual iterate of the solve
    (`Solver.rewind`), and the solver goes on from there with its state (e.g.
    Anderson's history, Broyden's inverse-Jacobian terms) cleared, as if that were a
    new start. That evaluation does not count towards the next stall, so a sample
    restarts at most every ``patience + 1`` evaluations. The samples never restarted
    take the solver's own batched steps, bit for bit; once some sample has restarted,
    the restarted ones also take a step mapped over the rows (each counts from its own
    restart), about one more step's work.

    Statistics: ``part`` is 0 (the one solver); ``switched_at`` the evaluation ``k``
    after which the sample last restarted (0: never).

    Built positionally (``restart(anderson(), 5)``) or by keywords
    (``restart(solver=anderson(), patience=5)``); the budget fields are keywords.

    Attributes:
      solver: the solver to restart.
      patience: evaluations without a new best residual that trigger a restart.
      tol, max_iter, stop_mode, full_budget: see `Solver`; unset, the solver's.
    """

    solver: Solver
    patience: int = 10
    tol: float | None = None
    max_iter: int | None = None
    stop_mode: str | None = None
    full_budget: bool | None = None

    def __init__(self, solver: Solver, patience: int = 10, **hyper: Any):
        check_keywords("restart", hyper, ("solver", "patience"))
        object.__setattr__(self, "solver", solver)
        object.__setattr__(self, "patience", patience)
        set_hyper(self, hyper)
        self.__post_init__()

    def __post_init__(self):
        check_part(self.solver, "restart's solver")
        _check_patience(self.patience)
        inherit_hyper(self, self.solver)
        super().__post_init__()

    def init(self, z0):
        return RestartState(
            inner=self.solver.init(z0),
            start=jnp.zeros((z0.shape[0],), jnp.int32),
            watch=_watch_init(z0),
        )

    def _restarts(self, aux, k):
        """Each sample's last restart, with those restarting now (at ``k``)."""
        return jnp.where(aux.watch.stall >= self.patience, k, aux.start)

    @staticmethod
    def _count(start, k):
        """Each sample's count: the solve's ``k``, or 1 at its first step after a restart."""
        return jnp.where(start > 0, jnp.maximum(k - start, 1), k)

    def _restarted_rows(self, aux, z, fz, k, z_next, inner):
        """The batched step's results, with a per-row step on the restarted samples.

        The solver's state is fresh on the samples rewound by the last step.
        """
        restarted = aux.start > 0
        state = where_rows(_rewound(aux.start, k), started(self.solver, z, fz, self), aux.inner)
        z_rows, rows = propose_rows(self.solver, state, z, fz, self._count(aux.start, k))
        return jnp.where(restarted[:, None], z_rows, z_next), where_rows(restarted, rows, inner)

    def propose(self, aux, z, fz, k):
        # the samples never restarted take the solver's own batched step, bit for bit
        z_next, inner = self.solver.propose(aux.inner, z, fz, k)
        z_next, inner = jax.lax.cond(
            jnp.any(aux.start > 0),
            lambda: self._restarted_rows(aux, z, fz, k, z_next, inner),
            lambda: (z_next, inner),
        )
        return z_next, RestartState(inner, self._restarts(aux, k), aux.watch)

    def book(self, aux, res, k):
        """The watch after evaluation ``k`` with residual ``res``; the evaluation of a
        sample's best iterate after a restart does not count as a stall."""
        aux = aux._replace(watch=_watch(aux.watch, res, reset=_rewound(aux.start, k)))
        if overrides(self.solver, "book"):
            aux = aux._replace(inner=self.solver.book(aux.inner, res, self._count(aux.start, k)))
        return aux

    def rewind(self, aux, k):
        """The samples restarting in this step, and the solver's own marks."""
        marks = aux.start == k
        if overrides(self.solver, "rewind"):
            marks |= self.solver.rewind(aux.inner, self._count(aux.start, k))
        return marks

    def phases(self):
        """Until a sample restarts, the solver's batched steps alone."""

        def unrestarted(aux, z, fz, k):
            z_next, inner = self.solver.propose(aux.inner, z, fz, k)
            return z_next, RestartState(inner, self._restarts(aux, k), aux.watch)

        def restarted_too(aux, z, fz, k):
            z_next, inner = self.solver.propose(aux.inner, z, fz, k)
            z_next, inner = self._restarted_rows(aux, z, fz, k, z_next, inner)
            return z_next, RestartState(inner, self._restarts(aux, k), aux.watch)

        return (
            Phase(unrestarted, stay=lambda aux, k: ~jnp.any(aux.start > 0)),
            Phase(restarted_too),
        )

    def path(self, aux, k):
        return jnp.zeros_like(aux.start), aux.start
