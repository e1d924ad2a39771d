"""The CLRS error breakdown: tree depths, reversed edges, path-cost excess, known answers."""

import numpy as np
import pytest
from scipy.sparse.csgraph import shortest_path

from deq_jax.models import clrs
from deq_jax.models.clrs import diagnostics


def test_tree_depths_of_a_forest_and_a_cycle():
    # Graph 0: the path 0 <- 1 <- 2 <- 3 and a lone root 4; graph 1: a star around 2.
    parents = np.array([[0, 0, 1, 2, 4], [2, 2, 2, 2, 2]])
    np.testing.assert_array_equal(
        diagnostics.tree_depths(parents), [[0, 1, 2, 3, 0], [1, 1, 0, 1, 1]]
    )
    with pytest.raises(ValueError, match="cycle"):
        diagnostics.tree_depths(np.array([[1, 0, 2]]))
    with pytest.raises(ValueError, match="integer"):
        diagnostics.tree_depths(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="node indices"):
        diagnostics.tree_depths(np.array([[0, 3, 1]]))


def test_pointer_errors_known_answers():
    # One graph: edges 0-1 (0.5), 0-2 (0.3), 1-2 (0.205), 2-3 (0.4); root 0. The shortest
    # paths: 1 via 0 (0.5, against 0.505 via 2), 2 via 0, 3 via 2.
    weights = np.zeros((1, 4, 4))
    for u, v, w in ((0, 1, 0.5), (0, 2, 0.3), (1, 2, 0.205), (2, 3, 0.4)):
        weights[0, u, v] = weights[0, v, u] = w
    adjacency = (weights > 0) | np.eye(4, dtype=bool)[None]
    targets = np.array([[0, 0, 0, 2]])
    # Node 1 takes the near-tie 2 (excess 0.005), node 2 its child 3 (reversed: excess
    # 0.7 + 0.4 - 0.3 = 0.8), node 3 the non-neighbour 1; node 0 is right.
    predicted = np.array([[0, 2, 3, 1]])
    out = diagnostics.pointer_errors(predicted, targets, adjacency=adjacency, weights=weights)
    assert out["accuracy"] == 0.25 and out["errors"] == 3 and out["nodes"] == 4
    assert out["reversed_share"] == pytest.approx(1 / 3)
    assert out["non_neighbour_share"] == pytest.approx(1 / 3)
    assert out["excess_median"] == pytest.approx((0.005 + 0.8) / 2)  # of the two neighbours
    assert out["excess_below_0.01"] == out["excess_below_0.05"] == pytest.approx(1 / 3)
    # Node 1 is the one near-tie (0.505 against 0.5); no other node has a path within 0.05.
    assert out["near_tie_share_0.01"] == out["near_tie_share_0.05"] == 0.25
    assert out["near_tie_accuracy_0.01"] == 0.0
    degree = {b["degrees"]: b for b in out["by_degree"]}  # degrees 2, 2, 3, 1
    assert degree["1-2"]["nodes"] == 3 and degree["1-2"]["accuracy"] == pytest.approx(1 / 3)
    assert degree["3-4"]["nodes"] == 1 and degree["3-4"]["accuracy"] == 0.0
    depth = {b["depths"]: b for b in out["by_depth"]}
    assert depth["0-0"]["accuracy"] == 1.0 and depth["0-0"]["share"] == 0.25
    assert depth["1-2"]["accuracy"] == 0.0 and depth["1-2"]["nodes"] == 3
    assert depth["3-5"]["accuracy"] is None and depth["3-5"]["nodes"] == 0
    perfect = diagnostics.pointer_errors(targets, targets, weights=weights)
    assert perfect["accuracy"] == 1.0 and perfect["reversed_share"] == 0.0
    assert perfect["excess_median"] is None
    with pytest.raises(ValueError, match="differ"):
        diagnostics.pointer_errors(np.concatenate([predicted, predicted]), targets)


def test_nodes_outside_the_tree_have_no_path_to_compare():
    # Directed edges 0 -> 1 (0.5) and 2 -> 1 (0.001); 2 and 3 are unreached from root 0.
    weights = np.zeros((1, 4, 4))
    weights[0, 0, 1], weights[0, 2, 1] = 0.5, 0.001
    targets = np.array([[0, 0, 2, 3]])
    with np.errstate(all="raise"):
        out = diagnostics.pointer_errors(np.array([[0, 2, 2, 3]]), targets, weights=weights)
    # Node 1's wrong parent 2 offers no path from the root: neither an excess nor a tie.
    assert out["errors"] == 1 and out["excess_median"] is None
    assert out["excess_below_0.05"] == 0.0 and out["near_tie_share_0.05"] == 0.0


