"""Neural deep equilibrium solvers: initialisers, HyperAnderson kernels, the solver, training."""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from problems import jit_as_users_compile

import deq_jax as dj
from deq_jax import neural_solver as ns
from deq_jax.nn.cells import MLPCell
from deq_jax.nn.deq import DEQ
from deq_jax.training import train_neural_solver

D, DX, B = 16, 8, 16


# ----------------------------------------------------------------------------- initialisers


@pytest.mark.parametrize(
    "kind, x_shape, z_shape",
    [
        ("sequence", (2, 7, 3), (2, 7, 5)),
        ("image", (2, 6, 4, 3), (2, 6, 4, 5)),
        ("vector", (2, 3), (2, 5)),
    ],
)
def test_initializer_shapes_and_zero_start(kind, x_shape, z_shape):
    h = ns.make_initializer(kind, features=5)
    x = jax.random.normal(jax.random.PRNGKey(0), x_shape)
    variables = h.init(jax.random.PRNGKey(1), x)
    z0 = h.apply(variables, x)
    chex.assert_shape(z0, z_shape)
    np.testing.assert_array_equal(z0, 0.0)  # untrained: the zero state of a classic DEQ
    noisy = jax.tree_util.tree_map(
        lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(2), p.shape), variables
    )
    assert float(jnp.max(jnp.abs(h.apply(noisy, x)))) > 0


def test_sequence_initializer_is_causal():
    h = ns.SequenceInitializer(features=4, kernel_size=3)
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 9, 2))
    variables = h.init(jax.random.PRNGKey(1), x)
    variables = jax.tree_util.tree_map(
        lambda p: p + jax.random.normal(jax.random.PRNGKey(2), p.shape), variables
    )
    changed = x.at[:, 5].add(1.0)
    diff = jnp.abs(h.apply(variables, changed) - h.apply(variables, x))[0].sum(-1)  # [L]
    np.testing.assert_array_equal(diff[:5], 0.0)
    assert float(diff[5]) > 0


def test_initializer_bad_input():
    with pytest.raises(ValueError, match="sequence, image, vector"):
        ns.make_initializer("graph", features=3)
    h = ns.make_initializer("image", features=3)
    with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):
        h.init(jax.random.PRNGKey(0), jnp.zeros((2, 5, 3)))


# ----------------------------------------------------------------------------- kernels


def test_normalize_alpha_known_answers():
    a = jnp.array([[1.0, 2.0, 7.0], [0.0, 0.0, -3.0]])
    first = ns.normalize_alpha(a[:1], jnp.array([True, True, False]))
    np.testing.assert_allclose(first, [[0.0, 1.0, 0.0]], atol=1e-6)  # shift (1 - 3) / 2
    second = ns.normalize_alpha(a[1:], jnp.ones(3, bool))
    np.testing.assert_allclose(second, [[4 / 3, 4 / 3, -5 / 3]], atol=1e-6)  # negative kept


