"""A DEQ in Equinox: an ``eqx.Module`` cell solved by `deq_jax.fixed_point`.

deq_jax's core is a pure function of pytrees, so an Equinox model needs no layer: split
it into its arrays and the rest (``eqx.partition``, Equinox's ``nnx.split``), and the
solver sees ``f(z, (arrays, x))`` exactly as for the linen and NNX layers. This example

1. checks the gradient of a loss of ``z*`` w.r.t. the cell's weights against autodiff
   through the unrolled iterations: the implicit gradient (IFT, Anderson forward solve)
   against 100 plain iterations, and the reversible DEQ's (`deq_jax.solvers.reversible`
   with `deq_jax.backward.reversible`, exact in constant memory) against autodiff
   through the same reversible steps;
2. trains the cell and a linear readout for a few optax Adam steps with each backward
   mode, regressing ``y = sin(3 x_0) + x_1^2``.

Equinox is not a dependency of deq_jax (it comes with the ``[test]`` extra)::

    pip install equinox
    python examples/equinox_deq.py

It prints one JSON line (the gradients' largest relative differences, the losses before
and after training) and exits non-zero if a gradient disagrees or a loss did not fall.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  McCallum, Arora & Foster, "Reversible Deep Equilibrium Models", 2025
  (arXiv:2509.12917).
"""

from __future__ import annotations

import json
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import deq_jax as dj

FEATURES = 16
STEPS = 40
BETA = 0.5  # the reversible step's relaxation
# (forward solver, backward mode) per gradient; the reversible solve runs its whole
# budget, 2 * 12 steps, so that the reference below takes the same steps.
MODES = {
    "ift": (dj.solvers.anderson(m=5, tol=1e-6, max_iter=60), dj.backward.ift()),
    "reversible": (
        dj.solvers.reversible(beta=BETA, max_iter=25, full_budget=True),
        dj.backward.reversible(),
    ),
}


class Cell(eqx.Module):
    """``z' = tanh(W z + U x + b)`` on ``z [B, FEATURES]``, ``x [B, 2]``."""

    inject: eqx.nn.Linear
    recurrent: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k_inject, k_recurrent = jax.random.split(key)
        self.inject = eqx.nn.Linear(2, FEATURES, use_bias=False, key=k_inject)
        self.recurrent = eqx.nn.Linear(FEATURES, FEATURES, key=k_recurrent)

    def __call__(self, z: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(jax.vmap(self.recurrent)(z) + jax.vmap(self.inject)(x))


def solve(cell: Cell, x: jax.Array, mode: str) -> dj.Solution:
    """``z* = cell(z*, x)`` by `deq_jax.fixed_point` with the solver and backward mode of
    ``mode``: the cell's arrays ride in ``args``, the rest is closed over."""
    solver, backward = MODES[mode]
    arrays, static = eqx.partition(cell, eqx.is_array)

    def f(z, args):  # the pure cell the solver sees
        arrays, x = args
        return eqx.combine(arrays, static)(z, x)

    z0 = jnp.zeros((x.shape[0], FEATURES), x.dtype)
    return dj.fixed_point(f, z0, (arrays, x), solver=solver, backward=backward)


class Regressor(eqx.Module):
    """The fixed point of `Cell`, read out linearly."""

    cell: Cell
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k_cell, k_head = jax.random.split(key)
        self.cell = Cell(k_cell)
        self.head = eqx.nn.Linear(FEATURES, "scalar", key=k_head)

    def __call__(self, x: jax.Array, mode: str) -> tuple[jax.Array, dj.SolverStats]:
        sol = solve(self.cell, x, mode)
        return jax.vmap(self.head)(sol.value), sol.stats


def unrolled(cell: Cell, x: jax.Array, mode: str) -> jax.Array:
    """The reference ``z*``: 100 plain iterations (IFT) or the reversible solve's steps,
    in a loop that autodiff differentiates step by step."""
    z0 = jnp.zeros((x.shape[0], FEATURES), x.dtype)
    if mode == "ift":
        return jax.lax.fori_loop(0, 100, lambda _, z: cell(z, x), z0)
    solver, _ = MODES[mode]

    def step(_, pair):  # (x_{k-1}, x_k) -> (x_k, x_{k+1})
        prev, z = pair
        return z, dj.solvers.reversible_step(prev, cell(z, x), BETA)

    # max_iter evaluations of the cell: the start's and one per step
    return jax.lax.fori_loop(0, solver.max_iter - 1, step, (z0, z0))[1]


def check_gradients(model: Regressor, x: jax.Array) -> dict[str, float]:
    """Per mode, the largest difference between its gradient w.r.t. the cell and the
    unrolled reference's, relative to the largest entry of the reference."""
    w = jnp.linspace(-1.0, 1.0, FEATURES)
    out = {}
    for mode in MODES:
        solved = lambda cell, mode=mode: jnp.sum(jnp.sin(solve(cell, x, mode).value) * w)
        reference = lambda cell, mode=mode: jnp.sum(jnp.sin(unrolled(cell, x, mode)) * w)
        g = eqx.filter_jit(eqx.filter_grad(solved))(model.cell)
        g_ref = eqx.filter_jit(eqx.filter_grad(reference))(model.cell)
        leaves = lambda tree: jnp.concatenate([a.ravel() for a in jax.tree_util.tree_leaves(tree)])
        diff = jnp.max(jnp.abs(leaves(g) - leaves(g_ref))) / jnp.max(jnp.abs(leaves(g_ref)))
        out[mode] = float(diff)
    return out


def train(model: Regressor, x: jax.Array, y: jax.Array, mode: str) -> dict[str, float]:
    """`STEPS` Adam steps on the squared error; the first and last losses."""
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    def loss_fn(model):
        prediction, stats = model(x, mode)
        return jnp.mean((prediction - y) ** 2), stats

    @eqx.filter_jit
    def step(model, opt_state):
        (loss, stats), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss, jnp.mean(stats.nstep)

    losses = []
    for _ in range(STEPS):
        model, opt_state, loss, nstep = step(model, opt_state)
        losses.append(float(loss))
    return {"loss_first": losses[0], "loss_last": losses[-1], "solver_steps": float(nstep)}


def main() -> int:
    k_data, k_model = jax.random.split(jax.random.key(0))
    x = jax.random.uniform(k_data, (64, 2), minval=-1.0, maxval=1.0)
    y = jnp.sin(3.0 * x[:, 0]) + x[:, 1] ** 2
    model = Regressor(k_model)
    report = {"gradient_relative_difference": check_gradients(model, x[:8])}
    report["training"] = {mode: train(model, x, y, mode) for mode in MODES}
    report["equinox"] = eqx.__version__
    print(json.dumps(report))
    grads_agree = all(d < 1e-4 for d in report["gradient_relative_difference"].values())
    learnt = all(r["loss_last"] < 0.5 * r["loss_first"] for r in report["training"].values())
    return 0 if grads_agree and learnt else 1


if __name__ == "__main__":
    sys.exit(main())
