"""CLRS-30 with DEQ processors: one package, laid out as google-deepmind/clrs's ``_src``.

Data (numpy/jax and `deq_jax.tasks`' base only):

* `specs` (feature names, stages, locations, types; `model_spec`), `probing`,
  `algorithms` (the reference implementations recording their hints), `graphs`,
  `samplers` (seeded splits, CLRS's ``Feedback``), `augment` (output-preserving
  training-graph changes), `local_rules` (per-node facts of a true solution),
  `evaluation` (CLRS's scores), `diagnostics` (where a model's errors sit);
* `dataset` (`ClrsConfig`, the generated splits) and `task` (`ClrsTask`, registered
  here as the task ``clrs``: ``tasks.get("clrs", algorithm="bfs")``).

Model (`deq_jax.nn` and below): `encoders`, `processors`, `decoders`, `losses`, `loops`
(the non-DEQ modes' loops) and `model` (`ClrsModel`, the model ``clrs_deq``).

Six algorithms of the CLRS Algorithmic Reasoning Benchmark, with its feature names,
stages, locations and types (`SPECS`), its graph distributions
(`GRAPH_DISTRIBUTIONS`) and its hints recorded at the same steps as its reference
implementations: ``bellman_ford``, ``bfs``, ``dfs``, ``dijkstra``, ``mst_kruskal``
and ``mst_prim``. No TensorFlow; every split is generated in memory from a seed::

    from deq_jax.models import clrs

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

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024
  blog post track.
"""

from deq_jax import tasks
from deq_jax.models.clrs.algorithms import bellman_ford, bfs, dfs, dijkstra, mst_kruskal, mst_prim
from deq_jax.models.clrs.dataset import ClrsConfig
from deq_jax.models.clrs.evaluation import f1_from_counts, mask_score, pointer_score
from deq_jax.models.clrs.graphs import SAMPLERS, adjacency, er_graph, random_stream
from deq_jax.models.clrs.local_rules import lightest_neighbours, near_tie_gaps
from deq_jax.models.clrs.model import ClrsModel
from deq_jax.models.clrs.samplers import (
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
from deq_jax.models.clrs.specs import (
    ALGORITHMS,
    NUM_CATEGORIES,
    SPECS,
    Location,
    Stage,
    Type,
    check_algorithm,
    feature_shape,
    model_spec,
)
from deq_jax.models.clrs.task import ClrsTask, clrs

tasks.register(clrs.__name__, clrs)

__all__ = [
    "ClrsModel",
    "clrs",
    "ALGORITHMS",
    "CLRS30_SEEDS",
    "ClrsConfig",
    "ClrsTask",
    "GRAPH_DISTRIBUTIONS",
    "NUM_CATEGORIES",
    "SAMPLERS",
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
    "random_stream",
    "run_algorithm",
    "sample_dataset",
    "sample_example",
]