def test_normalize_alpha_sums_to_one():
    a = 3.0 * jax.random.normal(jax.random.PRNGKey(0), (64, 6))
    for n_valid in range(1, 7):
        valid = jnp.arange(6) >= 6 - n_valid
        alpha = ns.normalize_alpha(a, valid)
        np.testing.assert_allclose(jnp.sum(alpha, axis=1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(alpha[:, ~np.asarray(valid)], 0.0)
    assert float(jnp.min(ns.normalize_alpha(a, jnp.ones(6, bool)))) < 0


@pytest.mark.parametrize("beta", [1.0, 0.6])
def test_update_with_least_squares_weights_is_anderson_step(beta):
    kf, kg = jax.random.split(jax.random.PRNGKey(0))
    fs = jax.random.normal(kf, (4, 5, 12))
    gs = jax.random.normal(kg, (4, 5, 12))
    gram = jnp.einsum("bmd,bnd->bmn", gs, gs)
    alpha = dj.solvers.anderson_weights(gram, jnp.ones(5, bool), 1e-4)
    ours = ns.hyper_anderson_update(fs, gs, alpha, jnp.full((4,), beta))
    np.testing.assert_allclose(ours, dj.solvers.anderson_step(fs, gs, alpha, beta), atol=1e-5)


def test_undamped_update_skips_the_residuals():
    # A Python 1.0 takes sum_i alpha_i f(z_i) and never reads gs (NaN there stays out).
    kf, ka = jax.random.split(jax.random.PRNGKey(0))
    fs = jax.random.normal(kf, (4, 5, 12))
    alpha = jax.random.normal(ka, (4, 5))
    gs = jnp.full_like(fs, jnp.nan)
    fast = ns.hyper_anderson_update(fs, gs, alpha, 1.0)
    np.testing.assert_allclose(fast, jnp.einsum("bm,bmd->bd", alpha, fs), rtol=1e-6)
    slow = ns.hyper_anderson_update(fs, jnp.zeros_like(fs), alpha, jnp.ones((4,)))
    np.testing.assert_allclose(fast, slow, rtol=1e-6)


def test_pool_residual():
    g = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 12)
    seq = g.reshape(2, 3, 4)
    np.testing.assert_allclose(ns.pool_residual(g, (3, 4), "mean"), seq.mean(1))
    np.testing.assert_allclose(ns.pool_residual(g, (3, 4), "last"), seq[:, -1])
    np.testing.assert_allclose(ns.pool_residual(g, (12,), "mean"), g)
    with pytest.raises(ValueError, match="values per sample"):
        ns.pool_residual(g, (5,), "mean")
    # Built for length 5, run on length 3: pooling only needs the channels.
    np.testing.assert_allclose(ns.pool_residual(g, (5, 4), "last"), seq[:, -1])
    np.testing.assert_allclose(ns.pool_residual(g, (2, 2, 4), "mean"), seq.mean(1))
    with pytest.raises(ValueError, match="multiple of 5"):
        ns.pool_residual(g, (3, 5), "mean")


class _PickNet:
    """Stands in for the network: all weight on one chronological slot, ``beta = 1``."""

    def __init__(self, oldest: bool):
        self.oldest = oldest

    def apply(self, params, x, valid):
        n = valid.shape[0]
        pick = jnp.argmax(valid) if self.oldest else n - 1
        a = jnp.broadcast_to(jnp.arange(n) == pick, x.shape[:2]).astype(x.dtype)
        return a, jnp.ones(x.shape[:1], x.dtype)


@pytest.mark.parametrize("oldest", [False, True])
def test_step_maps_history_to_ring_slots(oldest):
    """Weight on the newest slot gives f(z_k); on the oldest valid slot, f(z_{k-m})."""
    m, d = 3, 6
    f = lambda z: jnp.cos(z) + 0.1 * z
    z = jax.random.normal(jax.random.PRNGKey(0), (2, d))
    state = ns.hyper_anderson_init(z, m, d)
    images = []
    for k in range(1, 10):
        fz = f(z)
        images.append(fz)
        out = ns.hyper_anderson_step(_PickNet(oldest), None, state, z, fz, k, (d,), "mean")
        want = images[max(k - 1 - m, 0)] if oldest else fz
        np.testing.assert_allclose(out.z_next, want, atol=1e-6)
        np.testing.assert_allclose(jnp.sum(out.alpha, axis=1), 1.0, atol=1e-6)
        state, z = out.state, z + 0.3 * (out.z_next - z)


def test_step_weights_and_decay():
    w = ns.step_weights(4)
    np.testing.assert_allclose(w, [0.1, 0.2, 0.3, 0.4], atol=1e-7)
    assert ns.linear_decay(0.5, 0, 100) == 0.5
    assert ns.linear_decay(0.5, 50, 100) == pytest.approx(0.25)
    assert ns.linear_decay(0.5, 150, 100) == 0.0


def test_alpha_weight_decays_over_the_first_part_of_the_fit():
    # The paper's l3: 1e-4 to 5e-8 over the first 40% of the fit, then 5e-8.
    l3 = functools.partial(ns.alpha_weight, 1e-4, num_steps=1_000, fraction=0.4, final=5e-8)
    assert l3(0) == 1e-4
    assert l3(200) == pytest.approx(0.5 * (1e-4 + 5e-8))
    assert l3(400) == l3(999) == pytest.approx(5e-8)
    assert ns.alpha_weight(0.1, 500, 1_000) == pytest.approx(0.05)  # over the whole fit
    with pytest.raises(ValueError, match="fraction"):
        ns.alpha_weight(1e-4, 0, 10, fraction=0.0)
    assert ns.PAPER_WEIGHTS == {"l1": 0.1, "l2": 0.05, "l3": 1e-4, "l3_final": 5e-8}


def test_relative_error_divides_each_sample_by_its_fixed_point():
    target = jnp.array([[3.0, 4.0], [0.0, 1.0]])  # ||z*||^2 = 25 and 1
    zs = jnp.array([[[3.0, 5.0], [0.0, 3.0]]])  # [K=1, B=2, D=2]
    np.testing.assert_allclose(ns.step_errors(zs, target), [[1.0, 4.0]])
    np.testing.assert_allclose(ns.step_errors(zs, target, "relative"), [[1 / 25, 4.0]])
    with pytest.raises(ValueError, match="error must be one of absolute, relative, log"):
        ns.step_errors(zs, target, "squared")


def _loss_parts(z_star_scale=1.0, **options):
    """The loss of a 2-step unroll on an affine map, its metrics and its gradient."""
    k_a, k_x, k_s, k_i = jax.random.split(jax.random.PRNGKey(5), 4)
    a = 0.3 * jax.random.normal(k_a, (D, D)) / np.sqrt(D)
    x = jax.random.normal(k_x, (B, DX))
    z_star = z_star_scale * jax.random.normal(k_s, (B, D))
    f = lambda z, args: z @ args.T + z_star - z_star @ args.T  # z* is its fixed point
    solver = ns.init_neural_solver(jax.random.PRNGKey(0), (D,))
    h_phi = ns.make_initializer("vector", features=D)
    params = {"solver": solver.variables, "init": h_phi.init(k_i, x)}
    h_phi_params = jax.tree_util.tree_map(lambda p: p + 0.1, params["init"])  # not a 0 start
    params["init"] = h_phi_params

    def loss(p):
        return ns.neural_solver_loss(p, solver, h_phi, f, a, x, z_star, steps=2, **options)

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, metrics, grads


def test_initializer_learns_from_its_own_term_only_by_default():
    # l2 = 0: the initialiser's gradient is zero when z0 is detached (the default) ...
    _, _, grads = _loss_parts(l2=0.0, l3=1e-2)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree_util.tree_leaves(grads["init"]))
    # ... and not without detach_init (the earlier recipe).
    _, _, grads = _loss_parts(l2=0.0, l3=1e-2, detach_init=False)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads["init"])) > 0
    # The solver's gradient is the same either way (z0's value is the same).
    _, _, detached = _loss_parts(l3=1e-2)
    _, _, attached = _loss_parts(l3=1e-2, detach_init=False)
    chex.assert_trees_all_close(detached["solver"], attached["solver"], rtol=1e-5, atol=1e-8)


