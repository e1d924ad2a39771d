"""`deq_jax.solvers.iterate_unrolled`: the solvers' loop, returning what an unrolled net ends on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deq_jax import solvers


def _contraction(b):
    """``z -> 0.5 z + b``: plain iteration from 0 gives ``z_t = 2 b (1 - 2^-t)``."""
    return lambda z: 0.5 * z + b


def test_known_answer_image_path_and_statistics():
    b = jnp.array([[1.0, -2.0], [0.5, 0.0], [0.0, 0.0]])
    solver = solvers.fixed_point_iteration(tol=1e-3, max_iter=40, stop_mode="abs")
    image, stats, path = solvers.iterate_unrolled(solver, _contraction(b), jnp.zeros_like(b))
    best, best_stats = solvers.iterate(solver, _contraction(b), jnp.zeros_like(b), loop="scan")
    # the same loop: the same statistics; the image is one application past the best iterate
    for got, want in zip(stats, best_stats, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(image, _contraction(b)(best))
    # |z_{t+1} - z_t| = |b| 2^-t: stops at the first t with |b| 2^-t <= 1e-3
    norms = np.linalg.norm(np.asarray(b), axis=1)
    steps = [int(np.ceil(np.log2(n / 1e-3))) + 1 if n > 0 else 1 for n in norms]
    np.testing.assert_array_equal(stats.nstep, steps)
    pairs = zip(norms, steps, strict=True)
    want_path = [sum((n * 2.0**-t) ** 2 for t in range(k)) for n, k in pairs]
    np.testing.assert_allclose(path, want_path, rtol=1e-5)
    z_last = [2 * np.asarray(b[i]) * (1 - 2.0**-k) for i, k in enumerate(steps)]
    np.testing.assert_allclose(image, np.stack(z_last), rtol=1e-6, atol=1e-7)
    assert np.all(stats.converged) and not np.any(stats.diverged)


def test_out_of_budget_returns_the_last_image():
    b = jnp.array([[1.0, 1.0]])
    solver = solvers.fixed_point_iteration(tol=1e-9, max_iter=5, stop_mode="abs")
    image, stats, _ = solvers.iterate_unrolled(solver, _contraction(b), jnp.zeros_like(b))
    np.testing.assert_allclose(image, 2 * (1 - 2.0**-5) * np.ones((1, 2)), rtol=1e-6)
    assert stats.nstep[0] == 5 and not stats.converged[0]


def test_a_diverging_sample_keeps_its_last_finite_image_and_the_others_are_untouched():
    def fn(z):  # sample 0 contracts; sample 1's image turns inf at the 3rd evaluation
        blow = jnp.where(z[:, :1] > 1.5, jnp.inf, 0.0)
        return jnp.concatenate([0.5 * z[:1] + 1.0, z[1:] + 1.0 + blow[1:]], axis=0)

    z0 = jnp.zeros((2, 1))
    solver = solvers.fixed_point_iteration(tol=1e-4, max_iter=30, stop_mode="abs")
    image, stats, path = solvers.iterate_unrolled(solver, fn, z0)
    np.testing.assert_array_equal(stats.diverged, [False, True])
    assert stats.nstep[1] == 3 and float(image[1, 0]) == 2.0 and float(path[1]) == 2.0
    alone, alone_stats, alone_path = solvers.iterate_unrolled(
        solver, lambda z: 0.5 * z + 1.0, z0[:1]
    )
    np.testing.assert_array_equal(image[:1], alone)
    np.testing.assert_array_equal(path[:1], alone_path)
    assert stats.nstep[0] == alone_stats.nstep[0]


def test_gradient_flows_through_every_step():
    b = jnp.array([[0.3, -0.7]])
    solver = solvers.fixed_point_iteration(tol=1e-7, max_iter=60, stop_mode="abs")

    def loss(b):
        image, _, path = solvers.iterate_unrolled(solver, _contraction(b), jnp.zeros_like(b))
        return jnp.sum(image) + jnp.sum(path)

    loss = jax.jit(loss)  # one program for the four differences, not four eager loops
    grad = jax.grad(loss)(b)
    eps = 1e-3
    for j in range(2):
        e = jnp.zeros_like(b).at[0, j].set(eps)
        fd = (loss(b + e) - loss(b - e)) / (2 * eps)
        np.testing.assert_allclose(grad[0, j], fd, rtol=2e-3)
    # d image / d b -> 2 at convergence; d path / d b = 2 b sum 4^-t -> 8 b / 3
    np.testing.assert_allclose(grad, 2.0 + 8 * b / 3, rtol=1e-3)


def test_shape_is_checked():
    with pytest.raises(ValueError, match=r"\[B, D\]"):
        solvers.iterate_unrolled(solvers.fixed_point_iteration(), lambda z: z, jnp.zeros(3))


def test_plain_iteration_is_exactly_the_image():
    z, fz = jnp.array([0.1, 0.7]), jnp.array([0.3, 1e-9])
    assert np.array_equal(solvers.damped_step(z, fz, 1.0), fz)
    np.testing.assert_allclose(solvers.damped_step(z, fz, 0.5), (z + fz) / 2)
