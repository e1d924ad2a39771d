"""Tests for the edge-copy and matrix-inversion tasks: data, training noise and metrics."""

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks.edge_copy import (
    EdgeCopyConfig,
    edge_mse,
    step_noise,
    symmetric_from_upper,
)
from deq_jax.tasks.edge_copy import generate_split as graph_split
from deq_jax.tasks.matrix_inversion import MatrixInversionConfig, random_spd
from deq_jax.tasks.matrix_inversion import generate_split as matrix_split

GRAPHS = {
    "train_size": 64,
    "train_nodes": 6,
    "test_nodes": (6, 12, 40),
    "test_size": 16,
    "val_size": 16,
}
MATRICES = {"train_size": 64, "test_conds": (2, 50), "test_size": 16}


def _draws(iterator, steps):
    return [next(iterator) for _ in range(steps)]


def test_graphs_are_symmetric_er_graphs_with_copied_features():
    config = EdgeCopyConfig(**GRAPHS, num_features=2)
    for split in config.splits:
        arrays = graph_split(config, split)
        n = config.nodes(split)
        adj, x, y = arrays["adjacency"], arrays["inputs"], arrays["targets"]
        assert adj.shape == (16 if split != "train" else 64, n, n) and adj.dtype == np.float32
        assert x.shape == adj.shape + (2,) and x.dtype == np.float32
        assert set(np.unique(adj)) <= {0.0, 1.0}
        np.testing.assert_array_equal(adj, adj.transpose(0, 2, 1))
        np.testing.assert_array_equal(x, x.transpose(0, 2, 1, 3))
        assert not np.diagonal(adj, axis1=1, axis2=2).any()
        assert not x[adj == 0].any() and (x[adj == 1] != 0).all()
        assert np.abs(x).max() <= 1.0
        np.testing.assert_array_equal(x, y)  # clean copy
    big = graph_split(config, "test_40")["adjacency"]
    density = big.sum() / (16 * 40 * 39)
    assert abs(density - config.edge_prob) < 0.02


def test_graphs_deterministic_and_seed_dependent():
    config = EdgeCopyConfig(**GRAPHS)
    first = graph_split(config, "train")["inputs"].copy()
    graph_split.cache_clear()
    np.testing.assert_array_equal(graph_split(config, "train")["inputs"], first)
    other = graph_split(EdgeCopyConfig(**GRAPHS, seed=1), "train")["inputs"]
    assert not np.array_equal(other, first)
    assert not np.array_equal(graph_split(config, "test_6")["inputs"], first[:16])
    valid = graph_split(config, "valid")["inputs"]  # 6 nodes, its own stream
    assert valid.shape == (16, 6, 6, 1) and not np.array_equal(valid, first[:16])
    assert not np.array_equal(valid, graph_split(config, "test_6")["inputs"])
    without = EdgeCopyConfig(**{**GRAPHS, "val_size": 0})
    assert "valid" not in without.splits
    for split in without.splits:
        np.testing.assert_array_equal(
            graph_split(without, split)["inputs"], graph_split(config, split)["inputs"]
        )


def test_edge_copy_training_noise_is_fresh_symmetric_on_edges_and_resumable():
    task = tasks.get("edge_copy", **GRAPHS, noise_std=0.5)
    stream = _draws(task.train_iterator(16, seed=2), 6)  # one epoch is 4 steps
    for batch in stream:
        adj, noise = batch["adjacency"], batch["inputs"] - batch["targets"]
        np.testing.assert_array_equal(noise, noise.transpose(0, 2, 1, 3))
        assert not noise[adj == 0].any() and (noise[adj == 1] != 0).all()
        np.testing.assert_allclose(noise[adj == 1].std(), 0.5, rtol=0.25)
    clean = graph_split(task.config, "train")
    np.testing.assert_array_equal(stream[4]["targets"], clean["targets"][stream[4]["index"]])
    # The same example drawn in two epochs gets different noise.
    first = {int(i): x for i, x in zip(stream[0]["index"], stream[0]["inputs"], strict=True)}
    pairs = zip(stream[4]["index"], stream[4]["inputs"], strict=True)
    again = [(first[int(i)], x) for i, x in pairs if int(i) in first]
    assert again and all(not np.array_equal(a, b) for a, b in again)
    resumed = next(task.train_iterator(16, seed=2, start_step=5))
    np.testing.assert_array_equal(resumed["inputs"], stream[5]["inputs"])
    halves = [
        next(task.train_iterator(16, seed=2, process_index=p, process_count=2)) for p in (0, 1)
    ]
    np.testing.assert_array_equal(
        np.concatenate([h["inputs"] for h in halves]), stream[0]["inputs"]
    )
    silent = next(tasks.get("edge_copy", **GRAPHS, noise_std=0.0).train_iterator(16, seed=2))
    np.testing.assert_array_equal(silent["inputs"], silent["targets"])
    evals = list(task.eval_iterator("test_40", 6))
    assert len(evals) == 3 and int(sum(b["mask"].sum() for b in evals)) == 16
    np.testing.assert_array_equal(evals[0]["inputs"], evals[0]["targets"])  # eval is clean
    assert evals[0]["inputs"].shape == (6, 40, 40, 1)