def test_loss_weights_default_to_the_paper_and_relative_error_is_scale_free():
    value, m, _ = _loss_parts(l3=1e-4)
    np.testing.assert_allclose(
        value, 0.1 * m["conv"] + 0.05 * m["init"] + 1e-4 * m["alpha"], rtol=1e-6
    )
    # Scaling z* (and so every error) by 10: absolute terms grow 100x, relative ones not.
    _, small, _ = _loss_parts(error="relative")
    _, large, _ = _loss_parts(z_star_scale=10.0, error="relative")
    _, large_abs, _ = _loss_parts(z_star_scale=10.0)
    _, small_abs, _ = _loss_parts()
    assert float(large_abs["init"]) > 20 * float(small_abs["init"])
    np.testing.assert_allclose(small["final_rel_error"], m["final_rel_error"], rtol=1e-6)
    assert float(large["init"]) < 2 * float(small["init"])
    with pytest.raises(ValueError, match="error must be one of"):
        _loss_parts(error="squared")


def test_log_error_is_the_log_of_the_batch_mean_relative_error():
    zs = jnp.array([[[1.0, 0.0], [0.0, 3.0]], [[0.0, 0.0], [0.0, 2.0]]])  # [K=2, B=2, D=2]
    target = jnp.array([[0.0, 0.0], [0.0, 2.0]]) + jnp.array([[1.0, 0.0], [0.0, 0.0]])
    rel = ns.step_errors(zs, target, "relative")
    np.testing.assert_allclose(rel, [[0.0, 0.25], [1.0, 0.0]])
    np.testing.assert_allclose(ns.batch_error(zs, target, "log"), np.log([0.125, 0.5]))
    assert np.isfinite(float(ns.batch_error(target, target, "log")))  # converged: finite
    # In the loss: the initialiser's term is the log of the relative one, and the value
    # is still l1 * conv + l2 * init (+ l3 * alpha).
    value, logged, grads = _loss_parts(error="log")
    _, relative, _ = _loss_parts(error="relative")
    np.testing.assert_allclose(logged["init"], np.log(relative["init"]), rtol=1e-5)
    np.testing.assert_allclose(value, 0.1 * logged["conv"] + 0.05 * logged["init"], rtol=1e-6)
    assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))


