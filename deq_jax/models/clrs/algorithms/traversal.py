"""Graph traversals with CLRS's hints: breadth-first and depth-first search.

Each function mirrors the CLRS benchmark's ``algorithms/graphs.py`` step for step
(same state, same node-order tie-breaking, a hint at the same points), returning
``(outputs, hints)`` with ``outputs = {"pi": int [n]}``: ``pi[i]`` is ``i``'s parent in
the search forest, roots and unreached nodes point to themselves. ``A`` is float
``[n, n]``, ``A[i, j] != 0`` an edge ``i -> j``.

DFS records every hint of CLRS's spec, including its explicit-stack bookkeeping
(``s_prev``, ``s_last``) and the ``v`` probe's quirk: after a scan of ``u``'s
neighbours that finds no white node, CLRS's loop variable ``v`` is left at ``n - 1``,
and so is the hint here.

References:
  Moore, "The shortest path through a maze", 1959; Cormen et al., "Introduction to
  Algorithms" 3ed, sections 22.2-22.3.
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
"""

from __future__ import annotations

import numpy as np

from deq_jax.models.clrs.probing import Probes, Trajectory, categorical, mask_one

_WHITE, _GREY, _BLACK = 0, 1, 2
_TICK = 0.01  # CLRS's DFS clock advances by 0.01 per discovery or finish


def bfs(A: np.ndarray, s: int) -> tuple[Probes, list[Probes]]:
    """Breadth-first search from ``s``, one frontier expansion per step.

    A hint is recorded before every expansion; the search stops after the first
    expansion that reaches no new node (its starting state is the last hint, equal to
    the outputs). A newly reached node's parent is the lowest-index node of the
    previous frontier set with an edge to it.

    Returns:
      ``({"pi"}, hints)``, hints ``{"reach_h": [n] (reached set), "pi_h": int [n]}``.
    """
    n = A.shape[0]
    nodes = np.arange(n)
    edge = A > 0  # [i, j]
    reach = np.zeros(n)
    reach[s] = 1.0
    pi = nodes.copy()
    hints = Trajectory()
    while True:
        prev_reach = reach.copy()
        hints.push(reach_h=prev_reach, pi_h=pi)
        from_reached = edge & (prev_reach[:, None] == 1)  # [i, j]: i reached, i -> j
        hit = from_reached.any(axis=0)  # [j]
        first = np.argmax(from_reached, axis=0)  # [j] lowest reached i with i -> j
        pi = np.where(hit & (pi == nodes) & (nodes != s), first, pi)
        reach = np.maximum(reach, hit.astype(np.float64))
        if np.all(reach == prev_reach):
            break
    return {"pi": pi}, hints.steps


def dfs(A: np.ndarray) -> tuple[Probes, list[Probes]]:
    """Depth-first search from every white node in index order (a DFS forest).

    The search keeps an explicit stack (``s_prev[v]``: the node below ``v``,
    ``s_last``: the top) and visits the neighbours of the node on top in index
    order. A hint is recorded when a tree is started (root ``s``), when a node is
    discovered-and-entered (``d`` set), when a white neighbour ``v`` is pushed and
    when a node is finished (``f`` set): ``3 n`` hints in all.

    Returns:
      ``({"pi"}, hints)``, hints ``{"pi_h": int [n], "color": [n, 3] (white, grey,
      black), "d": [n], "f": [n] (discovery/finish times, 0 before), "s_prev": int
      [n], "s", "u", "v", "s_last": [n] one-hot (root, current node, last scanned
      neighbour, stack top), "time": [] (the clock)}``.
    """
    n = A.shape[0]
    edge = A != 0  # [u, v]
    color = np.full(n, _WHITE)
    pi = np.arange(n)
    d = np.zeros(n)
    f = np.zeros(n)
    s_prev = np.arange(n)
    time = 0.0
    hints = Trajectory()

    def push(s: int, u: int, v: int, s_last: int) -> None:
        hints.push(
            pi_h=pi,
            color=categorical(color, 3),
            d=d,
            f=f,
            s_prev=s_prev,
            s=mask_one(s, n),
            u=mask_one(u, n),
            v=mask_one(v, n),
            s_last=mask_one(s_last, n),
            time=time,
        )

    for s in range(n):
        if color[s] != _WHITE:
            continue
        s_last = u = v = s
        push(s, u, v, s_last)
        while True:
            if color[u] == _WHITE or d[u] == 0.0:  # enter u
                time += _TICK
                d[u] = time
                color[u] = _GREY
                push(s, u, v, s_last)
            white = np.flatnonzero(edge[u] & (color == _WHITE))
            if white.size:  # push the first white neighbour
                v = int(white[0])
                pi[v] = u
                color[v] = _GREY
                s_prev[v] = s_last
                s_last = v
                push(s, u, v, s_last)
            else:
                v = n - 1  # where CLRS's scan over all neighbours leaves its loop variable
            if s_last == u:  # no white neighbour: finish u and pop it
                color[u] = _BLACK
                time += _TICK
                f[u] = time
                push(s, u, v, s_last)
                if s_prev[u] == u:  # u is the root: the tree is done
                    break
                below = s_prev[s_last]
                s_prev[s_last] = s_last
                s_last = int(below)
            u = s_last
    return {"pi": pi}, hints.steps
