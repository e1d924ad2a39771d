"""Per-sample switching combinators: `fallback` to a backup solver, `restart` on a stall.

Both watch each sample's residual (in their ``stop_mode``) and act on that sample
alone: the other samples go on exactly as under the wrapped solver. Both restart the
part they hand a sample to from the sample's lowest-residual iterate so far, with a
fresh state (history), and record the switch in the statistics
(`deq_jax.SolverStats.part`, ``switched_at``).
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
    propose_rows,
    set_hyper,
    stop_residual,
    where_rows,
)

# What makes `fallback` hand a sample to its backup.
TRIGGERS = ("nonfinite", "diverging", "stalled")


class Watch(NamedTuple):
    """Each sample's best iterate so far and how long ago it improved."""

    best_z: jax.Array  # [B, D] lowest-residual iterate
    best_fz: jax.Array  # [B, D] its image
    best_res: jax.Array  # [B] its residual
    stall: jax.Array  # [B] int32, evaluations since the residual last improved


def _watch_init(z0: jax.Array) -> Watch:
    batch = z0.shape[0]
    return Watch(
        best_z=z0,
        best_fz=z0,
        best_res=jnp.full((batch,), jnp.inf, z0.dtype),
        stall=jnp.zeros((batch,), jnp.int32),
    )


def _watch(solver: Solver, w: Watch, z: jax.Array, fz: jax.Array) -> tuple[Watch, jax.Array]:
    """Books ``(z, fz)``; returns the new watch and the residual of ``z``, ``[B]``."""
    res = stop_residual(solver, z, fz)
    better = res < w.best_res  # false for NaN
    w = Watch(
        best_z=jnp.where(better[:, None], z, w.best_z),
        best_fz=jnp.where(better[:, None], fz, w.best_fz),
        best_res=jnp.where(better, res, w.best_res),
        stall=jnp.where(better, 0, w.stall + 1),
    )
    return w, res


def _check_patience(patience: Any) -> None:
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1, got {patience!r}.")


class FallbackState(NamedTuple):
    """The two parts' states, which samples are on the backup, and the watch."""

    primary: Any
    backup: Any
    on_backup: jax.Array  # [B] bool
    start: jax.Array  # [B] int32, evaluation after which the backup took over (0: never)
    watch: Watch