def _one_step_losses(cell_gradient):
    """The unrolled loss of one step (alpha = 1 on the only slot, beta = 1/2 untrained)
    and its closed form ``||beta f(z0) + (1 - beta) z0 - z*||^2`` with ``z0 = h_phi(x)``;
    ``f``'s image is a constant of the closed form when ``cell_gradient`` is off."""
    k_a, k_b, k_x, k_s, k_i = jax.random.split(jax.random.PRNGKey(3), 5)
    a = 0.3 * jax.random.normal(k_a, (D, D)) / np.sqrt(D)
    bias = jax.random.normal(k_b, (D,))
    x = jax.random.normal(k_x, (B, DX))
    z_star = jax.random.normal(k_s, (B, D))
    f = lambda z, args: z @ args[0].T + args[1]
    solver = ns.init_neural_solver(jax.random.PRNGKey(0), (D,))
    h_phi = ns.make_initializer("vector", features=D)
    params = {"solver": solver.variables, "init": h_phi.init(k_i, x)}

    def unrolled(p):
        loss, _ = ns.neural_solver_loss(
            p,
            solver,
            h_phi,
            f,
            (a, bias),
            x,
            z_star,
            steps=1,
            l1=1.0,
            l2=0.0,
            cell_gradient=cell_gradient,
            detach_init=False,  # h_phi's gradient through the unrolled step
        )
        return loss

    def closed_form(p):
        z0 = h_phi.apply(p["init"], x)
        fz = f(z0, (a, bias)) if cell_gradient else jax.lax.stop_gradient(f(z0, (a, bias)))
        return jnp.mean(jnp.sum((0.5 * fz + 0.5 * z0 - z_star) ** 2, axis=-1))

    return jax.value_and_grad(unrolled)(params), jax.value_and_grad(closed_form)(params)


