"""A side channel that carries the backward solve's statistics out of `jax.grad`.

A `jax.custom_vjp` backward pass can return nothing but cotangents. To let a training
loop log how the implicit backward solve went, `deq_jax.fixed_point` accepts a
``stats_probe``: a zero vector that the forward pass ignores. Under ``ift`` its
"gradient" is the vector of backward statistics named in `BACKWARD_STATS`; under the
other modes (no backward solve) it is zero. Differentiate the loss w.r.t. the probe
alongside the parameters and read the result with `read_stats_probe`::

    probe = dj.backward.stats_probe()
    loss = lambda p, probe: ... dj.fixed_point(f, z0, (p, x), solver=s,
                                               stats_probe=probe) ...
    grads, probe_grad = jax.grad(loss, argnums=(0, 1))(params, probe)
    dj.backward.read_stats_probe(probe_grad)   # {"nstep_max": ..., ...}

Pass the probe straight to `fixed_point` and nowhere else (one probe per call): any
arithmetic on it would scale its cotangent. Under `jax.vmap` of the solve with a shared
probe the statistics of the mapped problems are summed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deq_jax.solvers.base import SolverStats

BACKWARD_STATS = (
    "nstep_max",
    "nstep_mean",
    "abs_residual_max",
    "converged_fraction",
    "floor_mean",
    "at_floor_fraction",
)


def stats_probe(dtype=jnp.float32) -> jax.Array:
    """A fresh probe: zeros, one entry per name in `BACKWARD_STATS`."""
    return jnp.zeros((len(BACKWARD_STATS),), dtype)


def encode_stats(stats: SolverStats, dtype) -> jax.Array:
    """The backward `SolverStats` as the probe's cotangent, ``[len(BACKWARD_STATS)]``
    (the floor's entries are 0 for a solve that did not measure one)."""
    floor = jnp.zeros(()) if stats.floor is None else jnp.mean(stats.floor)
    at_floor = jnp.zeros(()) if stats.at_floor is None else jnp.mean(stats.at_floor)
    values = [
        jnp.max(stats.nstep),
        jnp.mean(stats.nstep),
        jnp.max(stats.abs_residual),
        jnp.mean(stats.converged),
        floor,
        at_floor,
    ]
    return jnp.stack([v.astype(dtype) for v in values])


def read_stats_probe(probe_grad: jax.Array) -> dict[str, jax.Array]:
    """Names the entries of a probe's gradient."""
    return {name: probe_grad[i] for i, name in enumerate(BACKWARD_STATS)}
