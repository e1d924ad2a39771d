"""Perfect mazes on a compact grid: the randomised depth-first search and its two variants.

A maze of ``n x n`` cells is a ``(2n + 1) x (2n + 1)`` grid of codes: cell ``(r, c)`` is
pixel ``(2r + 1, 2c + 1)``, the passage between two neighbouring cells is the pixel
between them, everything else is `WALL`. The passages form a spanning tree of the cells
(a perfect maze), carved by a randomised depth-first search (the recursive backtracker,
with an explicit stack). Where the search starts is what the two generators differ in:

- ``"from_start"`` (easy-to-hard-data's): start and goal are two distinct uniform cells
  and the search starts at the start cell, as ``gen_dataset`` and ``gen_sample`` in
  aks2203/easy-to-hard-data ``make_mazes.py`` do (``create_maze(n, ix, iy)`` carves
  ``Maze.make_maze`` from the start cell ``(ix, iy)``). A search that starts at the start
  cell runs deep before it backtracks, so the start-goal paths are longer: over 10,000
  13x13 mazes the path covers 41.0 pixels of the compact grid on average (41.1 with
  easy-to-hard-data's own ``gen_dataset``, 10,000 mazes), against 26.9 from a random root
  (the commands are in BUILD_NOTES.md, "Maze generators").
- ``"random_start"`` (this project's first generator): the search starts at a uniform
  random cell; start and goal are then two distinct uniform cells.

References:
  Schwarzschild et al., "Datasets for Studying Generalization from Easy to Hard
  Examples", arXiv:2108.06011, 2021 (the maze format and its generator).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WALL, OPEN, START, GOAL = 0, 1, 2, 3  # pixel codes of the compact grid
FROM_START, RANDOM_START = "from_start", "random_start"
GENERATORS = (FROM_START, RANDOM_START)


def check_generator(generator: str) -> str:
    """Returns ``generator`` if it names a generator.

    Raises:
      ValueError: naming the valid generators otherwise.
    """
    if generator not in GENERATORS:
        raise ValueError(
            f"Unknown maze generator {generator!r}. Valid generators: {', '.join(GENERATORS)} "
            f"({FROM_START!r}: easy-to-hard-data's, the search starts at the start cell)."
        )
    return generator


def draws_per_maze(n: int, generator: str) -> int:
    """How many uniform floats `draw_maze` reads for one ``n x n``-cell maze."""
    return n * n + 2 if check_generator(generator) == RANDOM_START else n * n + 1


def carve(n: int, draws: Sequence[float], *, root: int | None = None) -> tuple[list[int], int]:
    """Carves an ``n x n`` perfect maze with an iterative randomised depth-first search.

    Cells are numbered ``r * n + c``. Each step moves from the cell on top of the stack
    to a random unvisited neighbour, carving the passage, or pops it if there is none.

    Args:
      n: cells per side.
      draws: floats in ``[0, 1)``: one that picks the root (only when ``root`` is None),
        then one per carving step (``n * n - 1``), each picking a neighbour.
      root: the cell the search starts at; None draws it.

    Returns:
      ``(parent, root)``: ``parent[c]`` is the cell from which ``c`` was carved (-1 for
      the root); the passages are exactly the pairs ``(c, parent[c])``.
    """
    cells = n * n
    if root is None:
        root, draws = int(draws[0] * cells), draws[1:]
    visited = bytearray(cells)
    parent = [-1] * cells
    visited[root] = 1
    stack, k = [root], 0
    while stack:
        cell = stack[-1]
        r, c = divmod(cell, n)
        options = []  # unvisited neighbours: up, down, left, right
        if r > 0 and not visited[cell - n]:
            options.append(cell - n)
        if r < n - 1 and not visited[cell + n]:
            options.append(cell + n)
        if c > 0 and not visited[cell - 1]:
            options.append(cell - 1)
        if c < n - 1 and not visited[cell + 1]:
            options.append(cell + 1)
        if options:
            nxt = options[int(draws[k] * len(options))]
            k += 1
            visited[nxt] = 1
            parent[nxt] = cell
            stack.append(nxt)
        else:
            stack.pop()
    return parent, root


def tree_path(parent: Sequence[int], start: int, goal: int) -> list[int]:
    """The cells on the unique path from ``start`` to ``goal`` in a tree, both included."""
    up = [start]
    while parent[up[-1]] >= 0:
        up.append(parent[up[-1]])
    position = {cell: i for i, cell in enumerate(up)}
    down = [goal]
    while down[-1] not in position:
        down.append(parent[down[-1]])
    return up[: position[down[-1]]] + down[::-1]


def _pixels(cells: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Grid pixel (row, column) of each cell number."""
    r, c = np.divmod(cells, n)
    return 2 * r + 1, 2 * c + 1


def _two_cells(cells: int, first: float, second: float) -> tuple[int, int]:
    """Two distinct uniform cells from two uniform floats."""
    start = int(first * cells)
    goal = int(second * (cells - 1))
    return start, goal + (goal >= start)


def draw_maze(
    n: int, draws: Sequence[float], *, generator: str = FROM_START
) -> tuple[np.ndarray, np.ndarray]:
    """One maze and its solution as compact grids.

    Args:
      n: cells per side.
      draws: `draws_per_maze` floats in ``[0, 1)``. ``"from_start"``: the start, the
        goal (a different cell), then the ``n * n - 1`` carving steps from the start.
        ``"random_start"``: the ``n * n`` draws of `carve` (root first), then the start
        and the goal.
      generator: ``"from_start"`` or ``"random_start"`` (see the module docstring).

    Returns:
      ``(grid, path)``, uint8 ``[2n + 1, 2n + 1]`` each: ``grid`` holds the codes
      `WALL`, `OPEN`, `START`, `GOAL`; ``path`` is 1 on the pixels of the path.
    """
    cells = n * n
    if check_generator(generator) == FROM_START:
        start, goal = _two_cells(cells, draws[0], draws[1])
        parent, root = carve(n, draws[2 : cells + 1], root=start)
    else:
        parent, root = carve(n, draws[:cells])
        start, goal = _two_cells(cells, draws[cells], draws[cells + 1])
    side = 2 * n + 1
    grid, path = np.zeros((2, side, side), np.uint8)  # [2n+1, 2n+1] each
    grid[1::2, 1::2] = OPEN
    child = np.array([c for c in range(cells) if c != root])
    (cr, cc), (pr, pc) = _pixels(child, n), _pixels(np.asarray(parent)[child], n)
    grid[(cr + pr) // 2, (cc + pc) // 2] = OPEN
    route = np.array(tree_path(parent, start, goal))
    rr, rc = _pixels(route, n)
    path[rr, rc] = 1
    path[(rr[1:] + rr[:-1]) // 2, (rc[1:] + rc[:-1]) // 2] = 1
    grid[rr[0], rc[0]] = START
    grid[rr[-1], rc[-1]] = GOAL
    return grid, path
