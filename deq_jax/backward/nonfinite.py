"""Non-finite values never pass a fixed-point solve silently.

Forward: a sample whose input is non-finite is flagged ``diverged`` (and not
``converged``), even when the cell saturates it into a finite state (``tanh(inf) = 1``)
and its residual looks small. Backward: `solve_watched` runs any backward mode and,
when the gradients it returns are NaN or infinite, emits one `NonFiniteGradientWarning`
worded the same for every mode, from inside the compiled program
(`jax.pure_callback` behind a `jax.lax.cond`, so a finite step pays only the check).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.solvers.base import SolverStats


class NonFiniteGradientWarning(RuntimeWarning):
    """A backward mode returned NaN or infinite gradients."""


def _float_leaves(tree: Any) -> list[jax.Array]:
    return [
        x
        for x in jax.tree_util.tree_leaves(tree)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
    ]


def all_finite(tree: Any) -> jax.Array:
    """``[]`` bool: whether every float entry of ``tree`` is finite (true if it has none)."""
    flags = [jnp.all(jnp.isfinite(x)) for x in _float_leaves(tree)]
    return jnp.stack(flags).all() if flags else jnp.asarray(True)


def nonfinite_rows(tree: Any, batch_size: int) -> jax.Array:
    """``[batch_size]`` bool: the samples that see a non-finite float entry of ``tree``.

    A leaf whose leading axis has ``batch_size`` entries is read per sample (row ``b``
    belongs to sample ``b``); a non-finite entry of any other leaf (a parameter, a
    scalar) reaches every sample. A parameter whose leading axis happens to equal the
    batch size is read per sample too, which can only under-report.
    """
    bad = jnp.zeros((batch_size,), bool)
    for x in _float_leaves(tree):
        if x.ndim and x.shape[0] == batch_size:
            bad = bad | ~jnp.all(jnp.isfinite(x).reshape(batch_size, -1), axis=1)
        else:
            bad = bad | ~jnp.all(jnp.isfinite(x))
    return bad


def flag_nonfinite_inputs(stats: SolverStats, bad: jax.Array) -> SolverStats:
    """``stats`` with the samples ``bad [B]`` marked diverged and not converged."""
    return stats._replace(converged=stats.converged & ~bad, diverged=stats.diverged | bad)


def nonfinite_message(mode: str, n_bad: int, batch: int, n_forward: int, n_cotangent: int) -> str:
    """The one wording of every backward mode's non-finite-gradient warning."""
    causes = []
    if n_forward:
        causes.append(f"{n_forward} with a diverged forward solve or a non-finite input")
    if n_cotangent:
        causes.append(f"{n_cotangent} with a non-finite gradient arriving at z*")
    if not causes:
        causes.append(
            "every sample: a non-finite parameter, or a backward solve that failed "
            "under ift(on_failure='nan')"
        )
    return (
        f"deq_jax: {mode} backward produced non-finite gradients for {n_bad} of {batch} "
        f"samples ({'; '.join(causes)}). See the solver stats' diverged flags; a training "
        "step with these gradients is skipped (train.max_nonfinite_steps)."
    )


def _warn(mode: str, grads_finite, forward_bad, cotangent_bad) -> np.ndarray:
    """Host side: warns unless every gradient was finite; returns zeros (see below)."""
    zeros = np.zeros(np.shape(grads_finite), np.float32)
    if bool(np.all(grads_finite)):  # under vmap the guarding cond runs both branches
        return zeros
    forward_bad, cotangent_bad = np.asarray(forward_bad), np.asarray(cotangent_bad)
    n_bad = int(np.sum(forward_bad | cotangent_bad)) or forward_bad.size
    message = nonfinite_message(
        mode, n_bad, forward_bad.size, int(forward_bad.sum()), int(cotangent_bad.sum())
    )
    warnings.warn(message, NonFiniteGradientWarning, stacklevel=2)
    return zeros


def report_nonfinite(mode: str, grads: Any, forward_bad: jax.Array, g: jax.Array) -> Any:
    """``grads``, after a `NonFiniteGradientWarning` (from compiled code) if they hold a
    NaN or an infinity.

    The warning is a `jax.pure_callback` behind a `jax.lax.cond`, whose zero result is
    added to every gradient so that it is not pruned. Unlike `jax.debug.callback` it
    adds no effect to the program, so jit keeps its fast dispatch path: a finite step
    pays only the finiteness check (measured in BUILD_NOTES.md).

    Args:
      mode: the backward mode's name, for the message.
      grads: the cotangents the mode returned for the solve's arguments.
      forward_bad: ``[B]`` samples flagged diverged by the forward solve.
      g: ``[B, D]`` the incoming cotangent of ``z*``.
    """
    ok = all_finite(grads)
    cotangent_bad = ~jnp.all(jnp.isfinite(g), axis=1)
    warn = functools.partial(_warn, mode)
    zero = jax.lax.cond(
        ok,
        lambda: jnp.zeros((), jnp.float32),
        lambda: jax.pure_callback(
            warn,
            jax.ShapeDtypeStruct((), jnp.float32),
            ok,
            forward_bad,
            cotangent_bad,
            vmap_method="broadcast_all",
        ),
    )
    add = lambda x: x + zero.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact) else x
    return jax.tree_util.tree_map(add, grads)


def _solve_and_flag(mode, fn, solver, z0, params, probe) -> tuple[jax.Array, SolverStats]:
    z, stats = mode.solve(fn, z0, params, solver, probe)
    return z, flag_nonfinite_inputs(stats, nonfinite_rows(params, z0.shape[0]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def solve_watched(mode: Any, fn: Any, solver: Any, z0, params, probe):
    """``mode.solve(fn, z0, params, solver, probe)`` with the samples whose input is
    non-finite flagged diverged, and a `NonFiniteGradientWarning` when its gradients
    are non-finite.

    The gradient w.r.t. ``params`` (and the probe's) is ``mode``'s, unchanged; ``z0``
    and the statistics receive none.
    """
    return _solve_and_flag(mode, fn, solver, z0, params, probe)


def _watched_fwd(mode, fn, solver, z0, params, probe):
    run = lambda p, pr: _solve_and_flag(mode, fn, solver, z0, p, pr)
    # the statistics carry no gradient (as under ift): only z* is differentiated
    z, vjp, stats = jax.vjp(run, params, probe, has_aux=True)
    return (z, stats), (vjp, stats)


def _watched_bwd(mode, fn, solver, residuals, cotangents):
    vjp, stats = residuals
    g = cotangents[0]
    grads, probe_ct = vjp(g)
    grads = report_nonfinite(mode.name, grads, stats.diverged, g)
    return jnp.zeros_like(g), grads, probe_ct


solve_watched.defvjp(_watched_fwd, _watched_bwd)
