"""Composing solvers: `sequence` of solvers by step counts, and the pieces they share.

A combinator takes solvers and is a `Solver` itself: a frozen, hashable dataclass that
runs in `deq_jax.solvers.iterate`, `deq_jax.fixed_point`, the DEQ layer and as the
backward solver of `deq_jax.backward.ift`. Its own ``tol``, ``max_iter``,
``stop_mode`` and ``full_budget`` govern the solve (those of its parts are not read);
left unset they are taken from the part named in each combinator's docstring.

* `sequence` runs its parts one after the other for fixed numbers of steps (e.g. cheap
  fixed-point steps to warm up Anderson, or a neural solver's trained steps before
  Anderson's tail).
* `fallback` and `restart` (`deq_jax.solvers.switching`) switch per sample.

Every combinator takes its parts positionally, in the order below, or by the keywords
named there; the other fields are keywords (``restart``'s ``patience`` may also follow
its part):

* ``sequence((s1, k1), ..., sn)`` or ``sequence(solvers=(s1, ..., sn), steps=(k1, ...))``
* ``fallback(primary, backup)`` or ``fallback(primary=..., backup=...)``
* ``restart(solver)`` or ``restart(solver=...)``

Each combinator reports in the statistics which part made a sample's last step
(`SolverStats.part`) and when that part took over (`SolverStats.switched_at`).

The per-sample helpers here (`propose_rows`, `where_rows`) run a part whose samples are
at different points of their own history.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import Phase, Solver, residuals

_HYPER = ("tol", "max_iter", "stop_mode", "full_budget", "floor")


def inherit_hyper(combinator: Solver, source: Solver) -> None:
    """Fills the combinator's unset (``None``) budget fields from ``source``'s."""
    for name in _HYPER:
        if getattr(combinator, name) is None:
            object.__setattr__(combinator, name, getattr(source, name))


def check_part(value: Any, what: str) -> Solver:
    """``value`` if it is a `Solver`; otherwise a `TypeError` naming ``what``."""
    if not isinstance(value, Solver):
        raise TypeError(f"{what} must be a deq_jax Solver, got {value!r}.")
    return value


def set_hyper(combinator: Solver, hyper: dict) -> None:
    """Sets the budget fields (``tol``, ``max_iter``, ...) of a frozen ``combinator``
    from the keywords ``hyper`` (``None`` for each one not given: inherited later by
    `inherit_hyper`)."""
    for name in _HYPER:
        object.__setattr__(combinator, name, hyper.get(name))


def check_keywords(name: str, hyper: dict, fields: tuple[str, ...]) -> None:
    """A `TypeError` naming the unknown budget keywords of combinator ``name``, if any.

    ``hyper`` holds the keywords given besides the combinator's own ``fields``; only the
    budget keywords (``tol``, ``max_iter``, ``stop_mode``, ``full_budget``) are valid.
    """
    unknown = sorted(set(hyper) - set(_HYPER))
    if unknown:
        raise TypeError(
            f"Unknown {name} keyword(s) {unknown}; valid: {', '.join((*fields, *_HYPER))}."
        )


def stop_residual(solver: Solver, z: jax.Array, fz: jax.Array) -> jax.Array:
    """``[B]``: the residual of ``z`` in ``solver``'s stop mode (as the loop books it)."""
    abs_res, rel_res = residuals(z, fz)
    return rel_res if solver.stop_mode == "rel" else abs_res


def overrides(solver: Solver, hook: str) -> bool:
    """Whether ``solver`` implements the loop hook ``hook`` (``"book"``, ``"rewind"``)."""
    return getattr(type(solver), hook) is not getattr(Solver, hook)


def started(part: Solver, z: jax.Array, fz: jax.Array, stop: Solver) -> Any:
    """``part``'s state started afresh at ``z``, the evaluation ``fz`` of ``z`` booked.

    For a part taking over at ``z`` (a `sequence` stage, `fallback`'s backup, a
    restarted solver). The loop booked that evaluation (`Solver.book`) into the state
    being replaced, so a part that watches the residual books it again here, in the
    stop mode of ``stop`` (the combinator starting it), as its first (count 1).
    """
    state = part.init(z)
    if overrides(part, "book"):
        state = part.book(state, stop_residual(stop, z, fz), jnp.ones((), jnp.int32))
    return state


