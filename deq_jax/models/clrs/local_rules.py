"""Per-node facts of a graph and its true tree, jittable (jnp, batch axis first).

* `lightest_neighbours`: each node's lightest neighbour as its parent, MST-Prim's local
  rule (`ClrsTask.lightest_neighbour_score`);
* `near_tie_gaps`: how close each node's second-best path comes to its shortest, the
  near-ties of Bellman-Ford and Dijkstra
  (`deq_jax.models.clrs.diagnostics.pointer_errors`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def lightest_neighbours(weights, start):
    """Each node's lightest neighbour as its parent (MST-Prim's local rule); jittable.

    Args:
      weights: ``[B, n, n]`` edge weights, positive where an edge is.
      start: ``[B, n]`` one-hot start node.

    Returns:
      int ``[B, n]``: the lightest neighbour; the start node and nodes without
      neighbours point at themselves.
    """
    weights = jnp.asarray(weights)
    n = weights.shape[-1]
    nodes = jnp.broadcast_to(jnp.arange(n), weights.shape[:-1])
    neighbours = (weights > 0) & ~jnp.eye(n, dtype=bool)  # no self-loops
    lightest = jnp.where(neighbours, weights, jnp.inf).argmin(-1)
    parents = jnp.where(neighbours.any(-1), lightest, nodes)
    return jnp.where(jnp.asarray(start) > 0.5, nodes, parents)


def near_tie_gaps(weights, parents):
    """How much longer each node's best path through a neighbour other than its parent
    is than its shortest path (Bellman-Ford's and Dijkstra's near-ties); jittable.

    The path costs follow the parent pointers to the root, so ``parents`` must be a
    shortest-path forest of ``weights`` (the algorithm's ``pi``).

    Args:
      weights: ``[B, n, n]`` edge weights ``w[u, v]``, positive where an edge is.
      parents: int ``[B, n]``, the shortest-path forest; roots point at themselves.

    Returns:
      ``[B, n]``: ``min_{u != pi(v), v} d(u) + w(u, v) - d(v)`` over the neighbours ``u``
      reached from a root; ``inf`` for roots, unreached nodes and nodes with no other
      neighbour.
    """
    weights, parents = jnp.asarray(weights), jnp.asarray(parents)
    n = weights.shape[-1]
    nodes = jnp.arange(n)
    linked = parents != nodes  # [B, n]: has a parent
    step = jnp.where(linked, jnp.take_along_axis(weights, parents[:, None, :], 1)[:, 0], 0.0)
    cost = jax.lax.fori_loop(  # n sweeps reach every depth of a forest on n nodes
        0, n, lambda _, c: jnp.where(linked, jnp.take_along_axis(c, parents, 1) + step, 0.0), step
    )
    has_child = jax.vmap(lambda p, up: jnp.zeros(n, bool).at[p].max(up))(parents, linked)
    reached = linked | has_child  # in a tree of more than one node
    others = (weights > 0) & (nodes[:, None] != nodes[None, :])[None]  # [B, u, v]
    others &= nodes[None, :, None] != parents[:, None, :]  # u is not v's parent
    others &= reached[:, :, None]
    best = jnp.where(others, cost[:, :, None] + weights, jnp.inf).min(1)  # [B, v]
    return jnp.where(linked, best - cost, jnp.inf)
