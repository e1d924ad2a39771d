"""CLRS-30 datasets: sample graphs, run the algorithms, batch and pad the probes.

`sample_dataset` draws ``num_examples`` graphs from the algorithm's CLRS distribution
(`GRAPH_DISTRIBUTIONS`, one seeded numpy stream per dataset, `graphs.random_stream`),
runs the algorithm with its hints (`run_algorithm`) and stacks every feature with the
batch axis first: inputs and outputs ``[N, *shape]``, hints ``[N, T, *shape]``
zero-padded to the dataset's longest trajectory ``T``, and ``lengths`` int32 ``[N]``
(valid hint steps per example), where ``shape`` is
`deq_jax.models.clrs.specs.feature_shape`. `clrs30_splits` builds the CLRS-30 train /
val / test splits.

As in CLRS, the seed alone fixes the graphs: algorithms sharing a distribution
(Bellman-Ford, Dijkstra, Prim) see the same graphs and sources for the same seed. With
the default ``sampler="clrs30"`` the stream is CLRS's ``np.random.RandomState(seed)``
consumed in its samplers' call order (edge probability from the ``p`` tuple, graph,
source), so `clrs30_splits` are CLRS-30's official splits, graph for graph;
``"generator"`` draws from a numpy `Generator` instead (the same distribution, other
graphs: the project's splits before issue 35).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/samplers.py``: ``CLRS30``, the samplers' ``_sample_data``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from deq_jax.models.clrs import specs
from deq_jax.models.clrs.algorithms.shortest_paths import bellman_ford, dijkstra
from deq_jax.models.clrs.algorithms.spanning_trees import mst_kruskal, mst_prim
from deq_jax.models.clrs.algorithms.traversal import bfs, dfs
from deq_jax.models.clrs.graphs import Rng, adjacency, er_graph, random_stream

Arrays = dict[str, np.ndarray]

_ALGORITHMS: Mapping[str, Callable[..., tuple[Arrays, list[Arrays]]]] = types.MappingProxyType(
    {
        "bellman_ford": bellman_ford,
        "bfs": bfs,
        "dfs": dfs,
        "dijkstra": dijkstra,
        "mst_kruskal": mst_kruskal,
        "mst_prim": mst_prim,
    }
)


@dataclasses.dataclass(frozen=True)
class GraphDistribution:
    """An algorithm's Erdős–Rényi graph distribution (see `graphs.er_graph`).

    Attributes:
      p: Bernoulli probability of each ordered pair (undirected edges: ``p ** 2``).
      directed: directed graph (otherwise symmetric).
      weighted: weights in ``[low, high)`` (otherwise 0/1).
      low: smallest weight.
      high: weights stay below it.
    """

    p: float
    directed: bool = False
    weighted: bool = False
    low: float = 0.0
    high: float = 1.0


# CLRS's sampler defaults: BellmanFordSampler (also Dijkstra and Prim), BfsSampler,
# DfsSampler and MSTSampler (Kruskal, "lower p to account for class imbalance").
GRAPH_DISTRIBUTIONS: Mapping[str, GraphDistribution] = types.MappingProxyType(
    {
        "bellman_ford": GraphDistribution(p=0.5, weighted=True),
        "bfs": GraphDistribution(p=0.5),
        "dfs": GraphDistribution(p=0.5, directed=True),
        "dijkstra": GraphDistribution(p=0.5, weighted=True),
        "mst_kruskal": GraphDistribution(p=0.2, weighted=True),
        "mst_prim": GraphDistribution(p=0.5, weighted=True),
    }
)

# CLRS-30's splits: (seed, examples before the multiplier); val and test sizes scale.
CLRS30_SEEDS: Mapping[str, int] = types.MappingProxyType({"train": 1, "val": 2, "test": 3})


class Example(NamedTuple):
    """One run of an algorithm: its probes without a batch axis.

    Attributes:
      inputs: ``{name: [*shape]}`` (node ``[n]``, edge ``[n, n]``, graph ``[]``).
      outputs: ``{name: [*shape]}``.
      hints: ``{name: [T, *shape]}``, one row per step.
      length: ``T``, the number of hint steps.
    """

    inputs: Arrays
    outputs: Arrays
    hints: Arrays
    length: int


class Features(NamedTuple):
    """What a model sees (CLRS's ``Features``): batched inputs, hints and lengths."""

    inputs: Arrays  # {name: [N, *shape]}
    hints: Arrays  # {name: [N, T, *shape]}, zero past each example's length
    lengths: np.ndarray  # int32 [N]


class Feedback(NamedTuple):
    """Features and the outputs to predict (CLRS's ``Feedback``)."""

    features: Features
    outputs: Arrays  # {name: [N, *shape]}


@dataclasses.dataclass(frozen=True, eq=False)
class ClrsDataset:
    """A batched dataset of one algorithm (read-only arrays, batch axis first).

    Attributes:
      algorithm: a name in `deq_jax.models.clrs.specs.ALGORITHMS`.
      inputs: ``{name: [N, *shape]}``.
      hints: ``{name: [N, T, *shape]}``, zero-padded past ``lengths`` (empty when
        sampled ``with_hints=False``).
      outputs: ``{name: [N, *shape]}``.
      lengths: int32 ``[N]``, valid hint steps of each example (between 1 and ``T``).
    """

    algorithm: str
    inputs: Arrays
    hints: Arrays
    outputs: Arrays
    lengths: np.ndarray

    @property
    def spec(self) -> specs.Spec:
        """The algorithm's spec: ``{name: (stage, location, type)}``."""
        return specs.SPECS[self.algorithm]

    @property
    def num_examples(self) -> int:
        """``N``."""
        return int(self.lengths.shape[0])

    @property
    def num_nodes(self) -> int:
        """Nodes per graph ``n``."""
        return int(self.inputs["pos"].shape[1])

    @property
    def max_steps(self) -> int:
        """``T``, the padded hint length: the longest trajectory of the dataset."""
        return int(self.lengths.max())

    def feedback(self) -> Feedback:
        """The whole dataset as CLRS's ``Feedback(Features(inputs, hints, lengths),
        outputs)``, with the batch axis first."""
        return Feedback(Features(self.inputs, self.hints, self.lengths), self.outputs)

    def as_source(self) -> Arrays:
        """A flat mapping for `deq_jax.tasks.data` batching: ``"inputs/<name>"``,
        ``"hints/<name>"``, ``"outputs/<name>"`` and ``"lengths"``; see
        `feedback_from_batch` for the way back."""
        source = {"lengths": self.lengths}
        for stage, arrays in (("inputs", self.inputs), ("hints", self.hints)):
            source.update({f"{stage}/{name}": value for name, value in arrays.items()})
        source.update({f"outputs/{name}": value for name, value in self.outputs.items()})
        return source


def feedback_from_batch(batch: Mapping[str, Any]) -> Feedback:
    """Rebuilds a `Feedback` from a batch of `ClrsDataset.as_source` (numpy or jax).

    Keys without a ``"inputs/"``, ``"hints/"`` or ``"outputs/"`` prefix other than
    ``"lengths"`` (e.g. the batcher's ``"mask"`` and ``"index"``) are ignored.
    """
    parts: dict[str, dict[str, Any]] = {"inputs": {}, "hints": {}, "outputs": {}}
    for key, value in batch.items():
        stage, _, name = key.partition("/")
        if stage in parts and name:
            parts[stage][name] = value
    features = Features(parts["inputs"], parts["hints"], batch["lengths"])
    return Feedback(features, parts["outputs"])


def _encode(algorithm: str, stage: str, probes: Arrays) -> Arrays:
    """``stage``'s features in spec order: pointers as int32 node indices, the rest
    as float32."""
    encoded = {}
    for name in specs.names(algorithm, stage):
        pointer = specs.SPECS[algorithm][name][2] == specs.Type.POINTER
        encoded[name] = probes[name].astype(np.int32 if pointer else np.float32, copy=False)
    return encoded


def run_algorithm(algorithm: str, A: np.ndarray, source: int | None = None) -> Example:
    """Runs ``algorithm`` on one graph and encodes its probes per the spec.

    Args:
      algorithm: a name in `deq_jax.models.clrs.specs.ALGORITHMS`.
      A: ``[n, n]`` weights, ``A[i, j] != 0`` an edge ``i -> j`` (copied as float64).
      source: the start node, for the algorithms whose spec has the ``s`` input.

    Returns:
      The `Example`: inputs ``pos`` (``i / n``), ``A``, ``adj`` and, with a source,
      ``s`` (one-hot); the outputs and the stacked hints.
    """
    specs.check_algorithm(algorithm)
    A = np.array(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square [n, n] matrix, got shape {A.shape}.")
    n = A.shape[0]
    inputs = {"pos": np.arange(n) / n, "A": A, "adj": adjacency(A)}
    if "s" in specs.names(algorithm, specs.Stage.INPUT):
        if source is None or not 0 <= source < n:
            raise ValueError(f"{algorithm} needs a source node in [0, {n}), got {source}.")
        inputs["s"] = np.eye(n)[source]
        outputs, steps = _ALGORITHMS[algorithm](A, source)
    else:
        outputs, steps = _ALGORITHMS[algorithm](A)
    hints = {name: np.stack([step[name] for step in steps]) for name in steps[0]}  # [T, ...]
    return Example(
        inputs=_encode(algorithm, specs.Stage.INPUT, inputs),
        outputs=_encode(algorithm, specs.Stage.OUTPUT, outputs),
        hints=_encode(algorithm, specs.Stage.HINT, hints),
        length=len(steps),
    )


def sample_example(
    algorithm: str,
    rng: Rng,
    num_nodes: int,
    p: float | Sequence[float] | None = None,
) -> Example:
    """Draws one graph (and source) from the algorithm's distribution and runs it.

    Args:
      algorithm: a name in `deq_jax.models.clrs.specs.ALGORITHMS`.
      rng: the random stream (advanced in place, as CLRS: edge probability, graph,
        source). A ``RandomState`` follows CLRS's calls exactly (``rng.choice(p)``
        even for one value, the source by ``rng.choice(n)``), so it draws CLRS's
        examples; a `Generator` draws ``p`` only from a sequence and the source by
        ``rng.integers(n)``.
      num_nodes: nodes ``n``.
      p: overrides the distribution's ``p``; a sequence draws one value per graph,
        as CLRS's samplers do with a tuple.

    Returns:
      The `Example` (see `run_algorithm`).
    """
    specs.check_algorithm(algorithm)
    dist = GRAPH_DISTRIBUTIONS[algorithm]
    clrs_calls = isinstance(rng, np.random.RandomState)
    if p is None:
        p = dist.p
    if clrs_calls or not np.isscalar(p):
        p = float(rng.choice(np.atleast_1d(np.asarray(p, dtype=np.float64))))
    A = er_graph(
        rng,
        num_nodes,
        float(p),
        directed=dist.directed,
        weighted=dist.weighted,
        low=dist.low,
        high=dist.high,
    )
    needs_source = "s" in specs.names(algorithm, specs.Stage.INPUT)
    source = None
    if needs_source:
        source = int(rng.choice(num_nodes) if clrs_calls else rng.integers(num_nodes))
    return run_algorithm(algorithm, A, source)


def _stack(examples: Sequence[Example]) -> tuple[Arrays, Arrays, Arrays, np.ndarray]:
    """Batches examples: inputs/outputs stacked, hints zero-padded to the longest.

    Consumes the examples' hints (each is released once copied), so the peak memory
    stays near the batched size: Kruskal's ``[T, n, n]`` hints dominate at n = 128.
    """
    inputs = {k: np.stack([e.inputs[k] for e in examples]) for k in examples[0].inputs}
    outputs = {k: np.stack([e.outputs[k] for e in examples]) for k in examples[0].outputs}
    lengths = np.array([e.length for e in examples], np.int32)  # [N]
    steps = int(lengths.max())
    hints = {}
    for name in list(examples[0].hints):
        first = examples[0].hints[name]
        padded = np.zeros((len(examples), steps, *first.shape[1:]), first.dtype)
        for i, example in enumerate(examples):
            padded[i, : example.length] = example.hints.pop(name)
        hints[name] = padded  # [N, T, *shape]
    return inputs, hints, outputs, lengths


def _check_count(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")


@functools.lru_cache(maxsize=32)
def sample_dataset(
    algorithm: str,
    num_examples: int,
    num_nodes: int,
    seed: int,
    *,
    p: float | tuple[float, ...] | None = None,
    with_hints: bool = True,
    sampler: str = "clrs30",
) -> ClrsDataset:
    """Samples a batched dataset, deterministically from its arguments; cached.

    Args:
      algorithm: a name in `deq_jax.models.clrs.specs.ALGORITHMS`.
      num_examples: ``N``.
      num_nodes: nodes per graph ``n``.
      seed: seeds the one random stream the examples are drawn from in turn.
      p: overrides the edge probability (see `sample_example`).
      with_hints: keep the hints; without them ``hints`` is empty (``lengths`` stays),
        which saves memory where they are not used: Kruskal's ``in_mst_h`` is
        ``[N, T, n, n]`` with ``T`` ~ 1500 at n = 128 (~3 GB for 32 graphs).
      sampler: the random stream, `graphs.random_stream`: ``"clrs30"`` (CLRS's
        ``RandomState`` draws: ``clrs.build_sampler(algorithm, num_examples, seed=seed,
        length=num_nodes)``'s examples) or ``"generator"``.

    Returns:
      The `ClrsDataset` (read-only arrays; see the module docstring for the layout).

    Raises:
      ValueError: for an unknown algorithm or sampler (the message lists the valid
        ones) or a non-positive size.
    """
    specs.check_algorithm(algorithm)
    _check_count("num_examples", num_examples, 1)
    _check_count("num_nodes", num_nodes, 1)
    _check_count("seed", seed, 0)
    rng = random_stream(sampler, seed)
    examples = []
    for _ in range(num_examples):
        example = sample_example(algorithm, rng, num_nodes, p)
        if not with_hints:
            example.hints.clear()
        examples.append(example)
    inputs, hints, outputs, lengths = _stack(examples)
    for arrays in (inputs, hints, outputs, {"lengths": lengths}):
        for array in arrays.values():
            array.flags.writeable = False
    return ClrsDataset(algorithm, inputs, hints, outputs, lengths)


def clrs30_splits(
    algorithm: str,
    *,
    train_nodes: int = 16,
    test_nodes: int = 64,
    train_size: int = 1000,
    eval_size: int = 32,
    multiplier: int = 1,
    with_hints: bool = True,
    sampler: str = "clrs30",
) -> dict[str, ClrsDataset]:
    """The CLRS-30 splits of one algorithm.

    ``train``: ``train_size`` graphs of ``train_nodes`` nodes (seed 1); ``val``:
    ``eval_size * multiplier`` graphs of ``train_nodes`` nodes (seed 2); ``test``:
    ``eval_size * multiplier`` graphs of ``test_nodes`` nodes (seed 3). The defaults
    are CLRS-30's (its multiplier is 1 for the six graph algorithms here); with them
    and ``sampler="clrs30"`` the splits are CLRS-30's official ones, graph for graph.
    ``with_hints`` and ``sampler`` as in `sample_dataset`.

    Returns:
      ``{"train", "val", "test"}`` -> `ClrsDataset`.
    """
    specs.check_algorithm(algorithm)
    _check_count("multiplier", multiplier, 1)
    _check_count("eval_size", eval_size, 1)
    sizes = {
        "train": (train_size, train_nodes),
        "val": (eval_size * multiplier, train_nodes),
        "test": (eval_size * multiplier, test_nodes),
    }
    return {
        split: sample_dataset(
            algorithm, count, nodes, CLRS30_SEEDS[split], with_hints=with_hints, sampler=sampler
        )
        for split, (count, nodes) in sizes.items()
    }
