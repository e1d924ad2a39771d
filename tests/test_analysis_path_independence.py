"""The AA score on maps with one fixed point and with several."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax.analysis import (
    aa_score,
    aa_score_deq,
    adversarial_aa,
    derangement,
    per_sample_cosine,
)


@pytest.mark.parametrize("n", [2, 3, 16])
def test_derangement_moves_every_index(n):
    for seed in range(5):
        perm = np.asarray(derangement(jax.random.PRNGKey(seed), n))
        assert sorted(perm) == list(range(n))
        assert np.all(perm != np.arange(n))


def test_derangement_needs_two():
    with pytest.raises(ValueError, match="at least 2"):
        derangement(jax.random.PRNGKey(0), 1)


def test_per_sample_cosine_on_pytrees():
    a = {"u": jnp.array([[1.0, 0.0], [1.0, 1.0]]), "v": jnp.zeros((2, 1))}
    b = {"u": jnp.array([[0.0, 2.0], [2.0, 2.0]]), "v": jnp.zeros((2, 1))}
    np.testing.assert_allclose(per_sample_cosine(a, b), [0.0, 1.0], atol=1e-6)


def test_a_contraction_is_path_independent():
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=8, d=6, norm=0.7)
    mean, per = aa_score(
        tanh_cell,
        jnp.zeros_like(x),
        (w, x),
        solver=dj.solvers.anderson(tol=1e-6),
        key=jax.random.PRNGKey(1),
    )
    assert per.shape == (8,)
    assert float(mean) > 0.9999


def test_a_bistable_map_is_path_dependent():
    """z = tanh(3 z + x) with small x has two stable fixed points, near +1 and -1."""
    x = 0.01 * jnp.array([[1.0], [-1.0], [1.0], [-1.0]])
    f = lambda z, x: jnp.tanh(3.0 * z + x)
    # From z0 = x-sign starts, samples 0, 2 settle at +0.995 and 1, 3 at -0.995; each
    # restart from another sample's fixed point lands on the other sign for some pairs.
    z0 = jnp.sign(x)
    scores = [
        float(
            aa_score(f, z0, x, solver=dj.solvers.anderson(tol=1e-6), key=jax.random.PRNGKey(s))[0]
        )
        for s in range(4)
    ]
    assert min(scores) < 0.5


def test_aa_score_of_a_deq_module():
    model = dj.nn.DEQ(dj.nn.MLPCell(features=8), solver=dj.solvers.anderson(tol=1e-6))
    x = jax.random.normal(jax.random.PRNGKey(2), (6, 3))
    variables = model.init(jax.random.PRNGKey(3), x, train=False)
    mean, per = aa_score_deq(model, variables, x, key=jax.random.PRNGKey(4))
    assert per.shape == (6,)
    assert float(mean) > 0.999


def test_adversary_cannot_move_a_contraction():
    w, x = tanh_problem(jax.random.PRNGKey(5), batch=4, d=6, norm=0.6)
    result = adversarial_aa(
        tanh_cell,
        jnp.zeros_like(x),
        (w, x),
        solver=dj.solvers.anderson(tol=1e-6),
        key=jax.random.PRNGKey(6),
        steps=10,
        restarts=2,
        lbfgs_iters=5,
    )
    assert result.per_instance.shape == (4,)
    assert float(result.aa) > 0.9999
    assert result.fixed_points.shape == x.shape


def test_adversary_finds_other_fixed_points_of_a_multistable_map():
    """z = tanh(3 z + x) with small x has an unstable fixed point near -x/2, which a
    solver started at 0 reaches, and two stable ones near +-1 per coordinate; the
    adversary's starts end at the stable ones, far from the reference."""
    x = 0.05 * jnp.array([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0]])
    f = lambda z, x: jnp.tanh(3.0 * z + x)
    solver = dj.solvers.anderson(tol=1e-6)
    result = adversarial_aa(
        f,
        jnp.zeros_like(x),
        x,
        solver=solver,
        key=jax.random.PRNGKey(7),
        steps=20,
        restarts=2,
        lbfgs_iters=10,
    )
    assert float(result.aa) < 0.5
    np.testing.assert_allclose(jnp.abs(result.fixed_points), 0.995, atol=0.01)
    # The attacked fixed points are genuine fixed points.
    np.testing.assert_allclose(f(result.fixed_points, x), result.fixed_points, atol=1e-5)


def test_adversary_counts_a_blown_up_solve_as_unaligned():
    """z = 1 + (z - 1)^2 is superstable at 1 (the reference start) and blows up from
    any start with |z - 1| > 1: those attacks score 0, never NaN. The 8 unrolled steps
    overflow too, so the L-BFGS search yields non-finite starts, which fall back to
    the random ones."""
    f = lambda z, _: 1.0 + jnp.square(z - 1.0)
    result = adversarial_aa(
        f,
        jnp.ones((3, 4)),
        None,
        solver=dj.solvers.fixed_point_iteration(max_iter=40, tol=1e-6),
        key=jax.random.PRNGKey(8),
        steps=8,
        restarts=2,
        lbfgs_iters=3,
        init_scale=3.0,
    )
    assert np.all(np.asarray(result.diverged))
    np.testing.assert_array_equal(result.per_instance, 0.0)
    assert float(result.aa) == 0.0
    assert np.all(np.isfinite(np.asarray(jax.tree_util.tree_leaves(result.starts)[0])))


def test_adversary_rejects_bad_budgets():
    with pytest.raises(ValueError, match="restarts must be an integer >= 1"):
        adversarial_aa(
            lambda z, a: z,
            jnp.zeros((2, 2)),
            None,
            solver=dj.solvers.anderson(),
            key=jax.random.PRNGKey(0),
            restarts=0,
        )


def test_time_scaling_rows_and_convergence():
    from deq_jax import analysis

    model = dj.nn.DEQ(dj.nn.MLPCell(features=8), solver=dj.solvers.fixed_point_iteration(tol=1e-6))
    x = jax.random.normal(jax.random.PRNGKey(8), (6, 3))
    variables = model.init(jax.random.PRNGKey(9), x, train=False)
    apply = jax.jit(
        lambda x, n: model.apply(variables, x, train=False, max_iter=n), static_argnums=1
    )
    targets = jnp.argmax(apply(x, 200)[0], axis=-1)  # the converged model's own answers
    mask = jnp.array([True] * 5 + [False])
    rows = analysis.test_time_scaling(
        apply,
        {"easy": lambda: [{"inputs": x, "targets": targets, "mask": mask}]},
        budgets=[1, 3, 200],
        metric_fn=analysis.accuracy_from_logits,
    )
    assert [r["max_iter"] for r in rows] == [1, 3, 200]
    assert rows[-1]["accuracy"] == 1.0 and rows[-1]["converged"] == 1.0
    assert rows[0]["nstep_mean"] == 1.0 and rows[-1]["nstep_mean"] > 3
    residuals = [r["rel_residual_mean"] for r in rows]
    assert residuals[0] > residuals[1] > residuals[2]