def where_rows(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per sample, ``new`` where ``mask [B]`` else ``old`` (pytrees, batch axis first)."""

    def pick(a, b):
        return jnp.where(jnp.reshape(mask, (-1,) + (1,) * (a.ndim - 1)), a, b)

    return jax.tree_util.tree_map(pick, new, old)


def propose_rows(solver: Solver, aux: Any, z: jax.Array, fz: jax.Array, k: jax.Array):
    """``solver.propose`` with a count ``k [B]`` per sample (each row its own batch of 1).

    Every array of ``aux`` has the batch axis first (the `Solver` contract), so the
    proposal is mapped over the rows; a part restarted on some samples sees, on each,
    the evaluations made since its own start.
    """

    def one(aux_row, z_row, fz_row, k_row):
        aux1 = jax.tree_util.tree_map(lambda x: x[None], aux_row)
        z_next, aux1 = solver.propose(aux1, z_row[None], fz_row[None], k_row)
        return z_next[0], jax.tree_util.tree_map(lambda x: x[0], aux1)

    return jax.vmap(one)(aux, z, fz, k)


def _stages(stages: tuple[Any, ...]) -> tuple[tuple[Solver, ...], tuple[int, ...]]:
    """``((s1, k1), ..., sn)`` -> the parts and the step counts of all but the last."""
    if not stages:
        raise ValueError("sequence() needs at least one solver.")
    parts, steps = [], []
    for i, stage in enumerate(stages[:-1]):
        if not (isinstance(stage, tuple | list) and len(stage) == 2):
            raise ValueError(
                f"sequence stage {i} must be a (solver, steps) pair (only the last solver "
                f"runs to the end of the budget), got {stage!r}."
            )
        solver, count = stage
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"sequence stage {i} steps must be an integer >= 0, got {count!r}.")
        parts.append(check_part(solver, f"sequence stage {i}"))
        steps.append(count)
    parts.append(check_part(stages[-1], "the last sequence stage"))
    return tuple(parts), tuple(steps)


def _until(last: int):
    """A `Phase` ``stay`` rule: propose while the evaluation count is at most ``last``."""
    return lambda aux, k: k <= last


@dataclasses.dataclass(frozen=True, kw_only=True)
class sequence(Solver):  # noqa: N801 - registry name is the constructor name
    """Runs ``s1`` for ``k1`` steps, then ``s2`` for ``k2`` steps, ..., then ``sn``.

    ``sequence((s1, k1), (s2, k2), ..., sn)``: ``s1`` makes the first ``k1`` proposals
    (after evaluations ``1 .. k1``; each costs one evaluation of ``f``), ``s2`` the next
    ``k2``, and the last part the rest of the budget. A part takes over from where the
    previous one stopped: its state is re-initialised at the current iterate and image
    (it counts evaluations from its start), unless the previous part hands its history
    over (`Solver.hand_over`; e.g. a neural solver hands its history to an Anderson of
    the same memory, which then continues it). A part with ``0`` steps is skipped.

    Statistics: ``part`` is the index (from 0) of the part that made the sample's last
    step; ``switched_at`` the evaluation after which that part took over
    (``k1 + ... + k_i`` for part ``i``; 0 for part 0).

    Also buildable by keywords: ``sequence(solvers=(s1, s2, s3), steps=(k1, k2))``.

    Attributes:
      solvers: the parts, in order.
      steps: the step counts of all parts but the last.
      tol, max_iter, stop_mode, full_budget: see `Solver`; unset, the last part's.
    """

    solvers: tuple[Solver, ...]
    steps: tuple[int, ...]
    tol: float | None = None
    max_iter: int | None = None
    stop_mode: str | None = None
    full_budget: bool | None = None

    def __init__(self, *stages: Any, solvers: Any = None, steps: Any = None, **hyper: Any):
        if stages and (solvers is not None or steps is not None):
            raise ValueError("Give sequence() either (solver, steps) stages or solvers=/steps=.")
        if not stages:
            solvers, steps = tuple(solvers or ()), tuple(steps or ())
            if len(steps) != len(solvers) - 1:
                raise ValueError(
                    f"sequence(solvers=, steps=) needs one step count per solver but the "
                    f"last: got {len(solvers)} solvers and {len(steps)} steps."
                )
            stages = (*zip(solvers[:-1], steps, strict=True), *solvers[-1:])
        parts, counts = _stages(tuple(stages))
        check_keywords("sequence", hyper, ("solvers", "steps"))
        object.__setattr__(self, "solvers", parts)
        object.__setattr__(self, "steps", counts)
        set_hyper(self, hyper)
        self.__post_init__()

    def __post_init__(self):
        inherit_hyper(self, self.solvers[-1])
        super().__post_init__()

    @property
    def bounds(self) -> tuple[int, ...]:
        """The evaluation counts after which each later part takes over."""
        out, total = [], 0
        for count in self.steps:
            total += count
            out.append(total)
        return tuple(out)

    def init(self, z0):
        return tuple(part.init(z0) for part in self.solvers)

    def _stage(self, k: jax.Array) -> jax.Array:
        """The index of the part that proposes after evaluation ``k``."""
        k = jnp.asarray(k)
        return sum((k > b).astype(jnp.int32) for b in self.bounds) + jnp.zeros((), jnp.int32)

    def _branch(self, i: int, take_over: bool):
        """Part ``i``'s step; with ``take_over``, its first step (it takes over first)."""
        part = self.solvers[i]

        def run(aux, z, fz, k):
            own = aux[i]
            if take_over:
                handed = self._handed(aux, i, k)
                own = started(part, z, fz, self) if handed is None else handed
            z_next, own = part.propose(own, z, fz, self._count(aux, i, k))
            return z_next, (*aux[:i], own, *aux[i + 1 :])

        return run

    def propose(self, aux, z, fz, k):
        if len(self.solvers) == 1:
            return self._branch(0, False)(aux, z, fz, k)
        # one switch per step: part 0, then (take over, go on) for each later part
        branches = [self._branch(0, False)]
        for i in range(1, len(self.solvers)):
            branches += [self._branch(i, True), self._branch(i, False)]
        stage = self._stage(k)
        first = jnp.asarray(k) == jnp.asarray((0, *self.bounds))[stage] + 1
        index = jnp.where(stage > 0, 2 * stage - first.astype(jnp.int32), 0)
        return jax.lax.switch(index, branches, aux, z, fz, k)

    def phases(self):
        """Per part a stretch of its own steps (its first step, taking over, apart)."""
        out = []
        for i in range(len(self.solvers)):
            lo = self.bounds[i - 1] if i > 0 else 0
            hi = self.bounds[i] if i < len(self.bounds) else None
            if hi is not None and hi <= lo:
                continue  # a part with 0 steps is skipped
            if i > 0:
                out.append(Phase(self._branch(i, True), stay=_until(lo + 1)))
            out.append(Phase(self._branch(i, False), stay=None if hi is None else _until(hi)))
        return tuple(out)

    def _handed(self, aux, i: int, k):
        """The history part ``i - 1`` hands part ``i`` (`Solver.hand_over`), or ``None``."""
        return None if i == 0 else self.solvers[i - 1].hand_over(aux[i - 1], self.solvers[i], k - 1)

    def _count(self, aux, i: int, k):
        """Part ``i``'s own count at the solve's ``k``: a part started afresh counts from
        its start, one that continues a handed-over history sees the solve's count."""
        if i == 0 or self._handed(aux, i, k) is not None:
            return k
        return k - self.bounds[i - 1]

    def book(self, aux, res, k):
        """Every part that watches the residual books it (a part not running yet is
        started afresh when it takes over, so what it booked before is not read)."""
        return tuple(
            part.book(own, res, self._count(aux, i, k)) if overrides(part, "book") else own
            for i, (part, own) in enumerate(zip(self.solvers, aux, strict=True))
        )

    def rewind(self, aux, k):
        """The marks of the part that made the proposal after evaluation ``k``."""
        stage = self._stage(k)
        marks = None
        for i, part in enumerate(self.solvers):
            if not overrides(part, "rewind"):
                continue
            back = part.rewind(aux[i], self._count(aux, i, k))
            if back is not None:
                back = (stage == i) & back
                marks = back if marks is None else marks | back
        return marks

    def path(self, aux, k):
        batch = jax.tree_util.tree_leaves(aux)[0].shape[0] if jax.tree_util.tree_leaves(aux) else 1
        # the proposal after evaluation k - 1 made the k-th iterate
        stage = self._stage(jnp.asarray(k) - 1)
        starts = jnp.asarray((0, *self.bounds), jnp.int32)
        part = jnp.full((batch,), stage, jnp.int32)
        return part, jnp.full((batch,), starts[stage], jnp.int32)
