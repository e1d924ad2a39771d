"""Tests for the solution-preserving extra edges of CLRS training graphs."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.csgraph

from deq_jax.models.clrs import augment
from deq_jax.models.clrs.samplers import run_algorithm
from deq_jax.models.clrs.task import clrs

BATCH = 16


def _batches(algorithm, rate, **kwargs):
    task = clrs(algorithm=algorithm, train_size=64, extra_edge_rate=rate)
    return task, task.train_iterator(BATCH, **kwargs)


def _output(algorithm, batch, i):
    """The algorithm's own output on the i-th (augmented) graph of ``batch``."""
    source = int(np.argmax(batch["input_s"][i])) if "input_s" in batch else None
    graph = batch["input_A"][i].astype(np.float64)
    (out,) = run_algorithm(algorithm, graph, source).outputs.values()
    return out.astype(np.int64)


@pytest.mark.parametrize("algorithm", augment.ALGORITHMS)
def test_extra_edges_keep_the_output(algorithm):
    _, plain = _batches(algorithm, 0.0, seed=3)
    _, batches = _batches(algorithm, 1.0, seed=3)
    added = 0
    for _ in range(2):
        base, batch = next(plain), next(batches)
        np.testing.assert_array_equal(batch["targets"], base["targets"])
        old, new = base["inputs"] > 0, batch["inputs"] > 0
        assert not (old & ~new).any()  # no edge removed
        np.testing.assert_array_equal(batch["inputs"], np.swapaxes(batch["inputs"], 1, 2))
        np.testing.assert_array_equal(batch["input_A"], np.swapaxes(batch["input_A"], 1, 2))
        np.testing.assert_array_equal(batch["input_A"][old], base["input_A"][old])
        np.testing.assert_array_equal(
            batch["input_A"] > 0,
            new & ~np.eye(16, dtype=bool) | ((base["input_A"] > 0) & np.eye(16, dtype=bool)),
        )
        assert (batch["input_A"] <= augment.MAX_WEIGHT).all()
        added += int((new & ~old).sum())
        for i in range(BATCH):
            np.testing.assert_array_equal(_output(algorithm, batch, i), batch["targets"][i])
    # CLRS's Kruskal graphs are nearly forests, so few of their pairs are eligible.
    assert added > (10 if algorithm == "mst_kruskal" else 500)


@pytest.mark.parametrize("algorithm", ["bellman_ford", "mst_prim"])
def test_an_edge_just_under_the_bound_changes_the_output(algorithm):
    """The bounds are tight: an edge a little lighter than its bound changes the output
    of some graphs (so the test above can fail)."""
    task = clrs(algorithm=algorithm, train_size=64)
    batch = next(task.train_iterator(BATCH, seed=0))
    bounds = augment.weight_bounds(algorithm, batch["input_A"], batch["targets"], batch["input_s"])
    changed = 0
    for i in range(8):
        candidates = np.argwhere((batch["inputs"][i] == 0) & (bounds[i] > 0.05) & (bounds[i] < 1))
        if not len(candidates):
            continue
        u, v = candidates[0]
        A = batch["input_A"][i].astype(np.float64)
        A[u, v] = A[v, u] = bounds[i, u, v] - 0.01
        source = int(np.argmax(batch["input_s"][i]))
        (out,) = run_algorithm(algorithm, A, source).outputs.values()
        changed += not np.array_equal(out, batch["targets"][i])
    assert changed >= 4


def test_tree_bottlenecks_against_networkx():
    rng = np.random.default_rng(0)
    n = 9
    tree = nx.random_labeled_tree(n, seed=1)
    forest = np.full((1, n, n), np.inf)
    for u, v in tree.edges:
        forest[0, u, v] = forest[0, v, u] = tree[u][v]["weight"] = rng.uniform()
    bottlenecks = augment.tree_bottlenecks(forest)[0]
    for u in range(n):
        for v in range(n):
            path = nx.shortest_path(tree, u, v)
            edges = zip(path[:-1], path[1:], strict=True)
            expected = max((tree[a][b]["weight"] for a, b in edges), default=0.0)
            assert bottlenecks[u, v] == pytest.approx(expected)
    forest[0, 0, :] = forest[0, :, 0] = np.inf  # node 0 cut off
    assert np.isinf(augment.tree_bottlenecks(forest)[0, 0, 1:]).all()


def test_path_lengths_are_the_shortest_distances():
    task = clrs(algorithm="bellman_ford", train_size=64)
    batch = next(task.train_iterator(BATCH, seed=0))
    lengths = augment.path_lengths(batch["input_A"].astype(np.float64), batch["targets"])
    for i in range(BATCH):
        source = int(np.argmax(batch["input_s"][i]))
        graph = scipy.sparse.csr_matrix(batch["input_A"][i].astype(np.float64))
        dist = scipy.sparse.csgraph.shortest_path(graph, indices=source, directed=True)
        reached = np.isfinite(dist)
        np.testing.assert_allclose(lengths[i][reached], dist[reached], rtol=1e-6, atol=1e-6)


