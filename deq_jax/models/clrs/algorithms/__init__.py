"""CLRS-30's reference implementations, recording their hints (CLRS's ``algorithms/``).

Each takes a weighted adjacency ``A [n, n]`` (and a start node where it has one) and
returns ``(probes, hint steps)``: ``bellman_ford`` and ``dijkstra`` (shortest paths),
``mst_kruskal`` and ``mst_prim`` (spanning trees), ``bfs`` and ``dfs`` (traversal).
"""

from deq_jax.models.clrs.algorithms.shortest_paths import bellman_ford, dijkstra
from deq_jax.models.clrs.algorithms.spanning_trees import mst_kruskal, mst_prim
from deq_jax.models.clrs.algorithms.traversal import bfs, dfs

__all__ = ["bellman_ford", "bfs", "dfs", "dijkstra", "mst_kruskal", "mst_prim"]
