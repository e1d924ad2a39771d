"""The neural solver on multiscale states (a tuple of feature maps, one per resolution)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deq_jax as dj
import deq_jax.neural_solver as ns
from deq_jax.training.solver_fit.frozen_deq import (
    initializer_features,
    initializer_kind,
    learned_init,
)
from deq_jax.training.solver_fit.trainer import train_neural_solver

SHAPES = ((4, 4, 2), (2, 2, 3))


def _problem(key):
    """A contractive two-resolution map f(z, x) with x at the highest resolution."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    w_hi = 0.4 * jax.random.normal(k1, (2, 2)) / np.sqrt(2)
    w_lo = 0.4 * jax.random.normal(k2, (3, 3)) / np.sqrt(3)
    w_up = 0.3 * jax.random.normal(k3, (2, 3)) / np.sqrt(2)

    def f(z, x):
        hi, lo = z
        down = hi.reshape(hi.shape[0], 2, 2, 2, 2, 2).mean(axis=(2, 4))  # [B, 2, 2, 2]
        new_hi = jnp.tanh(hi @ w_hi + x)
        new_lo = jnp.tanh(lo @ w_lo + down @ w_up)
        return new_hi, new_lo

    x = jax.random.normal(k4, (6, 4, 4, 2))
    return f, x


def test_state_shape_helpers():
    assert ns.is_multiscale(SHAPES) and not ns.is_multiscale((4, 4, 2))
    assert ns.check_state_shape([[4, 4, 2], [2, 2, 3]]) == SHAPES
    assert ns.pooled_channels(SHAPES) == 5 and ns.pooled_channels((8, 3)) == 3
    z = (jnp.zeros((2, 4, 4, 2)), jnp.zeros((2, 2, 2, 3)))
    assert ns.state_shape_of(z) == SHAPES
    assert ns.state_shape_of(jnp.zeros((2, 7, 3))) == (7, 3)
    with pytest.raises(ValueError, match="tuple of batched arrays"):
        ns.state_shape_of((jnp.zeros(3),))
    with pytest.raises(ValueError, match="positive ints"):
        ns.check_state_shape(((4, 0, 2),))


def test_pool_residual_per_resolution():
    hi = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 4, 2))
    lo = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 2, 3))
    g = jnp.concatenate([hi.reshape(3, -1), lo.reshape(3, -1)], axis=1)
    pooled = ns.pool_residual(g, SHAPES, "mean")
    expected = jnp.concatenate([hi.mean(axis=(1, 2)), lo.mean(axis=(1, 2))], axis=-1)
    np.testing.assert_allclose(pooled, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="44 values per sample"):
        ns.pool_residual(g[:, :-1], SHAPES, "mean")
    with pytest.raises(ValueError, match="sequence state"):
        ns.pool_residual(g, SHAPES, "last")


def test_multiscale_initializer():
    x = jnp.ones((2, 8, 8, 3))
    init = ns.make_initializer("multiscale", (4, 6, 2))
    params = init.init(jax.random.PRNGKey(0), x)
    z0 = init.apply(params, x)
    assert [z.shape for z in z0] == [(2, 8, 8, 4), (2, 4, 4, 6), (2, 2, 2, 2)]
    assert all(float(jnp.abs(z).max()) == 0.0 for z in z0)  # starts at the zero state
    with pytest.raises(ValueError, match="tuple of channels"):
        ns.make_initializer("multiscale", 4)
    with pytest.raises(ValueError, match="divisible by 4"):
        init.init(jax.random.PRNGKey(0), jnp.ones((1, 6, 6, 3)))
    assert initializer_kind(SHAPES) == "multiscale"
    assert initializer_features(SHAPES) == (2, 3)
    with pytest.raises(ValueError, match="image states"):
        initializer_kind(((4, 2), (2, 3)))


def test_neural_solver_solves_and_trains_on_a_multiscale_state():
    f, x = _problem(jax.random.PRNGKey(3))
    z0 = (jnp.zeros((6, 4, 4, 2)), jnp.zeros((6, 2, 2, 3)))
    exact = dj.fixed_point(f, z0, x, solver=dj.solvers.anderson(tol=1e-7, max_iter=100))
    solver = ns.init_neural_solver(
        jax.random.PRNGKey(0), SHAPES, m=2, hidden=4, tol=1e-5, max_iter=60
    )
    h_phi = ns.make_initializer("multiscale", (2, 3))

    def batches():
        while True:
            yield x, x, exact.value

    trained = train_neural_solver(
        solver, h_phi, f, batches(), num_steps=12, key=jax.random.PRNGKey(1), steps=3
    )
    assert trained.losses[-1] < trained.losses[0]
    init = learned_init(SHAPES, trained.init_params, kernel_size=3)
    start = init(x)
    assert [z.shape for z in start] == [(6, 4, 4, 2), (6, 2, 2, 3)]
    sol = dj.fixed_point(f, start, x, solver=trained.solver)
    for got, want in zip(sol.value, exact.value, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)
