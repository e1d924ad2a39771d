"""CLRS-30 graph algorithms: seeded numpy samplers of inputs, hints and outputs.

Six algorithms of the CLRS Algorithmic Reasoning Benchmark, with its feature names,
stages, locations and types (`SPECS`), its graph distributions
(`GRAPH_DISTRIBUTIONS`) and its hints recorded at the same steps as its reference
implementations: ``bellman_ford``, ``bfs``, ``dfs``, ``dijkstra``, ``mst_kruskal``
and ``mst_prim``. No TensorFlow; every split is generated in memory from a seed::

    from deq_jax.tasks import clrs

    splits = clrs.clrs30_splits("bfs")          # {"train", "val", "test"}
    train = splits["train"]                     # 1000 graphs of 16 nodes, seed 1
    train.inputs["adj"].shape                   # (1000, 16, 16)
    train.hints["pi_h"].shape                   # (1000, T, 16), T = longest run
    train.lengths                               # int32 [1000], in [1, T]
    feedback = train.feedback()                 # CLRS's Feedback(Features, outputs)

Data layout (``N`` examples, ``n`` nodes, ``T`` padded hint steps):

- node features ``[N, n]``, edge features ``[N, n, n]``, graph features ``[N]``;
  categorical ones add a last axis of `NUM_CATEGORIES` classes;
- hints insert the time axis second (``[N, T, n]`` ...), zero-padded past
  ``lengths[i]``, the number of valid steps of example ``i`` (CLRS's semantics);
- types: ``scalar`` and ``mask`` float32, ``mask_one`` and ``categorical`` one-hot
  float32, ``pointer`` int32 node indices (``pi[i]`` is ``i``'s parent; roots and
  unreached nodes point to themselves);
- inputs always include ``pos`` (``i / n``), ``A`` (weights, 0 where no edge) and
  ``adj`` (0/1 with self-loops); algorithms with a start node add ``s`` (one-hot).

Unknown algorithm names raise a ValueError that lists the valid ones.

`ClrsTask` (registered as the task ``clrs``, ``tasks.get("clrs", algorithm="bfs")``)
puts one algorithm behind the uniform task interface, with CLRS's scores
(`pointer_score`, `mask_score`, in `deq_jax.tasks.clrs.scores`) and the model spec
`model_spec` of `deq_jax.nn.clrs_model.ClrsModel`; see `deq_jax.tasks.clrs.task`. Its
loss weights and reference scores read per-node facts of the true solution from
`deq_jax.tasks.clrs.local_rules` (`lightest_neighbours`, `near_tie_gaps`,
`tree_relations`).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024
  blog post track.
"""

from deq_jax.tasks.clrs.graphs import adjacency, er_graph
from deq_jax.tasks.clrs.local_rules import lightest_neighbours, near_tie_gaps, tree_relations
from deq_jax.tasks.clrs.sampler import (
    CLRS30_SEEDS,
    GRAPH_DISTRIBUTIONS,
    ClrsDataset,
    Example,
    Features,
    Feedback,
    GraphDistribution,
    clrs30_splits,
    feedback_from_batch,
    run_algorithm,
    sample_dataset,
    sample_example,
)
from deq_jax.tasks.clrs.scores import f1_from_counts, mask_score, pointer_score
from deq_jax.tasks.clrs.shortest_paths import bellman_ford, dijkstra
from deq_jax.tasks.clrs.spanning_trees import mst_kruskal, mst_prim
from deq_jax.tasks.clrs.specs import (
    ALGORITHMS,
    NUM_CATEGORIES,
    SPECS,
    Location,
    Stage,
    Type,
    check_algorithm,
    feature_shape,
)
from deq_jax.tasks.clrs.task import ClrsConfig, ClrsTask, model_spec
from deq_jax.tasks.clrs.traversal import bfs, dfs

__all__ = [
    "ALGORITHMS",
    "CLRS30_SEEDS",
    "ClrsConfig",
    "ClrsTask",
    "GRAPH_DISTRIBUTIONS",
    "NUM_CATEGORIES",
    "SPECS",
    "ClrsDataset",
    "Example",
    "Features",
    "Feedback",
    "GraphDistribution",
    "Location",
    "Stage",
    "Type",
    "adjacency",
    "bellman_ford",
    "bfs",
    "check_algorithm",
    "clrs30_splits",
    "dfs",
    "dijkstra",
    "er_graph",
    "f1_from_counts",
    "feature_shape",
    "feedback_from_batch",
    "lightest_neighbours",
    "mask_score",
    "model_spec",
    "near_tie_gaps",
    "mst_kruskal",
    "mst_prim",
    "pointer_score",
    "run_algorithm",
    "sample_dataset",
    "sample_example",
    "tree_relations",
]