def test_tree_path_costs_are_the_shortest_distances_on_bellman_ford_graphs():
    task = clrs.ClrsTask(clrs.ClrsConfig("bellman_ford", test_nodes=(20,), eval_size=6))
    arrays = task.source("test_20")
    targets, weights = arrays["targets"], arrays["input_A"]
    costs = diagnostics._path_costs(targets, weights, diagnostics.tree_depths(targets))
    for g, start in enumerate(arrays["input_s"].argmax(-1)):
        w = weights[g].copy()
        np.fill_diagonal(w, 0)
        distances = shortest_path(w, directed=True, indices=start)
        reached = np.isfinite(distances)
        np.testing.assert_allclose(costs[g][reached], distances[reached], atol=1e-5)
    # The true parents have no excess: the breakdown of a perfect model is empty.
    out = diagnostics.pointer_errors(targets, targets, weights=weights)
    assert out["accuracy"] == 1.0 and out["excess_median"] is None


def test_triangle_heaviest_equals_a_loop_over_triangles():
    rng = np.random.default_rng(0)
    g, n = 3, 9
    upper = np.triu(rng.random((g, n, n)) < 0.4, 1)
    adjacency = (upper | upper.transpose(0, 2, 1)).astype(np.float32)
    w = np.triu(rng.random((g, n, n)), 1)
    weights = (w + w.transpose(0, 2, 1)) * adjacency
    expected = np.zeros((g, n, n), bool)
    for b in range(g):
        for i in range(n):
            for j in range(n):
                for k in range(n):
                    if (
                        len({i, j, k}) == 3
                        and adjacency[b, i, j] * adjacency[b, i, k] * adjacency[b, j, k]
                    ):
                        expected[b, j, k] |= weights[b, j, k] > max(
                            weights[b, i, j], weights[b, i, k]
                        )
    got = diagnostics.triangle_heaviest(adjacency, weights)
    np.testing.assert_array_equal(got, expected)
    assert expected.any() and (got == got.transpose(0, 2, 1)).all()


def test_edge_mask_errors_known_answers():
    # A triangle 0-1-2 (heaviest 0-2) and a 4-cycle 3-4-5-6 (heaviest 3-6): each drops
    # its heaviest edge from the tree.
    n = 7
    adjacency, weights, tree = np.eye(n), np.zeros((n, n)), np.zeros((n, n), int)
    for (i, j), w, in_tree in (
        ((0, 1), 0.1, 1),
        ((1, 2), 0.2, 1),
        ((0, 2), 0.3, 0),
        ((3, 4), 0.1, 1),
        ((4, 5), 0.2, 1),
        ((5, 6), 0.3, 1),
        ((3, 6), 0.4, 0),
    ):
        adjacency[i, j] = adjacency[j, i] = 1
        weights[i, j] = weights[j, i] = w
        tree[i, j] = tree[j, i] = in_tree
    keep = (adjacency > 0) & ~np.eye(n, dtype=bool)
    keep[0, 2] = keep[2, 0] = keep[3, 4] = keep[4, 3] = False  # drop 0-2 (right), 3-4 (wrong)
    result = diagnostics.edge_mask_errors(
        keep[None], tree[None], adjacency=adjacency[None], weights=weights[None]
    )
    assert (result["true_positives"], result["false_positives"], result["false_negatives"]) == (
        8,
        2,
        2,
    )
    assert result["score"] == pytest.approx(16 / 20)
    assert (result["tree_edges"], result["tree_kept"]) == (10, pytest.approx(0.8))
    assert (result["non_tree_edges"], result["non_tree_dropped"]) == (4, 0.5)
    assert (result["triangle_edges"], result["triangle_dropped"]) == (2, 1.0)
    assert (result["cycle_edges"], result["cycle_dropped"]) == (2, 0.0)
    assert result["non_edges_kept"] == 0
    assert result["all_edges_score"] == pytest.approx(20 / 24)
    assert result["triangle_rule_score"] == pytest.approx(20 / 22)
    with pytest.raises(ValueError, match="masks"):
        diagnostics.edge_mask_errors(keep, tree, adjacency=adjacency, weights=weights)
