"""`fixed_point`: the one entry point that joins a solver and a backward mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax import _flat
from deq_jax.backward.base import Backward
from deq_jax.backward.ift import ift
from deq_jax.backward.nonfinite import flag_nonfinite_inputs, nonfinite_rows, solve_watched
from deq_jax.precision import in_precision
from deq_jax.solvers.base import Solution, Solver
from deq_jax.solvers.floor import floor_of
from deq_jax.solvers.loop import iterate


def _check_output(f: Callable[..., Any], z0: Any, args: Any) -> None:
    out = jax.eval_shape(f, z0, args)
    if not _flat.same_specs(out, z0):
        raise ValueError(
            "f(z, args) must return a pytree with the structure, shapes and dtypes of z0; "
            f"z0 is {_flat.describe(z0)} but f(z0, args) is {_flat.describe(out)}. (In a "
            "deq_jax.nn.DEQ, f is the cell and z0 its state: give the cell a state_spec(x) "
            "method (see deq_jax.nn.state_like) or pass z0 explicitly.)"
        )


def with_budget(solver: Any, max_iter: int | None) -> Solver:
    """``solver`` checked, with the call's budget ``max_iter`` (``None``: its own)."""
    if not isinstance(solver, Solver):
        raise TypeError(f"solver must be a deq_jax Solver, got {solver!r}.")
    return solver if max_iter is None else solver.replace(max_iter=max_iter)


def _in_precision(
    f: Callable[..., Any], solver: Solver, backward: Backward, precision: str
) -> tuple[Callable[..., Any], Solver, Backward]:
    """``f`` in ``precision``, the solvers stopping at its floor (unless given one)."""
    floor = floor_of(precision)
    if floor is not None and solver.floor is None:
        solver = solver.replace(floor=floor)
    return in_precision(f, precision), solver, backward.with_floor(floor)


def _flat_start(
    f: Callable[..., Any], z0: Any, args: Any, batched: bool | None
) -> tuple[_flat.Layout, jax.Array]:
    """Checks a solve's pieces; the state's layout and its flat, detached ``[B, D]`` start."""
    _check_output(f, z0, args)
    if batched is None:
        batched = _flat.infer_batched(z0)
    layout = _flat.layout_of(z0, batched)
    return layout, jax.lax.stop_gradient(_flat.flatten(z0, layout))


def fixed_point(
    f: Callable[[Any, Any], Any],
    z0: Any,
    args: Any = None,
    *,
    solver: Solver,
    backward: Backward | None = None,
    max_iter: int | None = None,
    batched: bool | None = None,
    stats_probe: jax.Array | None = None,
    precision: str | None = None,
) -> Solution:
    """Solves ``z = f(z, args)`` from ``z0`` and returns the fixed point and statistics.

    Args:
      f: the cell, ``f(z, args) -> z`` with the structure, shapes and dtypes of ``z``.
        For a batched state, sample ``b`` of the output may depend only on sample ``b``
        of ``z`` (samples are independent problems and stop independently).
      z0: the initial state, a pytree of float arrays. Never receives a gradient.
      args: a pytree of everything ``f`` depends on (parameters, inputs); gradients
        reach every float array in it, and any array ``f`` closes over.
      solver: the forward solver, e.g. ``deq_jax.solvers.anderson(tol=1e-4)``.
      backward: how gradients flow (`deq_jax.backward`); defaults to ``ift()`` with the
        forward solver reused for the backward system.
      max_iter: the budget of this solve (f-evaluations, the first included); ``None``
        keeps ``solver.max_iter``. An ``ift()`` without its own solver reuses it
        backward.
      batched: whether every leaf of ``z0`` has a leading batch axis. ``None`` means
        batched unless a leaf is a scalar. Pass ``False`` for a single vector state.
      stats_probe: an optional `deq_jax.backward.stats_probe()`; its gradient carries
        the backward solve's statistics (see `deq_jax.backward.probe`).
      precision: ``None`` solves ``f`` as written. A precision's name
        (`deq_jax.precision`: ``"default"``, ``"float32"``, ``"bfloat16"``) computes
        ``f``'s matmuls and convolutions in that arithmetic, and where it is coarser
        than float32 the forward and IFT backward solves measure their residual floor
        and stop at ``max(tol, floor)`` (`deq_jax.solvers.floor`; ``stats.floor``,
        ``stats.at_floor``). The state, residuals and backward solve stay float32.

    Returns:
      A `Solution` with ``value`` (like ``z0``) and per-sample ``stats``.

    Raises:
      ValueError: if ``f``'s output does not match ``z0`` (both are named), if ``z0``
        has no common batch axis while ``batched`` is true, or if ``backward`` cannot
        differentiate ``solver``'s solve (``reversible()`` needs the reversible solver).

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """
    if backward is None:
        backward = ift()
    elif not isinstance(backward, Backward):
        raise TypeError(f"backward must be a deq_jax backward mode, got {backward!r}.")
    solver = with_budget(solver, max_iter)
    backward.check_solver(solver)
    if precision is not None:
        f, solver, backward = _in_precision(f, solver, backward, precision)
    layout, z0_flat = _flat_start(f, z0, args, batched)

    def fn(z_flat, a):
        return _flat.flatten(f(_flat.unflatten(z_flat, layout), a), layout)

    fn_closed, consts = jax.closure_convert(fn, z0_flat, args)
    params = (args, tuple(consts))
    z_flat, stats = solve_watched(
        backward, lambda z, p: fn_closed(z, p[0], *p[1]), solver, z0_flat, params, stats_probe
    )
    stats = jax.tree_util.tree_map(lambda x: _flat.unbatch_stats(x, layout), stats)
    return Solution(value=_flat.unflatten(z_flat, layout), stats=stats)