def test_extra_edges_are_a_function_of_seed_step_and_row():
    task, batches = _batches("mst_prim", 0.7, seed=5)
    first = [next(batches) for _ in range(4)]
    _, resumed = _batches("mst_prim", 0.7, seed=5, start_step=2)
    np.testing.assert_array_equal(next(resumed)["input_A"], first[2]["input_A"])
    halves = [
        next(task.train_iterator(BATCH, seed=5, process_index=p, process_count=2)) for p in range(2)
    ]
    np.testing.assert_array_equal(
        np.concatenate([h["input_A"] for h in halves]), first[0]["input_A"]
    )
    _, other = _batches("mst_prim", 0.7, seed=6)
    assert not np.array_equal(next(other)["input_A"], first[0]["input_A"])


def test_rate_zero_is_the_plain_stream_and_bad_values_raise():
    plain = clrs(algorithm="dijkstra", train_size=64)
    assert plain.batch_extras == clrs(algorithm="dijkstra", train_size=64).batch_extras
    assert any(k.startswith("hint_") for k in plain.batch_extras)
    augmented = clrs(algorithm="dijkstra", train_size=64, extra_edge_rate=0.5)
    assert not any(k.startswith("hint_") for k in augmented.batch_extras)
    batch = next(augmented.train_iterator(BATCH, seed=0))
    assert not any(k.startswith("hint_") for k in batch)
    with pytest.raises(ValueError, match="extra_edge_rate must lie"):
        clrs(algorithm="dijkstra", extra_edge_rate=1.5)
    with pytest.raises(ValueError, match="bfs's would change"):
        clrs(algorithm="bfs", extra_edge_rate=0.5)
    with pytest.raises(ValueError, match="not 'dfs'"):
        augment.add_solution_preserving_edges("dfs", batch, np.random.default_rng(0), 0.5)
    with pytest.raises(ValueError, match="rate must lie"):
        augment.add_solution_preserving_edges("dijkstra", batch, np.random.default_rng(0), -1)


@pytest.mark.parametrize("algorithm", augment.SPANNING_TREES)
def test_raised_weights_keep_the_tree(algorithm):
    plain = clrs(algorithm=algorithm, train_size=64).train_iterator(BATCH, seed=2)
    raised = clrs(algorithm=algorithm, train_size=64, weight_power=4.0).train_iterator(
        BATCH, seed=2
    )
    powers = []
    for _ in range(2):
        base, batch = next(plain), next(raised)
        assert not any(k.startswith("hint_") for k in batch)
        np.testing.assert_array_equal(batch["targets"], base["targets"])
        np.testing.assert_array_equal(batch["inputs"], base["inputs"])
        edges = base["input_A"] > 0
        np.testing.assert_array_equal(batch["input_A"] > 0, edges)
        for i in range(BATCH):
            np.testing.assert_array_equal(_output(algorithm, batch, i), batch["targets"][i])
            w, w_raised = base["input_A"][i][edges[i]], batch["input_A"][i][edges[i]]
            inside = (w > 0.05) & (w < 0.95)
            powers.append(np.median(np.log(w_raised[inside]) / np.log(w[inside])))
    powers = np.array(powers)
    assert (powers >= 1 - 1e-3).all() and (powers <= 4 + 1e-3).all()
    assert powers.max() > 2 and powers.min() < 2  # drawn per graph


def test_raised_weights_change_a_shortest_path():
    """Why only the MSTs take the power: a shortest path depends on sums of weights,
    so a power that keeps every weight's order still moves some parents."""
    task = clrs(algorithm="bellman_ford", train_size=64)
    batch = next(task.train_iterator(BATCH, seed=0))
    changed = 0
    for i in range(BATCH):
        graph = {k: batch[k][i : i + 1] for k in ("input_A", "input_s")}
        graph["input_A"] = np.power(graph["input_A"].astype(np.float64), 3.0)
        changed += not np.array_equal(_output("bellman_ford", graph, 0), batch["targets"][i])
    assert changed >= BATCH // 4


def test_weight_power_errors():
    with pytest.raises(ValueError, match=">= 1"):
        clrs(algorithm="mst_prim", weight_power=0.5)
    with pytest.raises(ValueError, match="bellman_ford's would change"):
        clrs(algorithm="bellman_ford", weight_power=2.0)
    with pytest.raises(ValueError, match=">= 1"):
        augment.raise_weights(np.ones((2, 2)), np.random.default_rng(0), 0.9)