def test_step_noise_slices_the_global_draw():
    full = step_noise(3, 7, 8, (2, 2))
    assert full.shape == (8, 2, 2) and full.dtype == np.float32
    np.testing.assert_array_equal(step_noise(3, 7, 8, (2, 2), 3, 4), full[6:])
    assert not np.array_equal(step_noise(3, 8, 8, (2, 2)), full)
    x = np.arange(2 * 3 * 3, dtype=float).reshape(2, 3, 3)
    s = symmetric_from_upper(x)
    np.testing.assert_array_equal(s[0], [[0, 1, 2], [1, 0, 5], [2, 5, 0]])


def test_edge_mse_known_answers():
    adj = np.zeros((3, 4, 4), np.float32)
    adj[0, 0, 1] = adj[0, 1, 0] = 1  # one edge
    adj[1] = 1 - np.eye(4)  # complete
    targets = np.zeros((3, 4, 4, 2), np.float32)
    predictions = targets + 5.0 * (1 - adj[..., None])  # off-edge errors do not count
    predictions[0, 0, 1, 0] = 2.0  # error 4 on one of 2 edge entries x 2 features
    predictions[1] += 1.0 * adj[1][..., None]  # error 1 on every edge entry
    m = edge_mse(predictions, targets, adj)
    np.testing.assert_allclose(m["mse"], (4 / 4 + 1 + 0) / 3, rtol=1e-6)  # graph 2: no edges
    m = edge_mse(predictions, targets, adj, np.array([True, False, False]))
    np.testing.assert_allclose(m["mse"], 1.0)
    assert float(m["count"]) == 1.0
    task = tasks.get("edge_copy", **GRAPHS)
    np.testing.assert_allclose(task.metrics(predictions, targets, None, adj)["mse"], 2 / 3)
    with pytest.raises(ValueError, match="adjacency"):
        task.metrics(predictions, targets, None)
    with pytest.raises(ValueError, match="adjacency must be"):
        edge_mse(predictions, targets, adj[:, :3])
    with pytest.raises(ValueError, match="equal shapes"):
        edge_mse(predictions[..., :1], targets, adj)


def test_edge_copy_interface_and_bad_config():
    task = tasks.get("edge_copy", data_dir="/unused", **GRAPHS, num_features=3)
    assert task.name == "edge_copy" and task.num_classes is None and task.num_outputs == 3
    assert task.input_shape == (6, 6, 3) and task.splits == (
        "train",
        "valid",
        "test_6",
        "test_12",
        "test_40",
    )
    assert task.num_examples("test_12") == 16 and task.steps_per_epoch(16) == 4
    task.prepare()
    with pytest.raises(ValueError, match="Valid splits: train, valid, test_6, test_12, test_40"):
        task.num_examples("test_7")
    for bad in ({"edge_prob": 0.0}, {"edge_prob": 1.5}, {"test_nodes": (1,)}, {"noise_std": -1.0}):
        with pytest.raises(ValueError):
            EdgeCopyConfig(**bad)
    with pytest.raises(ValueError, match="integers"):
        EdgeCopyConfig(test_nodes=(10.5,))
    with pytest.raises(ValueError, match="distinct"):
        EdgeCopyConfig(test_nodes=(10, 10))
    with pytest.raises(ValueError, match="Valid keywords"):
        tasks.get("edge_copy", nodes=4)


def test_random_spd_has_exact_condition_numbers_and_inverses():
    conds = np.array([1.0, 3.0, 50.0, 1000.0])
    a, a_inv = random_spd(conds, 10, np.random.default_rng(0))
    assert a.shape == (4, 10, 10) and a_inv.shape == (4, 10, 10)
    np.testing.assert_array_equal(a, a.transpose(0, 2, 1))
    np.testing.assert_allclose(a @ a_inv, np.broadcast_to(np.eye(10), a.shape), atol=1e-10)
    np.testing.assert_allclose(np.linalg.cond(a), conds, rtol=1e-8)
    eig = np.linalg.eigvalsh(a)
    np.testing.assert_allclose(eig[:, 0] * eig[:, -1], 1.0, rtol=1e-8)  # [k^-1/2, k^1/2]