@dataclasses.dataclass(frozen=True, kw_only=True)
class fallback(Solver):  # noqa: N801 - registry name is the constructor name
    """``primary``, and per sample ``backup`` once ``primary`` fails on that sample.

    A sample switches (once, for good) when one of the ``when`` triggers fires after
    one of its evaluations:

    * ``"nonfinite"``: the primary proposes a non-finite iterate (e.g. Anderson's
      least-squares system went singular);
    * ``"diverging"``: the residual exceeds ``growth`` times the sample's best one (or
      is not finite);
    * ``"stalled"``: the residual has not gone below the sample's best for
      ``patience`` evaluations in a row.

    The backup then starts from the sample's lowest-residual iterate so far, with a
    fresh state, and makes that sample's next proposal. The other samples keep the
    primary's iterates, bit for bit. The backup runs only once some sample uses it.

    Statistics: ``part`` is 0 (primary) or 1 (backup); ``switched_at`` the evaluation
    after which the backup took over (0: never).

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
        )

    def _triggered(self, res, best_before, stall, z_primary) -> jax.Array:
        fired = jnp.zeros(res.shape, bool)
        if "nonfinite" in self.when:
            fired |= ~jnp.all(jnp.isfinite(z_primary), axis=1)
        if "diverging" in self.when:
            fired |= ~jnp.isfinite(res) | (res > self.growth * best_before)
        if "stalled" in self.when:
            fired |= stall >= self.patience
        return fired

    def _primary_step(self, aux, z, fz, k):
        """The primary's step, the watch, and which samples switch after it."""
        best_before = aux.watch.best_res
        watch, res = _watch(self, aux.watch, z, fz)
        z_primary, primary = self.primary.propose(aux.primary, z, fz, k)
        switch = ~aux.on_backup & self._triggered(res, best_before, watch.stall, z_primary)
        return watch, z_primary, primary, switch

    def _backup_rows(self, backup, watch, switch, start, z, fz, k):
        """The backup's step on every row, the samples switching now restarted first."""
        state = where_rows(switch, self.backup.init(watch.best_z), backup)
        z_in = jnp.where(switch[:, None], watch.best_z, z)
        fz_in = jnp.where(switch[:, None], watch.best_fz, fz)
        return propose_rows(self.backup, state, z_in, fz_in, jnp.maximum(k - start + 1, 1))

    def propose(self, aux, z, fz, k):
        watch, z_primary, primary, switch = self._primary_step(aux, z, fz, k)
        on_backup = aux.on_backup | switch
        start = jnp.where(switch, k, aux.start)
        z_backup, backup = jax.lax.cond(
            jnp.any(on_backup),
            lambda: self._backup_rows(aux.backup, watch, switch, start, z, fz, k),
            lambda: (z_primary, aux.backup),
        )
        z_next = jnp.where(on_backup[:, None], z_backup, z_primary)
        return z_next, FallbackState(primary, backup, on_backup, start, watch)

    def phases(self):
        """Until a sample switches or could stall, the primary's steps alone.

        The first stretch carries no backup state. A stall grows by at most one per
        evaluation, so it ends one evaluation before a stall could reach ``patience``
        ("stalled" needs no check in its steps); a non-finite proposal or a diverging
        residual is caught in the step that meets it, where the backup's first proposal
        replaces the primary's (a branch taken only then). From there on, `propose`.
        """
        checked = tuple(t for t in self.when if t != "stalled")

        def primary_only(aux, z, fz, k):
            watch, z_primary, primary, switch = self._primary_step(aux, z, fz, k)
            start = jnp.where(switch, k, aux.start)
            if checked:

                def first_backup_step():  # only z: the backup's state is rebuilt on entry
                    fresh = self.backup.init(z)
                    z_backup, _ = self._backup_rows(fresh, watch, switch, start, z, fz, k)
                    return jnp.where(switch[:, None], z_backup, z_primary)

                z_primary = jax.lax.cond(jnp.any(switch), first_backup_step, lambda: z_primary)
            return z_primary, FallbackState(primary, (), switch, start, watch)

        def stay(aux, k):
            calm = ~jnp.any(aux.on_backup)
            if "stalled" in self.when:
                calm &= ~jnp.any(aux.watch.stall >= self.patience - 1)
            return calm

        def enter_backup(aux, z, fz, k):
            # the state the backup's first proposal left on the rows switched in the
            # first stretch (the other rows' backup state is not read before they switch)
            w = aux.watch
            fresh = self.backup.init(w.best_z)
            _, backup = self._backup_rows(
                fresh, w, aux.on_backup, aux.start, w.best_z, w.best_fz, aux.start
            )
            return aux._replace(backup=backup)

        return (
            Phase(primary_only, stay=stay, enter=lambda aux, z, fz, k: aux._replace(backup=())),
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
    in a row, its state (e.g. Anderson's history, Broyden's inverse-Jacobian terms) is
    cleared and the solver goes on from the sample's lowest-residual iterate so far, as
    if that were a new start. The samples never restarted take the solver's own batched
    steps, bit for bit; once some sample has restarted, the restarted ones also take a
    step mapped over the rows (each counts from its own restart), about one more step's
    work.

    Statistics: ``part`` is 0 (the one solver); ``switched_at`` the evaluation after
    which the sample last restarted (0: never).

    Built positionally (``restart(anderson(), 5)``) or by keywords.

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

    def _watch_step(self, aux, z, fz, k):
        """The watch after ``(z, fz)``, the samples restarting now, and the restarts."""
        watch, _ = _watch(self, aux.watch, z, fz)
        now = watch.stall >= self.patience
        watch = watch._replace(stall=jnp.where(now, 0, watch.stall))
        return watch, now, jnp.where(now, k, aux.start)

    def _rows(self, inner, watch, now, start, z, fz, k):
        """The solver's step on every row, each counting from its last restart."""
        state = where_rows(now, self.solver.init(watch.best_z), inner)
        z_in = jnp.where(now[:, None], watch.best_z, z)
        fz_in = jnp.where(now[:, None], watch.best_fz, fz)
        local = jnp.where(start > 0, k - start + 1, k)
        return propose_rows(self.solver, state, z_in, fz_in, local)

    def _merge(self, aux, watch, now, start, z, fz, k, z_next, inner):
        """The batched step's results, with the per-row step on the restarted samples."""
        restarted = start > 0
        z_rows, inner_rows = self._rows(aux.inner, watch, now, start, z, fz, k)
        return (
            jnp.where(restarted[:, None], z_rows, z_next),
            where_rows(restarted, inner_rows, inner),
        )

    def propose(self, aux, z, fz, k):
        watch, now, start = self._watch_step(aux, z, fz, k)
        # the samples never restarted take the solver's own batched step, bit for bit
        z_next, inner = self.solver.propose(aux.inner, z, fz, k)
        z_next, inner = jax.lax.cond(
            jnp.any(start > 0),
            lambda: self._merge(aux, watch, now, start, z, fz, k, z_next, inner),
            lambda: (z_next, inner),
        )
        return z_next, RestartState(inner, start, watch)

    def phases(self):
        """Until a sample restarts, the solver's batched steps alone."""

        def unrestarted(aux, z, fz, k):
            watch, now, start = self._watch_step(aux, z, fz, k)
            z_next, inner = self.solver.propose(aux.inner, z, fz, k)

            def first_restart():  # only z: the restarted rows' state is rebuilt on entry
                fresh = self.solver.init(z)  # (only the restarting rows' z is kept)
                z_rows, _ = self._rows(fresh, watch, now, start, z, fz, k)
                return jnp.where(now[:, None], z_rows, z_next)

            z_next = jax.lax.cond(jnp.any(now), first_restart, lambda: z_next)
            return z_next, RestartState(inner, start, watch)

        def enter_restarted(aux, z, fz, k):
            # the state the restarting step's per-row proposal left on the restarted rows
            w, restarted = aux.watch, aux.start > 0
            _, rows = self._rows(aux.inner, w, restarted, aux.start, w.best_z, w.best_fz, aux.start)
            return aux._replace(inner=where_rows(restarted, rows, aux.inner))

        def restarted_too(aux, z, fz, k):
            watch, now, start = self._watch_step(aux, z, fz, k)
            z_next, inner = self.solver.propose(aux.inner, z, fz, k)
            z_next, inner = self._merge(aux, watch, now, start, z, fz, k, z_next, inner)
            return z_next, RestartState(inner, start, watch)

        return (
            Phase(unrestarted, stay=lambda aux, k: ~jnp.any(aux.start > 0)),
            Phase(restarted_too, enter=enter_restarted),
        )

    def path(self, aux, k):
        return jnp.zeros_like(aux.start), aux.start
