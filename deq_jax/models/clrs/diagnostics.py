"""Where a CLRS model goes wrong: pointer errors by tree depth, reversed edges and
near-ties; edge-mask (MST-Kruskal) errors by the kind of edge.

A pointer output (``pi``: each node's parent, the root pointing at itself) is scored
by CLRS as the fraction of right parents. That number alone does not say why a model
trained on 16-node graphs loses accuracy on 64-node ones. `pointer_errors` splits it:

* accuracy by the node's depth in the true tree (hops to the root) and by its number of
  neighbours: larger graphs have deeper trees and, on CLRS's Erdős-Rényi graphs, more
  neighbours per node than the training set shows;
* the share of wrong parents that are the node's child in the true tree (the model found
  the tree edge but oriented it away from the root), or not a neighbour at all;
* for the shortest-path algorithms (``weights`` given), how much longer the path through
  the predicted parent is than the shortest one: wrong parents on near-ties
  (``d(p) + w(p, v) - d(v)`` of a few thousandths) are a resolution limit, not a failure
  to run the algorithm.

MST-Kruskal's output is an edge mask scored by F1. `edge_mask_errors` counts which
edges a model keeps: the tree edges, and the non-tree edges split into those that are
the heaviest edge of a triangle (out of the tree by the cycle property, and visible to
a triplet processor, which sees every triangle) and those excluded only by a longer
cycle. CLRS-30's 16-node MST graphs are nearly forests, so keeping every edge is the
rule a model must beat at 64 nodes (`ClrsTask.all_edges_score`).

All functions are numpy on host arrays: predictions come from the model
(``experiments/clrs/diagnose.py`` loads a trained run), targets from `ClrsTask`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deq_jax.models.clrs.evaluation import f1_from_counts
from deq_jax.models.clrs.local_rules import near_tie_gaps

# Depth bins (inclusive ranges of hops to the root) of `pointer_errors`.
DEPTH_BINS = ((0, 0), (1, 2), (3, 5), (6, 9), (10, 15), (16, None))
# Degree bins (inclusive ranges of neighbours, self-loops not counted).
DEGREE_BINS = ((0, 0), (1, 2), (3, 4), (5, 8), (9, 16), (17, None))
# Path-cost excess thresholds of `pointer_errors` (edge weights of CLRS lie in [0, 1]).
EXCESS_THRESHOLDS = (0.01, 0.05)


def _check_parents(parents: np.ndarray) -> np.ndarray:
    parents = np.asarray(parents)
    if parents.ndim != 2 or not np.issubdtype(parents.dtype, np.integer):
        raise ValueError(
            f"Parents must be integer [graphs, nodes], got {parents.dtype} {parents.shape}."
        )
    n = parents.shape[-1]
    if parents.size and (parents.min() < 0 or parents.max() >= n):
        raise ValueError(f"Parents must be node indices in [0, {n}).")
    return parents


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """Hops from each node to its root (a node that points at itself) ``[graphs, nodes]``.

    Args:
      parents: integer ``[graphs, nodes]``, a forest of parent pointers.

    Raises:
      ValueError: for a malformed array, or pointers that run in a cycle.
    """
    parents = _check_parents(parents)
    n = parents.shape[-1]
    rows = np.arange(parents.shape[0])[:, None]
    depth = np.zeros(parents.shape, np.int64)
    current = np.broadcast_to(np.arange(n), parents.shape).copy()
    for _ in range(n):
        moving = parents[rows, current] != current
        if not moving.any():
            return depth
        depth += moving
        current = np.where(moving, parents[rows, current], current)
    raise ValueError("The parent pointers run in a cycle: not a forest.")


def _path_costs(parents: np.ndarray, weights: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """Each node's cost along the tree to its root, ``[graphs, nodes]``."""
    rows = np.arange(parents.shape[0])[:, None]
    nodes = np.arange(parents.shape[1])[None]
    cost = np.zeros(parents.shape)
    step = np.where(parents == nodes, 0.0, weights[rows, parents, nodes])
    for level in range(1, int(depths.max(initial=0)) + 1):  # parents are one level up
        at = depths == level
        cost = np.where(at, cost[rows, parents] + step, cost)
    return cost


def _binned(right: np.ndarray, values: np.ndarray, bins, name: str) -> list[dict]:
    """Share, accuracy and node count of the nodes whose ``values`` fall in each bin."""
    out = []
    for low, high in bins:
        inside = (values >= low) & (values <= (np.inf if high is None else high))
        out.append(
            {
                name: f"{low}+" if high is None else f"{low}-{high}",
                "share": float(inside.mean()),
                "accuracy": float(right[inside].mean()) if inside.any() else None,
                "nodes": int(inside.sum()),
            }
        )
    return out


