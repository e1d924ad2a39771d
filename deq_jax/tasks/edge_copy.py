"""Edge copy: a graph regression task that asks a network to reproduce its edge features.

Graphs are Erdős–Rényi ``G(n, p)``: undirected, no self-loops, each of the
``n (n - 1) / 2`` pairs an edge with probability ``p``. Every edge carries ``C``
features drawn uniformly from ``[-1, 1]``, the same in both directions. The target is
the clean edge features themselves. Models train on graphs of ``train_nodes`` nodes and
are tested on larger ones (``"test_{n}"`` splits), where more nodes and edges call for
more test-time computation.

Dense representation: ``adjacency`` float32 ``[n, n]`` (symmetric 0/1, zero diagonal),
``inputs`` float32 ``[n, n, C]`` (zero off the edges) and ``targets`` float32
``[n, n, C]`` (the clean features). Batches are ``{"inputs", "adjacency", "targets",
"mask": bool [b], "index": int32 [b]}``; the node count differs between splits.

Training noise. Du et al. 2022 draw a fresh random problem for every training example;
here the training set is fixed (so ``start_step`` resumes exactly) and fresh Gaussian
noise is added to its inputs each time a batch is drawn: the training batch at global
step ``s`` gets ``inputs + noise_std * E * adjacency[..., None]``, with ``E`` symmetric
standard normal noise (one draw per undirected edge and feature, mirrored), drawn from
``(seed, s)`` for the whole global batch and sliced per process (`add_training_noise`),
so it is resumable and identical across process counts. Targets stay clean, so the
network must denoise as it copies. Evaluation inputs are clean.

Each split is generated in memory from ``(seed, split)`` in milliseconds and cached.
The validation split ``"valid"`` (``val_size`` graphs of ``train_nodes`` nodes, for model
selection; none with ``val_size=0``) draws from a stream of its own, so it changes no
other split.
`edge_mse` is the metric: mean squared error over the existing edges of each graph.

References:
  Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
  Minimization", ICML 2022 (the edge-copy graph task).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (train on small graphs, test on larger ones).
"""

from __future__ import annotations

import abc
import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from deq_jax.tasks import data
from deq_jax.tasks.base import Task
from deq_jax.tasks.splits import TRAIN, VALID, HeldOutSplits, SplitSizes

_NOISE_STREAM = 7919  # separates the noise streams from the shuffling streams


def symmetric_from_upper(x: np.ndarray) -> np.ndarray:
    """Mirrors the strict upper triangle of ``x [N, n, n, ...]``; zero diagonal."""
    n = x.shape[1]
    upper = np.triu(np.ones((n, n), bool), k=1).reshape((1, n, n) + (1,) * (x.ndim - 3))
    x = np.where(upper, x, 0)
    return x + np.swapaxes(x, 1, 2)


def step_noise(
    seed: int,
    step: int,
    batch_size: int,
    shape: tuple[int, ...],
    process_index: int = 0,
    process_count: int = 1,
) -> np.ndarray:
    """Standard normal float32 noise ``[b, *shape]`` for this process's rows of a step.

    The whole global batch ``[batch_size, *shape]`` is drawn from ``(seed, step)`` and
    rows ``[p * b, (p + 1) * b)`` are returned, ``b = batch_size // process_count``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, _NOISE_STREAM, step]))
    noise = rng.standard_normal((batch_size, *shape), dtype=np.float32)
    local = batch_size // process_count
    return noise[process_index * local : (process_index + 1) * local]


class StepNoiseTask(Task):
    """A task whose training inputs get fresh noise each step (edge copy, matrix inversion).

    The subclass has ``config.noise_std`` and defines `perturb_inputs`; the noise of the
    training batch of global step ``s`` is `step_noise` drawn from ``(seed, s)`` for the
    whole global batch and sliced per process, so it is resumable and the same for every
    process count. Targets and evaluation inputs stay clean.
    """

    @property
    def augments_training(self) -> bool:
        """True with ``noise_std > 0``."""
        return self.config.noise_std > 0

    @abc.abstractmethod
    def perturb_inputs(self, batch: data.Batch, noise: np.ndarray) -> np.ndarray:
        """The noisy inputs of ``batch`` given standard normal ``noise`` of their shape."""

    def augment_train_batch(
        self,
        batch: data.Batch,
        *,
        seed: int,
        step: int,
        batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> data.Batch:
        """``batch`` with ``"inputs"`` replaced by `perturb_inputs` of this step's noise."""
        shape = batch["inputs"].shape[1:]
        noise = step_noise(seed, step, batch_size, shape, process_index, process_count)
        return {**batch, "inputs": self.perturb_inputs(batch, noise).astype(np.float32)}