def test_detached_cell_gradient_known_answer():
    (loss_full, g_full), (form_full, form_g_full) = _one_step_losses(True)
    (loss_det, g_det), (form_det, form_g_det) = _one_step_losses(False)
    # The forward pass is the same; only the gradient through f is dropped.
    chex.assert_trees_all_close(loss_full, loss_det, form_full, form_det, rtol=1e-6)
    chex.assert_trees_all_close(g_full["init"], form_g_full["init"], rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(g_det["init"], form_g_det["init"], rtol=1e-4, atol=1e-6)
    differ = jax.tree_util.tree_map(lambda u, v: float(jnp.max(jnp.abs(u - v))), g_full, g_det)
    assert max(jax.tree_util.tree_leaves(differ["init"])) > 1e-3


def test_detached_steps_train_and_validate():
    f = lambda z, args: jnp.tanh(z @ args[0].T + args[1])
    a = 0.5 * jax.random.normal(jax.random.PRNGKey(1), (D, D)) / np.sqrt(D)
    x = jax.random.normal(jax.random.PRNGKey(2), (B, D))
    truth = dj.solvers.anderson(tol=1e-7, max_iter=200, stop_mode="abs")
    z_star = dj.fixed_point(f, jnp.zeros((B, D)), (a, x), solver=truth).value
    solver = ns.init_neural_solver(jax.random.PRNGKey(0), (D,))
    h_phi = ns.make_initializer("vector", features=D)
    run = functools.partial(
        train_neural_solver,
        solver,
        h_phi,
        f,
        itertools.repeat(((a, x), x, z_star)),
        key=jax.random.PRNGKey(4),
        steps=4,
        optimizer=optax.adam(3e-3),
    )
    detached = run(num_steps=60, detached_steps=40).losses
    full = run(num_steps=60).losses
    # The same first loss (same start); both fits reduce it, the detached part included.
    np.testing.assert_allclose(detached[0], full[0], rtol=1e-6)
    assert detached[39] < 0.7 * detached[0] and detached[-1] < 0.7 * detached[0]
    for bad in (-1, 61):
        with pytest.raises(ValueError, match="detached_steps"):
            run(num_steps=60, detached_steps=bad)


# ----------------------------------------------------------------------------- the solver


def test_solver_is_hashable_by_content_and_validates():
    key = jax.random.PRNGKey(0)
    a = ns.init_neural_solver(key, (D,), m=4)
    b = ns.init_neural_solver(key, (D,), m=4)
    c = ns.init_neural_solver(jax.random.PRNGKey(1), (D,), m=4)
    assert a == b and hash(a) == hash(b) and a != c
    assert a.replace(max_iter=7).max_iter == 7
    with pytest.raises(ValueError, match="Unknown neural_solver keyword"):
        ns.init_neural_solver(key, (D,), memory=3)
    with pytest.raises(ValueError, match="do not match the network"):
        ns.neural_solver(params=a.variables, state_shape=(D,), m=4, hidden=8)
    with pytest.raises(ValueError, match="pool='last'"):
        ns.init_neural_solver(key, (D,), pool="last")
    with pytest.raises(ValueError, match="concrete arrays"):
        jax.jit(lambda p: ns.neural_solver(params=p, state_shape=(D,), m=4).max_iter)(a.variables)
    with pytest.raises(ValueError, match="values per sample"):
        dj.fixed_point(lambda z, _: jnp.cos(z), jnp.zeros((2, D + 1)), solver=a)


def test_fixed_beta_solver():
    key = jax.random.PRNGKey(0)
    learned = ns.init_neural_solver(key, (D,), hidden=8)
    fixed = ns.init_neural_solver(key, (D,), hidden=8, beta=1.0)
    # No beta head: the pooled Dense(hidden -> 1) is gone.
    assert learned.params.size - fixed.params.size == 8 + 1
    with pytest.raises(ValueError, match="beta"):
        ns.neural_solver(params=learned.variables, state_shape=(D,), hidden=8, beta=1.0)
    for bad in (0.0, 1.5, True, "1"):
        with pytest.raises(ValueError, match="beta must be None"):
            ns.init_neural_solver(key, (D,), beta=bad)
    with pytest.raises(ValueError, match="learns beta"):
        ns.init_neural_solver(key, (D,), alpha_mode="least_squares", beta=1.0)
    # Untrained with beta = 1: uniform alpha over the history, undamped. By hand:
    # z1 = f(z0), z2 = (f(z0) + f(z1)) / 2, z3 = (f(z0) + f(z1) + f(z2)) / 3.
    f = lambda z: jnp.cos(z) + 0.1 * z
    z0 = jax.random.normal(key, (2, D))
    state, z, images = fixed.init(z0), z0, []
    for k in (1, 2, 3):
        images.append(f(z))
        out = fixed.step(fixed.variables, state, z, images[-1], k)
        np.testing.assert_allclose(out.z_next, sum(images) / k, atol=1e-6)
        np.testing.assert_array_equal(out.beta, 1.0)
        state, z = out.state, out.z_next
    # A fixed beta below one damps with that beta; jitted and handed over to Anderson.
    damped = ns.init_neural_solver(key, (D,), hidden=8, beta=0.5, anderson_after=1)
    out = jax.jit(damped.step, static_argnums=4)(damped.variables, damped.init(z0), z0, f(z0), 1)
    np.testing.assert_allclose(out.z_next, 0.5 * f(z0) + 0.5 * z0, atol=1e-6)
    np.testing.assert_array_equal(out.beta, 0.5)


def test_anderson_after_zero_is_anderson():
    # From the first step on, the hand-over takes Anderson's alpha with beta = 1, so the
    # iterates are those of Anderson with the same history size (m + 1 = 6 slots).
    key = jax.random.PRNGKey(3)
    w = 0.9 * jax.random.orthogonal(key, D)
    f = lambda z, b: jnp.tanh(z @ w + b)
    bias = jax.random.normal(jax.random.PRNGKey(4), (B, D))
    classic = dj.solvers.anderson(m=6, tol=1e-30, max_iter=9)
    z0 = jnp.zeros((B, D))
    want = _solve(f, z0, bias, classic)
    for beta in (None, 1.0):  # learned or fixed, the hand-over takes beta = 1
        hyper = ns.init_neural_solver(
            key, (D,), m=5, anderson_after=0, beta=beta, tol=1e-30, max_iter=9
        )
        got = _solve(f, z0, bias, hyper)
        np.testing.assert_allclose(got.stats.trace, want.stats.trace, rtol=1e-3)
        np.testing.assert_allclose(got.value, want.value, atol=1e-5)


def test_anderson_after_switches_at_its_step():
    # Before the switch the learned (here: untrained, uniform, beta = 1/2) steps run;
    # the residual trace agrees with the learned solver up to the switch and not after.
    key = jax.random.PRNGKey(5)
    w = 0.9 * jax.random.orthogonal(key, D)
    f = lambda z, b: jnp.tanh(z @ w + b)
    bias = jax.random.normal(jax.random.PRNGKey(6), (B, D))
    learned = ns.init_neural_solver(key, (D,), tol=1e-30, max_iter=12)
    handed = learned.replace(anderson_after=4)
    z0 = jnp.zeros((B, D))
    solve = jit_as_users_compile(_solve.__wrapped__, static_argnums=(0, 3))
    a = solve(f, z0, bias, learned).stats.trace
    b = solve(f, z0, bias, handed).stats.trace
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-5)
    assert float(jnp.mean(b[:, -1])) < 0.1 * float(jnp.mean(a[:, -1]))
    # The while loop runs the hand-over's stretches (no per-step switch between the
    # parts); the iterates are those of the switching steps that "scan" takes.
    assert [p.stay is None for p in handed.phases()] == [False, False, True]
    fn = lambda z: f(z, bias)
    iterate = jit_as_users_compile(dj.solvers.iterate, static_argnums=(0, 1, 3))
    runs = {loop: iterate(handed, fn, z0, loop) for loop in ("while", "scan")}
    np.testing.assert_allclose(runs["while"][0], runs["scan"][0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(runs["while"][1].trace, runs["scan"][1].trace, rtol=1e-5)
    # Unrolled past the switch for training, the learned steps still get gradients.
    z_star = _solve(f, z0, bias, dj.solvers.anderson(tol=1e-7, max_iter=100)).value
    loss = lambda p: ns.neural_solver_loss(
        {"solver": p, "init": None}, handed, None, f, bias, None, z_star, steps=8
    )[0]
    grads = jax.jit(jax.grad(loss))(handed.variables)  # one program, not each op eagerly
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(grads)]
    assert all(np.isfinite(norms)) and max(norms) > 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="anderson_after"):
            learned.replace(anderson_after=bad)


