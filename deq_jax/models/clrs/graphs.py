"""Seeded random graphs with the CLRS benchmark's Erdős–Rényi distribution.

`er_graph` follows CLRS's ``Sampler._random_er_graph`` draw for draw (with a numpy
`Generator` in place of CLRS's ``RandomState``, so the distribution is CLRS's but the
individual graphs are not):

- every ordered pair ``(i, j)``, the diagonal included, draws a Bernoulli(``p``) bit;
- undirected graphs keep ``(i, j)`` only when both ``(i, j)`` and ``(j, i)`` drew 1, so
  an undirected edge exists with probability ``p ** 2`` and a self-loop with
  probability ``p``;
- directed acyclic graphs keep the strict upper triangle under a random node
  permutation;
- weighted graphs multiply by weights drawn uniformly in ``[low, high)``; undirected
  ones symmetrise them as CLRS does, ``w_ij = sqrt(u_ij * u_ji + 1e-3)``.

Connectivity is not enforced, as in CLRS: graphs may be disconnected, and the
algorithms handle it (unreachable nodes keep ``pi[i] = i``, Kruskal returns a minimum
spanning forest, Prim spans the source's component). Self-loops change none of the six
algorithms' results; the ``adj`` input marks every node adjacent to itself anyway.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/samplers.py``).
"""

from __future__ import annotations

import numpy as np


def er_graph(
    rng: np.random.Generator,
    num_nodes: int,
    p: float,
    *,
    directed: bool = False,
    acyclic: bool = False,
    weighted: bool = False,
    low: float = 0.0,
    high: float = 1.0,
) -> np.ndarray:
    """Samples one Erdős–Rényi graph as a dense matrix, as CLRS does.

    Args:
      rng: the random stream (advanced in place).
      num_nodes: nodes ``n``.
      p: Bernoulli probability of each ordered pair (see the module docstring).
      directed: keep ``(i, j)`` and ``(j, i)`` independent; otherwise symmetric.
      acyclic: for directed graphs, keep a DAG (upper triangle, permuted nodes).
      weighted: multiply the 0/1 matrix by random weights in ``[low, high)``.
      low: smallest weight.
      high: weights stay below ``high`` (before the undirected symmetrisation).

    Returns:
      float64 ``[n, n]``: ``A[i, j] != 0`` iff there is an edge ``i -> j``, with its
      weight (1 for unweighted graphs).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"Edge probability p must lie in [0, 1], got {p}.")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}.")
    mat = rng.binomial(1, p, size=(num_nodes, num_nodes))  # [n, n] 0/1
    if not directed:
        mat *= mat.T
    elif acyclic:
        perm = rng.permutation(num_nodes)
        mat = np.triu(mat, k=1)[perm][:, perm]
    mat = mat.astype(np.float64)
    if weighted:
        weights = rng.uniform(low, high, size=(num_nodes, num_nodes))  # [n, n]
        if not directed:
            weights = np.sqrt(weights * weights.T + 1e-3)  # symmetric, > 0
        mat *= weights
    return mat


def adjacency(A: np.ndarray) -> np.ndarray:
    """CLRS's ``adj`` probe: 1 where ``A`` has an edge or on the diagonal (float)."""
    return ((A + np.eye(A.shape[0])) != 0).astype(np.float64)