def _detach(x: Any) -> Any:
    """``x`` without a gradient if it is a float array, else ``x`` unchanged."""
    if isinstance(x, jax.Array | np.ndarray) and jnp.issubdtype(x.dtype, jnp.inexact):
        return jax.lax.stop_gradient(x)
    return x


def solve_until_settled(
    f: Callable[[Any, Any], Any],
    z0: Any,
    args: Any = None,
    *,
    solver: Solver,
    readout: Callable[[Any], Any],
    patience: int = 2,
    max_iter: int | None = None,
    batched: bool | None = None,
) -> Solution:
    """Solves ``z = f(z, args)`` like `fixed_point`, also stopping once ``readout`` settles.

    For models whose output is discrete (a pointer per node, a class), the residual
    test goes on iterating long after the decoded output is final. Here a sample also
    stops when ``readout(z)`` has been the same for ``patience`` evaluations in a row
    (`deq_jax.solvers.iterate`); it is then returned at the iterate it stopped on and
    counts as converged. A sample whose residual passes the solver's ``tol`` first stops
    as in `fixed_point`.

    Forward only, for evaluation: the returned value carries no gradient (train with
    `fixed_point`, whose implicit gradient assumes a converged fixed point).

    Args:
      f: the cell, as in `fixed_point`.
      z0: the initial state, a pytree of float arrays.
      args: everything ``f`` depends on.
      solver: the forward solver; its ``tol`` and ``max_iter`` still apply.
      readout: ``z -> pytree`` of arrays with the batch axis first (``z`` shaped like
        ``z0``), e.g. a decoder's argmax. Equality is exact, so read out discrete values.
      patience: evaluations in a row with an unchanged readout that stop a sample.
      max_iter: the budget of this solve; ``None`` keeps ``solver.max_iter``.
      batched: as in `fixed_point`.

    Returns:
      A `Solution`; ``stats.nstep`` counts the evaluations until the sample stopped by
      either rule.

    Raises:
      ValueError: as `fixed_point`, or for a ``patience`` below 1.
    """
    solver = with_budget(solver, max_iter)
    layout, z0_flat = _flat_start(f, z0, args, batched)
    batched = layout.batched
    args = jax.tree_util.tree_map(_detach, args)  # forward only
    fn = lambda z: _flat.flatten(f(_flat.unflatten(z, layout), args), layout)
    read = lambda z: readout(_flat.unflatten(z, layout))
    if not batched:  # iterate's rows are samples: give the readout's leaves one
        read = lambda z: jax.tree_util.tree_map(
            lambda x: jnp.reshape(x, (1, -1)), readout(_flat.unflatten(z, layout))
        )
    z_flat, stats = iterate(solver, fn, z0_flat, readout=read, patience=patience)
    stats = flag_nonfinite_inputs(stats, nonfinite_rows(args, layout.batch_size))
    stats = jax.tree_util.tree_map(lambda x: _flat.unbatch_stats(x, layout), stats)
    return Solution(value=_flat.unflatten(z_flat, layout), stats=stats)