def pointer_errors(
    predicted: np.ndarray,
    targets: np.ndarray,
    *,
    adjacency: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    depth_bins: Sequence[tuple[int, int | None]] = DEPTH_BINS,
    degree_bins: Sequence[tuple[int, int | None]] = DEGREE_BINS,
) -> dict:
    """The breakdown of a pointer output's errors (module docstring).

    Args:
      predicted: the model's parents, integer ``[graphs, nodes]``.
      targets: the true parents (a forest), the same shape.
      adjacency: ``[graphs, nodes, nodes]``, nonzero where an edge is (self-loops
        ignored); with it, the share of wrong parents that are not neighbours.
      weights: ``[graphs, nodes, nodes]`` edge weights ``w[u, v]`` of a shortest-path
        algorithm (Bellman-Ford, Dijkstra); with it, the path-cost excess of the
        predicted parents.
      depth_bins: inclusive ``(low, high)`` depth ranges (``high=None``: no bound).
      degree_bins: the same for the node's number of neighbours (with ``adjacency``).

    Returns:
      ``{"accuracy", "nodes", "errors", "by_depth": [{"depths", "share", "accuracy",
      "nodes"}], "reversed_share", ["non_neighbour_share", "by_degree"], ["excess_median",
      "excess_below_<t>", "near_tie_share_<t>", "near_tie_accuracy_<t>"]}`` with
      ``by_degree`` binned like ``by_depth`` (key ``"degrees"``): the
      ``*_share`` of errors are fractions of the errors, ``share`` of a bin the fraction
      of all nodes in it (``accuracy`` ``None`` for an empty bin); a node is a near-tie
      when a neighbour other than its parent offers a path at most ``t`` longer, and
      ``near_tie_share_<t>`` is the fraction of all nodes that are.

    Raises:
      ValueError: if the shapes disagree or the targets are not a forest.
    """
    predicted, targets = _check_parents(predicted), _check_parents(targets)
    if predicted.shape != targets.shape:
        raise ValueError(f"Predicted {predicted.shape} and target {targets.shape} differ.")
    graphs, n = targets.shape
    rows, nodes = np.arange(graphs)[:, None], np.arange(n)[None]
    right = predicted == targets
    wrong = ~right
    depths = tree_depths(targets)
    out: dict = dict(accuracy=float(right.mean()), nodes=int(right.size), errors=int(wrong.sum()))
    out["by_depth"] = _binned(right, depths, depth_bins, "depths")
    errors = max(out["errors"], 1)  # the denominator of the error shares
    reversed_edge = targets[rows, predicted] == nodes  # the predicted parent is my child
    out["reversed_share"] = float((wrong & reversed_edge & (predicted != nodes)).sum() / errors)
    if adjacency is not None:
        adjacency = np.asarray(adjacency) != 0
        linked = adjacency[rows, predicted, nodes]
        stray = wrong & ~linked & (predicted != nodes)
        out["non_neighbour_share"] = float(stray.sum() / errors)
        degrees = (adjacency & ~np.eye(n, dtype=bool)).sum(1)  # in-neighbours of each node
        out["by_degree"] = _binned(right, degrees, degree_bins, "degrees")
    if weights is not None:
        weights = np.asarray(weights, np.float64)
        # Nodes outside every tree (self-pointers without children) have no path: inf.
        child = (targets[:, None, :] == np.arange(n)[None, :, None]) & (targets != nodes)[:, None]
        in_tree = (depths > 0) | child.any(-1)
        cost = np.where(in_tree, _path_costs(targets, weights, depths), np.inf)
        through = cost[rows, predicted] + weights[rows, predicted, nodes]
        linked = weights[rows, predicted, nodes] > 0
        scored = wrong & (predicted != nodes) & linked & in_tree & np.isfinite(through)
        excess = through[scored] - cost[scored]  # a parent outside the tree has no path
        out["excess_median"] = float(np.median(excess)) if excess.size else None
        for threshold in EXCESS_THRESHOLDS:
            out[f"excess_below_{threshold:g}"] = float((excess < threshold).sum() / errors)
        # Near-ties in the data: nodes with another neighbour whose path is almost as short.
        alternative = np.asarray(near_tie_gaps(weights, targets), np.float64)
        for threshold in EXCESS_THRESHOLDS:
            tied = alternative < threshold
            accuracy = float(right[tied].mean()) if tied.any() else None
            out[f"near_tie_share_{threshold:g}"] = float(tied.mean())
            out[f"near_tie_accuracy_{threshold:g}"] = accuracy
    return out


