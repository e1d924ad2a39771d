"""Reference fixed-point problems with known answers, shared by the core tests."""

import jax
import jax.numpy as jnp
import numpy as np

COS_FIXED_POINT = 0.7390851332151607


def contractive_matrix(key, d, norm, dtype="float32"):
    """A random ``[d, d]`` matrix with spectral norm ``norm``."""
    w = jax.random.normal(key, (d, d), dtype)
    return norm * w / jnp.linalg.norm(w, 2)


def tanh_cell(z, args):
    """``tanh(z W + x)``, batched along axis 0 of ``z`` and ``x``."""
    w, x = args
    return jnp.tanh(z @ w + x)


def tanh_problem(key, batch=8, d=16, norm=0.7, dtype="float32"):
    """(W, x) for `tanh_cell`, contractive with Lipschitz constant ``norm``."""
    kw, kx = jax.random.split(key)
    w = contractive_matrix(kw, d, norm, dtype)
    x = jax.random.normal(kx, (batch, d), dtype)
    return w, x


def reference_fixed_point(activation, z0, args, iters=3000):
    """``z <- activation(z W + x)`` iterated far past convergence in numpy float64."""
    w, x = (np.asarray(a, np.float64) for a in args)
    z = np.asarray(z0, np.float64)
    for _ in range(iters):
        z = activation(z @ w + x)
    return z
