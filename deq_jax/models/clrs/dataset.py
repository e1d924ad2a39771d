"""The generated CLRS-30 splits: what to generate (`ClrsConfig`) and the arrays.

Trains on ``train_nodes``-node graphs (CLRS-30: 1000 graphs of 16 nodes, seed 1) and
evaluates on ``"val"`` (``eval_size * multiplier`` graphs of ``train_nodes`` nodes, seed
2) and one ``"test_{n}"`` split per entry of ``test_nodes`` (as many graphs of ``n``
nodes, seed 3; CLRS-30 tests at 64). ``seed`` shifts every split's seed by ``3 * seed``
(0 gives CLRS-30's seeds). With ``sampler="clrs30"`` (the default) the graphs are drawn
from CLRS's ``RandomState`` in its call order, so at CLRS-30's sizes and ``seed=0`` the
``"train"``, ``"val"`` and ``"test_64"`` splits are CLRS-30's official ones, graph for
graph (other test sizes reuse seed 3 at their node count); ``"generator"`` keeps the
project's earlier numpy-`Generator` graphs (`graphs.random_stream`). `generate_split`
gives a split's batchable arrays (see `deq_jax.models.clrs.task` for the batch layout):
the training split carries the whole hint trajectories (``T`` = its longest run), the
evaluation splits the first step only (``T = 1``: the algorithm's initial state, which
CLRS also hands its model), so a test split of large graphs stays small.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from deq_jax.models.clrs import specs
from deq_jax.models.clrs.graphs import SAMPLERS, random_stream
from deq_jax.models.clrs.samplers import CLRS30_SEEDS, sample_example

TRAIN, VAL = "train", "val"


@dataclasses.dataclass(frozen=True)
class ClrsConfig:
    """What to generate (frozen, hashable).

    Attributes:
      algorithm: a name in `deq_jax.models.clrs.ALGORITHMS`.
      train_nodes: nodes per training and validation graph.
      test_nodes: one ``"test_{n}"`` split per node count.
      train_size: training graphs.
      eval_size: validation and test graphs, before the multiplier.
      multiplier: CLRS-30's evaluation-size multiplier.
      seed: shifts every split's seed by ``3 * seed``.
      sampler: ``"clrs30"`` (CLRS's draws: official splits) or ``"generator"``
        (`graphs.random_stream`).
    """

    algorithm: str = "bellman_ford"
    train_nodes: int = 16
    test_nodes: tuple[int, ...] = (64,)
    train_size: int = 1000
    eval_size: int = 32
    multiplier: int = 1
    seed: int = 0
    sampler: str = "clrs30"

    def __post_init__(self):
        specs.check_algorithm(self.algorithm)
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"ClrsConfig.sampler (config key task.sampler) must be one of "
                f"{', '.join(SAMPLERS)}, got {self.sampler!r}."
            )
        object.__setattr__(self, "test_nodes", tuple(int(n) for n in self.test_nodes))
        for field in ("train_nodes", "train_size", "eval_size", "multiplier", "seed"):
            value, least = getattr(self, field), {"train_nodes": 2, "seed": 0}.get(field, 1)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
                raise ValueError(f"ClrsConfig.{field} must be an integer >= {least}: {value!r}.")
        if not self.test_nodes or min(self.test_nodes) < 2:
            raise ValueError(f"test_nodes must be node counts >= 2, got {self.test_nodes}.")
        if len(set(self.test_nodes)) != len(self.test_nodes):
            raise ValueError(f"test_nodes must be distinct, got {self.test_nodes}.")

    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "val", "test_64", ...)``."""
        return (TRAIN, VAL) + tuple(f"test_{n}" for n in self.test_nodes)

    def check_split(self, split: str) -> None:
        """Raises a ValueError naming the valid splits if ``split`` is not one."""
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(self.splits)}.")

    def nodes(self, split: str) -> int:
        """Nodes per graph in ``split``."""
        self.check_split(split)
        return self.train_nodes if split in (TRAIN, VAL) else int(split.removeprefix("test_"))

    def size(self, split: str) -> int:
        """Graphs in ``split``."""
        self.check_split(split)
        return self.train_size if split == TRAIN else self.eval_size * self.multiplier

    def seed_of(self, split: str) -> int:
        """The sampler seed of ``split`` (CLRS-30's 1, 2, 3 when ``seed == 0``)."""
        self.check_split(split)
        kind = split if split in (TRAIN, VAL) else "test"
        return CLRS30_SEEDS[kind] + 3 * self.seed


@functools.lru_cache(maxsize=16)
def generate_split(config: ClrsConfig, split: str) -> dict[str, np.ndarray]:
    """One split as batchable arrays (module docstring); deterministic and cached.

    Draws the graphs exactly as `deq_jax.models.clrs.sample_dataset` does (one numpy
    stream of ``config.sampler`` from the split's seed), keeping each example's whole
    hint trajectory for the training split and its first step otherwise.
    """
    alg, n, count = config.algorithm, config.nodes(split), config.size(split)
    rng = random_stream(config.sampler, config.seed_of(split))
    examples = []
    for _ in range(count):
        example = sample_example(alg, rng, n)
        if split != TRAIN:
            example = example._replace(hints={k: v[:1] for k, v in example.hints.items()})
        examples.append(example)
    lengths = np.array([e.length for e in examples], np.int32)  # [N]
    steps = max(int(lengths.max()), 2) if split == TRAIN else 1
    (output,) = specs.names(alg, specs.Stage.OUTPUT)
    out = {
        "inputs": np.stack([e.inputs["adj"] for e in examples]).astype(np.float32),
        "lengths": lengths,
        "targets": np.stack([e.outputs[output] for e in examples]).astype(np.int32),
    }
    for name in specs.names(alg, specs.Stage.INPUT):
        if name != "adj":
            out[f"input_{name}"] = np.stack([e.inputs[name] for e in examples])
    for name in specs.names(alg, specs.Stage.HINT):
        first = examples[0].hints[name]
        padded = np.zeros((count, steps, *first.shape[1:]), first.dtype)  # [N, T, ...]
        for i, example in enumerate(examples):
            padded[i, : len(example.hints[name])] = example.hints[name]
        out[f"hint_{name}"] = padded
    for array in out.values():
        array.flags.writeable = False
    return out