def triangle_heaviest(adjacency: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Where ``(j, k)`` is the heaviest edge of a triangle ``i, j, k`` of the graph.

    With distinct weights such an edge is in no minimum spanning tree (the cycle
    property).

    Args:
      adjacency: ``[graphs, n, n]``, nonzero where an edge is (self-loops ignored).
      weights: ``[graphs, n, n]`` symmetric edge weights.

    Returns:
      bool ``[graphs, n, n]``, symmetric.
    """
    n = adjacency.shape[-1]
    edges = (np.asarray(adjacency) != 0) & ~np.eye(n, dtype=bool)
    w = np.where(edges, np.asarray(weights, np.float64), np.inf)
    # [g, i, j, k]: i is a common neighbour of j and k, and (i, j), (i, k) are lighter.
    lighter = edges[:, :, :, None] & edges[:, :, None, :]
    lighter &= (w[:, :, :, None] < w[:, None, :, :]) & (w[:, :, None, :] < w[:, None, :, :])
    return edges & lighter.any(axis=1)


def edge_mask_errors(
    predicted: np.ndarray, targets: np.ndarray, *, adjacency: np.ndarray, weights: np.ndarray
) -> dict:
    """The breakdown of an edge-mask output's errors (module docstring).

    Counts are over ordered pairs ``(i, j)``, so an undirected edge counts twice, as in
    CLRS's F1.

    Args:
      predicted: the model's mask, ``[graphs, n, n]``, nonzero where it keeps an edge.
      targets: the true tree edges, the same shape.
      adjacency: ``[graphs, n, n]``, nonzero where an edge is (self-loops ignored).
      weights: ``[graphs, n, n]`` edge weights.

    Returns:
      ``{"score" (F1), "true_positives", "false_positives", "false_negatives",
      "tree_edges", "tree_kept", "non_tree_edges", "non_tree_dropped",
      "triangle_edges", "triangle_dropped", "cycle_edges", "cycle_dropped",
      "non_edges_kept", "all_edges_score", "triangle_rule_score"}``: ``*_kept`` and
      ``*_dropped`` are fractions of their kind (``None`` when there is none);
      ``triangle_*`` are the non-tree edges that are the heaviest of a triangle,
      ``cycle_*`` the other non-tree edges; the last two are the F1 of keeping every
      edge and of keeping every edge but the triangles' heaviest.

    Raises:
      ValueError: if the shapes disagree.
    """
    predicted, targets = np.asarray(predicted) != 0, np.asarray(targets) != 0
    if predicted.shape != targets.shape or predicted.ndim != 3:
        raise ValueError(
            f"Expected predicted and target masks [graphs, n, n], got {predicted.shape} and "
            f"{targets.shape}."
        )
    n = targets.shape[-1]
    edges = (np.asarray(adjacency) != 0) & ~np.eye(n, dtype=bool)
    triangle = triangle_heaviest(adjacency, weights)
    non_tree = edges & ~targets
    cycle = non_tree & ~triangle

    def f1(keep: np.ndarray) -> float:
        counts = (keep & targets).sum(), (keep & ~targets).sum(), (~keep & targets).sum()
        return float(f1_from_counts(*counts))

    def share(selected: np.ndarray, kind: np.ndarray) -> float | None:
        return float((selected & kind).sum() / kind.sum()) if kind.any() else None

    return {
        "score": f1(predicted),
        "true_positives": int((predicted & targets).sum()),
        "false_positives": int((predicted & ~targets).sum()),
        "false_negatives": int((~predicted & targets).sum()),
        "tree_edges": int(targets.sum()),
        "tree_kept": share(predicted, targets),
        "non_tree_edges": int(non_tree.sum()),
        "non_tree_dropped": share(~predicted, non_tree),
        "triangle_edges": int(triangle.sum()),
        "triangle_dropped": share(~predicted, triangle),
        "cycle_edges": int(cycle.sum()),
        "cycle_dropped": share(~predicted, cycle),
        "non_edges_kept": int((predicted & ~edges & ~np.eye(n, dtype=bool)).sum()),
        "all_edges_score": f1(edges),
        "triangle_rule_score": f1(edges & ~triangle),
    }
