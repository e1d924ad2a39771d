"""`ClrsTask`: one CLRS-30 algorithm behind the uniform task interface.

Trains on ``train_nodes``-node graphs (CLRS-30: 1000 graphs of 16 nodes, seed 1) and
evaluates on ``"val"`` (``eval_size * multiplier`` graphs of ``train_nodes`` nodes, seed
2) and one ``"test_{n}"`` split per entry of ``test_nodes`` (as many graphs of ``n``
nodes, seed 3; CLRS-30 tests at 64). ``seed`` shifts every split's seed by ``3 * seed``
(0 gives CLRS-30's seeds).

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
training split carries the whole hint trajectories (``T`` = its longest run); the
evaluation splits carry the first step only (``T = 1``: the algorithm's initial state,
which CLRS also hands its model), so a test split of large graphs stays small.

Metrics: CLRS's scores (`deq_jax.models.clrs.evaluation`), reported as ``"score"``; for
Kruskal's mask also its per-graph counts (``"true_positives"``, ...).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/evaluation.py``).
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024 blog
  post track.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deq_jax.models.clrs import augment, specs
from deq_jax.models.clrs.evaluation import f1_from_counts, mask_score, pointer_score
from deq_jax.models.clrs.local_rules import lightest_neighbours, near_tie_gaps, tree_relations
from deq_jax.models.clrs.samplers import CLRS30_SEEDS, sample_example
from deq_jax.tasks import data
from deq_jax.tasks.base import Task

TRAIN, VAL = "train", "val"
_EXTRA_EDGE_STREAM = 104_729  # separates the extra-edge draws from the shuffling streams


def model_spec(algorithm: str) -> tuple[tuple[str, str, str, str, int], ...]:
    """The algorithm's features as ``(name, stage, location, type, categories)`` rows,
    the ``spec`` of `deq_jax.models.clrs.model.ClrsModel`."""
    specs.check_algorithm(algorithm)
    categories = specs.NUM_CATEGORIES.get(algorithm, {})
    return tuple(
        (name, stage, location, type_, categories.get(name, 0))
        for name, (stage, location, type_) in specs.SPECS[algorithm].items()
    )


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
    """

    algorithm: str = "bellman_ford"
    train_nodes: int = 16
    test_nodes: tuple[int, ...] = (64,)
    train_size: int = 1000
    eval_size: int = 32
    multiplier: int = 1
    seed: int = 0

    def __post_init__(self):
        specs.check_algorithm(self.algorithm)
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
    stream from the split's seed), keeping each example's whole hint trajectory for the
    training split and its first step otherwise.
    """
    alg, n, count = config.algorithm, config.nodes(split), config.size(split)
    rng = np.random.default_rng(config.seed_of(split))
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


def edge_target_loss(logits, parents) -> jax.Array:
    """Per-graph ``[B]`` mean binary cross-entropy of ``logits [B, n, n, 2]`` against
    `tree_relations` of ``parents [B, n]`` (tree edge, ancestor), off the diagonal."""
    n = parents.shape[-1]
    labels = jnp.stack(tree_relations(parents), axis=-1).astype(logits.dtype)
    bce = optax.sigmoid_binary_cross_entropy(logits, labels)  # [B, n, n, 2]
    off_diagonal = ~jnp.eye(n, dtype=bool)[..., None]
    return jnp.where(off_diagonal, bce, 0.0).sum(axis=(1, 2, 3)) / (2 * n * max(n - 1, 1))


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
      hard_parent_weight: MST-Prim only: the weight, in `loss`, of the nodes whose parent
        is not their lightest neighbour (`lightest_neighbours`, a local rule right on
        70% of the nodes at every size); 1: every node weighs the same.
      near_tie_weight: Bellman-Ford and Dijkstra only: the weight, in `loss`, of the
        near-tie nodes, whose best path through another neighbour is less than
        ``near_tie_margin`` longer than their shortest path (`near_tie_gaps`); the
        errors of a trained model at 64 nodes are mostly such nodes.
      near_tie_margin: the path-length margin of a near-tie (edge weights lie in
        [0, 1]).
      edge_target_weight: node-pointer outputs only: the weight, in `loss`, of the
        binary cross-entropy of the model's ``aux_outputs`` (``ClrsModel(edge_targets=
        True)``: two logits per node pair read from its edge state) against two
        pairwise facts of the true tree (`tree_relations`): the pair is a tree edge,
        and the second node is an ancestor of the first. Both follow from the output
        pointers, so no hint is used. 0: no such term, and a model that sows
        ``aux_outputs`` is an error.
      extra_edge_rate: Bellman-Ford, Dijkstra, MST-Prim and MST-Kruskal only: each
        training graph of each step gets extra edges that leave its output unchanged
        (`deq_jax.models.clrs.augment`; each eligible non-edge with probability
        ``q ~ U(0, extra_edge_rate)``), so the training graphs have more neighbours per
        node, as larger test graphs do. The hints are then not the new graph's, so
        the batches carry none and ``fixed_steps`` (which needs them) raises. 0: the
        training graphs as sampled.
      reroot_rate: MST-Prim only: the probability that a training graph's start node
        moves, each step, to an end of its tree's longest path, with the tree
        re-oriented there (`augment.reroot_at_deepest`: Prim's output from that start),
        so the training trees are deeper. Hints are dropped as for
        ``extra_edge_rate``. 0: the start nodes as sampled.
      weight_power: MST-Prim and MST-Kruskal only: each training graph of each step has
        its edge weights raised to a power drawn log-uniformly from ``[1,
        weight_power]`` (`augment.raise_weights`), which keeps their order and so the
        output; the light tree edges then weigh what they do on larger graphs. Hints
        are dropped as for ``extra_edge_rate``. 1: the weights as sampled.

    Raises:
      ValueError: for a negative weight, or a weight other than 1 for an algorithm it
        does not apply to; an ``extra_edge_rate`` or ``reroot_rate`` outside
        ``[0, 1]``, a ``weight_power`` below 1, or any of them for another algorithm.
    """

    name = "clrs"
    train_split = TRAIN

    def __init__(
        self,
        config: ClrsConfig = ClrsConfig(),
        non_tree_edge_weight: float = 1.0,
        hard_parent_weight: float = 1.0,
        near_tie_weight: float = 1.0,
        near_tie_margin: float = 0.05,
        edge_target_weight: float = 0.0,
        extra_edge_rate: float = 0.0,
        reroot_rate: float = 0.0,
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
        self.reroot_rate = float(reroot_rate)
        if not 0.0 <= self.reroot_rate <= 1.0:
            raise ValueError(f"reroot_rate must lie in [0, 1], got {reroot_rate}.")
        if self.reroot_rate and alg != "mst_prim":
            raise ValueError(f"reroot_rate moves MST-Prim's start node; {alg} has no such tree.")
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
        self.hard_parent_weight = float(hard_parent_weight)
        self.near_tie_weight = float(near_tie_weight)
        self.near_tie_margin = float(near_tie_margin)
        if self.near_tie_margin <= 0:
            raise ValueError(f"near_tie_margin must be > 0, got {near_tie_margin}.")
        self.edge_target_weight = float(edge_target_weight)
        if self.edge_target_weight < 0:
            raise ValueError(f"edge_target_weight must be >= 0, got {edge_target_weight}.")
        if self.edge_target_weight and self.output_type != specs.Type.POINTER:
            raise ValueError(
                f"edge_target_weight scores a parent-pointer tree, not {alg}'s output "
                f"{self.output!r}."
            )
        for name, value, applies, what in (
            (
                "non_tree_edge_weight",
                non_tree_edge_weight,
                self.output_type == specs.Type.MASK,
                "an edge-mask output (mst_kruskal)",
            ),
            ("hard_parent_weight", hard_parent_weight, alg == "mst_prim", "mst_prim's parents"),
            (
                "near_tie_weight",
                near_tie_weight,
                alg in ("bellman_ford", "dijkstra"),
                "shortest-path parents (bellman_ford, dijkstra)",
            ),
        ):
            if float(value) < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
            if float(value) != 1.0 and not applies:
                raise ValueError(f"{name} weighs {what}, not {alg}'s output {self.output!r}.")

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
        """True with an ``extra_edge_rate``, a ``reroot_rate`` or a ``weight_power``."""
        return bool(self.extra_edge_rate or self.reroot_rate or self.weight_power != 1.0)

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
        """Each graph augmented on its own (`Task.augment_train_batch`): extra edges,
        re-rooting and raised weights as configured, `augment.augment_rows`; hints
        dropped.

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
            reroot_rate=self.reroot_rate,
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

    def loss(self, outputs, targets, mask, inputs, aux_outputs=None, **extras) -> jax.Array:
        """The training loss: the mean cross-entropy over every output entry, per graph,
        averaged over the real graphs (CLRS's), with ``non_tree_edge_weight`` on the
        entries of edges outside the tree (edge-mask outputs) and ``hard_parent_weight``
        on the nodes whose parent is not their lightest neighbour (MST-Prim) and
        ``near_tie_weight`` on the near-tie nodes (Bellman-Ford, Dijkstra); with
        ``edge_target_weight``, plus that weight times `edge_target_loss` per graph.

        Args:
          outputs: logits, ``[B, n, n]`` (pointer) or ``[B, n, n, 2]`` (edge mask).
          targets: int ``[B, n]`` parents or ``[B, n, n]`` 0/1 tree edges.
          mask: ``[B]`` bool, false for padding rows.
          inputs: ``[B, n, n]``, the adjacency (self-loops included).
          aux_outputs: ``[B, n, n, 2]`` logits of the model's edge state, with
            ``edge_target_weight`` (and only then).
          extras: the batch's other features (``input_A``, and MST-Prim's ``input_s``,
            with ``hard_parent_weight`` or ``near_tie_weight``).

        Returns:
          A scalar.

        Raises:
          ValueError: when ``aux_outputs`` is given without ``edge_target_weight`` or
            missing with it.
        """
        if (aux_outputs is None) != (self.edge_target_weight == 0):
            raise ValueError(
                "task.edge_target_weight > 0 scores the model's edge-state logits: set both "
                "it and model.edge_targets=True, or neither."
            )
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs, targets)  # [B, ...]
        if self.hard_parent_weight != 1.0:
            rule = lightest_neighbours(extras["input_A"], extras["input_s"])
            ce = jnp.where(rule != targets, self.hard_parent_weight * ce, ce)
        if self.near_tie_weight != 1.0:
            tied = near_tie_gaps(extras["input_A"], targets) < self.near_tie_margin
            ce = jnp.where(tied, self.near_tie_weight * ce, ce)
        if self.non_tree_edge_weight != 1.0:
            n = inputs.shape[-1]
            edges = (inputs > 0.5) & ~jnp.eye(n, dtype=bool)  # [B, n, n], no self-loops
            ce = jnp.where(edges & (targets == 0), self.non_tree_edge_weight * ce, ce)
        per_graph = ce.reshape(ce.shape[0], -1).mean(axis=1)
        if aux_outputs is not None:
            per_graph = per_graph + self.edge_target_weight * edge_target_loss(aux_outputs, targets)
        weight = jnp.asarray(mask, per_graph.dtype)
        return jnp.sum(weight * per_graph) / jnp.maximum(jnp.sum(weight), 1.0)

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
    hard_parent_weight: float = 1.0,
    near_tie_weight: float = 1.0,
    near_tie_margin: float = 0.05,
    edge_target_weight: float = 0.0,
    extra_edge_rate: float = 0.0,
    reroot_rate: float = 0.0,
    weight_power: float = 1.0,
) -> ClrsTask:
    """Builds a CLRS-30 task; the registry's constructor (see `ClrsConfig`).

    ``data_dir`` is accepted for a uniform call signature and unused (generated in
    memory). ``non_tree_edge_weight``, ``hard_parent_weight`` and ``near_tie_weight``
    (with ``near_tie_margin``) weigh Kruskal's, Prim's and the shortest paths' losses;
    ``edge_target_weight`` scores a model's edge state against the true tree;
    ``extra_edge_rate`` adds output-preserving edges to the training graphs and
    ``reroot_rate`` moves Prim's start node to deepen its trees; ``weight_power``
    raises the MSTs' training weights (see `ClrsTask`).
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
    )
    return ClrsTask(
        config,
        non_tree_edge_weight=non_tree_edge_weight,
        hard_parent_weight=hard_parent_weight,
        near_tie_weight=near_tie_weight,
        near_tie_margin=near_tie_margin,
        edge_target_weight=edge_target_weight,
        extra_edge_rate=extra_edge_rate,
        reroot_rate=reroot_rate,
        weight_power=weight_power,
    )