@dataclasses.dataclass(frozen=True)
class EdgeCopyConfig(SplitSizes):
    """What to generate (frozen, hashable).

    Attributes:
      seed: seeds every split (independent streams per split).
      train_size: training graphs.
      train_nodes: nodes per training graph.
      test_nodes: one test split ``"test_{n}"`` per node count.
      test_size: graphs per test split.
      val_size: graphs of the validation split ``"valid"`` (``train_nodes`` nodes; 0:
        none).
      edge_prob: Erdős–Rényi edge probability ``p``.
      num_features: features per edge ``C``.
      noise_std: standard deviation of the training-input noise (0 disables it).
    """

    seed: int = 0
    train_size: int = 10_000
    train_nodes: int = 10
    test_nodes: tuple[int, ...] = (10, 20, 40)
    test_size: int = 1_000
    val_size: int = 1_000
    edge_prob: float = 0.3
    num_features: int = 1
    noise_std: float = 0.1

    def __post_init__(self):
        if not all(isinstance(n, int | np.integer) for n in self.test_nodes):
            raise ValueError(f"test_nodes must be integers, got {self.test_nodes}.")
        object.__setattr__(self, "test_nodes", tuple(int(n) for n in self.test_nodes))
        fields = ("seed", "train_size", "train_nodes", "test_size", "val_size", "num_features")
        for field in fields:
            value = getattr(self, field)
            least = {"seed": 0, "train_nodes": 2, "val_size": 0}.get(field, 1)
            if not isinstance(value, int | np.integer) or value < least:
                raise ValueError(f"EdgeCopyConfig.{field} must be >= {least}, got {value!r}.")
        if not self.test_nodes or min(self.test_nodes) < 2:
            raise ValueError(f"test_nodes must be node counts >= 2, got {self.test_nodes}.")
        if len(set(self.test_nodes)) != len(self.test_nodes):
            raise ValueError(f"test_nodes must be distinct, got {self.test_nodes}.")
        if not 0.0 < self.edge_prob <= 1.0:
            raise ValueError(f"edge_prob must lie in (0, 1], got {self.edge_prob}.")
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}.")

    @property
    def test_splits(self) -> tuple[str, ...]:
        """``("test_10", ...)`` in the order of `test_nodes`."""
        return tuple(f"test_{n}" for n in self.test_nodes)

    def nodes(self, split: str) -> int:
        """Nodes per graph in ``split``."""
        return self.scale(split, self.train_nodes)


@functools.lru_cache(maxsize=16)
def generate_split(config: EdgeCopyConfig, split: str) -> dict[str, np.ndarray]:
    """Generates one split, deterministically from ``(config, split)``; cached.

    Returns:
      ``{"inputs": float32 [N, n, n, C], "adjacency": float32 [N, n, n], "targets":
      float32 [N, n, n, C]}`` (read-only), clean: targets equal inputs.
    """
    n, count = config.nodes(split), config.size(split)
    kind = {TRAIN: 0, VALID: 2}.get(split, 1)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, kind, n]))
    edges = symmetric_from_upper(rng.random((count, n, n)) < config.edge_prob)  # [N, n, n]
    features = rng.uniform(-1.0, 1.0, (count, n, n, config.num_features))  # [N, n, n, C]
    features = symmetric_from_upper(features) * edges[..., None]
    out = {
        "inputs": features.astype(np.float32),
        "adjacency": edges.astype(np.float32),
        "targets": features.astype(np.float32),
    }
    for array in out.values():
        array.flags.writeable = False
    return out


