"""Path independence: the Asymptotic Alignment (AA) score.

An equilibrium model is path independent when it reaches the same fixed point from any
initial state. The AA score of Anil et al. (Algorithm 1) measures it: solve every input
from the training-time initialisation, then solve each input again starting from the
fixed point of a *different* input, and compare the two fixed points by cosine
similarity. A score near 1 means the fixed point does not depend on the path.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax._flat import per_sample_cosine
from deq_jax.backward.phantom import jacobian_free
from deq_jax.fixed_point import fixed_point
from deq_jax.solvers.base import Solver


def derangement(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of ``range(n)`` with no fixed point (``n >= 2``).

    Shuffles the indices, then sends each one to its successor in the shuffled order.
    """
    if n < 2:
        raise ValueError(f"A derangement needs at least 2 elements, got {n}.")
    order = jax.random.permutation(key, n)
    return jnp.zeros((n,), jnp.int32).at[order].set(jnp.roll(order, -1).astype(jnp.int32))


def aa_score(
    f: Callable[[Any, Any], Any],
    z0: Any,
    args: Any,
    *,
    solver: Solver,
    key: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The Asymptotic Alignment score (Algorithm 1 of Anil et al. 2022).

    Args:
      f: the cell ``f(z, args) -> z``, batched along axis 0 of ``z`` (and of whatever
        per-sample inputs ``args`` holds).
      z0: the training-time initial state, batched (``B >= 2``).
      args: the cell's arguments (parameters and the batch of inputs).
      solver: the forward solver, with the budget of interest (e.g. the test budget).
      key: draws the permutation that pairs each input with another input's fixed
        point.

    Returns:
      ``(mean, per_instance)``: the batch mean and the ``[B]`` cosine similarities
      between the fixed point reached from ``z0`` and the one reached from another
      input's fixed point. No gradient flows (this is an analysis tool).
    """
    args = jax.lax.stop_gradient(args)
    solve = lambda start: fixed_point(f, start, args, solver=solver, backward=jacobian_free()).value
    z_star = solve(z0)
    batch = jax.tree_util.tree_leaves(z_star)[0].shape[0]
    perm = derangement(key, batch)
    z_other = solve(jax.tree_util.tree_map(lambda z: z[perm], z_star))
    per_instance = per_sample_cosine(z_star, z_other)
    return jnp.mean(per_instance), per_instance


def aa_score_deq(
    model: Any,
    variables: Any,
    x: Any,
    *,
    key: jax.Array,
    max_iter: int | None = None,
    rngs: dict[str, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`aa_score` for a trained `deq_jax.nn.DEQ` (eval mode).

    Args:
      model: a `deq_jax.nn.DEQ`.
      variables: its variables.
      x: a batch of inputs (``B >= 2``).
      key: draws the pairing permutation.
      max_iter: the solver budget (default: the model's eval budget).
      rngs: rngs for the first solve (e.g. ``{"z0": key}`` for ``z_init="normal"``).

    Returns:
      ``(mean, per_instance)`` as in `aa_score`.
    """
    z_star, _ = model.apply(variables, x, train=False, max_iter=max_iter, rngs=rngs)
    batch = jax.tree_util.tree_leaves(z_star)[0].shape[0]
    perm = derangement(key, batch)
    start = jax.tree_util.tree_map(lambda z: z[perm], z_star)
    z_other, _ = model.apply(variables, x, start, train=False, max_iter=max_iter)
    per_instance = per_sample_cosine(z_star, z_other)
    return jnp.mean(per_instance), per_instance
