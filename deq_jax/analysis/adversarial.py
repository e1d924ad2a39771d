"""Adversarial initialisations: searching for starts that reach a different fixed point.

A path-independent model reaches the same fixed point from every start; an adversary
tries to break that by optimising the initial state. Since `deq_jax.fixed_point` never
differentiates w.r.t. ``z0``, the adversary differentiates an unrolled run of ``steps``
iterations of the cell from its start (as in the paper), minimises the cosine similarity
between where that run ends and the reference fixed point with L-BFGS (`optax.lbfgs`),
then solves from the optimised start with the real solver. Each sample keeps its worst
result over several random restarts.

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (Section 4.2, adversarial initialisations).
  Liu & Nocedal, "On the limited memory BFGS method for large scale optimization",
  Math. Programming 1989.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from deq_jax.analysis.path_independence import per_sample_cosine
from deq_jax.backward.phantom import jacobian_free
from deq_jax.fixed_point import fixed_point
from deq_jax.solvers.base import Solver


class AttackResult(NamedTuple):
    """The outcome of `adversarial_aa`.

    Attributes:
      aa: the attacked AA score, the batch mean of ``per_instance``.
      per_instance: ``[B]`` cosine similarity between the reference fixed point and the
        fixed point reached from the worst start found for each sample.
      fixed_points: the attacked fixed points (like ``z0``), for attacked predictions.
      starts: the worst starts found (like ``z0``).
      diverged: ``[B]`` bool: the solve from the worst start blew up (the solver met a
        non-finite residual); its ``per_instance`` entry is then 0: nothing aligned.
    """

    aa: jax.Array
    per_instance: jax.Array
    fixed_points: Any
    starts: Any
    diverged: jax.Array


def _finite_per_sample(tree: Any) -> jax.Array:
    """``[B]`` bool: every value of the sample is finite, over all leaves."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(
        jnp.stack([jnp.isfinite(x.reshape(x.shape[0], -1)).all(axis=1) for x in leaves]), axis=0
    )


def _per_sample_where(keep: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``keep`` (``[B]``), else ``old``, leaf by leaf."""
    pick = lambda a, b: jnp.where(keep.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
    return jax.tree_util.tree_map(pick, new, old)


def unrolled_run(f: Callable[[Any, Any], Any], z0: Any, args: Any, steps: int) -> Any:
    """``steps`` plain iterations of ``f`` from ``z0``, differentiable w.r.t. ``z0``."""
    z, _ = jax.lax.scan(lambda z, _: (f(z, args), None), z0, None, length=steps)
    return z


def _random_start(key: jax.Array, like: Any, scale: float) -> Any:
    """A Gaussian start with std ``scale``, shaped like the state ``like``."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    keys = jax.random.split(key, len(leaves))
    noise = [
        scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, noise)


def _lbfgs_minimise(objective: Callable[[Any], jax.Array], start: Any, iters: int) -> Any:
    """``iters`` L-BFGS steps (`optax.lbfgs`) on ``objective`` from ``start``, as a scan."""
    optimizer = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(objective)

    def body(carry, _):
        params, state = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = optimizer.update(
            grad, state, params, value=value, grad=grad, value_fn=objective
        )
        return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(body, (start, optimizer.init(start)), None, length=iters)
    return params


def adversarial_aa(
    f: Callable[[Any, Any], Any],
    z0: Any,
    args: Any,
    *,
    solver: Solver,
    key: jax.Array,
    steps: int = 30,
    restarts: int = 3,
    lbfgs_iters: int = 20,
    init_scale: float = 1.0,
) -> AttackResult:
    """The AA score under adversarially chosen initial states.

    Args:
      f: the cell ``f(z, args) -> z``, batched along axis 0.
      z0: the training-time initial state (the reference fixed point is solved from it).
      args: the cell's arguments, held fixed.
      solver: the solver used for the reference and the attacked solves.
      key: draws the random restarts.
      steps: unrolled iterations the adversary differentiates through.
      restarts: random starts (Gaussian with std ``init_scale``), each optimised.
      lbfgs_iters: L-BFGS iterations per restart.
      init_scale: the standard deviation of the random starts.

    Returns:
      An `AttackResult`; ``per_instance`` is at most the AA score from any single start.
      A start from which the solve blows up (the solver reports ``diverged``) is the
      strongest attack and scores 0 for its sample; a search that itself blows up (a
      non-finite start) falls back to its random start, so the score is never NaN.
    """
    for name, value in (("steps", steps), ("restarts", restarts), ("lbfgs_iters", lbfgs_iters)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    args = jax.lax.stop_gradient(args)
    solve = lambda start: fixed_point(f, start, args, solver=solver, backward=jacobian_free())
    reference = solve(z0).value

    def objective(start):
        return jnp.sum(per_sample_cosine(unrolled_run(f, start, args, steps), reference))

    leaves = jax.tree_util.tree_leaves(z0)
    worst_cos = jnp.full((leaves[0].shape[0],), jnp.inf, leaves[0].dtype)
    worst_fp, worst_start = reference, z0
    worst_diverged = jnp.zeros(worst_cos.shape, bool)
    for restart_key in jax.random.split(key, restarts):
        random_start = _random_start(restart_key, z0, init_scale)
        optimised = _lbfgs_minimise(objective, random_start, lbfgs_iters)
        start = _per_sample_where(_finite_per_sample(optimised), optimised, random_start)
        solution = solve(start)
        attacked = solution.value
        diverged = solution.stats.diverged | ~_finite_per_sample(attacked)
        cos = jnp.where(diverged, 0.0, per_sample_cosine(attacked, reference))
        worse = cos < worst_cos
        worst_fp = _per_sample_where(worse, attacked, worst_fp)
        worst_start = _per_sample_where(worse, start, worst_start)
        worst_diverged = jnp.where(worse, diverged, worst_diverged)
        worst_cos = jnp.minimum(cos, worst_cos)
    return AttackResult(jnp.mean(worst_cos), worst_cos, worst_fp, worst_start, worst_diverged)
