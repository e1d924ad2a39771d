"""Training-graph augmentations derived from an algorithm's invariances.

Two of them, both computed from a training example alone (no algorithm is rerun):

* `add_solution_preserving_edges`: extra edges that leave the output unchanged
  (denser training graphs, below);
* `raise_weights`: the MSTs' edge weights raised to a power ``g >= 1``, which keeps
  their order and so the tree (the lighter tree edges of larger graphs, see its
  docstring);

and `augment_rows`, which applies them to each graph of a training batch.

Extra edges.

A model trained on CLRS-30's 16-node graphs is tested on 64-node graphs of the same
edge probability, whose nodes have about four times as many neighbours. The trained
models lose most of their accuracy on exactly those nodes (`ClrsTask`, BUILD_NOTES).
`add_solution_preserving_edges` adds edges to a training graph that provably do not
change its output, so the 1000 training graphs show the model many more neighbours
per node without a single new label:

* shortest paths (Bellman-Ford, Dijkstra): an edge ``(u, v)`` of weight
  ``w > |d(u) - d(v)|`` between two nodes reached from the source is never on a
  shortest path and never ties one (``d(u) + w > d(v)`` and the reverse), so every
  distance and every parent stays as it was;
* minimum spanning trees (Prim, Kruskal): an edge ``(u, v)`` heavier than the heaviest
  edge on the tree path between ``u`` and ``v`` closes a cycle on which it is the
  heaviest edge (the cycle property), so the tree stays the unique MST; Prim's parents
  (rooted at its start node) and Kruskal's edge mask stay as they were.

Only pairs already connected by the tree (reached from the source, or in one
component of Kruskal's forest) get edges, so no unreached node becomes reachable. The
hint trajectories are *not* preserved (the algorithm's steps change), so the
augmentation serves the modes that train on outputs alone (``deq``,
``hint_propagation``). Each graph draws its own rate ``q ~ U(0, rate)`` and keeps each
eligible non-edge with probability ``q``; the weight of a new edge is uniform between
its lower bound and 1 (CLRS's weights lie in ``(0, 1]``).

The idea of augmenting algorithmic data with changes that leave the algorithm's
trajectory or output invariant follows Bevilacqua et al., "Neural Algorithmic Reasoning
with Causal Regularisation", ICML 2023.
"""

from __future__ import annotations

import numpy as np

# Algorithms whose output a solution-preserving edge leaves unchanged, by kind.
SHORTEST_PATHS = ("bellman_ford", "dijkstra")
SPANNING_TREES = ("mst_prim", "mst_kruskal")
ALGORITHMS = SHORTEST_PATHS + SPANNING_TREES

# The largest weight a new edge gets, and how far above its bound it must stay.
MAX_WEIGHT = 1.0
MARGIN = 1e-4


