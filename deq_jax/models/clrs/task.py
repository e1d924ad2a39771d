"""`ClrsTask`: one CLRS-30 algorithm behind the uniform task interface.

The splits are `deq_jax.models.clrs.dataset`'s (`ClrsConfig`: CLRS-30's 1000 training
graphs of 16 nodes, ``"val"`` at 16 nodes and one ``"test_{n}"`` split per test size).

Batches (every value an array with the batch axis first)::

    inputs         float32 [b, n, n]   the adjacency `adj` (self-loops included)
    input_<name>   the other inputs: pos [b, n], A [b, n, n], s [b, n] (with a source)
    hint_<name>    [b, T, ...] hint trajectories, zero-padded past `lengths`
    lengths        int32 [b]           hint steps of each example
    targets        the output: `pi` int32 [b, n] (parents), or Kruskal's `in_mst`
                   int32 [b, n, n] (0/1)
    mask, index    added by the batcher

Everything but ``inputs``, ``targets``, ``mask`` and ``index`` is in `batch_extras`,
so the train and eval steps hand it to the model and to `metrics` as keywords. The
training split carries the whole hint trajectories, the evaluation splits their first
step only.

Metrics: CLRS's scores (`deq_jax.models.clrs.evaluation`), reported as ``"score"``; for
Kruskal's mask also its per-graph counts (``"true_positives"``, ...).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/evaluation.py``).
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024 blog
  post track.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deq_jax.models.clrs import augment, specs
from deq_jax.models.clrs.dataset import TRAIN, VAL, ClrsConfig, generate_split
from deq_jax.models.clrs.evaluation import f1_from_counts, mask_score, pointer_score
from deq_jax.models.clrs.local_rules import lightest_neighbours
from deq_jax.tasks import data
from deq_jax.tasks.base import Task

_EXTRA_EDGE_STREAM = 104_729  # separates the extra-edge draws from the shuffling streams
_DEFAULT_CONFIG = ClrsConfig()


class ClrsTask(Task):
    """A CLRS-30 algorithm behind the uniform task interface (module docstring).

    A classification task: ``num_classes`` is the training graphs' node count for
    pointer outputs (one class per candidate parent; larger graphs have more) and 2 for
    Kruskal's edge mask.

    Args:
      config: what to generate.
      non_tree_edge_weight: edge-mask outputs (MST-Kruskal) only: the weight of the
        cross-entropy of a graph's edges that are not in the tree, in `loss` (1: every
        entry weighs the same, as in CLRS). CLRS-30's 16-node MST graphs are nearly
        forests (55 such edges in the 1000 training graphs), so the plain loss hardly
        sees one.
      extra_edge_rate: Bellman-Ford, Dijkstra, MST-Prim and MST-Kruskal only: each
        training graph of each step gets extra edges that leave its output unchanged
        (`deq_jax.models.clrs.augment`; each eligible non-edge with probability
        ``q ~ U(0, extra_edge_rate)``), so the training graphs have more neighbours per
        node, as larger test graphs do. The hints are then not the new graph's, so
        the batches carry none and ``fixed_steps`` (which needs them) raises. 0: the
        training graphs as sampled.
      weight_power: MST-Prim and MST-Kruskal only: each training graph of each step has
        its edge weights raised to a power drawn log-uniformly from ``[1,
        weight_power]`` (`augment.raise_weights`), which keeps their order and so the
        output; the light tree edges then weigh what they do on larger graphs. Hints
        are dropped as for ``extra_edge_rate``. 1: the weights as sampled.

    Raises:
      ValueError: for a negative ``non_tree_edge_weight``, or one other than 1 for a
        pointer output; an ``extra_edge_rate`` outside ``[0, 1]``, a ``weight_power``
        below 1, or either of them for another algorithm.
    """

    name = "clrs"
    train_split = TRAIN

    def __init__(
        self,
        config: ClrsConfig = _DEFAULT_CONFIG,
        non_tree_edge_weight: float = 1.0,
        extra_edge_rate: float = 0.0,
        weight_power: float = 1.0,
    ):
        self.config = config
        alg = config.algorithm
        (self.output,) = specs.names(alg, specs.Stage.OUTPUT)
        self.output_type = specs.SPECS[alg][self.output][2]
        inputs = [f"input_{k}" for k in specs.names(alg, specs.Stage.INPUT) if k != "adj"]
        hints = [f"hint_{k}" for k in specs.names(alg, specs.Stage.HINT)]
        self.extra_edge_rate = float(extra_edge_rate)
        if not 0.0 <= self.extra_edge_rate <= 1.0:
            raise ValueError(f"extra_edge_rate must lie in [0, 1], got {extra_edge_rate}.")
        if self.extra_edge_rate and alg not in augment.ALGORITHMS:
            raise ValueError(
                f"extra_edge_rate adds edges that keep the output of "
                f"{', '.join(augment.ALGORITHMS)}; {alg}'s would change."
            )
        self.weight_power = float(weight_power)
        if self.weight_power < 1.0:
            raise ValueError(f"weight_power must be >= 1, got {weight_power}.")
        if self.weight_power != 1.0 and alg not in augment.SPANNING_TREES:
            raise ValueError(
                f"weight_power keeps the order of the weights, which fixes the output of "
                f"{', '.join(augment.SPANNING_TREES)}; {alg}'s would change."
            )
        if self.augments_training:
            hints = []  # the augmented graphs' hints are unknown (see the docstring)
        self.batch_extras = (*inputs, *hints, "lengths")
        self.non_tree_edge_weight = float(non_tree_edge_weight)
        if self.non_tree_edge_weight < 0:
            raise ValueError(f"non_tree_edge_weight must be >= 0, got {non_tree_edge_weight}.")
        if self.non_tree_edge_weight != 1.0 and self.output_type != specs.Type.MASK:
            raise ValueError(
                f"non_tree_edge_weight weighs an edge-mask output (mst_kruskal), not {alg}'s "
                f"output {self.output!r}."
            )

    selection_metric = ("score", "max")  # CLRS selects on the val score
    validation_split = VAL

    @property
    def num_classes(self) -> int:
        """Classes per output position (see the class docstring)."""
        return 2 if self.output_type == specs.Type.MASK else self.config.train_nodes

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """``("val", "test_64", ...)``."""
        return self.config.splits[1:]

    @property
    def input_shape(self) -> tuple[int, int]:
        """One training graph's adjacency ``(n, n)``, for ``model.init``."""
        return (self.config.train_nodes, self.config.train_nodes)

    def source(self, split: str) -> dict[str, np.ndarray]:
        """The arrays of ``split`` (`generate_split`)."""
        return generate_split(self.config, split)

    def num_examples(self, split: str) -> int:
        """Graphs in ``split``."""
        return self.config.size(split)

    @property
    def augments_training(self) -> bool:
        """True with an ``extra_edge_rate`` or a ``weight_power``."""
        return bool(self.extra_edge_rate or self.weight_power != 1.0)

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
        """Each graph augmented on its own (`Task.augment_train_batch`): extra edges
        and raised weights as configured, `augment.augment_rows`; hints dropped.

        A graph's draws are a pure function of ``(seed, step, its row in the global
        batch)``, so they do not depend on the number of processes, and a resumed run
        draws what the uninterrupted one did.
        """
        return augment.augment_rows(
            self.config.algorithm,
            batch,
            [seed, _EXTRA_EDGE_STREAM, step],
            first_row=process_index * (batch_size // process_count),
            extra_edge_rate=self.extra_edge_rate,
            weight_power=self.weight_power,
        )

    def all_edges_score(self, split: str) -> float:
        """The F1 of predicting every edge of ``split``'s graphs (edge-mask outputs).

        The reference a Kruskal model must beat: CLRS's MST graphs keep an edge with
        probability 0.04, so the 16-node graphs are nearly forests (this rule scores
        ~99% there) and the 64-node ones are not (~82%).

        Raises:
          ValueError: for a pointer output.
        """
        if self.output_type != specs.Type.MASK:
            raise ValueError(f"{self.config.algorithm}'s output is not an edge mask.")
        arrays = self.source(split)
        n = arrays["inputs"].shape[1]
        edges = (arrays["inputs"] > 0) & ~np.eye(n, dtype=bool)  # [N, n, n], no self-loops
        truth = arrays["targets"] > 0
        counts = ((edges & truth).sum(), (edges & ~truth).sum(), (~edges & truth).sum())
        return float(f1_from_counts(*counts))

    def lightest_neighbour_score(self, split: str) -> float:
        """MST-Prim's score of pointing every node at its lightest neighbour.

        A local rule a Prim model must beat: by the cut property each node's lightest
        incident edge is in the tree, so this parent is right whenever that neighbour
        lies on the node's path to the start node (the start node, and nodes without
        neighbours, point at themselves). It scores ~70% at every size on CLRS's MST
        graphs, where a trained model's score falls with the graph's size.

        Raises:
          ValueError: for another algorithm.
        """
        if self.config.algorithm != "mst_prim":
            raise ValueError(
                f"The lightest-neighbour rule is MST-Prim's reference, not "
                f"{self.config.algorithm!r}'s."
            )
        arrays = self.source(split)
        parents = lightest_neighbours(arrays["input_A"], arrays["input_s"])
        return float((np.asarray(parents) == arrays["targets"]).mean())

    def loss(self, outputs, targets, mask, inputs, **extras) -> jax.Array:
        """The training loss: the mean cross-entropy over every output entry, per graph,
        averaged over the real graphs (CLRS's), with ``non_tree_edge_weight`` on the
        entries of edges outside the tree (edge-mask outputs).

        Args:
          outputs: logits, ``[B, n, n]`` (pointer) or ``[B, n, n, 2]`` (edge mask).
          targets: int ``[B, n]`` parents or ``[B, n, n]`` 0/1 tree edges.
          mask: ``[B]`` bool, false for padding rows.
          inputs: ``[B, n, n]``, the adjacency (self-loops included).
          extras: the batch's other features (unused).

        Returns:
          A scalar.
        """
        del extras  # the batch's features; the loss needs the adjacency only
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs, targets)  # [B, ...]
        if self.non_tree_edge_weight != 1.0:
            n = inputs.shape[-1]
            edges = (inputs > 0.5) & ~jnp.eye(n, dtype=bool)  # [B, n, n], no self-loops
            ce = jnp.where(edges & (targets == 0), self.non_tree_edge_weight * ce, ce)
        per_graph = ce.reshape(ce.shape[0], -1).mean(axis=1)
        weight = jnp.asarray(mask, per_graph.dtype)
        return jnp.sum(weight * per_graph) / jnp.maximum(jnp.sum(weight), 1.0)

    def combine_metrics(self, combined: dict[str, float]) -> dict[str, float]:
        """A mask output's score over a whole split: the F1 of its combined counts
        (CLRS's micro-F1), not the mean of the batches' F1s."""
        if "true_positives" not in combined:
            return combined
        counts = (combined[k] for k in ("true_positives", "false_positives", "false_negatives"))
        return dict(combined, score=float(f1_from_counts(*counts)))

    def metrics(self, outputs, targets, mask=None, **extras) -> dict:
        """``{"score", ..., "count"}`` (module docstring); ``extras`` are ignored."""
        del extras  # the batch's features; the score needs outputs and targets only
        if self.output_type == specs.Type.MASK:
            return mask_score(outputs, targets, mask)
        return pointer_score(outputs, targets, mask)