@pytest.mark.parametrize(
    "state_shape, pool", [((5, 3), "last"), ((5, 3), "mean"), ((4, 4, 2), "mean")]
)
def test_untrained_solver_runs_on_structured_states(state_shape, pool):
    solver = ns.init_neural_solver(jax.random.PRNGKey(0), state_shape, pool=pool, max_iter=12)
    z0 = jnp.zeros((3, *state_shape))
    sol = jax.jit(lambda z: dj.fixed_point(lambda z, a: 0.5 * jnp.cos(z), z, solver=solver))(z0)
    chex.assert_shape(sol.value, z0.shape)
    chex.assert_tree_all_finite(sol.value)
    first = 0.5 * np.sqrt(np.prod(state_shape))  # ||f(0) - 0||
    np.testing.assert_array_less(sol.stats.abs_residual, 0.1 * first)


# ----------------------------------------------------------------------------- trained on a DEQ


@pytest.fixture(scope="module")
def trained():
    """A neural solver and initialiser trained for 300 steps on a frozen MLP-cell DEQ."""
    k_model, k_solver, k_init, k_test, k_data = jax.random.split(jax.random.PRNGKey(0), 5)
    model = DEQ(MLPCell(features=D), solver=dj.solvers.anderson(tol=1e-7, max_iter=200))
    variables = model.init(k_model, jnp.zeros((B, DX)), train=False)
    problem = model.apply(variables, jnp.zeros((B, DX)), train=False, method=DEQ.problem)
    f, cell_vars = problem.f, problem.args[0]
    truth = dj.solvers.anderson(tol=1e-7, max_iter=200, stop_mode="abs")

    @jax.jit
    def batch(key):
        x = 2.0 * jax.random.normal(key, (B, DX))
        args = (cell_vars, x, None)
        return args, x, dj.fixed_point(f, jnp.zeros((B, D)), args, solver=truth).value

    batches = [batch(k) for k in jax.random.split(k_data, 4)]
    untrained = ns.init_neural_solver(k_solver, (D,), tol=1e-4, max_iter=60)
    h_phi = ns.make_initializer("vector", features=D)
    progress = []
    result = train_neural_solver(
        untrained,
        h_phi,
        f,
        itertools.cycle(batches),
        num_steps=300,
        key=k_init,
        steps=8,
        optimizer=optax.adam(3e-3),
        on_step=lambda step, loss: progress.append((step, loss)),
        log_every=128,
    )
    return dict(
        model=model,
        variables=variables,
        f=f,
        untrained=untrained,
        h_phi=h_phi,
        result=result,
        progress=progress,
        test=batch(k_test),
    )


