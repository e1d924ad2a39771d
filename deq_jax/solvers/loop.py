"""The one iteration driver shared by all solvers.

`iterate(solver, fn, z0, loop=...)` runs any `Solver` on ``fn: [B, D] -> [B, D]`` with
per-sample stopping: a sample that converges (or diverges) is frozen, its ``nstep``
recorded, and the loop ends when every sample has stopped or ``max_iter`` evaluations
were spent. The lowest-residual iterate of each sample is returned. The loop itself is
chosen here and nowhere else:

* ``"while"``: `jax.lax.while_loop`, stops early; not reverse-differentiable (the
  implicit backward modes never differentiate through it).
* ``"scan"``: `jax.lax.scan` over ``max_iter - 1`` steps (later steps are skipped with
  `jax.lax.cond` once all samples stopped); reverse-differentiable, used by
  `deq_jax.backward.unrolled`.
* ``"python"``: a plain Python loop, for debugging with prints and breakpoints.

A solver made of stretches (`deq_jax.solvers.Solver.phases`, e.g. `sequence`'s parts)
runs one while (or Python) loop per stretch, so no step pays for choosing its branch;
``"scan"`` calls the solver's one ``propose``, which gives the same iterates.

The loop and a solver talk through two more hooks, no-ops for a plain solver: after each
evaluation the loop hands the solver its residual (`Solver.book`), and after each
proposal it puts its own best iterate on the rows the solver marks (`Solver.rewind`);
`fallback` and ``restart`` restart samples from their best iterates through them.

A second, optional stop rule watches what the state means rather than how far it still
moves: with ``readout`` (``[B, D] ->`` a pytree, batch axis first, e.g. a decoded answer)
and ``patience = p``, a sample also stops once its readout has been the same for ``p``
evaluations in a row; it is returned at that iterate and counts as converged.

A solver with a ``floor`` (a reduced-precision ``fn``, `deq_jax.solvers.floor`) measures
the residual floor at its first proposal, with one more evaluation, and stops each
sample at ``max(tol, margin * floor)``.

`iterate_unrolled(solver, fn, z0)` is the same loop as a `jax.lax.scan` that returns what
an unrolled network computes instead of the best iterate: per sample ``fn`` at the
iterate it stopped on (at its last finite one if it diverged), and the sum of the
squared residuals ``||fn(z) - z||^2`` along its path (for plain iteration the squared
step lengths ``||z_{t+1} - z_t||^2``), both reverse-differentiable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Phase, Solver, SolverStats, residuals
from deq_jax.solvers.floor import moved_by_one_rounding, stopping_tolerance

LOOPS = ("while", "scan", "python")


class LoopState(NamedTuple):
    """The carry of the iteration; every array but ``k`` has the batch axis first."""

    k: jax.Array  # [] int32, evaluations of fn made so far
    z: jax.Array  # [B, D] current iterate
    fz: jax.Array  # [B, D] fn(z)
    aux: Any  # the solver's own state
    best_z: jax.Array  # [B, D] lowest-residual iterate so far
    best_abs: jax.Array  # [B]
    best_rel: jax.Array  # [B]
    nstep: jax.Array  # [B] int32
    active: jax.Array  # [B] bool, still iterating
    diverged: jax.Array  # [B] bool
    trace: jax.Array  # [B, max_iter] stop-mode residual after each evaluation
    read: Any  # the readout of z (a pytree, batch axis first); () without a readout
    same: jax.Array  # [B] int32, evaluations in a row with an unchanged readout
    path: Any  # a composed solver's (part [B], switched_at [B]) while active; () otherwise
    image: Any  # [B, D] fn at the last iterate with a finite image (unrolled); else ()
    squares: Any  # [B] sum of squared residuals while active (unrolled); else ()
    floor: Any  # (floor [B], at_floor [B] bool) with solver.floor (0 until measured); else ()


class Settle(NamedTuple):
    """The readout stop rule: ``readout: [B, D] -> pytree`` and its ``patience``."""

    readout: Callable[[jax.Array], Any]
    patience: int


def _same_rows(a: Any, b: Any) -> jax.Array:
    """``[B]``: whether every leaf of ``a`` equals ``b``'s on each sample."""
    rows = [
        jnp.all((x == y).reshape(x.shape[0], -1), axis=1)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    ]
    return jnp.stack(rows, axis=0).all(axis=0)


def _best_res(solver: Solver, s: LoopState) -> jax.Array:
    return s.best_rel if solver.stop_mode == "rel" else s.best_abs


