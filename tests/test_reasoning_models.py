"""The edge-copy and matrix-inversion DEQs, and the three reasoning configs end to end."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import blurry_digits, edge_copy, matrix_inversion
from deq_jax import backward as backward_lib
from deq_jax import models
from deq_jax.models.reasoning import (
    EdgeCell,
    EdgeCopyDEQ,
    MatrixInversionDEQ,
    complete_graph,
    edge_neighbourhood,
)
from deq_jax.nn import DEQSpec
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.fixed_point_iteration import fixed_point_iteration
from deq_jax.tasks.edge_copy import symmetric_from_upper
from deq_jax.training import train_and_evaluate
from deq_jax.training.run import writers

KEY = jax.random.PRNGKey(0)
RNGS = {"params": jax.random.PRNGKey(1), "z0": jax.random.PRNGKey(2)}


def random_graphs(seed, batch, nodes, features=1, p=0.4):
    """``(x [B, n, n, C], adjacency [B, n, n])``: symmetric, zero diagonal and non-edges."""
    rng = np.random.default_rng(seed)
    adj = symmetric_from_upper(rng.random((batch, nodes, nodes)) < p).astype(np.float32)
    x = symmetric_from_upper(rng.uniform(-1, 1, (batch, nodes, nodes, features)))
    return jnp.asarray(x * adj[..., None], jnp.float32), jnp.asarray(adj)


def edge_model(**kw):
    spec = {k: kw.pop(k) for k in ("solver", "backward", "z_init") if k in kw}
    spec = {"solver": anderson(tol=1e-4, max_iter=30)} | spec
    return EdgeCopyDEQ(**({"width": 8, "hidden": 16, "deq": DEQSpec(**spec)} | kw))


def n_params(variables):
    return sum(x.size for x in jax.tree_util.tree_leaves(variables["params"]))


@pytest.fixture(scope="module")
def edge_variables():
    """Parameters of `edge_model()` for two input features, initialised on 6 nodes."""
    x, adj = random_graphs(0, 3, 6, features=2)
    return jax.jit(lambda: edge_model().init(RNGS, x, adjacency=adj, train=False))()


def test_registered_by_name():
    assert models.get("edge_copy_deq", width=4).width == 4
    assert isinstance(models.get("matrix_inversion_deq"), MatrixInversionDEQ)


def test_edge_neighbourhood_known_answer():
    # Path graph 0 - 1 - 2, one feature equal to 10 i + j on edge (i, j).
    adj = np.zeros((1, 3, 3), np.float32)
    adj[0, 0, 1] = adj[0, 1, 0] = adj[0, 1, 2] = adj[0, 2, 1] = 1
    z = (10 * np.arange(3)[:, None] + np.arange(3)[None, :]).astype(np.float32)
    z = jnp.asarray(z[None, :, :, None])
    out_mean, in_mean = edge_neighbourhood(z, jnp.asarray(adj))
    # Node 0 has the edge (0, 1); node 1 has (1, 0) and (1, 2); node 2 has (2, 1).
    np.testing.assert_allclose(out_mean[0, :, 0, 0], [1.0, (10 + 12) / 2, 21.0])
    np.testing.assert_allclose(in_mean[0, 0, :, 0], [10.0, (1 + 21) / 2, 12.0])
    assert out_mean.shape == in_mean.shape == z.shape


def test_edge_model_parameter_count(edge_variables):
    # project 2*8+8; cell: recurrent (4*8)*16+16, inject 8*16, out 16*8+8, layer norm
    # 2*8; head 8*2+2.
    assert n_params(edge_variables) == 24 + (528 + 128 + 136 + 16) + 18


def test_edge_model_is_size_agnostic_and_zero_off_edges(edge_variables):
    model = edge_model(z_init="mixed")
    apply = jax.jit(
        lambda x, a: model.apply(edge_variables, x, adjacency=a, train=True, rngs={"z0": KEY})
    )
    for nodes in (6, 9):
        x, adj = random_graphs(nodes, 3, nodes, features=2)
        out, stats = apply(x, adj)
        chex.assert_shape(out, (3, nodes, nodes, 2))
        chex.assert_shape(stats.nstep, (3,))
        chex.assert_tree_all_finite((out, stats.rel_residual))
        assert bool(jnp.all(out[adj == 0] == 0.0))
        assert bool(jnp.all(out[adj == 1] != 0.0))


def test_edge_model_default_adjacency_is_the_complete_graph(edge_variables):
    x, _ = random_graphs(3, 2, 5, features=2)
    model = edge_model()
    out, _ = model.apply(edge_variables, x, train=False)
    ref, _ = model.apply(edge_variables, x, adjacency=complete_graph(2, 5), train=False)
    chex.assert_trees_all_close(out, ref)
    assert bool(jnp.all(jnp.diagonal(out, axis1=1, axis2=2) == 0.0))


@pytest.mark.parametrize("jit", [False, True])
def test_edge_model_is_permutation_equivariant(edge_variables, jit):
    x, adj = random_graphs(4, 2, 7, features=2)
    # Plain iteration with a fixed budget: every iterate is equivariant, converged or not.
    model = edge_model(solver=fixed_point_iteration(tol=1e-6, max_iter=20))
    apply = lambda x, a: model.apply(edge_variables, x, adjacency=a, train=False)[0]
    if jit:
        apply = jax.jit(apply)
    perm = np.random.default_rng(0).permutation(7)
    relabel = lambda t: t[:, perm][:, :, perm]  # node i of the new graph is perm[i]
    out = apply(x, adj)
    out_perm = apply(relabel(x), relabel(adj))
    chex.assert_trees_all_close(out_perm, relabel(out), atol=1e-5)
    # A relabelling is not a symmetry of the output itself: the check can fail.
    assert not np.allclose(out_perm, out, atol=1e-3)


def test_edge_cell_output_is_masked_and_shaped():
    x, adj = random_graphs(5, 2, 5)
    cell = EdgeCell(6, hidden=8)
    z = jax.random.normal(KEY, (2, 5, 5, 6))
    variables = cell.init(KEY, z, (x, adj))
    z_new = cell.apply(variables, z, (x, adj))
    chex.assert_shape(z_new, (2, 5, 5, 6))
    assert bool(jnp.all(z_new[adj == 0] == 0.0))
    assert cell.state_spec((x, adj)).shape == (2, 5, 5, 6)


def test_matrix_model_shapes_and_parameter_count():
    x = jax.random.normal(KEY, (4, 5, 5))
    model = MatrixInversionDEQ(
        width=8, hidden=16, deq=DEQSpec(solver=anderson(tol=1e-4, max_iter=30))
    )
    variables = jax.jit(lambda: model.init(RNGS, x, train=False))()
    # project 25*8+8; cell inject 8*16, hidden 8*16+16, out 16*8+8; head 8*25+25.
    assert n_params(variables) == 208 + (128 + 144 + 136) + 225
    out, stats = jax.jit(lambda v: model.apply(v, x, train=False))(variables)
    chex.assert_shape(out, (4, 5, 5))
    chex.assert_shape(stats.nstep, (4,))
    assert bool(jnp.all(stats.converged))


@pytest.mark.parametrize("which", ["edge", "matrix"])
def test_gradients_are_finite_and_reach_every_parameter(which, edge_variables):
    if which == "edge":
        model = edge_model(backward=backward_lib.get("jacobian_free"), z_init="mixed")
        inputs, adj = random_graphs(6, 3, 6, features=2)
        extra, params = {"adjacency": adj}, edge_variables["params"]
    else:
        model = MatrixInversionDEQ(
            width=8, hidden=16, deq=DEQSpec(backward=backward_lib.get("ift"))
        )
        inputs, extra = jax.random.normal(KEY, (3, 4, 4)), {}
        params = jax.jit(lambda: model.init(RNGS, inputs, train=False))()["params"]

    def loss(p):
        out, _ = model.apply({"params": p}, inputs, train=True, rngs={"z0": KEY}, **extra)
        return jnp.mean(jnp.square(out - inputs))

    grads = jax.jit(jax.grad(loss))(params)
    chex.assert_tree_all_finite(grads)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert float(jnp.max(jnp.abs(g))) > 0, path


def test_bad_inputs_raise():
    x, adj = random_graphs(7, 2, 5)
    model = edge_model()
    with pytest.raises(ValueError, match=r"inputs \[B, n, n, C\]"):
        model.init(RNGS, x[..., 0], train=False)
    with pytest.raises(ValueError, match=r"inputs \[B, n, n, C\]"):
        model.init(RNGS, x[:, :, :4], train=False)
    with pytest.raises(ValueError, match="adjacency"):
        model.init(RNGS, x, adjacency=adj[:, :4, :4], train=False)
    mat = MatrixInversionDEQ(width=4, hidden=8)
    with pytest.raises(ValueError, match=r"inputs \[B, d, d\]"):
        mat.init(RNGS, jnp.ones((2, 9)), train=False)
    with pytest.raises(ValueError, match=r"inputs \[B, d, d\]"):
        mat.init(RNGS, jnp.ones((2, 3, 4)), train=False)
    with pytest.raises(ValueError, match="EdgeCell expects"):
        EdgeCell(4).init(KEY, jnp.ones((2, 5, 5, 4)), (x, adj[:, :4]))


@pytest.mark.parametrize(
    "module, metric",
    [
        (edge_copy, "mse"),  # CI runs one; the other two are the same loop (27 s)
        pytest.param(matrix_inversion, "mse", marks=pytest.mark.slow),
        pytest.param(blurry_digits, "accuracy", marks=pytest.mark.slow),
    ],
)
def test_smoke_config_runs_end_to_end(module, metric, tmp_path):
    config = module.get_config("smoke")
    assert config.ckpt.every_steps <= config.train.steps
    name = module.__name__.split(".")[-1]
    assert f"python -m launch.main --config configs/{name}.py:smoke --workdir" in module.__doc__
    result = train_and_evaluate(config, str(tmp_path), emit=lambda s: None)
    assert result.step == config.train.steps
    steps = [int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()]
    assert config.train.steps in steps
    assert set(result.report) == {f"{m}x" for m in config.eval.budget_multipliers}
    for by_split in result.report.values():
        for metrics in by_split.values():
            assert np.isfinite(metrics[metric])
    train = [r for r in writers.read_metrics(str(tmp_path)) if r["split"] == "train"]
    assert np.isfinite(train[-1]["loss"])