def test_matrix_splits_conditioning_and_determinism():
    config = MatrixInversionConfig(**MATRICES)
    assert config.splits == ("train", "valid", "test_cond2", "test_cond50")
    train = matrix_split(config, "train")
    assert train["inputs"].shape == (64, 10, 10) and train["inputs"].dtype == np.float32
    conds = np.linalg.cond(train["inputs"].astype(np.float64))
    assert conds.min() >= 1.0 - 1e-4 and conds.max() <= 5.0 + 1e-3
    np.testing.assert_allclose(conds, train["conds"], rtol=1e-3)
    hard = matrix_split(config, "test_cond50")
    np.testing.assert_allclose(np.linalg.cond(hard["inputs"].astype(np.float64)), 50.0, rtol=1e-3)
    product = hard["inputs"].astype(np.float64) @ hard["targets"].astype(np.float64)
    np.testing.assert_allclose(product, np.broadcast_to(np.eye(10), product.shape), atol=1e-4)
    first = train["inputs"].copy()
    matrix_split.cache_clear()
    np.testing.assert_array_equal(matrix_split(config, "train")["inputs"], first)
    other = MatrixInversionConfig(**MATRICES, seed=1)
    assert not np.array_equal(matrix_split(other, "train")["inputs"], first)
    reordered = MatrixInversionConfig(**{**MATRICES, "test_conds": (50, 2)})
    np.testing.assert_array_equal(
        matrix_split(reordered, "test_cond50")["inputs"], hard["inputs"]
    )  # a split's stream depends on its condition number, not its position
    # "valid": drawn as the training matrices (condition numbers in [1, 5]), its own
    # stream: without it the other splits are the same.
    valid = matrix_split(MatrixInversionConfig(**MATRICES, val_size=32), "valid")
    valid_conds = np.linalg.cond(valid["inputs"].astype(np.float64))
    assert valid["inputs"].shape == (32, 10, 10) and valid_conds.max() <= 5.0 + 1e-3
    assert not np.isin(valid["inputs"], train["inputs"]).all(axis=(1, 2)).any()
    without = MatrixInversionConfig(**MATRICES, val_size=0)
    assert without.splits == ("train", "test_cond2", "test_cond50")
    for split in without.splits:
        np.testing.assert_array_equal(
            matrix_split(without, split)["inputs"], matrix_split(config, split)["inputs"]
        )


def test_matrix_training_noise_symmetric_fresh_and_resumable():
    task = tasks.get("matrix_inversion", **MATRICES, noise_std=0.1)
    stream = _draws(task.train_iterator(16, seed=0), 5)
    for batch in stream:
        noise = batch["inputs"] - matrix_split(task.config, "train")["inputs"][batch["index"]]
        np.testing.assert_allclose(noise, noise.transpose(0, 2, 1), atol=1e-6)
        diagonal = np.diagonal(noise, axis1=1, axis2=2)
        np.testing.assert_allclose(diagonal.std(), 0.1, rtol=0.25)
        np.testing.assert_array_equal(
            batch["targets"], matrix_split(task.config, "train")["targets"][batch["index"]]
        )
    resumed = next(task.train_iterator(16, seed=0, start_step=4))
    np.testing.assert_array_equal(resumed["inputs"], stream[4]["inputs"])
    halves = [
        next(task.train_iterator(16, seed=0, process_index=p, process_count=2)) for p in (0, 1)
    ]
    np.testing.assert_array_equal(
        np.concatenate([h["inputs"] for h in halves]), stream[0]["inputs"]
    )
    evals = list(task.eval_iterator("test_cond50", 10))
    assert len(evals) == 2 and int(sum(b["mask"].sum() for b in evals)) == 16
    np.testing.assert_array_equal(
        evals[0]["inputs"], matrix_split(task.config, "test_cond50")["inputs"][:10]
    )


def test_matrix_interface_metrics_and_bad_config():
    task = tasks.get("matrix_inversion", data_dir="/unused", **MATRICES)
    assert task.name == "matrix_inversion" and task.num_classes is None
    assert task.input_shape == (10, 10) and task.num_outputs == 100
    assert task.eval_splits == ("test_cond2", "test_cond50") and task.num_examples("train") == 64
    assert task.validation_split == "valid" and task.num_examples("valid") == 1_000
    task.prepare()
    targets = np.zeros((4, 10, 10), np.float32)
    predictions = targets.copy()
    predictions[0] += 2.0  # squared error 4 everywhere in one matrix
    m = task.metrics(predictions, targets, np.array([True, True, False, False]))
    np.testing.assert_allclose(m["mse"], 2.0)
    with pytest.raises(ValueError, match="Valid splits: train, valid, test_cond2, test_cond50"):
        task.num_examples("test_cond3")
    for bad in (
        {"train_cond": (0.5, 5.0)},
        {"train_cond": (5.0, 2.0)},
        {"train_cond": (1.0,)},
        {"test_conds": (0.9,)},
        {"test_conds": (2.0, 2)},
        {"dim": 1},
        {"noise_std": -0.1},
    ):
        with pytest.raises(ValueError):
            MatrixInversionConfig(**bad)
    with pytest.raises(ValueError, match="Valid keywords"):
        tasks.get("matrix_inversion", size=10)