def _observe(solver: Solver, s: LoopState, settle: Settle | None, first: bool = False) -> LoopState:
    """Books the residual (and readout) of ``s.z``, the ``s.k``-th evaluation."""
    abs_res, rel_res = residuals(s.z, s.fz)
    res = rel_res if solver.stop_mode == "rel" else abs_res
    s = s._replace(aux=solver.book(s.aux, res, s.k))
    finite = jnp.isfinite(abs_res) & jnp.isfinite(rel_res)
    improved = s.active & finite & (res < _best_res(solver, s))
    floor = s.floor
    if floor:  # a reduced-precision f stops at its residual floor (solvers/floor.py)
        limit = stopping_tolerance(solver.tol, floor[0], solver.floor.margin)
        converged_now = s.active & finite & (res <= limit) & (not solver.full_budget)
        floor = (floor[0], floor[1] | (converged_now & (res > solver.tol)))
    else:
        converged_now = s.active & finite & (res <= solver.tol) & (not solver.full_budget)
    diverged_now = s.active & ~finite
    read, same, settled_now = s.read, s.same, jnp.zeros_like(s.active)
    if settle is not None:
        read = settle.readout(s.z)
        if not first:
            unchanged = _same_rows(read, s.read)
            same = jnp.where(s.active, jnp.where(unchanged, s.same + 1, 0), s.same)
            settled_now = s.active & finite & ~converged_now & (same >= settle.patience)
            # a stopped sample keeps the readout it stopped with
            keep = lambda new, old: jnp.where(
                s.active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old
            )
            read = jax.tree_util.tree_map(keep, read, s.read)
    take = improved | settled_now  # a settled sample is returned where it settled
    path = s.path
    now = solver.path(s.aux, s.k)
    if now is not None:  # a composed solver: which part made this step, while active
        path = tuple(jnp.where(s.active, new, old) for new, old in zip(now, s.path, strict=True))
    image, squares = s.image, s.squares
    if not isinstance(squares, tuple):  # iterate_unrolled
        moved = s.active & finite
        image = jnp.where(moved[:, None], s.fz, image)
        squares = squares + jnp.where(moved, jnp.square(abs_res), 0.0)
    return s._replace(
        best_z=jnp.where(take[:, None], s.z, s.best_z),
        best_abs=jnp.where(take, abs_res, s.best_abs),
        best_rel=jnp.where(take, rel_res, s.best_rel),
        nstep=jnp.where(s.active, s.k, s.nstep),
        active=s.active & ~converged_now & ~diverged_now & ~settled_now,
        diverged=s.diverged | diverged_now,
        trace=jax.lax.dynamic_update_index_in_dim(s.trace, res, s.k - 1, axis=1),
        read=read,
        same=same,
        path=path,
        image=image,
        squares=squares,
        floor=floor,
    )


def _init(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    z0: jax.Array,
    settle: Settle | None,
    unrolled: bool = False,
    floor: jax.Array | None = None,
) -> LoopState:
    batch = z0.shape[0]
    inf = jnp.full((batch,), jnp.inf, z0.dtype)
    aux = solver.init(z0)
    path = () if solver.path(aux, 1) is None else (jnp.zeros((batch,), jnp.int32),) * 2
    if floor is None and _measures_floor(solver, unrolled):
        floor = jnp.zeros_like(inf)  # measured by the first step
    s = LoopState(
        k=jnp.ones((), jnp.int32),
        z=z0,
        fz=fn(z0),
        aux=aux,
        best_z=z0,
        best_abs=inf,
        best_rel=inf,
        nstep=jnp.zeros((batch,), jnp.int32),
        active=jnp.ones((batch,), bool),
        diverged=jnp.zeros((batch,), bool),
        trace=jnp.zeros((batch, solver.max_iter), z0.dtype),
        read=(),
        same=jnp.zeros((batch,), jnp.int32),
        path=path,
        image=z0 if unrolled else (),
        squares=jnp.zeros((batch,), z0.dtype) if unrolled else (),
        floor=() if floor is None else (floor.astype(z0.dtype), jnp.zeros((batch,), bool)),
    )
    return _observe(solver, s, settle, first=True)


def _measures_floor(solver: Solver, unrolled: bool = False) -> bool:
    """Whether a solve by ``solver`` measures its residual floor (`iterate_unrolled` not)."""
    return solver.floor is not None and solver.max_iter >= 2 and not unrolled


