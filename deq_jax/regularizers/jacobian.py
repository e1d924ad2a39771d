"""Stochastic estimates of the Jacobian of a cell at its fixed point.

Both estimators work on any cell ``f(z, args) -> z`` with a pytree state, batched along
axis 0 or not, through the flat ``[B, D]`` view of `deq_jax._flat`; they never build
the ``D x D`` Jacobian.

* `jacobian_frobenius` is the Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` that Bai
  et al. (2021) add to the training loss; it is differentiable w.r.t. ``args``.
* `spectral_radius` is a power-method estimate of ``rho(J_f(z*))``, a diagnostic of how
  contractive the cell is at the equilibrium (``rho < 1`` means fixed-point iteration
  converges locally).
* `spectral_radius_penalty_estimate` is a cheaper power-method estimate of ``rho`` whose
  last steps are differentiable w.r.t. ``args``: what a penalty on ``rho`` trains
  against (`deq_jax.training.JacobianRegularizer`'s ``spectral_weight``).

Per-sample values assume that sample ``b`` of ``f(z)`` depends on sample ``b`` of ``z``
only (a block-diagonal Jacobian across the batch), as the solvers do. If a cell mixes
samples (e.g. batch statistics), the per-sample values are the column blocks of the
full Jacobian and still sum to the whole-batch quantity.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` as a training penalty;
  the spectral radius of ``J_f(z*)`` as the measure of stability).
  Hutchinson, "A stochastic estimator of the trace of the influence matrix for
  Laplacian smoothing splines", 1989.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax import _flat, _forward_mode

PROBES = ("gaussian", "rademacher")


def _flat_problem(
    f: Callable[[Any, Any], Any], z_star: Any, args: Any, batched: bool | None
) -> tuple[Callable[[jax.Array], jax.Array], jax.Array, _flat.Layout]:
    """``f`` as a map ``[B, D] -> [B, D]`` and ``z*`` flattened, without its gradient."""
    if batched is None:
        batched = _flat.infer_batched(z_star)
    layout = _flat.layout_of(z_star, batched)
    z = jax.lax.stop_gradient(_flat.flatten(z_star, layout))  # [B, D]
    return _flat.flat_fn(f, layout, args), z, layout


def _detach_float(leaf: Any) -> Any:
    """``leaf`` without its gradient if it is a float array (keys and ints pass as they are)."""
    if isinstance(leaf, jax.Array | float) and jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
        return jax.lax.stop_gradient(leaf)
    return leaf


def _probes(key: jax.Array, shape: tuple[int, ...], dtype: Any, probe: str) -> jax.Array:
    """Random vectors with ``E[eps eps^T] = I``: Gaussian or Rademacher (+-1)."""
    if probe == "gaussian":
        return jax.random.normal(key, shape, dtype)
    if probe == "rademacher":
        return jax.random.rademacher(key, shape, dtype)
    raise ValueError(f"Unknown probe {probe!r}. Valid probes: {', '.join(PROBES)}.")


def jacobian_frobenius(
    f: Callable[[Any, Any], Any],
    z_star: Any,
    args: Any,
    key: jax.Array,
    num_samples: int = 1,
    *,
    probe: str = "gaussian",
    batched: bool | None = None,
) -> jax.Array:
    """Hutchinson estimate of ``||J_f(z*)||_F^2 / d`` per sample.

    With probes ``eps`` such that ``E[eps eps^T] = I``,
    ``E ||eps^T J||^2 = tr(J J^T) = ||J||_F^2``. The estimate averages
    ``||eps_m^T J||^2`` over ``num_samples`` probes, each a vector-Jacobian product of
    ``z -> f(z, args)`` at ``z*`` (one linearisation, ``num_samples`` VJPs under
    ``vmap``), and divides by ``d``, the per-sample state size summed over leaves.

    Gradients: ``z_star`` is treated as a constant (`jax.lax.stop_gradient`); the value
    is differentiable w.r.t. ``args`` through ``f`` only. This is what the paper's
    reference implementation does (the penalty is computed at the detached
    equilibrium, so its gradient never flows back through the solver or the implicit
    backward pass). For a fixed ``key`` the estimate is a deterministic, smooth function
    of ``args``.

    Args:
      f: the cell, ``f(z, args) -> z`` with the same pytree structure as ``z``.
      z_star: the equilibrium (or any point), a pytree of float arrays.
      args: the cell's other arguments (parameters, input injection).
      key: a PRNG key for the probes.
      num_samples: probes per sample, ``M >= 1``; the variance falls as ``1 / M``.
      probe: ``"gaussian"`` or ``"rademacher"`` (+-1 entries; lower variance).
      batched: whether every leaf of ``z_star`` has a leading batch axis; ``None``
        means batched unless a leaf is a scalar.

    Returns:
      ``[B]`` estimates for a batched state, a scalar otherwise; unbiased for
      ``||J_f(z*)_b||_F^2 / d`` (the mean over the batch is the paper's penalty).

    Raises:
      ValueError: for ``num_samples < 1`` or an unknown ``probe``.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}.")
    if probe not in PROBES:
        raise ValueError(f"Unknown probe {probe!r}. Valid probes: {', '.join(PROBES)}.")
    fn, z, layout = _flat_problem(f, z_star, args, batched)
    _, vjp_fn = jax.vjp(fn, z)
    eps = _probes(key, (num_samples, *z.shape), z.dtype, probe)  # [M, B, D]
    (eps_j,) = jax.vmap(vjp_fn)(eps)  # [M, B, D]
    estimate = jnp.mean(jnp.sum(jnp.square(eps_j), axis=-1), axis=0) / z.shape[1]  # [B]
    return _flat.unbatch_stats(estimate, layout)


