"""Exact gradients in constant memory: the reversible DEQ's backward mode.

`reversible()` pairs with the solver `deq_jax.solvers.reversible`, whose step
``x_{k+1} = (1 - b) x_{k-1} + b f(x_k)`` can be undone from the two points after it,
``x_{k-1} = (x_{k+1} - b f(x_k)) / (1 - b)``. The forward solve keeps only its last two
points; the backward pass walks the steps in reverse, rebuilding each point as it goes
and accumulating the cotangents, so the gradient is the exact gradient of the
computation the forward pass made (not an implicit-function approximation at an inexact
fixed point), with memory that does not grow with the number of steps.

Undoing step ``x_{k+1} = (1 - b) x_{k-1} + b f(x_k)`` with cotangents ``c_k``,
``c_{k+1}`` of the pair ``(x_k, x_{k+1})``::

    f(x_k), vjp = jax.vjp(f, x_k, params)       # one VJP per step, its primal reused
    x_{k-1} = (x_{k+1} - b f(x_k)) / (1 - b)     # the rebuilt point
    dx, dparams = vjp(b c_{k+1})
    (c_{k-1}, c_k) <- ((1 - b) c_{k+1}, c_k + dx);  grads += dparams

A forward solve of ``K + 1`` evaluations (``K`` steps) costs ``K`` VJPs backward.

Per-sample stopping: each sample stops on its own when its residual reaches ``tol``
(at any evaluation, a ``y`` or a ``z`` point of the paper), when it diverges, or at
``max_iter``; ``full_budget=True`` runs every sample the whole budget (the paper's fixed
step count). The returned value is the point each sample stopped on (not the lowest-
residual iterate the other modes return: the gradient must be that of one fixed
computation), and the backward pass undoes each sample's own number of steps. A sample
whose residual turns non-finite is stopped at its last finite point, flagged
``diverged``, and differentiated through the steps up to that point.

Numerics: each undone step divides by ``1 - b``, so the rebuilt points drift from the
forward ones as the steps grow, the more so in float32 and for ``b`` near 1
(docs/results/reversible.md measures it against the stored forward points). The
backward pass stores no forward point to check against, but it does rebuild the start:
with a stats probe (`deq_jax.backward.stats_probe`, which the train steps log) its
backward ``abs_residual`` is the drift of the rebuilt ``(x_{-1}, x_0)`` from ``z_0``
(`backward_stats`), the reconstruction error the gradient was computed with.

References:
  McCallum, Arora & Foster, "Reversible Deep Equilibrium Models", 2025
  (arXiv:2509.12917).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.backward.base import Backward, FlatFn
from deq_jax.backward.probe import encode_stats
from deq_jax.solvers.base import Solver, SolverStats, residuals
from deq_jax.solvers.reversible import reversible as reversible_solver
from deq_jax.solvers.reversible import reversible_step, reversible_unstep


class ForwardState(NamedTuple):
    """The carry of the reversible forward loop; every array but ``k`` per sample."""

    k: jax.Array  # [] int32, evaluations of fn made so far
    prev: jax.Array  # [B, D] x_{n-1} of each sample's last step
    z: jax.Array  # [B, D] x_n, the point each sample is at (and returns)
    fz: jax.Array  # [B, D] fn(z)
    steps: jax.Array  # [B] int32, n: the steps each sample took (to undo backward)
    active: jax.Array  # [B] bool
    diverged: jax.Array  # [B] bool
    abs_res: jax.Array  # [B] of z
    rel_res: jax.Array  # [B] of z
    nstep: jax.Array  # [B] int32, evaluations spent on the sample
    trace: jax.Array  # [B, max_iter]


def _res(solver: Solver, abs_res: jax.Array, rel_res: jax.Array) -> jax.Array:
    return rel_res if solver.stop_mode == "rel" else abs_res


def _start(solver: Solver, fn, z0: jax.Array) -> ForwardState:
    fz = fn(z0)
    abs_res, rel_res = residuals(z0, fz)
    res = _res(solver, abs_res, rel_res)
    finite = jnp.isfinite(abs_res) & jnp.isfinite(rel_res)
    converged = finite & (res <= solver.tol) & (not solver.full_budget)
    batch = z0.shape[0]
    trace = jnp.zeros((batch, solver.max_iter), z0.dtype).at[:, 0].set(res)
    return ForwardState(
        k=jnp.ones((), jnp.int32),
        prev=z0,
        z=z0,
        fz=fz,
        steps=jnp.zeros((batch,), jnp.int32),
        active=finite & ~converged,
        diverged=~finite,
        abs_res=abs_res,
        rel_res=rel_res,
        nstep=jnp.ones((batch,), jnp.int32),
        trace=trace,
    )


def _advance(solver: Solver, fn, s: ForwardState) -> ForwardState:
    """One step for every sample; the active ones with a finite result take it."""
    new = reversible_step(s.prev, s.fz, solver.beta)
    f_new = fn(new)
    abs_res, rel_res = residuals(new, f_new)
    res = _res(solver, abs_res, rel_res)
    finite = jnp.isfinite(abs_res) & jnp.isfinite(rel_res)
    moved = s.active & finite
    converged = moved & (res <= solver.tol) & (not solver.full_budget)
    rows = moved[:, None]
    return ForwardState(
        k=s.k + 1,
        prev=jnp.where(rows, s.z, s.prev),
        z=jnp.where(rows, new, s.z),
        fz=jnp.where(rows, f_new, s.fz),
        steps=s.steps + moved.astype(jnp.int32),
        active=moved & ~converged,
        diverged=s.diverged | (s.active & ~finite),
        abs_res=jnp.where(moved, abs_res, s.abs_res),
        rel_res=jnp.where(moved, rel_res, s.rel_res),
        nstep=jnp.where(s.active, s.k + 1, s.nstep),
        trace=jax.lax.dynamic_update_index_in_dim(s.trace, res, s.k, axis=1),
    )


def forward(solver: Solver, fn, z0: jax.Array) -> tuple[ForwardState, SolverStats]:
    """Runs the reversible iteration on ``fn: [B, D] -> [B, D]`` from ``z0 [B, D]``
    with per-sample stopping (module docstring); returns the final loop state (each
    sample's last two points and its step count) and the statistics."""
    s = _start(solver, fn, z0)
    s = jax.lax.while_loop(
        lambda s: (s.k < solver.max_iter) & jnp.any(s.active),
        lambda s: _advance(solver, fn, s),
        s,
    )
    res = _res(solver, s.abs_res, s.rel_res)
    taken = jnp.arange(solver.max_iter)[None, :] < s.nstep[:, None]
    stats = SolverStats(
        nstep=s.nstep,
        abs_residual=s.abs_res,
        rel_residual=s.rel_res,
        converged=~s.diverged & (res <= solver.tol),
        diverged=s.diverged,
        trace=jnp.where(taken, s.trace, res[:, None]),
    )
    return s, stats


class BackwardState(NamedTuple):
    """The carry of the reverse loop: each sample's pair ``(x_{k-1}, x_k)``, their
    cotangents, the steps it has left to undo, and the parameters' cotangent so far."""

    left: jax.Array  # [B] int32
    prev: jax.Array  # [B, D]
    cur: jax.Array  # [B, D]
    ct_prev: jax.Array  # [B, D]
    ct_cur: jax.Array  # [B, D]
    grads: list  # the float leaves of params' cotangent


def _float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def unwind(
    fn: FlatFn,
    params: Any,
    z0: jax.Array,
    prev: jax.Array,
    cur: jax.Array,
    steps: jax.Array,
    beta: float,
    g: jax.Array,
) -> BackwardState:
    """Undoes ``steps [B]`` reversible steps from each sample's last pair ``(prev, cur)``
    with the cotangent ``g`` of ``cur``; the returned state holds the rebuilt first pair
    ``(x_{-1}, x_0)`` (both ``z_0`` up to rounding) and the parameters' cotangent.

    The last step undone is linearised at ``z0`` itself rather than at its rebuilt
    copy: the start is known exactly, and a cell with kinks (a ReLU, a clipped variance)
    evaluated at ``z_0 = 0`` sits on them, where a rounding-sized offset would change
    the derivative (an MDEQ cell at its initial weights does)."""
    leaves = jax.tree_util.tree_leaves(params)

    def body(s: BackwardState) -> BackwardState:
        live = s.left > 0
        point = jnp.where((s.left == 1)[:, None], z0, s.prev)  # x_0 is z_0 exactly
        f_prev, vjp = jax.vjp(fn, point, params)
        u = jnp.where(live[:, None], beta * s.ct_cur, 0.0)
        d_prev, d_params = vjp(u)
        rows = live[:, None]
        d_all = jax.tree_util.tree_leaves(d_params)
        d_leaves = [d for x, d in zip(leaves, d_all, strict=True) if _float(x)]
        return BackwardState(
            left=s.left - live.astype(jnp.int32),
            prev=jnp.where(rows, reversible_unstep(s.cur, f_prev, beta), s.prev),
            cur=jnp.where(rows, s.prev, s.cur),
            ct_prev=jnp.where(rows, (1.0 - beta) * s.ct_cur, s.ct_prev),
            ct_cur=jnp.where(rows, s.ct_prev + d_prev, s.ct_cur),
            grads=[a + d for a, d in zip(s.grads, d_leaves, strict=True)],
        )

    start = BackwardState(
        left=steps,
        prev=prev,
        cur=cur,
        ct_prev=jnp.zeros_like(g),
        ct_cur=g,
        grads=[jnp.zeros_like(x) for x in leaves if _float(x)],
    )
    return jax.lax.while_loop(lambda s: jnp.any(s.left > 0), body, start)


def backward_stats(unwound: BackwardState, z0: jax.Array, steps: jax.Array) -> SolverStats:
    """The backward pass's statistics (what a stats probe carries): ``nstep`` the steps
    undone, ``abs_residual`` the drift of the rebuilt start ``(x_{-1}, x_0)`` from
    ``z_0`` (zero in exact arithmetic: the accumulated reconstruction error),
    ``rel_residual`` that drift over ``||z_0||`` (plus 1e-8), ``converged`` whether the
    rebuilt start is finite."""
    drift = jnp.sqrt(
        jnp.sum(jnp.square(unwound.prev - z0), axis=-1)
        + jnp.sum(jnp.square(unwound.cur - z0), axis=-1)
    )
    finite = jnp.isfinite(drift)
    return SolverStats(
        nstep=steps,
        abs_residual=drift,
        rel_residual=drift / (jnp.linalg.norm(z0, axis=-1) + 1e-8),
        converged=finite,
        diverged=~finite,
        trace=drift[:, None],
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _reversible_solve(solver: Solver, fn: FlatFn, z0, params, probe):
    s, stats = forward(solver, lambda z: fn(z, params), z0)
    return s.z, stats


def _fwd(solver, fn, z0, params, probe):
    s, stats = forward(solver, lambda z: fn(z, params), z0)
    return (s.z, stats), (z0, s.prev, s.z, s.steps, params, probe)


def _bwd(solver, fn, saved, cotangents):
    z0, prev, z, steps, params, probe = saved
    s = unwind(fn, params, z0, prev, z, steps, solver.beta, cotangents[0])
    grads = iter(s.grads)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    out = [next(grads) if _float(x) else np.zeros(np.shape(x), jax.dtypes.float0) for x in leaves]
    probe_ct = None
    if probe is not None:
        probe_ct = encode_stats(backward_stats(s, z0, steps), probe.dtype)
    return jnp.zeros_like(z0), jax.tree_util.tree_unflatten(treedef, out), probe_ct


_reversible_solve.defvjp(_fwd, _bwd)


@dataclasses.dataclass(frozen=True, kw_only=True)
class reversible(Backward):  # noqa: N801 - registry name is the constructor name
    """The exact gradient of the reversible iteration, in constant memory.

    Pairs only with the solver `deq_jax.solvers.reversible` (its ``beta``, ``tol``,
    ``max_iter`` and ``full_budget`` drive both passes). The value is the point each
    sample stopped on; the gradient is autodiff's through the same steps, computed by
    undoing them (module docstring). A backward pass costs one VJP per forward step and
    holds two states and their cotangents, however many steps were taken.

    Higher derivatives: the forward and backward loops are `jax.lax.while_loop`s, so
    ``grad`` of ``grad`` is not defined (as with ``ift``); `jax.jit` and `jax.vmap` are.
    """

    def check_solver(self, solver: Solver) -> None:
        if not isinstance(solver, reversible_solver):
            raise ValueError(
                "deq_jax.backward.reversible() differentiates by undoing the steps of the "
                f"reversible solver and cannot undo those of {solver.name!r}. Pair it with "
                "deq_jax.solvers.reversible(beta=...) (config: deq.solver.name="
                "'reversible'), or differentiate a "
                f"{solver.name!r} solve with ift, phantom or unrolled."
            )

    def solve(self, fn, z0, params, solver, probe=None):
        self.check_solver(solver)
        return _reversible_solve(solver, fn, z0, params, probe)