def _step(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    settle: Settle | None,
    s: LoopState,
    propose: Callable[..., tuple[jax.Array, Any]] | None = None,
    measure: bool = False,
) -> LoopState:
    """One proposal and its evaluation; with ``measure``, the residual floor is measured
    at the proposal too (`deq_jax.solvers.floor`: one more evaluation)."""
    z, aux = (propose or solver.propose)(s.aux, s.z, s.fz, s.k)
    z = _rewound(solver, aux, s.k, z, s.best_z)
    fz = fn(z)
    if measure:
        abs_floor, rel_floor = residuals(fn(moved_by_one_rounding(z, solver.floor.unit)), fz)
        floor = rel_floor if solver.stop_mode == "rel" else abs_floor
        s = s._replace(floor=(jnp.where(jnp.isfinite(floor), floor, 0.0), s.floor[1]))
    return _observe(solver, s._replace(k=s.k + 1, z=z, fz=fz, aux=aux), settle)


def _first_step(solver, fn, settle, s, going, python, propose=None) -> LoopState:
    """The step measuring the floor, taken if the solve goes on after ``z0``."""
    step = lambda s: _step(solver, fn, settle, s, propose, measure=True)
    if python:
        return step(s) if bool(going(s)) else s
    return jax.lax.cond(going(s), step, lambda s: s, s)


def _rewound(solver: Solver, aux: Any, k: jax.Array, z: jax.Array, best_z: jax.Array) -> jax.Array:
    """``z``, with ``best_z`` on the rows ``solver.rewind(aux, k)`` marks (`Solver.rewind`)."""
    back = solver.rewind(aux, k)
    return z if back is None else jnp.where(back[:, None], best_z, z)


def _keep_going(solver: Solver, s: LoopState) -> jax.Array:
    return (s.k < solver.max_iter) & jnp.any(s.active)


def _run_phases(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    settle: Settle | None,
    s: LoopState,
    python: bool,
    measure: bool,
) -> LoopState:
    """The steps of the solve as a `jax.lax.while_loop` (or a Python loop) per phase.

    A solver without `Solver.phases` is one phase of ``propose`` steps. With
    ``measure`` the first step measures the residual floor.
    """
    for i, phase in enumerate(solver.phases() or (Phase(solver.propose),)):
        if phase.enter is not None:
            s = s._replace(aux=phase.enter(s.aux, s.z, s.fz, s.k))

        def going(s, stay=phase.stay):
            keep = _keep_going(solver, s)
            return keep if stay is None else keep & stay(s.aux, s.k)

        if i == 0 and measure:
            s = _first_step(solver, fn, settle, s, going, python, phase.propose)
        step = lambda s, propose=phase.propose: _step(solver, fn, settle, s, propose)
        if python:
            while bool(going(s)):
                s = step(s)
        else:
            s = jax.lax.while_loop(going, step, s)
    return s


def _scan(
    solver: Solver, step: Callable[[LoopState], LoopState], s: LoopState, length: int
) -> LoopState:
    """``length`` steps as a `jax.lax.scan`, skipped once every sample stopped."""
    body = lambda s, _: (jax.lax.cond(_keep_going(solver, s), step, lambda s: s, s), None)
    return jax.lax.scan(body, s, None, length=length)[0]


def _finish(solver: Solver, s: LoopState) -> tuple[jax.Array, SolverStats]:
    best = _best_res(solver, s)
    taken = jnp.arange(solver.max_iter)[None, :] < s.nstep[:, None]
    stats = SolverStats(
        nstep=s.nstep,
        abs_residual=s.best_abs,
        rel_residual=s.best_rel,
        # a sample stopped without diverging passed the residual test or settled; one
        # still active ran out of budget (with a full budget: it passed the residual test)
        converged=~s.diverged & (~s.active | (solver.full_budget & (best <= solver.tol))),
        diverged=s.diverged,
        trace=jnp.where(taken, s.trace, best[:, None]),
        part=s.path[0] if s.path else None,
        switched_at=s.path[1] if s.path else None,
        floor=s.floor[0] if s.floor else None,
        at_floor=s.floor[1] & ~s.diverged if s.floor else None,
    )
    return s.best_z, stats


