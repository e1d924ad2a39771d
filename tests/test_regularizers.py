"""Tests for deq_jax.regularizers: Hutchinson, power method and trajectory losses."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deq_jax import regularizers

B, D = 3, 6


def _tanh_cell(z, args):
    w, x = args
    return jnp.tanh(z @ w + x)


def _linear_cell(z, a):
    return z @ a.T  # J = A for every sample


def _problem(dtype=jnp.float32):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    w = jax.random.normal(keys[0], (D, D), dtype) / np.sqrt(D)
    x = jax.random.normal(keys[1], (B, D), dtype)
    z = jax.random.normal(keys[2], (B, D), dtype)
    return w, x, z


def _exact_frobenius(f, z, args):
    """||J_b||_F^2 / d per sample from the full Jacobian (jacfwd)."""
    full = jax.jacfwd(lambda zz: f(zz, args))(z)  # [B, D, B, D]
    blocks = jnp.stack([full[b, :, b, :] for b in range(z.shape[0])])  # [B, D, D]
    return jnp.sum(blocks**2, axis=(1, 2)) / z.shape[1]


@functools.partial(jax.jit, static_argnames=("num_samples", "probe", "keys"))
def _many_estimates(w, x, z, num_samples, probe, keys):
    """Estimates with ``keys`` independent keys: [keys, B]."""
    ks = jax.random.split(jax.random.PRNGKey(42), keys)
    est = lambda k: regularizers.jacobian_frobenius(
        _tanh_cell, z, (w, x), k, num_samples, probe=probe
    )
    return jax.vmap(est)(ks)


@pytest.mark.parametrize("probe", ["gaussian", "rademacher"])
def test_hutchinson_unbiased_and_error_shrinks_with_num_samples(x64, probe):
    w, x, z = _problem(jnp.float64)
    exact = _exact_frobenius(_tanh_cell, z, (w, x))
    rmse = {}
    for m in (1, 64):
        est = _many_estimates(w, x, z, m, probe, 400)  # [400, B]
        stderr = est.std(axis=0) / np.sqrt(est.shape[0])
        assert np.all(np.abs(est.mean(axis=0) - exact) < 3 * stderr + 1e-12)
        rmse[m] = float(jnp.sqrt(jnp.mean((est - exact) ** 2)))
    assert rmse[64] < rmse[1] / 4  # 1 / sqrt(M) would give / 8


def test_hutchinson_linear_cell_known_answer(x64):
    a = jax.random.normal(jax.random.PRNGKey(1), (D, D), jnp.float64)
    z = jnp.zeros((B, D), jnp.float64)
    exact = jnp.sum(a**2) / D
    est = regularizers.jacobian_frobenius(_linear_cell, z, a, jax.random.PRNGKey(0), 4000)
    chex.assert_shape(est, (B,))
    np.testing.assert_allclose(est, exact, rtol=0.1)
    # Rademacher probes with D = 1 are exact: eps^2 = 1.
    scalar = regularizers.jacobian_frobenius(
        lambda z, c: 3.0 * z + c, jnp.ones((B, 1)), 0.0, jax.random.PRNGKey(0), probe="rademacher"
    )
    np.testing.assert_allclose(scalar, 9.0, rtol=1e-12)


def test_hutchinson_pytree_state_and_unbatched():
    w, x, z = _problem()
    f_tree = lambda s, args: {"a": _tanh_cell(s["a"], args), "b": 0.5 * s["b"]}
    state = {"a": z, "b": jnp.ones((B, 2, 2))}
    exact_a = _exact_frobenius(_tanh_cell, z, (w, x)) * D  # sum of squares
    expected = (exact_a + 0.25 * 4) / (D + 4)
    est = jax.jit(regularizers.jacobian_frobenius, static_argnums=(0, 4))(
        f_tree, state, (w, x), jax.random.PRNGKey(0), 2000
    )
    np.testing.assert_allclose(est, expected, rtol=0.1)
    single = regularizers.jacobian_frobenius(
        _tanh_cell, z[0], (w, x[0]), jax.random.PRNGKey(0), 8, batched=False
    )
    assert single.shape == ()


def test_hutchinson_gradient_matches_finite_differences(x64):
    w, x, z = _problem(jnp.float64)
    key = jax.random.PRNGKey(3)
    loss = lambda w, x: jnp.sum(regularizers.jacobian_frobenius(_tanh_cell, z, (w, x), key, 3))
    jax.test_util.check_grads(loss, (w, x), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x)
    chex.assert_tree_all_finite(grads)


def test_hutchinson_does_not_differentiate_through_z_star():
    w, x, z = _problem()
    g = jax.grad(
        lambda z: jnp.sum(
            regularizers.jacobian_frobenius(_tanh_cell, z, (w, x), jax.random.PRNGKey(0))
        )
    )(z)
    np.testing.assert_array_equal(g, 0.0)


def test_hutchinson_same_jitted_and_not():
    w, x, z = _problem()
    key = jax.random.PRNGKey(5)
    f = lambda w, x: regularizers.jacobian_frobenius(_tanh_cell, z, (w, x), key, 5)
    np.testing.assert_allclose(jax.jit(f)(w, x), f(w, x), rtol=1e-5)


def test_spectral_radius_symmetric_jacobian(x64):
    a = jax.random.normal(jax.random.PRNGKey(0), (D, D), jnp.float64)
    s = (a + a.T) / 2
    exact = jnp.max(jnp.abs(jnp.linalg.eigvals(s)))
    z = jnp.zeros((B, D), jnp.float64)
    rho = regularizers.spectral_radius(_linear_cell, z, s, jax.random.PRNGKey(1), iters=100)
    chex.assert_shape(rho, (B,))
    np.testing.assert_allclose(rho, exact, rtol=1e-6)


def test_spectral_radius_nonlinear_cell_per_sample(x64):
    w, x, z = _problem(jnp.float64)
    w = (w + w.T) / 2
    rho = regularizers.spectral_radius(_tanh_cell, z, (w, x), jax.random.PRNGKey(1), iters=400)
    for b in range(B):
        jac = jax.jacfwd(lambda v, b=b: jnp.tanh(v @ w + x[b]))(z[b])  # diag(s) W: real spectrum
        exact = jnp.max(jnp.abs(jnp.linalg.eigvals(jac)))
        np.testing.assert_allclose(rho[b], exact, rtol=1e-3)


def test_spectral_radius_complex_dominant_pair(x64):
    pair = jnp.array([[0.5, 2.0], [-0.3, 0.5]])  # eigenvalues 0.5 +- i sqrt(0.6), non-normal
    a = jax.scipy.linalg.block_diag(pair, 0.3 * jnp.eye(D - 2))
    exact = jnp.max(jnp.abs(jnp.linalg.eigvals(a)))
    z = jnp.zeros((B, D), jnp.float64)
    rho = regularizers.spectral_radius(_linear_cell, z, a, jax.random.PRNGKey(0), iters=400)
    np.testing.assert_allclose(rho, exact, rtol=0.01)


def test_spectral_radius_pytree_and_zero_jacobian():
    state = {"a": jnp.ones((B, 3)), "b": jnp.ones((B, 2))}
    f = lambda s, c: {"a": 0.5 * s["a"], "b": c * s["b"]}
    rho = regularizers.spectral_radius(f, state, -2.0, jax.random.PRNGKey(0), iters=20)
    np.testing.assert_allclose(rho, 2.0, rtol=1e-5)
    zero = regularizers.spectral_radius(
        lambda s, c: c * s, jnp.ones((B, 3)), 0.0, jax.random.PRNGKey(0), 3
    )
    chex.assert_tree_all_finite(zero)
    np.testing.assert_allclose(zero, 0.0, atol=1e-30)


def test_penalty_estimate_symmetric_value_and_gradient(x64):
    q, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(0), (D, D), jnp.float64))
    eigenvalues = jnp.array([-1.3, 0.9, 0.5, 0.2, -0.1, 0.05])
    a = (q * eigenvalues) @ q.T  # symmetric, dominant eigenvalue -1.3 along q[:, 0]
    z = jnp.zeros((B, D), jnp.float64)
    key = jax.random.PRNGKey(1)
    estimate = lambda a: regularizers.spectral_radius_penalty_estimate(_linear_cell, z, a, key, 60)
    chex.assert_shape(estimate(a), (B,))
    np.testing.assert_allclose(estimate(a), 1.3, rtol=1e-8)
    # d|lambda_1| / dA = sign(lambda_1) u u^T for a symmetric A, per sample.
    grad = jax.grad(lambda a: estimate(a).sum())(a)
    u = q[:, 0]
    np.testing.assert_allclose(grad, -B * jnp.outer(u, u), atol=1e-7)
    direction = jax.random.normal(jax.random.PRNGKey(2), (D, D), jnp.float64)
    direction = direction + direction.T
    h = 1e-6
    fd = (estimate(a + h * direction).sum() - estimate(a - h * direction).sum()) / (2 * h)
    np.testing.assert_allclose(fd, jnp.sum(grad * direction), rtol=1e-5)


def test_penalty_estimate_differentiates_only_the_tail(x64):
    w, x, z = _problem(jnp.float64)
    key, iters = jax.random.PRNGKey(3), 5
    estimate = lambda w, z, tail: regularizers.spectral_radius_penalty_estimate(
        _tanh_cell, z, (w, x), key, iters, tail=tail
    )
    # z* is a constant.
    np.testing.assert_array_equal(jax.grad(lambda z: estimate(w, z, 2).sum())(z), 0.0)
    # The power steps are constants: the gradient is that of ||J_w v|| for their v.
    jvp = lambda w, v: jax.jvp(lambda zz: _tanh_cell(zz, (w, x)), (z,), (v,))[1]
    unit = lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    v = unit(jax.random.normal(key, z.shape, z.dtype))
    for _ in range(iters):
        v = unit(jvp(w, v))
    expected = jax.grad(lambda w: jnp.linalg.norm(jvp(w, v), axis=-1).sum())(w)
    np.testing.assert_allclose(jax.grad(lambda w: estimate(w, z, 1).sum())(w), expected, rtol=1e-8)


def test_penalty_estimate_pytree_and_no_power_steps():
    state = {"a": jnp.ones((B, 3)), "b": jnp.ones((B, 2))}
    f = lambda s, c: {"a": 0.5 * s["a"], "b": c * s["b"]}
    rho = regularizers.spectral_radius_penalty_estimate(f, state, -2.0, jax.random.PRNGKey(0), 30)
    np.testing.assert_allclose(rho, 2.0, rtol=1e-5)
    w, x, z = _problem()
    crude = regularizers.spectral_radius_penalty_estimate(
        _tanh_cell, z, (w, x), jax.random.PRNGKey(0), 0
    )  # growth of a random direction: at most the spectral norm
    for b in range(B):
        jac = jax.jacfwd(lambda v, b=b: jnp.tanh(v @ w + x[b]))(z[b])
        assert 0 < crude[b] <= jnp.linalg.norm(jac, 2) * (1 + 1e-5)


def test_descent_on_the_hinge_brings_rho_under_the_target():
    a0 = 1.2 * jnp.eye(D) + 0.1 * jax.random.normal(jax.random.PRNGKey(0), (D, D))
    z = jnp.zeros((B, D))
    target = 0.9

    @jax.jit
    def descend(a, key):
        rho = lambda a: regularizers.spectral_radius_penalty_estimate(_linear_cell, z, a, key, 10)
        hinge = lambda a: jnp.mean(jnp.square(jax.nn.relu(rho(a) - target)))
        return a - 0.5 * jax.grad(hinge)(a)

    a = a0
    for step in range(300):
        a = descend(a, jax.random.PRNGKey(step))
    exact = lambda a: float(jnp.max(jnp.abs(jnp.linalg.eigvals(a))))
    assert exact(a0) > 1.1
    assert exact(a) < target + 0.02


@pytest.mark.parametrize("iters, tail", [(-1, 2), (1.0, 2), (3, 0)])
def test_bad_penalty_estimate_arguments(iters, tail):
    w, x, z = _problem()
    with pytest.raises(ValueError, match="iters" if tail else "tail"):
        regularizers.spectral_radius_penalty_estimate(
            _tanh_cell, z, (w, x), jax.random.PRNGKey(0), iters, tail=tail
        )


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_num_samples_and_iters(bad):
    w, x, z = _problem()
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="num_samples"):
        regularizers.jacobian_frobenius(_tanh_cell, z, (w, x), key, bad)
    with pytest.raises(ValueError, match="iters"):
        regularizers.spectral_radius(_tanh_cell, z, (w, x), key, iters=bad)


def test_bad_probe_lists_valid_ones():
    w, x, z = _problem()
    with pytest.raises(ValueError, match="gaussian, rademacher"):
        regularizers.jacobian_frobenius(_tanh_cell, z, (w, x), jax.random.PRNGKey(0), probe="x")


def test_unrolled_trajectory_matches_python_loop():
    w, x, z = _problem()
    traj = regularizers.unrolled_trajectory(_tanh_cell, z, (w, x), steps=4, tau=0.5)
    chex.assert_shape(traj, (5, B, D))
    expected = [z]
    for _ in range(4):
        expected.append(0.5 * expected[-1] + 0.5 * _tanh_cell(expected[-1], (w, x)))
    np.testing.assert_allclose(traj, jnp.stack(expected), rtol=1e-6, atol=1e-6)
    tree = regularizers.unrolled_trajectory(
        lambda s, a: {"u": 0.5 * s["u"]}, {"u": jnp.ones((B, 2))}, None, steps=2
    )
    np.testing.assert_allclose(tree["u"][:, 0, 0], [1.0, 0.5, 0.25])


@pytest.mark.parametrize(
    "weights, expected",
    [
        ("constant", [1 / 3, 1 / 3, 1 / 3]),
        ("linear", [1 / 6, 2 / 6, 3 / 6]),
        ("exponential", np.array([0.25, 0.5, 1.0]) / 1.75),
        ([0.0, 1.0, 3.0], [0.0, 0.25, 0.75]),
    ],
)
def test_trajectory_weights(weights, expected):
    w = regularizers.trajectory_weights(3, weights, gamma=0.5)
    np.testing.assert_allclose(w, expected, rtol=1e-6)
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-6)


def test_bad_weights_list_valid_names():
    with pytest.raises(ValueError, match="constant, linear, exponential"):
        regularizers.trajectory_weights(3, "quadratic")
    for bad in ([1.0, 2.0], [1.0, -1.0, 1.0], [0.0, 0.0, 0.0]):
        with pytest.raises(ValueError, match="non-negative"):
            regularizers.trajectory_weights(3, bad)
    with pytest.raises(ValueError, match="gamma"):
        regularizers.trajectory_weights(3, "exponential", gamma=0.0)
    with pytest.raises(ValueError, match="steps"):
        regularizers.unrolled_trajectory(_tanh_cell, jnp.zeros((B, D)), None, steps=0)
    with pytest.raises(ValueError, match="tau"):
        regularizers.unrolled_trajectory(_tanh_cell, jnp.zeros((B, D)), None, 2, tau=1.5)


def test_fixed_point_correction_known_answer_and_gradient():
    traj = jnp.arange(3 * B * 2, dtype=jnp.float32).reshape(3, B, 2)
    target = jnp.ones((B, 2))
    loss_fn = lambda z: jnp.sum((z - target) ** 2, axis=-1)  # [B]
    per_iter = jnp.stack([loss_fn(traj[t]) for t in range(3)])  # [T, B]
    for name, w in [("constant", [1, 1, 1]), ("linear", [1, 2, 3])]:
        got = regularizers.fixed_point_correction(traj, loss_fn, name)
        expected = jnp.tensordot(jnp.array(w, jnp.float32) / sum(w), per_iter, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    w, x, z = _problem()
    mean_square = lambda z: jnp.mean(z**2, axis=-1)  # [B]

    def loss(w):
        traj = regularizers.unrolled_trajectory(_tanh_cell, z, (w, x), steps=3)
        return jnp.mean(regularizers.fixed_point_correction(traj[1:], mean_square, "linear"))

    jax.test_util.check_grads(loss, (w,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_step_penalty_known_answer():
    traj = jnp.array([[[0.0, 0.0]], [[1.0, 2.0]], [[1.0, 0.0]]])  # [T=3, B=1, 2]
    np.testing.assert_allclose(regularizers.step_penalty(traj), [5.0 + 4.0])
    tree = {"a": traj, "b": jnp.zeros((3, 1, 4, 4))}
    np.testing.assert_allclose(regularizers.step_penalty(tree), [9.0])
    unbatched = regularizers.step_penalty(jnp.array([0.0, 1.0, 3.0]))
    assert unbatched.shape == ()
    np.testing.assert_allclose(unbatched, 5.0)
    np.testing.assert_allclose(regularizers.step_penalty(traj[:1]), [0.0])


def test_trajectory_bad_input():
    with pytest.raises(ValueError, match="same length"):
        regularizers.step_penalty({"a": jnp.zeros((3, B)), "b": jnp.zeros((2, B))})
    with pytest.raises(ValueError, match="leading iterate axis"):
        regularizers.fixed_point_correction(jnp.float32(1.0), lambda z: z)