def spectral_radius(
    f: Callable[[Any, Any], Any],
    z_star: Any,
    args: Any,
    key: jax.Array,
    iters: int = 50,
    *,
    batched: bool | None = None,
) -> jax.Array:
    """Power-method estimate of the spectral radius ``rho(J_f(z*))`` per sample.

    Starting from a random unit vector ``v_0``, each step applies the Jacobian with a
    Jacobian-vector product (`jax.linearize` once, then ``iters`` JVPs) and
    renormalises: ``g_t = ||J v_t||``, ``v_{t+1} = J v_t / g_t``. The estimate is the
    geometric mean of the growth factors ``g_t`` over the second half of the steps,
    i.e. ``(||J^k v|| / ||v||)^(1/k)`` after a burn-in of ``iters // 2`` steps.

    Accuracy: with a dominant real eigenvalue (e.g. a symmetric ``J``) every ``g_t``
    converges to ``|lambda_1|`` geometrically, at the rate ``|lambda_2 / lambda_1|``.
    With a dominant complex pair ``r e^{+-i theta}`` (common: ``J`` is not symmetric)
    the single factors ``g_t`` oscillate and never converge, but their geometric mean
    over ``k`` steps does, to ``r``, with an error of order ``log(cond) / k`` where
    ``cond`` is the conditioning of the eigenbasis of that pair; use more ``iters`` for
    such cells. Several eigenvalues of (nearly) equal modulus slow convergence
    further. It is a diagnostic, not a loss (gradients do flow, through every step).

    Args:
      f: the cell, ``f(z, args) -> z``.
      z_star: the point at which to linearise ``f``, a pytree of float arrays.
      args: the cell's other arguments.
      key: a PRNG key for the starting vector.
      iters: Jacobian-vector products, ``>= 1``.
      batched: whether every leaf of ``z_star`` has a leading batch axis; ``None``
        means batched unless a leaf is a scalar.

    Returns:
      ``[B]`` estimates of ``rho`` for a batched state, a scalar otherwise.

    Raises:
      ValueError: for ``iters < 1``.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (the spectral radius of ``J_f`` at the equilibrium
      tracks the stability of the forward and backward solves).
    """
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}.")
    fn, z, layout = _flat_problem(f, z_star, args, batched)
    _, log_growth = _power_steps(fn, z, key, iters)  # [iters, B]
    estimate = jnp.exp(jnp.mean(log_growth[iters // 2 :], axis=0))  # [B]
    return _flat.unbatch_stats(estimate, layout)


def _power_steps(
    fn: Callable[[jax.Array], jax.Array], z: jax.Array, key: jax.Array, iters: int
) -> tuple[jax.Array, jax.Array]:
    """``iters`` power steps ``v <- J v / ||J v||`` on ``J = d fn / dz`` at ``z [B, D]``
    (one `jax.linearize`, then JVPs) from a random unit vector drawn with ``key``.

    Returns:
      ``(v, log_growth)``: the last unit vectors ``[B, D]`` and ``log ||J v||`` of each
      step ``[iters, B]``.
    """
    with _forward_mode.forward_products():  # layers trace their forward-friendly form
        _, jvp_fn = jax.linearize(fn, z)
    v0 = jax.random.normal(key, z.shape, z.dtype)  # [B, D]
    v0 = v0 / jnp.linalg.norm(v0, axis=-1, keepdims=True)
    tiny = jnp.finfo(z.dtype).tiny

    def step(v, _):
        jv = jvp_fn(v)  # [B, D]
        growth = jnp.linalg.norm(jv, axis=-1)  # [B]
        v_next = jv / jnp.maximum(growth, tiny)[:, None]
        return v_next, jnp.log(jnp.maximum(growth, tiny))

    return jax.lax.scan(step, v0, None, length=iters)


def spectral_radius_penalty_estimate(
    f: Callable[[Any, Any], Any],
    z_star: Any,
    args: Any,
    key: jax.Array,
    iters: int = 10,
    *,
    tail: int = 2,
    batched: bool | None = None,
) -> jax.Array:
    """Power-method estimate of ``rho(J_f(z*))`` per sample, differentiable w.r.t. ``args``.

    ``iters`` power steps ``v <- J v / ||J v||`` from a random unit vector run without
    gradients (one `jax.linearize` of ``f`` at the detached ``z*`` and ``args``, then
    JVPs). The estimate is the growth over ``tail`` more steps from the resulting unit
    vector ``v``, ``(||J^tail v||)^(1 / tail)``, and these steps are differentiated
    w.r.t. ``args`` (``v`` and ``z*`` are constants). For a converged ``v`` its gradient
    is the gradient of ``|lambda_1|``: with ``J v = lambda v`` and left eigenvector
    ``u``, ``d|lambda| = sign(lambda) u^T dJ v / u^T v`` for a real eigenvalue, which the
    tail's ``(Jv / ||Jv||)^T dJ v`` matches when ``J`` is normal. A tail of two steps
    averages a dominant real eigenvalue near ``-1`` (the period-2 oscillation a
    fixed-point iteration shows) and, over a complex pair, halves the wobble of single
    growth factors (`spectral_radius` explains it).

    Cost: ``iters`` JVPs plus ``tail`` differentiated JVPs (a JVP and a VJP each), on top
    of one linearisation. It is cruder than `spectral_radius` with many iterations; as a
    penalty it only has to see the directions that grow.

    Args:
      f: the cell, ``f(z, args) -> z``.
      z_star: the point at which to linearise ``f``, a pytree of float arrays; treated
        as a constant.
      args: the cell's other arguments (parameters, input injection).
      key: a PRNG key for the starting vector.
      iters: power steps without gradients, ``>= 0``.
      tail: differentiated power steps, ``>= 1``.
      batched: whether every leaf of ``z_star`` has a leading batch axis; ``None``
        means batched unless a leaf is a scalar.

    Returns:
      ``[B]`` estimates of ``rho`` for a batched state, a scalar otherwise.

    Raises:
      ValueError: for ``iters < 0`` or ``tail < 1``.

    References:
      Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian
      Regularization", ICML 2021 (``rho(J_f(z*))`` governs the stability of the solves).
      Yoshida, Miyato, "Spectral Norm Regularization for Improving the Generalizability
      of Deep Learning", 2017 (a detached power iteration inside a differentiable
      penalty).
    """
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be an integer >= 0, got {iters!r}.")
    if not isinstance(tail, int) or tail < 1:
        raise ValueError(f"tail must be an integer >= 1, got {tail!r}.")
    fn, z, layout = _flat_problem(f, z_star, args, batched)
    frozen_fn = _flat.flat_fn(f, layout, jax.tree.map(_detach_float, args))
    v, _ = _power_steps(frozen_fn, z, key, iters)  # [B, D]
    v = jax.lax.stop_gradient(v)
    w = v
    for _ in range(tail):
        _, w = jax.jvp(fn, (z,), (w,))  # differentiable w.r.t. args through fn
    growth = jnp.linalg.norm(w, axis=-1)  # [B], ||J^tail v|| with ||v|| = 1
    estimate = jnp.maximum(growth, jnp.finfo(z.dtype).tiny) ** (1.0 / tail)
    return _flat.unbatch_stats(estimate, layout)
