"""Minimum spanning trees with CLRS's hints: Prim and Kruskal.

Each function mirrors the CLRS benchmark's ``algorithms/graphs.py`` step for step
(same state, same tie-breaking, a hint at the same points). ``A`` is a symmetric float
``[n, n]`` weight matrix, ``A[i, j] > 0`` an undirected edge. Graphs may be
disconnected (CLRS does not enforce connectivity): Kruskal then returns a minimum
spanning forest and Prim the minimum spanning tree of the root's component.

References:
  Prim, "Shortest connection networks and some generalizations", 1957; Kruskal, "On
  the shortest spanning subtree of a graph", 1956; Cormen et al., "Introduction to
  Algorithms" 3ed, chapter 23.
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
"""

from __future__ import annotations

import numpy as np

from deq_jax.models.clrs.algorithms.shortest_paths import extract_min_tree
from deq_jax.models.clrs.probing import Probes, Trajectory, mask_one

# Kruskal's phases (a categorical hint): next edge, find root of u, find root of v.
_NEXT_EDGE, _FIND_U, _FIND_V = 0, 1, 2


def mst_prim(A: np.ndarray, s: int) -> tuple[Probes, list[Probes]]:
    """Prim's algorithm from root ``s``; a hint at the start and after every extraction.

    Returns:
      ``({"pi": int [n]}, hints)``: ``pi[v]`` is ``v``'s parent in the tree (``pi[s] =
      s``; nodes outside ``s``'s component point to themselves); hints ``{"pi_h": int
      [n], "key": [n] (weight of the lightest edge to the tree), "mark": [n] (in the
      tree), "in_queue": [n], "u": [n] (one-hot, the node just added; ``s`` at
      first)}``.
    """
    return extract_min_tree(A, s, key_name="key", relax=lambda key_u, weights: weights)


def mst_kruskal(A: np.ndarray) -> tuple[Probes, list[Probes]]:
    """Kruskal's algorithm with a union-find forest (path compression, as CLRS).

    Edges ``i < j`` are taken by increasing weight (ties, of probability zero, in
    ``(i, j)`` order; CLRS's unstable sort leaves their order unspecified). For each
    edge ``(u, v)`` the hints follow the root searches: one when the edge is taken
    (phase "find u"), one per step up from ``u`` (phase "find u", compressing the
    visited path onto the current root) and from ``v`` (phase "find v"), and one
    after the union (phase "next edge"). The very first hint (before any edge) points
    every one-hot probe at node 0.

    Returns:
      ``({"in_mst": [n, n] (symmetric 0/1, the forest's edges)}, hints)``, hints
      ``{"in_mst_h": [n, n], "pi": int [n] (union-find parents), "u", "v", "root_u",
      "root_v": [n] one-hot, "mask_u", "mask_v": [n] (nodes visited from u / v),
      "phase": [3] one-hot}``.
    """
    n = A.shape[0]
    pi = np.arange(n)
    in_mst = np.zeros((n, n))
    hints = Trajectory()
    accepted = []  # (step, u, v): the edges taken, with the step of their union hint

    def push(u, v, root_u, root_v, mask_u, mask_v, phase):
        hints.push(
            pi=pi,
            u=mask_one(u, n),
            v=mask_one(v, n),
            root_u=mask_one(root_u, n),
            root_v=mask_one(root_v, n),
            mask_u=mask_u,
            mask_v=mask_v,
            phase=mask_one(phase, 3),
        )

    push(0, 0, 0, 0, np.zeros(n), np.zeros(n), _NEXT_EDGE)
    rows, cols = np.triu_indices(n, k=1)  # row-major, as CLRS lists the edges
    present = A[rows, cols] > 0
    rows, cols = rows[present], cols[present]
    for k in np.argsort(A[rows, cols], kind="stable"):
        u, v = int(rows[k]), int(cols[k])
        root_u, root_v = u, v
        mask_u, mask_v = mask_one(u, n), mask_one(v, n)
        push(u, v, root_u, root_v, mask_u, mask_v, _FIND_U)
        while pi[root_u] != root_u:
            root_u = int(pi[root_u])
            pi[mask_u == 1] = root_u
            mask_u[root_u] = 1.0
            push(u, v, root_u, root_v, mask_u, mask_v, _FIND_U)
        while pi[root_v] != root_v:
            root_v = int(pi[root_v])
            pi[mask_v == 1] = root_v
            mask_v[root_v] = 1.0
            push(u, v, root_u, root_v, mask_u, mask_v, _FIND_V)
        if root_u != root_v:  # different trees: take the edge, hang the lower root
            in_mst[u, v] = in_mst[v, u] = 1.0
            low, high = min(root_u, root_v), max(root_u, root_v)
            pi[low] = high
            accepted.append((len(hints.steps), u, v))
        push(u, v, root_u, root_v, mask_u, mask_v, _NEXT_EDGE)
    # ``in_mst_h`` (``[n, n]`` per step) is built once from the accepted edges rather
    # than copied at every push: at n = 128 that is ~10^3 steps of 16k entries.
    in_mst_h = np.zeros((len(hints.steps), n, n), np.float32)  # [T, n, n]
    for step, u, v in accepted:
        in_mst_h[step:, u, v] = in_mst_h[step:, v, u] = 1.0
    for step, probes in enumerate(hints.steps):
        probes["in_mst_h"] = in_mst_h[step]
    return {"in_mst": in_mst}, hints.steps