def iterate(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    z0: jax.Array,
    loop: str = "while",
    *,
    readout: Callable[[jax.Array], Any] | None = None,
    patience: int = 2,
    floor: jax.Array | None = None,
) -> tuple[jax.Array, SolverStats]:
    """Runs ``solver`` on ``fn`` from ``z0 [B, D]``; returns ``(z_best [B, D], stats)``.

    Args:
      solver: any `Solver`.
      fn: the map ``[B, D] -> [B, D]``; row ``b`` of the output may depend only on row
        ``b`` of the input (samples are independent problems).
      z0: the initial iterate.
      loop: ``"while"``, ``"scan"`` or ``"python"`` (see the module docstring).
      readout: optional ``[B, D] ->`` pytree of arrays with the batch axis first; a
        sample also stops once its readout has not changed for ``patience``
        evaluations in a row (see the module docstring). Its ``converged`` is then
        true and its returned iterate is the one it stopped on.
      patience: evaluations with an unchanged readout that stop a sample (``>= 1``).
      floor: for a solver with a ``floor``, the residual floor ``[B]`` (stop-mode units)
        known already, e.g. the forward solve's for the IFT backward solve: used instead
        of measured. Ignored by a solver without one.

    Raises:
      ValueError: for a ``z0`` that is not ``[B, D]``, an unknown loop or a
        ``patience`` below 1 with a readout.
    """
    if z0.ndim != 2:
        raise ValueError(f"iterate() expects a [B, D] array, got shape {z0.shape}.")
    settle = None
    if readout is not None:
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}.")
        settle = Settle(readout, patience)
    if loop not in LOOPS:
        raise ValueError(f"Unknown loop {loop!r}. Valid loops: {', '.join(LOOPS)}.")
    known = floor is not None and solver.floor is not None
    s = _init(solver, fn, z0, settle, floor=floor if known else None)
    measure = _measures_floor(solver) and not known
    if loop == "scan":
        if measure:
            s = _first_step(solver, fn, settle, s, lambda s: _keep_going(solver, s), False)
        step = lambda s: _step(solver, fn, settle, s)
        s = _scan(solver, step, s, solver.max_iter - 1 - measure)
    else:  # a composed solver runs its phases, each in a loop of its own
        s = _run_phases(solver, fn, settle, s, loop == "python", measure)
    return _finish(solver, s)


def iterate_unrolled(
    solver: Solver, fn: Callable[[jax.Array], jax.Array], z0: jax.Array
) -> tuple[jax.Array, SolverStats, jax.Array]:
    """Runs ``solver`` on ``fn`` from ``z0 [B, D]`` as an unrolled network would.

    `iterate`'s loop with ``loop="scan"`` (reverse-differentiable), returning what the
    unrolled computation ends on rather than the best iterate (no floor is measured).

    Returns:
      ``(image [B, D], stats, squares [B])``: per sample ``fn`` at the iterate it stopped
      on (converged, or out of budget), or at its last iterate with a finite image if it
      diverged (``z0`` if none had one); `SolverStats` as `iterate`'s; and
      ``sum_t ||fn(z_t) - z_t||^2`` over the evaluations with a finite residual (for
      ``fixed_point_iteration()`` the squared step lengths ``||z_{t+1} - z_t||^2``, the
      step penalty of `deq_jax.regularizers.step_penalty`).

    Raises:
      ValueError: for a ``z0`` that is not ``[B, D]``.
    """
    if z0.ndim != 2:
        raise ValueError(f"iterate_unrolled() expects a [B, D] array, got shape {z0.shape}.")
    s = _init(solver, fn, z0, None, unrolled=True)
    s = _scan(solver, lambda s: _step(solver, fn, None, s), s, solver.max_iter - 1)
    _, stats = _finish(solver, s)
    return s.image, stats, s.squares


def iterate_observed(
    solver: Solver,
    fn: Callable[[jax.Array], jax.Array],
    z0: jax.Array,
    steps: int,
    observe: Callable[[jax.Array, jax.Array], Any],
) -> Any:
    """``observe(z, fn(z))`` of each of the first ``steps`` iterates of ``solver``'s solve.

    The loop's iterates (its hooks included), ``steps`` evaluations of every sample.

    Returns:
      The observations stacked along a new axis 1: leaves ``[B, steps, ...]``; index
      ``k - 1`` observes the ``k``-th iterate (index 0 is ``z0``).
    """
    if z0.ndim != 2:
        raise ValueError(f"iterate_observed() expects a [B, D] array, got shape {z0.shape}.")
    solver = solver.replace(max_iter=steps, full_budget=True, floor=None)
    s = _init(solver, fn, z0, None)

    def body(s, _):
        s = _step(solver, fn, None, s)
        return s, observe(s.z, s.fz)

    _, rest = jax.lax.scan(body, s, None, length=steps - 1)
    first = observe(s.z, s.fz)
    return jax.tree_util.tree_map(
        lambda a, b: jnp.concatenate([a[:, None], jnp.moveaxis(b, 0, 1)], axis=1), first, rest
    )