def _parent_forest(weights: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """``[B, n, n]`` symmetric weights of the tree edges ``(v, pi(v))``, inf elsewhere."""
    b, n = parents.shape
    rows, nodes = np.arange(b)[:, None], np.arange(n)[None, :]
    linked = parents != nodes  # [B, n]
    step = weights[rows, parents, nodes]  # [B, n]: w(pi(v), v)
    forest = np.full((b, n, n), np.inf)
    r, v = np.nonzero(linked)
    forest[r, v, parents[r, v]] = step[r, v]
    forest[r, parents[r, v], v] = step[r, v]
    return forest


def tree_bottlenecks(forest: np.ndarray) -> np.ndarray:
    """The heaviest edge on the tree path between every pair of nodes.

    Args:
      forest: ``[B, n, n]`` symmetric weights of a forest's edges, ``inf`` where there
        is no edge.

    Returns:
      ``[B, n, n]``: the minimax path weight (on a forest, the heaviest edge of the
      unique path); 0 on the diagonal, ``inf`` between components.
    """
    n = forest.shape[-1]
    out = np.array(forest, dtype=np.float64)
    out[:, np.arange(n), np.arange(n)] = 0.0
    for k in range(n):  # Floyd-Warshall on the (min, max) semiring
        out = np.minimum(out, np.maximum(out[:, :, k : k + 1], out[:, k : k + 1, :]))
    return out


def path_lengths(weights: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """``[B, n]`` length of each node's path to its root along the parent pointers."""
    b, n = parents.shape
    rows, nodes = np.arange(b)[:, None], np.arange(n)[None, :]
    linked = parents != nodes
    step = np.where(linked, weights[rows, parents, nodes], 0.0)  # [B, n]
    lengths = np.zeros((b, n))
    for _ in range(n):  # a path has at most n - 1 edges
        lengths = step + np.where(linked, lengths[rows, parents], 0.0)
    return lengths


def weight_bounds(algorithm: str, weights: np.ndarray, targets: np.ndarray, start=None):
    """The least weight a new edge between each pair needs to leave the output alone.

    Args:
      algorithm: one of `ALGORITHMS`.
      weights: ``[B, n, n]`` the graphs' symmetric edge weights (``input_A``).
      targets: the outputs: int ``[B, n]`` parents, or Kruskal's ``[B, n, n]`` 0/1 mask.
      start: ``[B, n]`` one-hot source / start node (pointer outputs).

    Returns:
      ``[B, n, n]``: a new edge ``(u, v)`` must weigh more than this; ``inf`` where no
      edge may go (unreached nodes, other components, the diagonal).
    """
    weights = np.asarray(weights, np.float64)
    n = weights.shape[-1]
    if algorithm == "mst_kruskal":
        in_tree = (np.asarray(targets) > 0) & ~np.eye(n, dtype=bool)
        bounds = tree_bottlenecks(np.where(in_tree, weights, np.inf))
    else:
        parents = np.asarray(targets, np.int64)
        reached = (parents != np.arange(n)) | (np.asarray(start) > 0.5)  # [B, n]
        if algorithm in SHORTEST_PATHS:
            d = path_lengths(weights, parents)
            bounds = np.abs(d[:, :, None] - d[:, None, :])
        else:
            bounds = tree_bottlenecks(_parent_forest(weights, parents))
        bounds = np.where(reached[:, :, None] & reached[:, None, :], bounds, np.inf)
    bounds[:, np.arange(n), np.arange(n)] = np.inf
    return bounds


def add_solution_preserving_edges(
    algorithm: str,
    batch: dict[str, np.ndarray],
    rng: np.random.Generator,
    rate: float,
) -> dict[str, np.ndarray]:
    """A copy of ``batch`` whose graphs have extra edges that keep every output.

    Args:
      algorithm: one of `ALGORITHMS`.
      batch: a `ClrsTask` batch: ``inputs`` (the adjacency, self-loops included),
        ``input_A``, ``targets`` and, for pointer outputs, ``input_s``.
      rng: draws the rates, the edges and their weights.
      rate: in ``[0, 1]``; each graph keeps each eligible non-edge with probability
        ``q ~ U(0, rate)``.

    Returns:
      The batch with new ``inputs`` and ``input_A`` (same dtypes); everything else is
      shared with ``batch``.

    Raises:
      ValueError: for another algorithm or a rate outside ``[0, 1]``.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"Solution-preserving edges are defined for {', '.join(ALGORITHMS)}, not {algorithm!r}."
        )
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must lie in [0, 1], got {rate}.")
    adjacency, weights = batch["inputs"], batch["input_A"]
    b, n = adjacency.shape[:2]
    bounds = weight_bounds(algorithm, weights, batch["targets"], batch.get("input_s"))
    eligible = (adjacency <= 0.5) & (bounds < MAX_WEIGHT - MARGIN)  # [B, n, n]
    q = rate * rng.uniform(size=(b, 1, 1))
    upper = np.triu(rng.uniform(size=(b, n, n)) < q, k=1)
    add = eligible & (upper | np.swapaxes(upper, 1, 2))
    u = rng.uniform(size=(b, n, n))
    u = np.triu(u, k=1) + np.swapaxes(np.triu(u, k=1), 1, 2)  # symmetric
    finite = np.where(np.isfinite(bounds), bounds, 0.0)
    new_weight = finite + np.maximum((MAX_WEIGHT - finite) * u, MARGIN)
    return {
        **batch,
        "inputs": np.where(add, 1.0, adjacency).astype(adjacency.dtype),
        "input_A": np.where(add, new_weight, weights).astype(weights.dtype),
    }


def raise_weights(weights: np.ndarray, rng: np.random.Generator, max_power: float) -> np.ndarray:
    """One graph's edge weights raised to a power ``g = max_power ** u``, ``u ~ U(0, 1)``.

    Prim's and Kruskal's outputs depend only on the order of the edge weights, and
    ``w -> w ** g`` keeps the order of weights in ``[0, 1]`` for any ``g > 0``, so the
    minimum spanning tree (and Prim's parents from the same start) stays as it was.
    What changes is the scale the model sees. CLRS's 64-node test graphs keep the edge
    probability of the 16-node training graphs, so a node has four times as many
    neighbours and its tree edge is the lightest of more: the tree edges weigh 0.12 on
    average there against 0.29 in training, and a node's two lightest edges differ by
    0.04 (median) against 0.13, while all edges still weigh 0.45 on average. Raising
    the weights to ``g > 1`` moves the light edges (the tree's) towards 0 and closer
    together, as on the larger graphs (``g = 2`` takes the training tree edges to 0.11).

    Args:
      weights: ``[..., n, n]`` weights in ``[0, 1]`` (0 where there is no edge).
      rng: draws ``u``.
      max_power: ``>= 1``; the powers lie log-uniformly in ``[1, max_power]``.

    Returns:
      The raised weights, in the input dtype (0 stays 0).
    """
    if max_power < 1.0:
        raise ValueError(f"max_power must be >= 1, got {max_power}.")
    power = max_power ** rng.uniform()
    return np.power(weights.astype(np.float64), power).astype(weights.dtype)


def augment_rows(
    algorithm: str,
    batch: dict[str, np.ndarray],
    entropy: list[int],
    *,
    first_row: int = 0,
    extra_edge_rate: float = 0.0,
    weight_power: float = 1.0,
) -> dict[str, np.ndarray]:
    """Each graph of a training batch given extra edges (``extra_edge_rate``), then its
    weights raised to a power in ``[1, weight_power]`` (MSTs; 1: not); the hints
    dropped (they no longer fit).

    The ``i``-th graph draws from ``SeedSequence([*entropy, first_row + i])``, so a
    graph's augmentation depends on its row in the global batch, not on how the batch
    is split over processes.
    """
    if weight_power != 1.0 and algorithm not in SPANNING_TREES:
        raise ValueError(
            f"Raising the weights keeps the output of {', '.join(SPANNING_TREES)}, "
            f"not {algorithm!r}'s."
        )
    keys = ("inputs", "input_A", "input_s", "targets")
    rows = []
    for i in range(len(batch["inputs"])):
        rng = np.random.default_rng(np.random.SeedSequence([*entropy, first_row + i]))
        graph = {k: batch[k][i : i + 1] for k in keys if k in batch}
        if extra_edge_rate:
            graph = add_solution_preserving_edges(algorithm, graph, rng, extra_edge_rate)
        if weight_power != 1.0:
            graph["input_A"] = raise_weights(graph["input_A"], rng, weight_power)
        rows.append(graph)
    out = {k: v for k, v in batch.items() if not k.startswith("hint_")}
    for key in keys:
        if key in batch:
            out[key] = np.concatenate([row[key] for row in rows])
    return out
