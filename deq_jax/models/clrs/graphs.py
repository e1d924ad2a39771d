"""Seeded random graphs with the CLRS benchmark's Erdős–Rényi distribution.

`er_graph` follows CLRS's ``Sampler._random_er_graph`` draw for draw. Handed a numpy
``RandomState`` (`random_stream` with ``"clrs30"``, CLRS's own generator) it draws CLRS's
graphs exactly; handed a `Generator` (``"generator"``) the distribution is CLRS's but the
individual graphs are not:

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

Rng = np.random.Generator | np.random.RandomState

# The ways of drawing a dataset's graphs from its seed (`random_stream`).
SAMPLERS = ("clrs30", "generator")


def random_stream(sampler: str, seed: int) -> Rng:
    """The random stream a dataset's graphs are drawn from.

    Args:
      sampler: ``"clrs30"``: ``np.random.RandomState(seed)``, consumed in CLRS's call
        order, so seeds 1, 2, 3 give CLRS-30's official train, val and test graphs;
        ``"generator"``: ``np.random.default_rng(seed)`` (CLRS's distribution, other
        graphs).
      seed: the stream's seed.

    Raises:
      ValueError: for an unknown sampler, listing the valid ones.
    """
    if sampler == "clrs30":
        return np.random.RandomState(seed)
    if sampler == "generator":
        return np.random.default_rng(seed)
    raise ValueError(f"Unknown CLRS sampler {sampler!r}. Valid samplers: {', '.join(SAMPLERS)}.")


def er_graph(
    rng: Rng,
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
      rng: the random stream (advanced in place; see `random_stream`).
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
