"""A solve's replayed trajectory: the iterates, settling steps and the worst node's residual."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from deq_jax.analysis import first_below, node_residual, settle_step, solver_trajectory


def test_replay_of_plain_iteration_is_the_iteration():
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=3, d=5, norm=0.7)
    z0 = jnp.zeros_like(x)
    solver = dj.solvers.fixed_point_iteration(max_iter=6)
    seen = solver_trajectory(
        tanh_cell, z0, (w, x), solver=solver, observe=lambda z, fz: {"z": z, "fz": fz}
    )
    assert seen["z"].shape == (3, 6, 5)
    z = z0
    for k in range(6):
        np.testing.assert_allclose(seen["z"][:, k], z, atol=1e-6)
        z = tanh_cell(z, (w, x))
        np.testing.assert_allclose(seen["fz"][:, k], z, atol=1e-6)


@pytest.mark.parametrize("solver", ["anderson", "broyden"])
def test_replayed_steps_match_the_solve(solver, x64):
    """The step at which the replay's residual first passes tol is the solve's nstep."""
    w, x = tanh_problem(jax.random.PRNGKey(1), batch=16, d=12, norm=0.9, dtype="float64")
    z0 = jnp.zeros_like(x)
    solver = dj.solvers.get(solver, tol=1e-6, max_iter=40)
    sol = dj.fixed_point(tanh_cell, z0, (w, x), solver=solver)
    residual = solver_trajectory(
        tanh_cell,
        z0,
        (w, x),
        solver=solver,
        observe=lambda z, fz: jnp.linalg.norm(fz - z, axis=-1) / jnp.linalg.norm(fz, axis=-1),
    )
    assert residual.shape == (16, 40)
    np.testing.assert_array_equal(first_below(residual, solver.tol), sol.stats.nstep)
    assert np.all(np.asarray(sol.stats.nstep) < 40)  # a real stop, not the budget


def test_replay_checks_steps():
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=2, d=3)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        solver_trajectory(
            tanh_cell,
            x,
            (w, x),
            solver=dj.solvers.anderson(),
            observe=lambda z, fz: z,
            steps=0,
        )


def test_settle_step_known_answers():
    values = jnp.array([[1, 2, 3, 3], [5, 5, 5, 5], [1, 2, 1, 2], [7, 7, 8, 7]])
    np.testing.assert_array_equal(settle_step(values), [3, 1, 4, 4])
    # against a given final answer; one that the last step misses counts the budget
    np.testing.assert_array_equal(settle_step(values, jnp.array([3, 6, 2, 7])), [3, 4, 4, 4])
    # steps past the solver's stop do not count
    np.testing.assert_array_equal(settle_step(values, until=jnp.array([2, 4, 3, 2])), [2, 1, 3, 1])
    np.testing.assert_array_equal(
        settle_step(values, jnp.array([3, 5, 1, 7]), until=jnp.array([3, 4, 3, 2])), [3, 1, 3, 1]
    )
    # whole pointer vectors per step: settled when every entry is
    pointers = jnp.array([[[0, 1], [0, 0], [1, 0], [1, 0]]])  # [B=1, K=4, n=2]
    np.testing.assert_array_equal(settle_step(pointers), [3])


def test_first_below_known_answers():
    res = jnp.array([[1.0, 0.5, 1e-4, 1e-5], [1.0, 1.0, 1.0, 1.0], [1e-5, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(first_below(res, 1e-3), [3, 4, 1])


def test_node_residual_is_size_invariant_where_the_whole_state_one_is_not():
    key = jax.random.PRNGKey(0)
    hidden = 4

    def graph(n):  # every node at norm 1; node 0 moves by 0.1, the others stay
        z = jnp.ones((1, n, hidden)) / np.sqrt(hidden)
        return z, z.at[0, 0, 0].add(0.1)

    whole = lambda z, fz: float(jnp.linalg.norm(fz - z) / jnp.linalg.norm(fz))
    z16, fz16 = graph(16)
    z64, fz64 = graph(64)
    np.testing.assert_allclose(
        node_residual(z16, fz16, 16), node_residual(z64, fz64, 64), rtol=5e-3
    )
    np.testing.assert_allclose(whole(z16, fz16) / whole(z64, fz64), 2.0, rtol=5e-3)
    # when every node moves alike the two agree
    z = jax.random.normal(key, (2, 8, hidden))
    z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
    fz = 1.1 * z
    np.testing.assert_allclose(
        node_residual(z, fz, 8),
        jnp.linalg.norm((fz - z).reshape(2, -1), axis=-1)
        / jnp.linalg.norm(fz.reshape(2, -1), axis=-1),
        rtol=1e-5,
    )


def test_node_residual_counts_an_edge_state_row_towards_its_node():
    n = 3
    nodes = jnp.ones((1, n, 2))
    edges = jnp.zeros((1, n, n, 1))
    moved_edges = edges.at[0, 2, 0, 0].set(2.0)  # an edge out of node 2 moves
    z, fz = (nodes, edges), (nodes, moved_edges)
    scale = np.sqrt((n * 2 + 4.0) / n)  # RMS node norm of f(z): the moved edge counts
    np.testing.assert_allclose(node_residual(z, fz, n), [2.0 / scale], rtol=1e-6)
    with pytest.raises(ValueError, match="node_residual needs leaves"):
        node_residual(jnp.ones((1, 4, 2)), jnp.ones((1, 4, 2)), 3)
