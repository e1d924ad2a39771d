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


# XLA's default fusion emitters on the CPU. The suite compiles with the older ones, which
# compile a third faster (`conftest`), but round some programs differently: two programs
# that do the same arithmetic in a different arrangement (a composed solver and its part
# alone, a ``while`` and a ``scan`` loop, a gradient with and without a stats probe)
# round alike under the default emitters and not always under the older ones. A test that
# compares such programs bit for bit, or in float32 at rounding tolerance, compiles them
# with `jit_as_users_compile`: as a user's program is compiled.
DEFAULT_CPU_EMITTERS = {"xla_cpu_use_fusion_emitters": True}


def jit_as_users_compile(fun, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with XLA's default CPU fusion emitters."""
    return jax.jit(fun, compiler_options=DEFAULT_CPU_EMITTERS, **jit_kwargs)