def clrs(
    *,
    algorithm: str = "bellman_ford",
    data_dir: str | None = None,
    seed: int = 0,
    train_nodes: int = 16,
    test_nodes: tuple[int, ...] = (64,),
    train_size: int = 1000,
    eval_size: int = 32,
    multiplier: int = 1,
    non_tree_edge_weight: float = 1.0,
    extra_edge_rate: float = 0.0,
    weight_power: float = 1.0,
    sampler: str = "clrs30",
) -> ClrsTask:
    """Builds a CLRS-30 task; the registry's constructor (see `ClrsConfig`).

    ``data_dir`` is accepted for a uniform call signature and unused (generated in
    memory). ``non_tree_edge_weight`` weighs Kruskal's loss; ``extra_edge_rate`` adds
    output-preserving edges to the training graphs and ``weight_power`` raises the
    MSTs' training weights (see `ClrsTask`); ``sampler`` picks the random stream
    (``"clrs30"``: CLRS-30's official graphs, or ``"generator"``; see `ClrsConfig`).
    """
    del data_dir  # Generated in memory.
    config = ClrsConfig(
        algorithm=algorithm,
        train_nodes=train_nodes,
        test_nodes=tuple(test_nodes),
        train_size=train_size,
        eval_size=eval_size,
        multiplier=multiplier,
        seed=seed,
        sampler=sampler,
    )
    return ClrsTask(
        config,
        non_tree_edge_weight=non_tree_edge_weight,
        extra_edge_rate=extra_edge_rate,
        weight_power=weight_power,
    )
