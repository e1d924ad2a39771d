"""CLRS-30 feature specs: the name, stage, location and type of every probe.

Each algorithm's spec maps a feature name to ``(stage, location, type)``, exactly as
the CLRS benchmark's ``specs.SPECS`` does for the six graph algorithms here:

- ``stage``: ``input`` (one snapshot), ``output`` (one snapshot) or ``hint`` (one
  snapshot per algorithm step);
- ``location``: ``node`` (``[n, ...]``), ``edge`` (``[n, n, ...]``) or ``graph``
  (``[...]``);
- ``type``: ``scalar`` (float), ``mask`` (0/1 float), ``mask_one`` (one-hot float over
  the nodes), ``categorical`` (one-hot float over `NUM_CATEGORIES` classes, last axis)
  or ``pointer`` (int node index; ``pi[i] = j`` means "i points to j", roots point to
  themselves).

Every algorithm has the ``pos`` input (node ``i`` at ``i / n``), the edge weights ``A``
and the adjacency mask ``adj`` (self-loops included). `feature_shape` gives the
per-example shape of a feature, `model_spec` an algorithm's spec as the rows
`deq_jax.models.clrs.model.ClrsModel` takes.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (github.com/google-deepmind/clrs, ``clrs/_src/specs.py``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping


class Stage:
    """When a feature is observed."""

    INPUT = "input"
    OUTPUT = "output"
    HINT = "hint"


class Location:
    """What a feature is attached to."""

    NODE = "node"
    EDGE = "edge"
    GRAPH = "graph"


class Type:
    """How a feature is encoded (see the module docstring)."""

    SCALAR = "scalar"
    CATEGORICAL = "categorical"
    MASK = "mask"
    MASK_ONE = "mask_one"
    POINTER = "pointer"


Spec = Mapping[str, tuple[str, str, str]]

_I, _O, _H = Stage.INPUT, Stage.OUTPUT, Stage.HINT
_N, _E, _G = Location.NODE, Location.EDGE, Location.GRAPH
_SCALAR, _CAT, _MASK = Type.SCALAR, Type.CATEGORICAL, Type.MASK
_ONE, _PTR = Type.MASK_ONE, Type.POINTER

# The inputs every graph algorithm shares; those with a source node add ``s``.
_GRAPH_INPUTS = {"pos": (_I, _N, _SCALAR), "A": (_I, _E, _SCALAR), "adj": (_I, _E, _MASK)}
_SOURCE_INPUTS = {
    "pos": (_I, _N, _SCALAR),
    "s": (_I, _N, _ONE),
    "A": (_I, _E, _SCALAR),
    "adj": (_I, _E, _MASK),
}

SPECS: Mapping[str, Spec] = types.MappingProxyType(
    {
        "bellman_ford": types.MappingProxyType(
            {
                **_SOURCE_INPUTS,
                "pi": (_O, _N, _PTR),
                "pi_h": (_H, _N, _PTR),
                "d": (_H, _N, _SCALAR),
                "msk": (_H, _N, _MASK),
            }
        ),
        "bfs": types.MappingProxyType(
            {
                **_SOURCE_INPUTS,
                "pi": (_O, _N, _PTR),
                "reach_h": (_H, _N, _MASK),
                "pi_h": (_H, _N, _PTR),
            }
        ),
        "dfs": types.MappingProxyType(
            {
                **_GRAPH_INPUTS,
                "pi": (_O, _N, _PTR),
                "pi_h": (_H, _N, _PTR),
                "color": (_H, _N, _CAT),
                "d": (_H, _N, _SCALAR),
                "f": (_H, _N, _SCALAR),
                "s_prev": (_H, _N, _PTR),
                "s": (_H, _N, _ONE),
                "u": (_H, _N, _ONE),
                "v": (_H, _N, _ONE),
                "s_last": (_H, _N, _ONE),
                "time": (_H, _G, _SCALAR),
            }
        ),
        "dijkstra": types.MappingProxyType(
            {
                **_SOURCE_INPUTS,
                "pi": (_O, _N, _PTR),
                "pi_h": (_H, _N, _PTR),
                "d": (_H, _N, _SCALAR),
                "mark": (_H, _N, _MASK),
                "in_queue": (_H, _N, _MASK),
                "u": (_H, _N, _ONE),
            }
        ),
        "mst_kruskal": types.MappingProxyType(
            {
                **_GRAPH_INPUTS,
                "in_mst": (_O, _E, _MASK),
                "in_mst_h": (_H, _E, _MASK),
                "pi": (_H, _N, _PTR),
                "u": (_H, _N, _ONE),
                "v": (_H, _N, _ONE),
                "root_u": (_H, _N, _ONE),
                "root_v": (_H, _N, _ONE),
                "mask_u": (_H, _N, _MASK),
                "mask_v": (_H, _N, _MASK),
                "phase": (_H, _G, _CAT),
            }
        ),
        "mst_prim": types.MappingProxyType(
            {
                **_SOURCE_INPUTS,
                "pi": (_O, _N, _PTR),
                "pi_h": (_H, _N, _PTR),
                "key": (_H, _N, _SCALAR),
                "mark": (_H, _N, _MASK),
                "in_queue": (_H, _N, _MASK),
                "u": (_H, _N, _ONE),
            }
        ),
    }
)

ALGORITHMS: tuple[str, ...] = tuple(SPECS)

# Classes of each categorical feature: DFS colours white/grey/black; Kruskal's phase
# (0: next edge, 1: find the root of u, 2: find the root of v).
NUM_CATEGORIES: Mapping[str, Mapping[str, int]] = types.MappingProxyType(
    {"dfs": {"color": 3}, "mst_kruskal": {"phase": 3}}
)


def check_algorithm(algorithm: str) -> None:
    """Raises a ValueError naming the valid algorithms if ``algorithm`` is not one."""
    if algorithm not in SPECS:
        raise ValueError(
            f"Unknown CLRS algorithm {algorithm!r}. Valid algorithms: {', '.join(ALGORITHMS)}."
        )


def names(algorithm: str, stage: str) -> tuple[str, ...]:
    """The features of ``algorithm`` at ``stage``, in spec order."""
    check_algorithm(algorithm)
    return tuple(name for name, (st, _, _) in SPECS[algorithm].items() if st == stage)


def feature_shape(algorithm: str, name: str, num_nodes: int) -> tuple[int, ...]:
    """Per-example shape of one feature (no batch or time axis).

    Args:
      algorithm: a name in `ALGORITHMS`.
      name: a feature of its spec.
      num_nodes: nodes per graph ``n``.

    Returns:
      ``(n,)`` for node, ``(n, n)`` for edge and ``()`` for graph features, with the
      number of categories appended for categorical ones.
    """
    check_algorithm(algorithm)
    spec = SPECS[algorithm]
    if name not in spec:
        raise ValueError(f"{algorithm} has no feature {name!r}. Features: {', '.join(spec)}.")
    _, location, type_ = spec[name]
    shape = {_N: (num_nodes,), _E: (num_nodes, num_nodes), _G: ()}[location]
    if type_ == _CAT:
        shape += (NUM_CATEGORIES[algorithm][name],)
    return shape


def model_spec(algorithm: str) -> tuple[tuple[str, str, str, str, int], ...]:
    """The algorithm's features as ``(name, stage, location, type, categories)`` rows,
    the ``spec`` of `deq_jax.models.clrs.model.ClrsModel`."""
    check_algorithm(algorithm)
    categories = NUM_CATEGORIES.get(algorithm, {})
    return tuple(
        (name, stage, location, type_, categories.get(name, 0))
        for name, (stage, location, type_) in SPECS[algorithm].items()
    )