def test_training_reduces_loss(trained):
    losses = trained["result"].losses
    assert losses.shape == (300,) and np.all(np.isfinite(losses))
    assert losses[-20:].mean() < 0.5 * losses[:20].mean()
    # on_step: every log_every steps and after the last, with that step's loss.
    steps, reported = zip(*trained["progress"], strict=True)
    assert steps == (128, 256, 300)
    np.testing.assert_allclose(reported, losses[[127, 255, 299]], rtol=1e-6)


@functools.partial(jax.jit, static_argnums=(0, 3))  # the solver is hashable: a static arg
def _solve(f, z0, args, solver):
    return dj.fixed_point(f, z0, args, solver=solver)


def test_trained_solver_converges_to_anderson_fixed_point(trained):
    f, (args, x, z_star) = trained["f"], trained["test"]
    solver = trained["result"].solver
    z0 = trained["h_phi"].apply(trained["result"].init_params, x)
    sol = _solve(f, z0, args, solver)
    assert bool(jnp.all(sol.stats.converged))
    np.testing.assert_array_less(sol.stats.rel_residual, solver.tol)
    ref = _solve(f, jnp.zeros_like(z0), args, dj.solvers.anderson(tol=1e-4, max_iter=60))
    np.testing.assert_allclose(sol.value, ref.value, atol=2e-3)
    np.testing.assert_allclose(sol.value, z_star, atol=2e-3)


def test_training_reduces_solver_steps(trained):
    f, (args, x, _) = trained["f"], trained["test"]
    res = trained["result"]
    zeros = jnp.zeros((B, D))
    before = _solve(f, zeros, args, trained["untrained"]).stats.nstep
    after = _solve(f, trained["h_phi"].apply(res.init_params, x), args, res.solver).stats.nstep
    assert float(jnp.mean(after)) < 0.5 * float(jnp.mean(before))


def test_deq_gradient_with_neural_solver_matches_anderson(trained):
    model, variables = trained["model"], trained["variables"]
    (_, x, _), res = trained["test"], trained["result"]
    z0 = trained["h_phi"].apply(res.init_params, x)
    backward = dj.backward.ift(solver=dj.solvers.anderson(tol=1e-7, max_iter=100))

    def grads(solver, z0):
        deq = DEQ(model.cell, solver=solver, backward=backward)

        @jax.jit
        def loss(v):
            z, _ = deq.apply(v, x, z0, train=False)
            return jnp.sum(z**2) / B

        return jax.grad(loss)(variables)

    neural = grads(res.solver.replace(tol=1e-6, max_iter=100), z0)
    classic = grads(dj.solvers.anderson(tol=1e-6, max_iter=100), jnp.zeros_like(z0))
    chex.assert_tree_all_finite(neural)
    chex.assert_trees_all_close(neural, classic, rtol=2e-4, atol=2e-5)
