"""Single-source shortest paths with CLRS's hints: Bellman-Ford and Dijkstra.

Each function mirrors the CLRS benchmark's ``algorithms/graphs.py`` step for step:
the same state, the same tie-breaking (lowest node index first) and a hint recorded
at the same points; the inner loops over nodes are vectorised where the result is
provably identical to CLRS's sequential loops (the updates within a step read only
the previous step's state).

Both take ``A`` float ``[n, n]`` (``A[u, v] != 0``: an edge ``u -> v`` of weight
``A[u, v] > 0``) and a source ``s``, and return ``(outputs, hints)``: ``outputs =
{"pi": int [n]}`` (``pi[v]`` is ``v``'s predecessor on a shortest path, ``pi[s] = s``
and unreachable nodes point to themselves) and ``hints``, one dict per step.

References:
  Bellman, "On a routing problem", 1958; Dijkstra, "A note on two problems in
  connexion with graphs", 1959; Cormen et al., "Introduction to Algorithms" 3ed.
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from deq_jax.models.clrs.probing import Probes, Trajectory, mask_one

# CLRS's drop-in for extract-min adds this to the keys of nodes outside the queue.
_NOT_QUEUED = 1e9


def bellman_ford(A: np.ndarray, s: int) -> tuple[Probes, list[Probes]]:
    """Bellman-Ford from ``s``; a hint before every round of relaxations.

    Round ``t`` relaxes every edge out of the nodes reached before it, from the
    distances before it (Jacobi style, as CLRS); it stops after the first round that
    changes no distance, whose starting state is the last hint.

    Returns:
      ``({"pi"}, hints)``, hints ``{"pi_h": int [n], "d": [n], "msk": [n]}`` (``d`` is
      0 where ``msk``, the reached set, is 0).
    """
    n = A.shape[0]
    edge = A != 0  # [n, n]
    d = np.zeros(n)
    pi = np.arange(n)
    msk = np.zeros(n)
    msk[s] = 1.0
    hints = Trajectory()
    while True:
        prev_d, prev_msk = d.copy(), msk.copy()
        hints.push(pi_h=pi, d=prev_d, msk=prev_msk)
        valid = edge & (prev_msk[:, None] == 1)  # [u, v]: u reached, edge u -> v
        cand = np.where(valid, prev_d[:, None] + A, np.inf)  # [u, v]
        best_u = np.argmin(cand, axis=0)  # [v] first u reaching the minimum
        best = cand[best_u, np.arange(n)]  # [v]
        reachable = valid.any(axis=0)  # [v]
        # CLRS sets d[v] from the first candidate when v was unreached, then keeps
        # strict improvements: the first minimal candidate wins.
        update = reachable & ((prev_msk == 0) | (best < prev_d))
        d = np.where(update, best, prev_d)
        pi = np.where(update, best_u, pi)
        msk = np.maximum(prev_msk, reachable.astype(np.float64))
        if np.all(d == prev_d):
            break
    return {"pi": pi}, hints.steps


def dijkstra(A: np.ndarray, s: int) -> tuple[Probes, list[Probes]]:
    """Dijkstra from ``s``; a hint at the start and after every extraction.

    Stops after ``n`` extractions or when the queue is empty (then the extracted
    nodes are exactly those reachable from ``s``).

    Returns:
      ``({"pi"}, hints)``, hints ``{"pi_h": int [n], "d": [n], "mark": [n] (settled),
      "in_queue": [n], "u": [n] (one-hot, the node just extracted; ``s`` at first)}``.
    """
    return extract_min_tree(A, s, key_name="d", relax=lambda key_u, weights: key_u + weights)


def extract_min_tree(
    A: np.ndarray,
    s: int,
    *,
    key_name: str,
    relax: Callable[[float, np.ndarray], np.ndarray],
) -> tuple[Probes, list[Probes]]:
    """The extract-min loop that Dijkstra and Prim share, with CLRS's hints.

    Args:
      A: float ``[n, n]`` edge weights (0: no edge).
      s: the source (root).
      key_name: the hint name of the keys (``"d"`` for Dijkstra, ``"key"`` for Prim).
      relax: ``relax(key[u], A[u]) -> [n]``, the key each neighbour ``v`` of the
        extracted node ``u`` would get through ``u``.

    Returns:
      ``({"pi"}, hints)`` as `dijkstra` documents, the keys under ``key_name``.
    """
    n = A.shape[0]
    key = np.zeros(n)
    mark = np.zeros(n)
    in_queue = np.zeros(n)
    pi = np.arange(n)
    in_queue[s] = 1.0
    hints = Trajectory()
    hints.push(pi_h=pi, **{key_name: key}, mark=mark, in_queue=in_queue, u=mask_one(s, n))
    for _ in range(n):
        u = int(np.argmin(key + (1.0 - in_queue) * _NOT_QUEUED))
        if in_queue[u] == 0:
            break
        mark[u], in_queue[u] = 1.0, 0.0
        cand = relax(key[u], A[u])  # [n]
        update = (A[u] != 0) & (mark == 0) & ((in_queue == 0) | (cand < key))
        pi = np.where(update, u, pi)
        key = np.where(update, cand, key)
        in_queue = np.where(update, 1.0, in_queue)
        hints.push(pi_h=pi, **{key_name: key}, mark=mark, in_queue=in_queue, u=mask_one(u, n))
    return {"pi": pi}, hints.steps