def edge_mse(predictions, targets, adjacency, mask=None) -> dict:
    """Mean squared error over each graph's existing edges; numpy or jax, jittable.

    Args:
      predictions: ``[B, n, n, C]``.
      targets: ``[B, n, n, C]``.
      adjacency: ``[B, n, n]`` 0/1, which entries are edges (both directions count).
      mask: optional ``[B]`` bool, which graphs count (padding is False).

    Returns:
      ``{"mse": mean over counted graphs of the mean squared error over the graph's
      edge entries (0 for a graph without edges), "count": number of counted graphs}``;
      combine batches with `deq_jax.tasks.data.weighted_mean`.
    """
    if predictions.shape != targets.shape or predictions.ndim != 4:
        raise ValueError(
            f"predictions and targets need equal shapes [B, n, n, C], got {predictions.shape} "
            f"and {targets.shape}."
        )
    if adjacency.shape != targets.shape[:3]:
        raise ValueError(f"adjacency must be {targets.shape[:3]}, got {adjacency.shape}.")
    edges = jnp.asarray(adjacency, jnp.float32)[..., None]  # [B, n, n, 1]
    err = jnp.square(jnp.asarray(predictions, jnp.float32) - jnp.asarray(targets, jnp.float32))
    total = jnp.sum(err * edges, axis=(1, 2, 3))  # [B]
    entries = jnp.sum(edges, axis=(1, 2, 3)) * targets.shape[-1]  # [B]
    per_graph = total / jnp.maximum(entries, 1.0)  # [B]
    weight = jnp.ones(per_graph.shape[0]) if mask is None else jnp.asarray(mask, jnp.float32)
    count = jnp.sum(weight)
    return {"mse": jnp.sum(weight * per_graph) / jnp.maximum(count, 1.0), "count": count}


class EdgeCopyTask(HeldOutSplits, StepNoiseTask):
    """The edge-copy task behind the uniform task interface (see `deq_jax.tasks`).

    Unlike classification tasks, `metrics` needs the batch's ``adjacency``.

    Args:
      config: what to generate.
    """

    name = "edge_copy"
    num_classes = None  # a regression task: C real outputs per edge
    batch_extras = ("adjacency",)
    train_split = TRAIN

    def __init__(self, config: EdgeCopyConfig = EdgeCopyConfig()):
        self.config = config

    @property
    def num_outputs(self) -> int:
        """Features per edge ``C``."""
        return self.config.num_features

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One training graph's edge features ``(n, n, C)``, for ``model.init``."""
        n = self.config.train_nodes
        return (n, n, self.config.num_features)

    def source(self, split: str) -> dict[str, np.ndarray]:
        """The arrays of ``split`` (see `arrays`)."""
        return self.arrays(split)

    def arrays(self, split: str) -> dict[str, np.ndarray]:
        """The clean arrays of ``split`` (`generate_split`)."""
        return generate_split(self.config, split)

    def num_examples(self, split: str) -> int:
        """Graphs in ``split``."""
        return self.config.size(split)

    def perturb_inputs(self, batch: data.Batch, noise: np.ndarray) -> np.ndarray:
        """Symmetric noise on the edges (module docstring): ``inputs + noise_std * E *
        adjacency[..., None]``, ``E`` the mirrored upper triangle of ``noise [b, n, n, C]``.
        """
        std, edges = self.config.noise_std, batch["adjacency"][..., None]
        return batch["inputs"] + std * symmetric_from_upper(noise) * edges

    @staticmethod
    def metrics(predictions, targets, mask=None, adjacency=None) -> dict:
        """``{"mse", "count"}`` over existing edges; see `edge_mse`.

        Raises:
          ValueError: without ``adjacency`` (pass ``batch["adjacency"]``).
        """
        if adjacency is None:
            raise ValueError("edge_copy metrics need adjacency=batch['adjacency'].")
        return edge_mse(predictions, targets, adjacency, mask)


def edge_copy(
    *,
    data_dir: str | None = None,
    seed: int = 0,
    train_size: int = 10_000,
    train_nodes: int = 10,
    test_nodes: tuple[int, ...] = (10, 20, 40),
    test_size: int = 1_000,
    val_size: int = 1_000,
    edge_prob: float = 0.3,
    num_features: int = 1,
    noise_std: float = 0.1,
) -> EdgeCopyTask:
    """Builds the edge-copy task; the registry's constructor (see `EdgeCopyConfig`).

    ``data_dir`` is accepted for a uniform call signature and unused (generated in
    memory).
    """
    del data_dir  # Generated in memory.
    config = EdgeCopyConfig(
        seed=seed,
        train_size=train_size,
        train_nodes=train_nodes,
        test_nodes=tuple(test_nodes),
        test_size=test_size,
        val_size=val_size,
        edge_prob=edge_prob,
        num_features=num_features,
        noise_std=noise_std,
    )
    return EdgeCopyTask(config)
